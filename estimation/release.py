"""The release family: estimates per level with a :class:`~censusdp.estimation.covariance.Covariance`,
and the uncertainty methods written once on top of it.

:class:`ReleaseBase` is the root. A member says what it holds — its levels
(:attr:`~ReleaseBase.level_names`), each level's estimates (:meth:`~ReleaseBase.level`), node
codes and cell labels, whether it is integer, its privacy statement, and its covariance (per
node diagonal or full, :class:`~censusdp.estimation.covariance.NodeCovariance`, or
block-diagonal in the marginal basis, :class:`~censusdp.estimation.covariance.BlockCovariance`)
— and inherits ``standard_errors``, ``query_estimates``, ``query_variances``,
``query_standard_errors``, ``conf_int`` (normal ``1 − alpha`` intervals ``estimate ∓ z·se``,
90% by default as the ``_moe`` columns of every written table), ``summary`` (one row per
level) and ``to_frame`` (one row per node and cell), like a statsmodels results object.
Members: :class:`Release` (every estimator of the flat cell model), the structured GLS
releases (:class:`~censusdp.estimation.gls.structured.StructuredRelease`,
:class:`~censusdp.estimation.gls.structured.StructuredPiece`, their areas), the codebook
hierarchy release (:class:`~censusdp.pipelines.products.codebook_hierarchy.HierarchyRelease`); the PPMF
units and codebook table releases hold one (their ``release`` attribute).

A release is frozen: an estimator that relabels or adjusts another's release makes a new
one (:meth:`Release.replace`), so no caller sees a release change under it. Levels are
addressed by name (or index) everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.covariance import Covariance, NodeCovariance
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.queries import level_position, query_matrix

__all__ = ["LevelRelease", "Release", "ReleaseBase", "ReleaseProtocol", "SumVariances"]


@dataclass(frozen=True, eq=False)
class SumVariances:
    """Variances of sums of a node's cells (totals, marginal rows), per level.

    Attributes
    ----------
    masks : (m, K) bool
        The cells of each tracked sum: every cell, the total, then marginal rows.
    labels : tuple of str
        One per mask (``"total"``, ``"query:row"``).
    estimator : list of (n_nodes, m) arrays
        The estimator's variance of each sum at each node (NaN where it had no covariances).
    rounding : list of (n_nodes, m) arrays
        The variance the integer rounding adds (exact under the dependent scheme; NaN where
        the scheme has no closed form).
    """

    masks: np.ndarray
    labels: tuple[str, ...]
    estimator: list[np.ndarray]
    rounding: list[np.ndarray]

    def index(self, matrix: np.ndarray) -> np.ndarray | None:
        """Position of each row of a 0/1 query matrix among the masks, or None if one is not."""
        rows = np.asarray(matrix).astype(bool)
        key = {m.tobytes(): i for i, m in enumerate(self.masks)}
        idx = [key.get(r.tobytes()) for r in rows]
        return None if any(i is None for i in idx) else np.asarray(idx, np.int64)


@runtime_checkable
class ReleaseProtocol(Protocol):
    """What every released estimate offers, whatever its kind (:class:`Release`,
    :class:`~censusdp.estimation.gls.structured.StructuredRelease`): the privacy statement,
    estimates and normal intervals by level name, and a one-row-per-level summary with the
    columns ``nodes, total, min_cell, negative_share, mean_se, max_se, se_of``. Model: the
    results objects of statsmodels (``conf_int``, ``summary``)."""

    privacy: PrivacyStatement

    def level(self, level: str | int) -> np.ndarray: ...

    def conf_int(self, level: str | int, alpha: float = 0.1) -> tuple[np.ndarray, np.ndarray]: ...

    def summary(self) -> pd.DataFrame: ...


class ReleaseBase:
    """The root of the release family: the uncertainty methods, written once on a
    :class:`~censusdp.estimation.covariance.Covariance` (module docstring).

    A member provides :attr:`level_names`, :meth:`level`, :meth:`level_codes`,
    :attr:`cell_labels` (or the ``hierarchy``, ``estimates`` and ``cells`` the defaults
    read), :attr:`covariance` (None: no standard errors), :attr:`integer`,
    :attr:`estimator`, ``privacy``; optionally :meth:`resolve_query` and
    :attr:`default_query` (the query of :meth:`conf_int` and :meth:`summary` when none is
    given: None for every cell, ``"total"`` for a schema histogram published as tables).
    """

    #: True when the released values are integers (their ``_moe`` is the lattice one).
    integer = False
    #: The query :meth:`conf_int` and :meth:`summary` use when given none (None: the cells).
    default_query = None
    #: What made the estimates (``"gls"``, ``"topdown"``...): a member sets it (no default
    #: here, so that a dataclass member's field of that name stays required).
    estimator: str
    privacy: PrivacyStatement

    # -- what a member provides (the defaults read ``hierarchy``, ``estimates``, ``cells``) --
    @property
    def level_names(self) -> tuple[str, ...]:
        """The levels held, top first."""
        return tuple(self.hierarchy.names)

    def level(self, level: str | int) -> np.ndarray:
        """Estimates at one level, ``(n_nodes, *cells)``."""
        return self.estimates[self.level_index(level)]

    def level_codes(self, level: str | int) -> np.ndarray:
        """The code of every node of one level (the ``code`` column of :meth:`to_frame`)."""
        return self.hierarchy.levels[self.level_index(level)].codes

    @property
    def cell_labels(self) -> tuple[str, ...]:
        """One label per cell, in the order of a level's flattened estimates."""
        return self.cells

    @property
    def covariance(self) -> Covariance | None:
        """The error covariance, level by level; None when the estimator has none."""
        raise NotImplementedError

    def __repr__(self) -> str:
        levels = ", ".join(f"{n}={len(self.level_codes(n))}" for n in self.level_names)
        kind = "integer" if self.integer else "real"
        se = "no SEs" if self.covariance is None else "with SEs"
        return (
            f"<{type(self).__name__} {self.estimator}: {kind}, {len(self.cell_labels)} cells, "
            f"levels {levels}, {se}; {self.privacy.guarantee}>"
        )

    def _check_shapes(self) -> None:
        """Refuse estimates that are not one ``(n_nodes, n_cells)`` array per level."""
        names, n_cells = self.level_names, len(self.cell_labels)
        if len(self.estimates) != len(names):
            raise ValueError(f"a {type(self).__name__} needs one estimate array per level")
        for name in names:
            n = len(self.level_codes(name))
            if self.level(name).shape != (n, n_cells):
                raise ValueError(f"level {name!r}: estimates must be ({n}, {n_cells})")

    def resolve_query(self, query):
        """``query`` as the covariance takes it (a member over a schema parses names)."""
        return query

    def level_index(self, level: str | int) -> int:
        """The index of a level given by name or index (negative from the leaves).

        Raises
        ------
        SpecError
            An unknown name or an index out of range, naming the levels
            (:func:`~censusdp.mechanisms.queries.level_position`).
        """
        return level_position(self.level_names, level, f"{self.estimator} release")

    def no_covariance(self) -> SpecError:
        """The error of asking a release without a covariance for standard errors."""
        return SpecError(
            f"the {self.estimator!r} release has no variances; standard errors are "
            "defined for GLS (exact) and averaged MCMC (Monte Carlo) output"
        )

    # -- written once ----------------------------------------------------------------------
    def standard_errors(self, level: str | int) -> np.ndarray | None:
        """Every cell's standard error at one level (the shape of :meth:`level`), or None
        when the estimator has none."""
        cov = self.covariance
        return None if cov is None else cov.cell_standard_errors(self.level_index(level))

    def query_estimates(self, level: str | int, query) -> np.ndarray:
        """Estimates of every row of ``query`` at every node, ``(n_nodes, n_rows)``."""
        est = np.asarray(self.level(level), dtype=np.float64)
        return est.reshape(est.shape[0], -1) @ query_matrix(self.resolve_query(query)).T

    def query_variances(self, level: str | int, query) -> np.ndarray:
        """Error variances of every row of ``query`` at every node, ``(n_nodes, n_rows)``
        (:meth:`Covariance.query_variances`: NaN where not determined or not identified).

        Raises
        ------
        SpecError
            When the release has no covariance.
        """
        cov = self.covariance
        if cov is None:
            raise self.no_covariance()
        return cov.query_variances(self.level_index(level), self.resolve_query(query))

    def query_standard_errors(self, level: str | int, query) -> np.ndarray:
        """Square roots of :meth:`query_variances`."""
        return np.sqrt(self.query_variances(level, query))

    def conf_int(
        self, level: str | int, alpha: float = 0.1, *, query=None, **se_options
    ) -> tuple[np.ndarray, np.ndarray]:
        """Normal ``1 − alpha`` intervals ``estimate ∓ z_{1−α/2}·se`` at every node of a
        level: of every cell, or of every row of ``query`` (default :attr:`default_query`).
        90% by default, the level of the written ``_moe`` columns (which widen an integer
        release's interval to whole numbers, :func:`~censusdp.pipelines.io.outputs.lattice_moe`).
        ``se_options`` go to the cells' :meth:`standard_errors` (a :class:`Release`'s
        ``include_rounding``); they are refused with a query.

        Returns
        -------
        lower, upper : numpy.ndarray
            The shape of the estimates (cells) or ``(n_nodes, n_rows)`` (a query); NaN for
            rows that are not identified.

        Raises
        ------
        SpecError
            No standard errors, an unknown level or query, or alpha not in (0, 1).
        """
        from censusdp.estimation.uncertainty import normal_intervals

        query = self.default_query if query is None else query
        if query is None:
            se = self.standard_errors(level, **se_options)
            if se is None:
                raise self.no_covariance()
            return normal_intervals(self.level(level), se, alpha)
        if any(se_options.values()):
            raise SpecError(f"{sorted(se_options)} apply to the cells' intervals, not a query's")
        q = self.resolve_query(query)
        return normal_intervals(
            self.query_estimates(level, q), self.query_standard_errors(level, q), alpha
        )

    def summary(self, query=None) -> pd.DataFrame:
        """One row per level held: nodes, the sum and the smallest of the cell estimates, the
        share of negative cells, and the mean and largest standard error over the nodes — of
        the cells, or of the rows of ``query`` (default :attr:`default_query`); ``se_of``
        names which (``"cell"`` or the query's name); NaN without a covariance, and
        unidentified rows are left out."""
        query = self.default_query if query is None else query
        q = None if query is None else self.resolve_query(query)
        rows = []
        for name in self.level_names:
            est = np.asarray(self.level(name), dtype=np.float64)
            if self.covariance is None:
                se = np.full(0, np.nan)
            elif q is None:
                se = self.standard_errors(name)
            else:
                se = self.query_standard_errors(name, q)
            finite = se[np.isfinite(se)]
            rows.append(
                {
                    "level": name,
                    "nodes": est.shape[0],
                    "total": float(est.sum()),
                    "min_cell": float(est.min()) if est.size else np.nan,
                    "negative_share": float((est < 0).mean()) if est.size else np.nan,
                    "mean_se": float(finite.mean()) if finite.size else np.nan,
                    "max_se": float(finite.max()) if finite.size else np.nan,
                    "se_of": "cell" if q is None else getattr(q, "name", "query"),
                }
            )
        return pd.DataFrame(rows).set_index("level")

    def to_frame(self, levels: Sequence[str | int] | None = None) -> pd.DataFrame:
        """Long table: level, code, cell, estimator, value, se (se NaN where undefined).

        ``value`` is int64 for an integer release (:attr:`integer`: the released counts, as
        pandas and R users expect them), float64 otherwise; ``se`` float64 at full precision
        (the written tables round it, :func:`censusdp.pipelines.runner.release_frame`).
        """
        names = self.level_names
        ks = range(len(names)) if levels is None else [self.level_index(k) for k in levels]
        labels = np.asarray(self.cell_labels, dtype=object)
        frames = []
        for name in (names[k] for k in ks):
            est = np.asarray(self.level(name))
            se = self.standard_errors(name)
            codes = np.asarray(self.level_codes(name), dtype=object)
            frames.append(
                pd.DataFrame(
                    {
                        "level": np.repeat(name, est.size),
                        "code": np.repeat(codes, labels.size),
                        "cell": np.tile(labels, est.shape[0]),
                        "estimator": self.estimator,
                        "value": est.reshape(-1).astype(np.int64 if self.integer else np.float64),
                        "se": np.full(est.size, np.nan) if se is None else np.reshape(se, -1),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True, eq=False, repr=False)
class Release(ReleaseBase):
    """A consistent, invariant-respecting release (frozen; see :meth:`replace`).

    Attributes
    ----------
    estimator : str
        ``"gls"``, ``"conditioning"``, ``"topdown"``, ``"lattice"``, ...
    hierarchy : Hierarchy
    cells : tuple of str
    estimates : list of numpy.ndarray
        Per level (root first), shape (n_nodes, n_cells); float64, or int64 when ``integer``.
    variances : list of numpy.ndarray or None
        Per level, per node and cell, the variance of the estimate's error (exact for GLS;
        Monte Carlo for averaged MCMC output); None where not defined (TopDown-style).
    privacy : PrivacyStatement
    integer : bool
        True when the estimates are integers.
    diagnostics : dict
        Estimator-specific facts (TV bound, R-hat, solver status, timings...).
    covariances : list of numpy.ndarray or None
        Optional per-node covariance, per level (n_nodes, n_cells, n_cells).
    sums : SumVariances or None
        Variances of node totals and tracked marginals (integer releases: the estimator's
        and the rounding's; see :meth:`sum_variances`).
    """

    estimator: str
    hierarchy: Hierarchy
    cells: tuple[str, ...]
    estimates: list[np.ndarray]
    variances: list[np.ndarray] | None
    privacy: PrivacyStatement
    integer: bool = False
    diagnostics: dict = field(default_factory=dict)
    covariances: list[np.ndarray] | None = None
    sums: SumVariances | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cells", tuple(self.cells))
        # continuous laws: Mironov (2012)
        object.__setattr__(self, "privacy", floating_point_note(self.privacy))
        self._check_shapes()

    def replace(self, **changes) -> Release:
        """A new release with some fields changed (this one is left as it was)."""
        return dataclasses.replace(self, **changes)

    @property
    def covariance(self) -> NodeCovariance | None:
        """Per node: the cell variances, with the full covariances when the estimator kept
        them (``tree_gls(..., covariance=True)``); None without variances."""
        if self.variances is None:
            return None
        full = None if self.covariances is None else tuple(self.covariances)
        return NodeCovariance(tuple(self.variances), full)

    def standard_errors(
        self, level: str | int, *, include_rounding: bool = False
    ) -> np.ndarray | None:
        """:meth:`ReleaseBase.standard_errors`; ``include_rounding`` adds the rounding variance
        ``p(1 − p)`` of the (real-valued) estimates, exact for leaf cells only: each is rounded
        to ⌊x⌋ or ⌈x⌉ unbiasedly. Above the leaves a value's rounding error is a sum of
        dependent leaf errors whose variance depends on the rounding mode and the invariants:
        round the release and read the rounded release's :meth:`sum_variances`, exact.

        Raises
        ------
        SpecError
            ``include_rounding`` above the leaves, or without variances.
        """
        if not include_rounding:
            return super().standard_errors(level)
        from censusdp.estimation.integer.laminar import rounding_variance

        k = self.level_index(level)
        if self.variances is None:
            raise self.no_covariance()
        if k != self.hierarchy.depth - 1:
            raise SpecError(
                f"include_rounding predicts the rounding variance of leaf cells only, not of "
                f"level {self.hierarchy.names[k]!r}: round the release (round_release) and use "
                "its variances, exact at every level"
            )
        return np.sqrt(self.variances[k] + rounding_variance(self.estimates[k]))

    def sum_variances(self, level: str | int, query, *, rounding_only: bool = False) -> np.ndarray:
        """Variance of each row of ``query`` (a sum of cells) at every node of a level.

        ``(n_nodes, rows)``: the estimator's variance of the sum plus, for an integer
        release, the variance its rounding adds (the variance of the sum of the rounding
        errors, with their covariances — not the sum of the cells' variances);
        ``rounding_only``: that rounding part alone.

        Raises
        ------
        SpecError
            When a row's variance is not available: an integer release tracks the cells,
            the totals and the marginals passed to ``round_release(queries=...)``; the
            estimator part of a sum of several cells needs its covariances (e.g.
            ``tree_gls(..., covariance=True)``).
        """
        k = self.level_index(level)
        M = np.asarray(query.matrix)
        name = getattr(query, "name", "query")
        if self.sums is not None:
            idx = self.sums.index(M)
            if idx is None:
                raise SpecError(
                    f"the rounding of this release did not track query {name!r}: pass it to "
                    "round_release(..., queries=[...]) to get the variances of its sums"
                )
            est = self.sums.estimator[k][:, idx]
            rnd = self.sums.rounding[k][:, idx]
            if rounding_only:
                est = np.zeros_like(rnd)
        else:
            if self.integer:
                raise SpecError(
                    f"this integer release carries no variances of sums (estimator "
                    f"{self.estimator!r}); round it with round_release to get them"
                )
            rnd = 0.0
            cov = self.covariance
            if cov is not None:
                est = cov.query_variances(k, M)
            else:
                est = np.full((self.estimates[k].shape[0], M.shape[0]), np.nan)
        out = est + rnd
        if np.isnan(out).any():
            raise SpecError(
                f"the variance of a sum of several cells of query {name!r} at level "
                f"{self.hierarchy.names[k]!r} is not available: the estimator's part needs "
                "its covariances (e.g. tree_gls(..., covariance=True)), and 'bipartite' "
                "rounding has none for marginals"
            )
        # a variance is never negative: below 0 is the float error of a held (exact) sum
        return np.maximum(out, 0.0)

    def sum_standard_errors(self, level: str | int, query) -> np.ndarray:
        """Standard errors of each row of ``query`` at every node (:meth:`sum_variances`)."""
        return np.sqrt(self.sum_variances(level, query))

    def totals(self, level: str | int) -> np.ndarray:
        """Node totals (sum over cells) at one level."""
        return self.level(level).sum(axis=1)


@dataclass(frozen=True, eq=False, repr=False)
class LevelRelease(ReleaseBase):
    """A release given by its parts: the member a route's own release type holds (the PPMF
    units' ``H1Release.release``, the codebook tables' ``TableRelease.release``) to offer
    the family's methods without a hierarchy or an estimator of its own.

    Attributes
    ----------
    estimator : str
        What the values are (``"unbiased"``: the unbiased integer product).
    names : tuple of str
        The levels, top first.
    codes : tuple of numpy.ndarray
        Per level, every node's code.
    cells : tuple of str
    estimates : tuple of numpy.ndarray
        Per level, ``(n_nodes, n_cells)``.
    cov : Covariance or None
        The error covariance (read as :attr:`covariance`).
    privacy : PrivacyStatement
    integer : bool
    """

    estimator: str
    names: tuple[str, ...]
    codes: tuple[np.ndarray, ...]
    cells: tuple[str, ...]
    estimates: tuple[np.ndarray, ...]
    cov: Covariance | None
    privacy: PrivacyStatement
    integer: bool = False

    def __post_init__(self) -> None:
        if len(self.codes) != len(self.names):
            raise ValueError("a LevelRelease needs one code array per level")
        self._check_shapes()

    @property
    def level_names(self) -> tuple[str, ...]:
        return self.names

    def level_codes(self, level: str | int) -> np.ndarray:
        return self.codes[self.level_index(level)]

    @property
    def covariance(self) -> Covariance | None:
        return self.cov
