"""Exact error prediction before any noise: the structured GLS covariance from the shape alone.

The weighted GLS release of :func:`~censusdp.estimation.gls.structured.structured_gls` is
linear in the noise, and its error covariance ``Cov(ẑ_v − z_v)`` at every node depends only
on the strategy (which product queries are measured at which level), the noise variances,
the invariants' queries and the tree's shape — never on the counts, the invariants' values or
the noise drawn. So the standard error of every table row at every node is known before the
budget is spent, from public geography (child counts per node) alone.

The computation is the structured GLS's own: the same per-axis marginal basis and, per block
``S``, the same upward and downward covariance recursions of the general path
(:func:`~censusdp.estimation.gls.kernel.general_up` /
:func:`~censusdp.estimation.gls.kernel.general_down`,
Rauch–Tung–Striebel smoothing on the tree), run with zero information vectors. What is new is
the tree they run on: nodes of a level whose subtrees have the same shape carry the same
upward information, and the same posterior once their parents are alike, so the passes run
on the quotient forest of :func:`~censusdp.hierarchy.shape_classes.shape_classes` with each
child class's message counted with its multiplicity. On a national hierarchy (8.2 million
blocks) that is a few hundred thousand classes; summaries over nodes weight each class by its
number of nodes. Two further reductions keep a national run small: a block whose
information matrices and invariant projectors commute at every level splits into
one-dimensional tree problems, and identical problems (across blocks) are solved once (10
for ``pl94`` instead of 16 blocks of sizes 1 and 3); and a table's rows are summarised
through their variance coefficients on the covariance entries, so rows with the same
coefficients (the 2,016 ``detailed`` cells of ``pl94`` have three) are summarised once. On
any tree the result equals the structured GLS's covariances (up to floating-point summation
order: 1e-13 relative on a 1,500-block ``pl94`` state).

References
----------
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1).
Rauch, Tung & Striebel (1965). Maximum likelihood estimates of linear dynamic systems.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm —
    the production strategy and allocation whose errors are predicted here.
Aho, Hopcroft & Ullman (1974), §3.2 — tree shapes by canonical labels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls.areas import (
    AreaEstimates,
    AreaPairs,
    SweepOptions,
    area_pairs,
    area_sweep,
)
from censusdp.estimation.gls.block_kernels import eigh, eigvalsh, matmul
from censusdp.estimation.gls.kernel import (
    PSEUDO_INVERSE_RTOL,
    LevelInputs,
    general_down,
    general_up,
    not_identifiable,
    root_start,
)
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.gls.structured import (
    axes_label,
    identified_rows,
    range_basis,
    schema_query,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.equivalency import Equivalency
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.hierarchy.shape_classes import ShapeClasses, shape_classes
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.privacy import derive_statement
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import level_position
from censusdp.schema import Allocation, Schema
from censusdp.timing import stage

__all__ = ["Prediction", "allocation_plan", "predict_errors", "weighted_quantiles"]

#: Quantiles of the standard error over nodes reported by :meth:`Prediction.summary`.
QUANTILES = (0.05, 0.5, 0.95)
#: Distinct rows whose SEs over all classes :meth:`Prediction.summary` holds at a time.
_COLUMNS = 64


def _entry_index(basis: MarginalBasis) -> list[tuple[int, int, int]]:
    """(mask, i, j), i ≤ j: the distinct entries of a symmetric block-diagonal matrix."""
    return [
        (m, i, j)
        for m in basis.subsets
        for i in range(basis.block_size(m))
        for j in range(i, basis.block_size(m))
    ]


class _ClassForest(Forest):
    """The quotient forest of shape classes: child sums count each child class with its
    multiplicity (a class stands for that many identical siblings)."""

    __slots__ = ("multiplicity", "_mult_total")

    def __init__(self, classes: ShapeClasses) -> None:
        super().__init__(0, classes.names, classes.sizes, classes.child_count, ())
        self.multiplicity = tuple(m.astype(np.float64) for m in classes.multiplicity)
        self._mult_total = tuple(
            np.bincount(
                np.repeat(np.arange(classes.sizes[j]), classes.child_count[j]),
                weights=self.multiplicity[j + 1],
                minlength=classes.sizes[j],
            )
            for j in range(classes.depth - 1)
        )

    def sum_children(self, j: int, values: np.ndarray, shared: bool = False) -> np.ndarray:
        shape = (-1,) + (1,) * (values.ndim - 1)
        if shared:
            return self._mult_total[j].reshape(shape) * values
        return super().sum_children(j, self.multiplicity[j + 1].reshape(shape) * values)


def _refuse_shared_flat(classes: ShapeClasses, ups: list, names: Sequence[str]) -> None:
    """Siblings of one class share their flat directions: the split is not identifiable.

    The general path packs each child's flat directions beside its siblings'; two identical
    siblings would pack the same directions twice and the tree pass would refuse them. The
    quotient forest holds one copy, so the refusal is made here, before the downward pass.
    """
    for j in range(1, classes.depth):
        r = ups[j].r
        if r is not None and np.any((r > 0) & (classes.multiplicity[j] > 1)):
            raise not_identifiable(
                names[j],
                f"siblings of the same shape under one {names[j - 1]} share a combination of "
                "cells that is measured neither at their level nor below",
            )


@dataclass(frozen=True, eq=False)
class Prediction:
    """Predicted error covariances of a structured GLS release, per shape class.

    Attributes
    ----------
    schema : Schema
    classes : ShapeClasses
        The quotient forest the passes ran on (``weight``: nodes per class).
    basis : MarginalBasis
    covariances : tuple of BlockDiagonal
        Per level, blocks ``(n_classes, n_S, n_S)``: the error covariance of every node of
        the class (zero on unidentified directions).
    identified : BlockDiagonal
        The projector onto the identified subspace (as :class:`StructuredRelease`'s).
    privacy : PrivacyStatement
        Derived from the planned measurements (and the invariants' names).
    plan : tuple of (str, str, float)
        (level, query name, noise variance) of every planned measurement.
    diagnostics : dict
        Timings, classes per level and the number of distinct tree problems solved.
    tau2 : float
        The noise scale (median noise variance): variances below ``1e-12 τ²`` are rounding
        residue of exactly held directions and are reported as 0.
    """

    schema: Schema
    classes: ShapeClasses
    basis: MarginalBasis
    covariances: tuple[BlockDiagonal, ...]
    identified: BlockDiagonal
    privacy: PrivacyStatement
    plan: tuple[tuple[str, str, float], ...]
    diagnostics: dict
    tau2: float = 1.0
    _rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    #: Off-spine areas' covariances (``predict_errors(..., areas=)``), queried as a level
    #: named by the areas (``areas.query_standard_errors("place", q)``); None without.
    areas: AreaEstimates | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self.classes.names

    def level_index(self, level: str | int) -> int:
        """A level by name or index (:func:`~censusdp.mechanisms.queries.level_position`)."""
        return level_position(self.names, level, "prediction")

    def _query(self, query: ProductQuery | str) -> ProductQuery:
        return schema_query(self.schema, query)

    def identified_rows(self, query: ProductQuery | str) -> np.ndarray:
        """Per row of ``query``, True when it lies in the identified subspace (the rule of
        :meth:`StructuredRelease.identified_rows`)."""
        return identified_rows(self.basis, self.identified, self._query(query), self._rows)

    def _floor(self, var: np.ndarray) -> np.ndarray:
        return np.where(var > 1e-12 * self.tau2, var, 0.0)

    def _coefficients(self, q: ProductQuery) -> np.ndarray:
        """``(n_rows, n_entries)``: each row's variance as a linear function of the
        covariance's block entries (upper triangles, blocks in ``basis.subsets`` order),
        from :meth:`BlockDiagonal.query_variances` applied to unit symmetric blocks."""
        key = ("coef", *(id(f) for f in q.factors))
        if key not in self._rows:
            entries = _entry_index(self.basis)
            units = {
                m: np.zeros((len(entries), self.basis.block_size(m), self.basis.block_size(m)))
                for m in self.basis.subsets
            }
            for c, (m, i, j) in enumerate(entries):
                units[m][c, i, j] = units[m][c, j, i] = 1.0
            self._rows[key] = BlockDiagonal(self.basis, units).query_variances(q).T.copy()
        return self._rows[key]

    def _entries(self, k: int) -> np.ndarray:
        """``(n, n_entries)``: the covariance block entries of every class of level ``k``
        (one row when the level's covariance is shared)."""
        return self._block_entries(self.covariances[k])

    def _block_entries(self, cov: BlockDiagonal) -> np.ndarray:
        blocks = cov.blocks
        n = max(b.shape[0] for b in blocks.values())
        out = np.empty((n, len(_entry_index(self.basis))))
        for c, (m, i, j) in enumerate(_entry_index(self.basis)):
            out[:, c] = blocks[m][:, i, j]
        return out

    def class_variances(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Error variance of every row of ``query`` for every class of ``level``,
        ``(n_classes, n_rows)``; NaN for unidentified rows."""
        q = self._query(query)
        k = self.level_index(level)
        var = self._floor(self._entries(k) @ self._coefficients(q).T)
        var = np.broadcast_to(var, (self.classes.sizes[k], q.n_rows))
        return np.where(self.identified_rows(q)[None, :], var, np.nan)

    def query_variances(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Error variance of every row at every node, ``(n_nodes, n_rows)`` — what
        :meth:`StructuredRelease.query_variances` will report for this spec."""
        k = self.level_index(level)
        return self.class_variances(k, query)[self.classes.node_class[k]]

    def query_standard_errors(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Square roots of :meth:`query_variances`."""
        return np.sqrt(self.query_variances(level, query))

    def node_covariance(self, level: str | int, node: int) -> BlockDiagonal:
        """One node's covariance blocks (no node axis)."""
        k = self.level_index(level)
        c = int(self.classes.node_class[k][node])
        n = self.classes.sizes[k]
        return BlockDiagonal(
            self.basis,
            {
                m: np.broadcast_to(b, (n, *b.shape[1:]))[c]
                for m, b in self.covariances[k].blocks.items()
            },
        )

    def summary(
        self,
        tables: Sequence[ProductQuery | str] | None = None,
        quantiles: Sequence[float] = QUANTILES,
    ) -> pd.DataFrame:
        """Standard errors per level × table × row, summarised over the level's nodes.

        Parameters
        ----------
        tables : sequence of ProductQuery or str, optional
            Default: every measured query, in plan order.
        quantiles : sequence of float
            Quantiles of the SE over nodes (lower, ``inverted_cdf``: a value some node has).

        Returns
        -------
        pandas.DataFrame
            Columns ``level, table, row, label, nodes, se_mean, se_rms, se_min, se_q…,
            se_max``; NaN for rows that are not identified (not released). With
            ``areas``, the areas follow the levels as one more "level" (``nodes``: areas).

        """
        if tables is None:
            tables = list(dict.fromkeys(name for _, name, _ in self.plan))
        qs = [self._query(t) for t in tables]
        frames = []
        for k, lvl in enumerate(self.names):
            w = self.classes.weight[k].astype(np.float64)
            n = float(w.sum())
            X = self._entries(k)
            for q in qs:
                frames.append(self._summarise(X, q, w, n, quantiles))
                frames[-1].insert(0, "level", lvl)
        if self.areas is not None:  # the off-spine areas, one row per area
            assert self.areas.covariances is not None
            X = self._block_entries(self.areas.covariances[0])
            w = np.ones(self.areas.n_areas)
            for q in qs:
                frames.append(self._summarise(X, q, w, float(w.size), quantiles))
                frames[-1].insert(0, "level", self.areas.name)
        return pd.concat(frames, ignore_index=True)

    def _summarise(
        self, X: np.ndarray, q: ProductQuery, w: np.ndarray, n: float, quantiles: Sequence[float]
    ) -> pd.DataFrame:
        """One level × table: rows with the same variance function (the same coefficients
        on the block entries — e.g. the 63 ``cenrace`` rows of ``pl94``, exchangeable under
        its strategy) are summarised once."""
        coef = self._coefficients(q)
        ok = self.identified_rows(q)
        scale = max(float(np.abs(coef).max(initial=0.0)), 1e-300)
        key = np.column_stack([np.round(coef / scale, 12), ok])
        _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
        stats: dict[str, list[np.ndarray]] = {"se_mean": [], "se_rms": [], "se_min": []}
        stats |= {f"se_q{100 * p:g}": [] for p in quantiles}
        stats["se_max"] = []
        for c in range(0, first.size, _COLUMNS):
            se = np.sqrt(self._floor(X @ coef[first[c : c + _COLUMNS]].T))
            se = np.broadcast_to(se, (w.size, se.shape[1]))
            stats["se_mean"].append(w @ se / n)
            stats["se_rms"].append(np.sqrt(w @ se**2 / n))
            stats["se_min"].append(se.min(axis=0))
            for p, v in zip(quantiles, weighted_quantiles(se, w, quantiles), strict=True):
                stats[f"se_q{100 * p:g}"].append(v)
            stats["se_max"].append(se.max(axis=0))
        inv = inverse.reshape(-1)
        cols: dict = {
            "table": q.name,
            "row": np.arange(q.n_rows),
            "label": list(q.labels),
            "nodes": int(n),
        }
        for name, parts in stats.items():
            cols[name] = np.where(ok, np.concatenate(parts)[inv], np.nan)
        return pd.DataFrame(cols)


def weighted_quantiles(
    values: np.ndarray, weights: np.ndarray, quantiles: Sequence[float], columns: int = 64
) -> list[np.ndarray]:
    """Column-wise quantiles of ``values`` ``(n, m)`` whose row ``i`` stands for
    ``weights[i]`` identical rows: ``numpy.quantile(..., method="inverted_cdf")`` of the
    expanded rows, without expanding them (``columns`` columns sorted at a time)."""
    n, m = values.shape
    out = [np.empty(m, values.dtype) for _ in quantiles]
    for c in range(0, m, columns):
        v = values[:, c : c + columns]
        order = np.argsort(v, axis=0, kind="stable")
        cum = np.cumsum(weights[order], axis=0)
        total = cum[-1]
        cols = np.arange(v.shape[1])
        for i, p in enumerate(quantiles):
            pos = np.minimum((cum < p * total[None, :]).sum(axis=0), n - 1)
            out[i][c : c + columns] = v[order[pos, cols], cols]
    return out


def _rounded(x: np.ndarray) -> tuple:
    """A key for a small matrix: its shape and entries to 12 significant digits."""
    return (x.shape, *(float(f"{v:.12g}") for v in np.ravel(x)))


def _rows(HG: np.ndarray) -> np.ndarray:
    """Orthonormal rows spanning invariant rows ``H G`` restricted to a group of coordinates
    (``H`` has orthonormal rows, so the threshold is absolute)."""
    ev, v = eigh(matmul(HG.T, HG))
    return v[:, ev > 1e-10].T


def _decouple(Js: Sequence[np.ndarray | None], Ps: Sequence[np.ndarray | None], K: int) -> list:
    """Groups of coordinates (orthonormal columns) that split one block's tree problem.

    When every level's information matrix ``J_k`` and invariant projector ``P_k`` commute,
    one orthonormal basis diagonalises them all and the problem splits into ``K``
    one-dimensional tree problems (many of them identical across blocks, solved once). The
    basis is that of a fixed generic combination ``Σ c_i M_i``; it is used only when it
    diagonalises every matrix (off-diagonal below 1e-12 of the largest entry), else the
    block stays whole (``[I]``).
    """
    mats = [m for m in [*Js, *Ps] if m is not None]
    if K == 1 or not mats:
        return [np.eye(K)]
    combo = sum(m / max(np.abs(m).max(), 1e-300) * (1.0 + 0.7548776662 * i) ** 0.5 * (1 + i)
                for i, m in enumerate(mats))  # fmt: skip
    _, Q = eigh(0.5 * (combo + combo.T))
    for m in mats:
        d = matmul(matmul(Q.T, m), Q)
        off = d - np.diag(np.diag(d))
        if np.abs(off).max() > 1e-12 * max(np.abs(m).max(), 1e-300):
            return [np.eye(K)]
    return [Q[:, [i]] for i in range(K)]


def _group_information(Jk: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``Gᵀ J_k G`` for one group of :func:`_decouple`; exact 0 when it is rounding residue.

    A group of a split block spans eigenvectors of ``J_k``; where ``J_k`` is 0 along them,
    ``Gᵀ J_k G`` comes out ≈ 1e-16 of ``J_k``'s scale, and the tree pass, seeing that small
    matrix alone, would read it as information (a pseudo-inverse's threshold is relative to
    the matrix it is given): an unmeasured split between siblings would be solved instead of
    refused, and a one-child chain would get variances off by about ``1/residue``. The
    whole block's pass drops eigenvalues below
    :data:`~censusdp.estimation.gls.kernel.PSEUDO_INVERSE_RTOL` of the largest
    (:func:`~censusdp.estimation.gls.kernel.general_up`); a group whose every entry is below
    that fraction of ``J_k``'s largest eigenvalue is likewise no information at all (a group
    with any larger entry, or the whole block, is passed on unchanged).
    """
    out = matmul(matmul(G.T, Jk), G)
    scale = float(np.abs(eigvalsh(0.5 * (Jk + Jk.T))).max(initial=0.0))
    if np.abs(out).max(initial=0.0) <= PSEUDO_INVERSE_RTOL * scale:
        return np.zeros_like(out)  # the level measures nothing of this group
    return out


def _covariance_passes(
    forest: _ClassForest, classes: ShapeClasses, Js: list, Hs: list, K: int
) -> tuple[list[np.ndarray], list]:
    """Posterior covariances ``(1|n_classes, K, K)`` per level of one tree problem (scaled
    units): the general path's upward and downward passes with zero information vectors;
    also the upward states (for sums of leaves, :func:`~censusdp.estimation.gls.areas.area_sweep`)."""
    names, sizes = classes.names, classes.sizes
    levels = [
        LevelInputs(Jk, np.zeros((n, K)), H, np.zeros((n, H.shape[0])), True)
        for Jk, H, n in zip(Js, Hs, sizes, strict=True)
    ]
    ups = general_up(forest, levels, K, None)
    _refuse_shared_flat(classes, ups, names)
    z0, P0 = root_start(ups, K, names[0])
    _, Phat = general_down(forest, ups, K, z0, P0)
    return Phat, ups


def _area_pass(
    hierarchy: Hierarchy,
    classes: ShapeClasses,
    forest: _ClassForest,
    ups: list,
    Phat: list[np.ndarray],
    areas: Equivalency,
    pairs: tuple[Forest, AreaPairs],
    K: int,
) -> np.ndarray:
    """Area covariances ``(n_areas, K, K)`` of one class problem (scaled units): the sweep on
    the hierarchy's nodes (``pairs``: its forest and the areas' pairs) with each node's
    matrices those of its class."""
    tree, shared = pairs
    return area_sweep(
        tree, ups, K, areas.leaf, areas.area, areas.n_areas, Phat[0][:1],
        options=SweepOptions(rows=classes.node_class, up_forest=forest, pairs=shared),
    )  # fmt: skip


def allocation_plan(
    schema: Schema, allocation: Allocation | None = None, levels: Sequence[str] | None = None
) -> list[tuple[str, ProductQuery, DiscreteGaussian]]:
    """(level, query, law) of an allocation of the schema's strategy, discrete Gaussian noise.

    Each measured (level, query) gets ``ρ_q = ρ · level share · query share`` and
    ``σ² = Δ₂²/(2ρ_q)`` (Canonne, Kamath & Steinke 2020), with ``Δ₂²`` the query's largest
    column count (its matrix is 0/1), rounded *up* to a rational of bounded denominator
    (:meth:`~censusdp.mechanisms.discrete.DiscreteGaussian.from_sigma2`, the privacy-safe
    direction). The plan therefore spends at most ``ρ``, not exactly: Σ Δ₂²/(2σ²) of the
    rounded σ² (2.554619 for the 2020 allocation's ρ = 2.556226), which is what the derived
    statement states, the allocation's ρ beside it as the target.

    Parameters
    ----------
    schema : Schema
    allocation : Allocation, optional
        Default: the schema's own (``pl94``: the 2020 production allocation).
    levels : sequence of str, optional
        The hierarchy's level names; every allocated level must be one of them.

    Raises
    ------
    SpecError
        No allocation, or an allocated level the hierarchy does not have.
    """
    alloc = schema.allocation if allocation is None else allocation
    if alloc is None:
        raise SpecError(
            f"schema {schema.name!r} ({schema.source}) has no [allocation]; give one in the "
            "spec ([allocation] rho, levels, queries) or use a schema that ships one (pl94)"
        )
    if levels is not None:
        missing = [lvl for lvl in alloc.levels if lvl not in levels]
        if missing:
            raise SpecError(
                f"the allocation has level(s) {missing} that the hierarchy ({list(levels)}) "
                "does not have; name the hierarchy's levels as the allocation does"
            )
    plan = []
    for lvl, text, rho in alloc.query_rhos(schema.strategy):
        q = ProductQuery.parse(schema, text)
        sigma2 = Fraction(q.l1_sensitivity) / (2 * rho)
        plan.append((lvl, q, DiscreteGaussian.from_sigma2(sigma2)))
    return plan


def predict_errors(
    hierarchy: Hierarchy | ShapeClasses,
    schema: Schema,
    plan: Sequence[tuple[str | int, ProductQuery, NoiseLaw]],
    invariants: Sequence[tuple[str | int, ProductQuery]] = (),
    *,
    delta: float | None = None,
    areas: Equivalency | None = None,
    information: Sequence[tuple[str | int, ProductQuery, float]] = (),
) -> Prediction:
    """The exact error covariance of the weighted structured GLS release, before any noise.

    Parameters
    ----------
    hierarchy : Hierarchy or ShapeClasses
        Only its shape is read (child counts per node); pass precomputed classes to reuse them.
    schema : Schema
    plan : sequence of (level, ProductQuery, NoiseLaw)
        What :func:`~censusdp.mechanisms.product_measure.measure_products` would measure
        (one noise variance per level and query).
    invariants : sequence of (level, ProductQuery)
        Queries held exact at every node of a level (their values are not needed).
    delta : float, optional
        δ at which a zCDP total is also stated as (ε, δ).
    areas : Equivalency, optional
        Off-spine areas (sums of leaves, :mod:`censusdp.hierarchy.equivalency`): their
        covariances too (``Prediction.areas``), from the class passes' matrices looked up
        per node (:func:`~censusdp.estimation.gls.areas.area_sweep`); needs a Hierarchy.
    information : sequence of (level, ProductQuery, float)
        Extra precision ``p`` (any sign, repeats add) of a query's Gram at every node of a
        level, ``J_k += p · QᵀQ``: not a measurement, no privacy is spent or stated. Since
        ``d/dp Cov = −C (QᵀQ at the level) C``, runs at ``±p`` give the gradient of a
        variance with respect to every measurement's precision
        (:mod:`censusdp.estimation.gls.allocate`).

    Returns
    -------
    Prediction
        Per level and shape class the covariance blocks that
        :func:`~censusdp.estimation.gls.structured.structured_gls` (weighted geometry) would
        report for every node of the class, whatever the counts and the noise.

    Raises
    ------
    SpecError
        Unknown levels, queries over another schema, a (level, query) planned twice, no
        measurement, or an estimate that would not be identifiable (naming level and block).

    References
    ----------
    Hay et al. (2010); Rauch, Tung & Striebel (1965); docs/design.md § The structured algebra (the block algebra).
    """
    clock: dict[str, float] = {}
    with stage(clock, "classes"):
        tree_pairs = _area_tree(hierarchy, areas)
        classes = hierarchy if isinstance(hierarchy, ShapeClasses) else shape_classes(hierarchy)
    with stage(clock, "passes"):
        names = classes.names
        meas, extra, invs = _checked_plan(names, schema, plan, information, invariants)
        derived = derive_statement(names, meas, delta=delta)
        labels = tuple(dict.fromkeys(f"{names[k]}: {q.name}" for k, q in invs))
        privacy = dataclasses.replace(derived, invariants=labels, geometry="weighted")
        info = _Information.of(schema, meas, extra, invs, classes.depth)
        solver = _ProblemSolver(classes, schema, hierarchy, areas, tree_pairs)
        cov_blocks: list[dict[int, np.ndarray]] = [{} for _ in range(classes.depth)]
        ident: dict[int, np.ndarray] = {}
        area_cov: dict[int, np.ndarray] = {}
        for mask in info.basis.subsets:
            ident[mask] = _block_covariance(mask, info, solver, cov_blocks, area_cov)
        area_estimates = None
        if areas is not None:
            area_estimates = _area_estimates(areas, schema, info.basis, area_cov, ident, privacy)
    diagnostics = {
        "classes": dict(zip(names, (int(s) for s in classes.sizes), strict=True)),
        "nodes": dict(zip(names, classes.n_nodes(), strict=True)),
        "tree_problems": solver.n_problems,
        "seconds_classes": clock["classes"],
        "seconds_passes": clock["passes"],
    }
    basis = info.basis
    return Prediction(
        schema=schema,
        classes=classes,
        basis=basis,
        covariances=tuple(BlockDiagonal(basis, b) for b in cov_blocks),
        identified=BlockDiagonal(basis, ident),
        privacy=privacy,
        plan=tuple(
            (names[k], q.name, float(v)) for (k, q, _), v in zip(meas, info.variances, strict=True)
        ),
        diagnostics=diagnostics,
        tau2=info.tau2,
        areas=area_estimates,
    )


def _area_tree(
    hierarchy: Hierarchy | ShapeClasses, areas: Equivalency | None
) -> tuple[Forest, AreaPairs] | None:
    """The hierarchy's forest and the areas' pairs on it (None without areas)."""
    if areas is None:
        return None
    if not isinstance(hierarchy, Hierarchy):
        raise SpecError("predict: areas need the hierarchy itself (its parents), not its classes")
    if areas.n_leaves != hierarchy.leaves.size:
        raise SpecError(
            f"{areas.source}: the equivalency was read for {areas.n_leaves} leaves, the "
            f"hierarchy has {hierarchy.leaves.size}; read it against this hierarchy"
        )
    tree = whole_forest(hierarchy)
    return tree, area_pairs(tree, areas.leaf, areas.area, areas.n_areas)


def _checked_plan(
    names: Sequence[str],
    schema: Schema,
    plan: Sequence[tuple[str | int, ProductQuery, NoiseLaw]],
    information: Sequence[tuple[str | int, ProductQuery, float]],
    invariants: Sequence[tuple[str | int, ProductQuery]],
) -> tuple[list, list, list]:
    """Measurements, extra information and invariants with levels as indices, each over
    ``schema`` and each (level, query) measured once."""
    if not plan:
        raise SpecError("predict: the plan has no measurement; give (level, query, law) entries")
    meas: list[tuple[int, ProductQuery, NoiseLaw]] = []
    seen: set[tuple[int, str]] = set()
    for level, q, law in plan:
        k = level_position(names, level, f"measurement of {q.name!r}")
        if q.schema is not schema:
            raise SpecError(
                f"measurement {q.name!r} at level {names[k]!r} is over schema {q.schema.name!r}, "
                f"not {schema.name!r}"
            )
        if (k, q.name) in seen:
            raise SpecError(
                f"level {names[k]!r}: query {q.name!r} is planned twice; measure each (level, "
                "query) once"
            )
        seen.add((k, q.name))
        meas.append((k, q, law))
    extra = []
    for level, q, p in information:
        k = level_position(names, level, f"information of {q.name!r}")
        if q.schema is not schema:
            raise SpecError(f"information {q.name!r} at level {names[k]!r} is over another schema")
        extra.append((k, q, float(p)))
    invs = []
    for level, q in invariants:
        k = level_position(names, level, f"invariant {q.name!r}")
        if q.schema is not schema:
            raise SpecError(f"invariant {q.name!r} at level {names[k]!r} is over another schema")
        invs.append((k, q))
    return meas, extra, invs


@dataclass(frozen=True)
class _Information:
    """Per level the information ``J_k`` (scaled by ``tau2``) and invariant Grams ``GH_k``
    in the marginal basis, per block; ``measured`` sums every measured Gram."""

    basis: MarginalBasis
    variances: np.ndarray
    tau2: float
    J: list
    GH: list
    measured: dict

    @classmethod
    def of(cls, schema: Schema, meas: list, extra: list, invs: list, D: int) -> _Information:
        variances = np.array([float(law.variance) for _, _, law in meas])
        tau2 = float(np.median(variances))  # the scaling of structured_gls, for equal rounding
        queries = [q for _, q, _ in meas] + [q for _, q in invs] + [q for _, q, _ in extra]
        basis = MarginalBasis.for_queries(schema, queries)
        grams: dict[tuple, dict] = {}
        for q in queries:
            key = tuple(id(f) for f in q.factors)
            if key not in grams:
                grams[key] = basis.gram(q).blocks

        def gram(q: ProductQuery) -> dict:
            return grams[tuple(id(f) for f in q.factors)]

        J: list[dict[int, np.ndarray] | None] = [None] * D
        GH: list[dict[int, np.ndarray] | None] = [None] * D
        measured = {m: np.zeros((basis.block_size(m),) * 2) for m in basis.subsets}
        for _, q, _ in meas:
            for mask, blk in gram(q).items():
                measured[mask] = measured[mask] + blk
        weighted = [(k, q, tau2 / v) for (k, q, _), v in zip(meas, variances, strict=True)]
        for k, q, w in weighted + [(k, q, tau2 * p) for k, q, p in extra]:
            J[k] = {m: (0.0 if J[k] is None else J[k][m]) + blk * w for m, blk in gram(q).items()}
        for k, q in invs:
            g = gram(q)
            GH[k] = g if GH[k] is None else {m: GH[k][m] + g[m] for m in g}
        return cls(basis, variances, tau2, J, GH, measured)


class _ProblemSolver:
    """The class passes of each distinct small tree problem, run once (keyed by its
    rounded matrices) and counted, with the areas' sweep when there are areas."""

    def __init__(
        self,
        classes: ShapeClasses,
        schema: Schema,
        hierarchy: Hierarchy | ShapeClasses,
        areas: Equivalency | None,
        tree_pairs: tuple[Forest, AreaPairs] | None,
    ) -> None:
        self.classes, self.schema, self.hierarchy = classes, schema, hierarchy
        self.areas, self.tree_pairs = areas, tree_pairs
        self.forest = _ClassForest(classes)
        self.solved: dict[tuple, list[np.ndarray]] = {}
        self.area_solved: dict[tuple, np.ndarray] = {}
        self.n_problems = 0

    def solve(self, Jg: list, Hg: list, g: int, mask: int) -> tuple:
        """The problem's key (for :attr:`solved` and :attr:`area_solved`), solved if new."""
        key = (g, *(_rounded(x) for x in Jg), *(_rounded(x) for x in Hg))
        if key not in self.solved:
            self.n_problems += 1
            try:
                self.solved[key], ups = _covariance_passes(self.forest, self.classes, Jg, Hg, g)
                if self.areas is not None:
                    self.area_solved[key] = _area_pass(
                        self.hierarchy, self.classes, self.forest, ups, self.solved[key],
                        self.areas, self.tree_pairs, g,
                    )  # fmt: skip
            except SpecError as err:
                raise SpecError(
                    f"{err} (block of the group parts of attributes "
                    f"{axes_label(self.schema, mask)})"
                ) from None
        return key


def _block_covariance(
    mask: int,
    info: _Information,
    solver: _ProblemSolver,
    cov_blocks: list[dict[int, np.ndarray]],
    area_cov: dict[int, np.ndarray],
) -> np.ndarray:
    """Add block ``mask``'s covariances to ``cov_blocks`` (every level) and ``area_cov``;
    return the projector onto its identified subspace."""
    D, tau2 = len(info.J), info.tau2
    J, GH = info.J, info.GH
    nS = info.basis.block_size(mask)
    V, _ = range_basis(sum([info.measured[mask]] + [g[mask] for g in GH if g is not None]))
    kS = V.shape[1]
    for k in range(D):
        cov_blocks[k][mask] = np.zeros((1, nS, nS))
    if kS == 0:
        return matmul(V, V.T)
    Js = [None if J[k] is None else matmul(matmul(V.T, J[k][mask]), V) for k in range(D)]
    Hs = [None] * D
    for k in range(D):
        if GH[k] is not None:
            U, _ = range_basis(GH[k][mask])
            Hs[k] = matmul(U.T, V)
    groups = _decouple(Js, [None if H is None else matmul(H.T, H) for H in Hs], kS)
    for G in groups:
        g = G.shape[1]
        Jg = [np.zeros((1, g, g)) if Jk is None else _group_information(Jk, G)[None] for Jk in Js]
        Hg = [
            np.zeros((0, g)) if H is None else (H if len(groups) == 1 else _rows(matmul(H, G)))
            for H in Hs
        ]
        key = solver.solve(Jg, Hg, g, mask)
        W = matmul(V, G)
        if solver.areas is not None:
            add = matmul(matmul(W, solver.area_solved[key]), W.T) * tau2
            area_cov[mask] = area_cov[mask] + add if mask in area_cov else add
        for k, P in enumerate(solver.solved[key]):
            if g == 1:  # a scalar per class times one outer product
                block = (P.reshape(-1, 1, 1) * tau2) * np.outer(W[:, 0], W[:, 0])
            else:
                block = matmul(matmul(W, P), W.T) * tau2
            cov_blocks[k][mask] = cov_blocks[k][mask] + block
    return matmul(V, V.T)


def _area_estimates(
    areas: Equivalency,
    schema: Schema,
    basis: MarginalBasis,
    area_cov: dict[int, np.ndarray],
    ident: dict[int, np.ndarray],
    privacy: PrivacyStatement,
) -> AreaEstimates:
    """The areas' predicted covariances (no estimates: there are no counts)."""
    blocks = {
        m: area_cov.get(m, np.zeros((areas.n_areas, basis.block_size(m), basis.block_size(m))))
        for m in basis.subsets
    }
    return AreaEstimates(
        name=areas.name,
        codes=areas.codes,
        leaves=areas.leaves_per_area(),
        schema=schema,
        basis=basis,
        estimates=(),
        covariances=(BlockDiagonal(basis, blocks),),
        identified=BlockDiagonal(basis, ident),
        privacy=privacy,
    )
