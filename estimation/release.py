"""The :class:`Release` every estimator returns: estimates for every level and cell, their
exact (or Monte Carlo) variances, diagnostics and the privacy statement.

A release is frozen: an estimator that relabels or adjusts another's release makes a new
one (:meth:`Release.replace`), so no caller sees a release change under it. Levels are
addressed by name (or index) everywhere; :meth:`Release.conf_int` gives intervals and
:meth:`Release.summary` one row per level, like a statsmodels results object."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.queries import level_position

__all__ = ["Release", "ReleaseProtocol", "SumVariances"]


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
    :class:`~censusdp.estimation.structured_gls.StructuredRelease`): the privacy statement,
    estimates and normal intervals by level name, and a one-row-per-level summary with the
    columns ``nodes, total, min_cell, negative_share, mean_se, max_se, se_of``. Model: the
    results objects of statsmodels (``conf_int``, ``summary``)."""

    privacy: PrivacyStatement

    def level(self, level: str | int) -> np.ndarray: ...

    def conf_int(self, level: str | int, alpha: float = 0.1) -> tuple[np.ndarray, np.ndarray]: ...

    def summary(self) -> pd.DataFrame: ...


@dataclass(frozen=True, eq=False, repr=False)
class Release:
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
        if len(self.estimates) != self.hierarchy.depth:
            raise ValueError("a Release needs one estimate array per level")
        for lv, est in zip(self.hierarchy.levels, self.estimates, strict=True):
            if est.shape != (lv.size, len(self.cells)):
                raise ValueError(
                    f"level {lv.name!r}: estimates must be ({lv.size}, {len(self.cells)})"
                )

    def replace(self, **changes) -> Release:
        """A new release with some fields changed (this one is left as it was)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        levels = ", ".join(f"{lv.name}={lv.size}" for lv in self.hierarchy.levels)
        kind = "integer" if self.integer else "real"
        se = "with SEs" if self.variances is not None else "no SEs"
        return (
            f"<Release {self.estimator}: {kind}, {len(self.cells)} cells, levels {levels}, "
            f"{se}; {self.privacy.guarantee}>"
        )

    def level_index(self, level: str | int) -> int:
        """The index of a level given by name (``"county"``) or index (negative from the
        leaves), as every method here takes it.

        Raises
        ------
        SpecError
            An unknown name or an index out of range, naming the release's levels
            (:func:`~censusdp.mechanisms.queries.level_position`).
        """
        return level_position(self.hierarchy.names, level, f"{self.estimator} release")

    def level(self, level: str | int) -> np.ndarray:
        """Estimates at one level, (n_nodes, n_cells)."""
        return self.estimates[self.level_index(level)]

    def conf_int(
        self, level: str | int, alpha: float = 0.1, *, include_rounding: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Normal ``1 − alpha`` intervals ``estimate ∓ z·se`` of every cell at one level
        (:func:`censusdp.estimation.uncertainty.intervals`); ``include_rounding`` adds the
        rounding's variance of an integer release.

        Returns
        -------
        lower, upper : numpy.ndarray
            (n_nodes, n_cells) each.

        Raises
        ------
        SpecError
            When the release has no standard errors (TopDown-style) or alpha is not in (0, 1).
        """
        from censusdp.estimation.uncertainty import intervals

        k = self.level_index(level)
        return intervals(self, k, alpha, include_rounding=include_rounding)

    def summary(self) -> pd.DataFrame:
        """One row per level: nodes, the sum of the estimates, the smallest estimate, the share
        of negative cells, and the mean and largest cell standard error (NaN without SEs;
        ``se_of`` says they are per cell)."""
        rows = []
        for k, lv in enumerate(self.hierarchy.levels):
            est = np.asarray(self.estimates[k], dtype=float)
            se = self.standard_errors(k)
            rows.append(
                {
                    "level": lv.name,
                    "nodes": lv.size,
                    "total": float(est.sum()),
                    "min_cell": float(est.min()) if est.size else np.nan,
                    "negative_share": float((est < 0).mean()) if est.size else np.nan,
                    "mean_se": float(se.mean()) if se is not None and se.size else np.nan,
                    "max_se": float(se.max()) if se is not None and se.size else np.nan,
                    "se_of": "cell",
                }
            )
        return pd.DataFrame(rows).set_index("level")

    def standard_errors(self, level: str | int) -> np.ndarray | None:
        """Standard errors at one level, or None when the estimator has none."""
        if self.variances is None:
            return None
        return np.sqrt(self.variances[self.level_index(level)])

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
        from censusdp.errors import SpecError

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
            if self.covariances is not None:
                A = M.astype(float)
                est = np.einsum("qa,nab,qb->nq", A, self.covariances[k], A)
            elif self.variances is not None and np.all(M.sum(axis=1) == 1):
                est = self.variances[k][:, np.argmax(M, axis=1)]
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

    def to_frame(self, levels: Sequence[str | int] | None = None) -> pd.DataFrame:
        """Long table: level, code, cell, estimator, value, se (se NaN where undefined).

        ``value`` is int64 for an integer release (:attr:`integer`: the released counts, as
        pandas and R users expect them), float64 otherwise; ``se`` float64 at full precision
        (the written tables round it, :func:`censusdp.pipelines.runner.release_frame`).
        """
        ks = (
            range(self.hierarchy.depth)
            if levels is None
            else [self.hierarchy.level_index(k) for k in levels]
        )
        frames = []
        n_cells = len(self.cells)
        for k in ks:
            lv = self.hierarchy.levels[k]
            est = self.estimates[k]
            se = self.standard_errors(k)
            frames.append(
                pd.DataFrame(
                    {
                        "level": np.repeat(lv.name, lv.size * n_cells),
                        "code": np.repeat(lv.codes.astype(object), n_cells),
                        "cell": np.tile(np.asarray(self.cells, dtype=object), lv.size),
                        "estimator": self.estimator,
                        "value": est.reshape(-1).astype(np.int64 if self.integer else np.float64),
                        "se": np.full(est.size, np.nan) if se is None else se.reshape(-1),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)
