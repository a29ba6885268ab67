"""Structured tree GLS for schema histograms: the two-pass smoother block by block.

The problem is the GLS of :mod:`censusdp.estimation.gls` on cell tensors: at every node v of
every level, product-query measurements ``y_{v,q} = Q_q z_v + e`` (noise variance σ² per
level and query, or per node), consistency ``z_parent = Σ_children z_child`` cell by cell, and
invariants ``H z_v = t_v`` held exactly. In the per-axis basis ``⊗_a B_a`` of
:class:`~censusdp.estimation.marginal_basis.MarginalBasis` (built from every measured and
invariant query) every Gram ``Q_qᵀQ_q`` and ``HᵀH`` is block-diagonal: one ``n_S × n_S`` block
per axis subset ``S``, repeated identically over ``mult_S`` within-group contrast indices
(DESIGN §10). Consistency is coordinate-wise and an invariant is equivalent to
``Π_H z = H⁺ t`` with ``Π_H = G_H⁺ G_H`` block-diagonal, i.e. per block the rows ``U_Sᵀ``
(an orthonormal basis of the range of ``G_H``'s block) with values ``U_Sᵀ (H⁺t)_S``. So the
tree problem splits into one independent tree problem per (block S, copy c) whose matrices
depend on S only: the general path of :mod:`censusdp.estimation.gls` runs once per block with
``K = n_S`` and a copy axis on every mean and information vector (``(n, mult_S, n_S)``) while
every matrix (information, covariance, flat directions, gains) stays per node. No cells ×
cells matrix appears; the cost per node is ``O(cells · Σ_a d_a)`` for the moves in and out of
the basis plus ``O(Σ_S mult_S n_S² + n_S³)`` for the passes.

**What is identified.** Per block S let ``W_S`` be the span of every level's measured and
invariant Gram blocks. The coordinates of ``W_S^⊥`` appear in no measurement and no
invariant at any node, so they are free at every node (they are exactly the directions flat
at the root: every node of a level measuring ``u`` is determined along ``u``, hence so is every
ancestor). They are *dropped*: each block's problem is solved on ``W_S`` (``V_Sᵀ z`` with
``V_S`` an orthonormal basis of ``W_S``), the released cell tensors are the estimates of the
projection ``Π_W x`` of the histogram onto the identified subspace, and every query row that
has a component in ``W^⊥`` is *unidentified*: :meth:`StructuredRelease.query_estimates` and
:meth:`StructuredRelease.query_variances` return NaN for it (a marginal of the identified
part is released; a row that would need the unmeasured part is not). Within ``W`` the rule of
the general path holds: a direction undetermined at some level below the root (siblings
sharing a flat direction) makes the estimate not identifiable, and a
:class:`~censusdp.errors.SpecError` names the level and the block's axes.

Geometry: ``"weighted"`` (Σ⁻¹-weighted GLS; for Gaussian noise the conditional mean given
consistency and the invariants) or ``"euclidean"`` (unit weights: the projection Π_N; its
covariance is reported only when every noise scale is equal). The privacy statement is
derived from the measurements (:func:`~censusdp.mechanisms.product_measure.product_privacy`,
composed by :func:`~censusdp.mechanisms.privacy.derive_statement`); with invariants the
guarantee is induced subspace DP in the chosen geometry.

References
----------
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1) — the two-pass tree algorithm.
Rauch, Tung & Striebel (1965). Maximum likelihood estimates of linear dynamic systems — the
    downward smoother.
McKenna, R. et al. (2018). Optimizing error of high-dimensional statistical queries under
    differential privacy (HDMM) — Kronecker-structured workloads solved per axis.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm —
    the marginal workload and its allocation.
Gao, Gong & Yu (2022). Subspace Differential Privacy — induced subspace DP (invariants).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls import (
    _general_down,
    _general_up,
    _Level,
    _not_identifiable,
    check_invariants,
    whole_forest,
)
from censusdp.estimation.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.privacy import check_statement
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    checked_values,
    product_privacy,
)
from censusdp.mechanisms.product_query import ProductQuery, axis_product
from censusdp.mechanisms.queries import Invariant, check_float_exact, exact_release_note
from censusdp.schema import Schema

__all__ = ["StructuredRelease", "structured_gls"]

Geometry = Literal["weighted", "euclidean"]

#: Eigenvalues below this fraction of a block's largest count as zero (ranges of Grams).
_RANGE_RTOL = 1e-10


@dataclass(frozen=True, eq=False)
class StructuredRelease:
    """The structured GLS estimate of a schema histogram on a hierarchy.

    Attributes
    ----------
    hierarchy : Hierarchy
    schema : Schema
    basis : MarginalBasis
        The per-axis basis the blocks are in.
    estimates : tuple of numpy.ndarray
        Per level (root first), ``(n_nodes, *schema.shape)``: the estimate of the projection
        of each node's histogram onto the identified subspace (the histogram itself when
        every component is identified).
    covariances : tuple of BlockDiagonal, or None
        Per level, the error covariance of every node as blocks ``(n_nodes, n_S, n_S)`` in
        ``basis`` (zero on unidentified directions); None for the Euclidean geometry with
        unequal noise scales.
    identified : BlockDiagonal
        The orthogonal projector onto the identified subspace ``W`` (blocks ``(n_S, n_S)``).
    privacy : PrivacyStatement
        Derived from the measurements, with the invariants and geometry.
    diagnostics : dict
        Timings, residuals, and ``unidentified``: per block (axis names) the number of
        dimensions dropped.
    """

    hierarchy: Hierarchy
    schema: Schema
    basis: MarginalBasis
    estimates: tuple[np.ndarray, ...]
    covariances: tuple[BlockDiagonal, ...] | None
    identified: BlockDiagonal
    privacy: PrivacyStatement
    diagnostics: dict
    _rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def level(self, level: str | int) -> np.ndarray:
        """Cell-tensor estimates of one level, ``(n_nodes, *schema.shape)``."""
        return self.estimates[self.hierarchy.level_index(level)]

    def _query(self, query: ProductQuery | str) -> ProductQuery:
        if isinstance(query, str):
            return ProductQuery.parse(self.schema, query)
        if query.schema is not self.schema:
            raise SpecError(
                f"query {query.name!r} is over another schema than {self.schema.name!r}"
            )
        return query

    def identified_rows(self, query: ProductQuery | str) -> np.ndarray:
        """Per row of ``query`` (measured or not), True when it is identified.

        A row ``q`` is identified when it lies in ``W``: ``‖(I − Π_W) q‖² ≤ 1e-9 ‖q‖²``,
        computed per block like a variance (:meth:`BlockDiagonal.query_variances`).
        """
        q = self._query(query)
        key = _key(q)
        if key not in self._rows:
            norm2 = self.basis.identity().query_variances(q)
            outside = (self.basis.identity() + self.identified * -1.0).query_variances(q)
            self._rows[key] = outside <= 1e-9 * np.maximum(norm2, 1.0)
        return self._rows[key]

    def query_estimates(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Estimates of every row of ``query`` at every node, ``(n_nodes, n_rows)``.

        Rows that touch an unidentified component are NaN (not released).
        """
        q = self._query(query)
        out = q.apply(self.level(level))
        return np.where(self.identified_rows(q)[None, :], out, np.nan)

    def query_variances(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Error variances of every row of ``query`` at every node, ``(n_nodes, n_rows)``,
        from the nodes' blocks; NaN for unidentified rows.

        Raises
        ------
        SpecError
            When the release has no covariances (Euclidean geometry, unequal noise scales).
        """
        if self.covariances is None:
            raise SpecError(
                "this release has no covariances: the Euclidean projection with unequal noise "
                "scales has no tree-pass covariance; use geometry='weighted'"
            )
        q = self._query(query)
        k = self.hierarchy.level_index(level)
        var = np.maximum(self.covariances[k].query_variances(q), 0.0)
        var = np.broadcast_to(var, (self.hierarchy.levels[k].size, q.n_rows))
        return np.where(self.identified_rows(q)[None, :], var, np.nan)

    def query_standard_errors(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Square roots of :meth:`query_variances`."""
        return np.sqrt(self.query_variances(level, query))

    def node_covariance(self, level: str | int, node: int) -> BlockDiagonal:
        """One node's covariance blocks (no node axis), e.g. for ``dense_cells()``."""
        if self.covariances is None:
            raise SpecError("this release has no covariances (see query_variances)")
        cov = self.covariances[self.hierarchy.level_index(level)]
        return BlockDiagonal(self.basis, {m: b[node] for m, b in cov.blocks.items()})


# ----------------------------------------------------------------------------- blocks
def _block_index(basis: MarginalBasis, mask: int) -> tuple[tuple, list[int]]:
    """Index of block ``S``'s coordinates and the permutation putting copies first."""
    k = len(basis.axes)
    inside = [i + 1 for i in range(k) if mask >> i & 1]
    outside = [i + 1 for i in range(k) if not mask >> i & 1]
    return (slice(None), *basis._index(mask)), [0, *outside, *inside]


def _gather(basis: MarginalBasis, y: np.ndarray, mask: int) -> np.ndarray:
    """Block ``S`` of coefficient tensors ``(n, *shape)`` as ``(n, mult_S, n_S)``."""
    idx, perm = _block_index(basis, mask)
    sub = np.transpose(y[idx], perm)
    return sub.reshape(y.shape[0], basis.multiplicity(mask), basis.block_size(mask))


def _scatter(basis: MarginalBasis, out: np.ndarray, mask: int, vals: np.ndarray) -> None:
    """Write ``(n, mult_S, n_S)`` values into block ``S`` of ``out`` (inverse of _gather)."""
    idx, perm = _block_index(basis, mask)
    shape = [out[idx].shape[p] for p in perm]
    out[idx] = np.transpose(vals.reshape(shape), np.argsort(perm))


def _range_basis(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal basis of the range of a symmetric PSD matrix, and its eigenvalues."""
    ev, v = np.linalg.eigh(0.5 * (m + m.T))
    keep = ev > _RANGE_RTOL * max(float(ev.max(initial=0.0)), 1e-300)
    return v[:, keep], ev[keep]


def _axes_label(schema: Schema, mask: int) -> str:
    names = [a.name for i, a in enumerate(schema.attributes) if mask >> i & 1]
    return "{" + ", ".join(names) + "}"


# ----------------------------------------------------------------------------- inputs
@dataclass
class _Inputs:
    """Per level, in the basis and in scaled units (variances / τ²)."""

    h: list[np.ndarray | None]  # (n, *shape) information vectors
    J: list[dict[int, np.ndarray] | None]  # mask → (1|n, n_S, n_S)
    GH: list[dict[int, np.ndarray] | None]  # invariant Gram blocks (n_S, n_S)
    b: list[np.ndarray | None]  # (n, *shape) coefficients of Hᵀt
    measured: dict[int, np.ndarray]  # mask → Σ of every measured Gram block (unweighted)
    grams: dict[tuple, BlockDiagonal]  # query (its elements) → its unweighted Gram blocks


def _add_adjoint(
    basis: MarginalBasis, query: ProductQuery, answers: np.ndarray, out: np.ndarray
) -> None:
    """``out += (⊗_a B_a)ᵀ Qᵀ answers``: a query's adjoint straight into basis coordinates.

    Per axis the factor is ``B_aᵀ R_eᵀ``; ``R_e`` annihilates the within-group contrasts of
    every element but the detailed one, so on such an axis only the ``r_a`` group
    coordinates are nonzero and the product is computed on them alone: a marginal's
    information vector costs its own size, not the histogram's.
    """
    z = answers.reshape((answers.shape[0], *query.row_shape))
    idx: list[slice] = [slice(None)]
    for ax, (a, f) in enumerate(zip(basis.axes, query.factors, strict=True)):
        if f.is_detailed:
            m, sl = a.basis.T, slice(None)
        else:
            m, sl = (a.basis[:, : a.r].T @ f.matrix.T).astype(np.float64), slice(0, a.r)
        z = axis_product(z, ax + 1, np.ascontiguousarray(m))
        idx.append(sl)
    out[tuple(idx)] += z


#: Answers converted to float64 at a time when building information vectors (per chunk of
#: nodes), so a block level's measurements are never copied whole.
_CHUNK_VALUES = 1 << 23


def _node_chunks(n_nodes: int, n_rows: int) -> list[slice]:
    """Slices of nodes holding about :data:`_CHUNK_VALUES` answers each."""
    step = max(1, _CHUNK_VALUES // max(1, n_rows))
    return [slice(i, min(i + step, n_nodes)) for i in range(0, n_nodes, step)]


def _key(query: ProductQuery) -> tuple[int, ...]:
    """A query's identity: its elements (shared objects of the schema)."""
    return tuple(id(f) for f in query.factors)


def _resolve(
    hierarchy: Hierarchy,
    schema: Schema,
    items: Sequence[ProductMeasurement | ProductInvariant],
    what: str,
) -> list:
    out = []
    for it in items:
        k = hierarchy.level_index(it.level)
        name = hierarchy.names[k]
        if it.query.schema is not schema:
            raise SpecError(
                f"{what} {it.query.name!r} at level {name!r} is over schema "
                f"{it.query.schema.name!r}, not {schema.name!r}"
            )
        vals = checked_values(it.values, hierarchy.levels[k].size, it.query, what, name)
        changes: dict = {"level": k, "values": vals}
        nv = getattr(it, "node_variance", None)
        if nv is not None:
            nv = np.asarray(nv, dtype=np.float64).reshape(-1)
            if nv.shape != (hierarchy.levels[k].size,) or not np.all(np.isfinite(nv) & (nv > 0)):
                raise SpecError(
                    f"level {name!r}, query {it.query.name!r}: node_variance must be "
                    f"({hierarchy.levels[k].size},) positive finite values"
                )
            changes["node_variance"] = nv
        out.append(dataclasses.replace(it, **changes))
    return out


def _collect(
    hierarchy: Hierarchy,
    basis: MarginalBasis,
    meas: Sequence[ProductMeasurement],
    invs: Sequence[ProductInvariant],
    weight: dict[int, np.ndarray],
    tau: float,
) -> _Inputs:
    D = hierarchy.depth
    inp = _Inputs([None] * D, [None] * D, [None] * D, [None] * D, {}, {})
    unit = {m: np.zeros((basis.block_size(m),) * 2) for m in basis.subsets}
    for x in [*meas, *invs]:
        if _key(x.query) not in inp.grams:
            inp.grams[_key(x.query)] = basis.gram(x.query)
    for i, m in enumerate(meas):
        k, w = m.level, weight[i]
        g = inp.grams[_key(m.query)]
        for mask, blk in g.blocks.items():
            unit[mask] = unit[mask] + blk
        wg = g * w if w.shape[0] > 1 else g * float(w[0])
        blocks = {mask: (b if b.ndim == 3 else b[None]) for mask, b in wg.blocks.items()}
        inp.J[k] = (
            blocks if inp.J[k] is None else {mask: inp.J[k][mask] + blocks[mask] for mask in blocks}
        )
        if inp.h[k] is None:
            inp.h[k] = np.zeros((hierarchy.levels[k].size, *basis.shape))
        scale = np.broadcast_to(w / tau, (inp.h[k].shape[0],))
        for s in _node_chunks(inp.h[k].shape[0], m.query.n_rows):
            answers = np.asarray(m.values[s], np.float64) * scale[s, None]
            _add_adjoint(basis, m.query, answers, inp.h[k][s])
    for inv in invs:
        k = inv.level
        g = inp.grams[_key(inv.query)].blocks
        inp.GH[k] = g if inp.GH[k] is None else {mask: inp.GH[k][mask] + g[mask] for mask in g}
        if inp.b[k] is None:
            inp.b[k] = np.zeros((hierarchy.levels[k].size, *basis.shape))
        for s in _node_chunks(inp.b[k].shape[0], inv.query.n_rows):
            _add_adjoint(basis, inv.query, np.asarray(inv.values[s], np.float64) / tau, inp.b[k][s])
    inp.measured = unit
    return inp


def _exact_release_levels(
    hierarchy: Hierarchy,
    basis: MarginalBasis,
    meas: Sequence[ProductMeasurement],
    inp: _Inputs,
) -> dict[str, tuple[str, ...]]:
    """Levels whose every measured query lies in the span of the invariants at or below.

    The block form of :func:`~censusdp.mechanisms.queries.exactly_released`: a query's rows
    are in the span of the invariant rows iff, block by block, the range of its Gram is in
    the range of the invariants' Gram.
    """
    out: dict[str, tuple[str, ...]] = {}
    levels = sorted({m.level for m in meas})
    for k in levels:
        below = [g for j, g in enumerate(inp.GH) if j >= k and g is not None]
        if not below:
            continue
        proj = {}
        for mask in basis.subsets:
            u, _ = _range_basis(sum(g[mask] for g in below))
            proj[mask] = u @ u.T
        ok = True
        for m in (x for x in meas if x.level == k):
            for mask, blk in inp.grams[_key(m.query)].blocks.items():
                resid = blk - proj[mask] @ blk
                if np.abs(resid).max(initial=0.0) > 1e-9 * max(1.0, np.abs(blk).max()):
                    ok = False
        if ok:
            out[hierarchy.names[k]] = tuple(m.query.name for m in meas if m.level == k)
    return out


# ----------------------------------------------------------------------------- the estimator
def structured_gls(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    invariants: Sequence[ProductInvariant] = (),
    *,
    geometry: Geometry = "weighted",
    privacy: PrivacyStatement | None = None,
    delta: float | None = None,
    acknowledge_exact_release: bool = False,
) -> StructuredRelease:
    """The GLS estimate of a consistent schema histogram, block by block in the marginal basis.

    Parameters
    ----------
    hierarchy : Hierarchy
    schema : Schema
    measurements : sequence of ProductMeasurement
        Noisy answers ``(n_nodes, n_rows)`` of a product query at every node of a level,
        with their noise law (and optional per-node variances).
    invariants : sequence of ProductInvariant
        Exact answers of product queries at every node of a level.
    geometry : {"weighted", "euclidean"}
        Σ⁻¹-weighted projection (GLS) or unit weights (Euclidean Π_N).
    privacy : PrivacyStatement, optional
        A statement to check: refused when it claims less than the measurements cost. The
        release always carries the derived statement.
    delta : float, optional
        δ at which a zCDP total is also stated as (ε, δ).
    acknowledge_exact_release : bool
        Allow invariants that determine every measured value (see
        :func:`~censusdp.mechanisms.queries.guard_exact_release`).

    Returns
    -------
    StructuredRelease

    Raises
    ------
    SpecError
        Queries over another schema, shapes that do not match the hierarchy, an estimate not
        identifiable within the identified subspace (naming the level and block), or an
        unacknowledged exact release.
    DataError
        Non-finite values, invariants beyond 2⁵³ or contradicting each other.
    BudgetError
        A stated privacy that claims less than the derived one.

    References
    ----------
    Hay et al. (2010); Rauch, Tung & Striebel (1965); DESIGN §10 (the block algebra); Gao,
    Gong & Yu (2022), Def. 6 and Thm. 22.
    """
    t0 = time.perf_counter()
    if geometry not in ("weighted", "euclidean"):
        raise SpecError(f"geometry must be 'weighted' or 'euclidean', got {geometry!r}")
    names = hierarchy.names
    meas = _resolve(hierarchy, schema, measurements, "measurement")
    invs = _resolve(hierarchy, schema, invariants, "invariant")
    derived = product_privacy(meas, level_names=names, delta=delta)
    if privacy is not None:
        check_statement(privacy, derived)
    for inv in invs:
        check_float_exact(inv.values, f"invariant {inv.query.name!r} at level {names[inv.level]!r}")
    # exact consistency of the invariants (rows are small: totals and marginals)
    check_invariants(hierarchy, [Invariant(i.level, i.query.to_query(), i.values) for i in invs])

    variances = [np.atleast_1d(np.asarray(m.variance, dtype=np.float64)) for m in meas]
    var_all = np.concatenate(variances)
    equal = bool(np.all(var_all == var_all[0]))
    tau2 = float(np.median(var_all)) if geometry == "weighted" else 1.0
    tau = float(np.sqrt(tau2))
    vscale = tau2 if geometry == "weighted" else (float(var_all[0]) if equal else None)
    weight = {
        i: (tau2 / v if geometry == "weighted" else np.ones(1)) for i, v in enumerate(variances)
    }

    basis = MarginalBasis.for_queries(schema, [x.query for x in [*meas, *invs]])
    inp = _collect(hierarchy, basis, meas, invs, weight, tau)
    determined = _exact_release_levels(hierarchy, basis, meas, inp)
    notes: tuple[str, ...] = ()
    if len(determined) == len({m.level for m in meas}):
        if not acknowledge_exact_release:
            held = ", ".join(f"{names[i.level]}: {i.query.name}" for i in invs)
            lvls = ", ".join(repr(x) for x in determined)
            raise SpecError(
                f"the invariants ({held}) determine every measured value (at level(s) {lvls}): "
                "the release would be exact, with no privacy protection, whatever the budget "
                "says; hold fewer statistics invariant, or pass acknowledge_exact_release=True "
                "to release them exactly on purpose"
            )
        notes = (exact_release_note(determined),)
    t1 = time.perf_counter()

    forest = whole_forest(hierarchy)
    D = hierarchy.depth
    sizes = [lv.size for lv in hierarchy.levels]
    coef = [np.zeros((n, *schema.shape)) for n in sizes]
    cov_blocks: list[dict[int, np.ndarray]] = [{} for _ in range(D)]
    ident: dict[int, np.ndarray] = {}
    dropped: dict[str, int] = {}
    for mask in basis.subsets:
        nS, C = basis.block_size(mask), basis.multiplicity(mask)
        spans = [inp.measured[mask]] + [g[mask] for g in inp.GH if g is not None]
        V, _ = _range_basis(sum(spans))
        kS = V.shape[1]
        ident[mask] = V @ V.T
        if kS < nS:
            dropped[_axes_label(schema, mask)] = (nS - kS) * C
        if kS == 0:
            for k in range(D):
                cov_blocks[k][mask] = np.zeros((sizes[k], nS, nS))
            continue
        levels = []
        for k in range(D):
            n = sizes[k]
            J = inp.J[k]
            Jk = np.zeros((1, kS, kS)) if J is None else V.T @ J[mask] @ V
            hk = np.zeros((n, C, kS)) if inp.h[k] is None else _gather(basis, inp.h[k], mask) @ V
            H, t = np.zeros((0, kS)), np.zeros((n, C, 0))
            if inp.GH[k] is not None:
                U, ev = _range_basis(inp.GH[k][mask])
                if U.shape[1]:
                    H = U.T @ V
                    t = (_gather(basis, inp.b[k], mask) @ U) / ev
            levels.append(_Level(Jk, hk, H, t, Jk.shape[0] == 1))
        try:
            ups = _general_up(forest, levels, kS, None)
            root = ups[0]
            if root.N is not None and np.any(root.r):
                raise _not_identifiable(names[0], "some combination of cells is measured nowhere")
            P0 = np.broadcast_to(root.P, (1, kS, kS)).copy()
            zhat, Phat = _general_down(forest, ups, kS, root.m, P0)
        except SpecError as err:
            raise SpecError(
                f"{err} (block of the group parts of attributes {_axes_label(schema, mask)})"
            ) from None
        for k in range(D):
            _scatter(basis, coef[k], mask, (zhat[k] @ V.T) * tau)
            P = np.broadcast_to(Phat[k], (sizes[k], kS, kS))
            cov_blocks[k][mask] = V @ P @ V.T * (vscale if vscale is not None else np.nan)
        del levels, ups, zhat, Phat  # one block's passes in memory at a time
    inp.h = inp.b = []  # the information vectors are no longer needed: free them first
    t2 = time.perf_counter()
    estimates_list = []
    for k in range(D):  # level by level, freeing each coefficient tensor once moved
        estimates_list.append(basis.from_basis(coef[k]))
        coef[k] = None
    estimates = tuple(estimates_list)
    covariances = None if vscale is None else tuple(BlockDiagonal(basis, b) for b in cov_blocks)
    t3 = time.perf_counter()

    cons = 0.0
    for k in range(D - 1):
        d = np.abs(hierarchy.aggregate_up(k + 1, estimates[k + 1]) - estimates[k])
        cons = max(cons, float(d.max(initial=0.0)))
    inv_res, inv_val, worst = 0.0, 0.0, ""
    for inv in invs:
        r = float(np.abs(inv.query.apply(estimates[inv.level]) - inv.values).max(initial=0.0))
        inv_val = max(inv_val, float(np.abs(inv.values).max(initial=0.0)))
        if r >= inv_res:
            inv_res, worst = r, names[inv.level]
    if inv_res > 1e-6 * (1.0 + inv_val):
        raise DataError(
            "the invariants contradict each other (they cannot all hold with parent = sum of "
            f"children); largest violation at level {worst!r}"
        )
    labels = tuple(dict.fromkeys(f"{names[i.level]}: {i.query.name}" for i in invs))
    # the derived statement names every invariant the computation holds
    statement = dataclasses.replace(
        derived, invariants=labels, geometry=geometry, notes=derived.notes + notes
    )
    diagnostics = {
        "estimator": "structured_gls",
        "geometry": geometry,
        "blocks": {_axes_label(schema, m): basis.block_size(m) for m in basis.subsets},
        "unidentified": dropped,
        "max_consistency_residual": cons,
        "max_invariant_residual": inv_res,
        "max_invariant_value": inv_val,
        "seconds_setup": t1 - t0,
        "seconds_solve": t2 - t1,
        "seconds_output": t3 - t2,
    }
    if vscale is None:
        diagnostics["note"] = (
            "euclidean geometry with unequal noise scales: the tree passes give the estimate "
            "but not its sandwich covariance"
        )
    return StructuredRelease(
        hierarchy=hierarchy,
        schema=schema,
        basis=basis,
        estimates=estimates,
        covariances=covariances,
        identified=BlockDiagonal(basis, ident),
        privacy=floating_point_note(statement),
        diagnostics=diagnostics,
    )
