"""Structured tree GLS for schema histograms: the two-pass smoother block by block.

The problem is the GLS of :mod:`censusdp.estimation.gls.tree` on cell tensors: at every node v of
every level, product-query measurements ``y_{v,q} = Q_q z_v + e`` (noise variance σ² per
level and query, or per node), consistency ``z_parent = Σ_children z_child`` cell by cell, and
invariants ``H z_v = t_v`` held exactly. In the per-axis basis ``⊗_a B_a`` of
:class:`~censusdp.estimation.gls.marginal_basis.MarginalBasis` (built from every measured and
invariant query) every Gram ``Q_qᵀQ_q`` and ``HᵀH`` is block-diagonal: one ``n_S × n_S`` block
per axis subset ``S``, repeated identically over ``mult_S`` within-group contrast indices
(docs/design.md § The structured algebra). Consistency is coordinate-wise and an invariant is equivalent to
``Π_H z = H⁺ t`` with ``Π_H = G_H⁺ G_H`` block-diagonal, i.e. per block the rows ``U_Sᵀ``
(an orthonormal basis of the range of ``G_H``'s block) with values ``U_Sᵀ (H⁺t)_S``. So the
tree problem splits into one independent tree problem per (block S, copy c) whose matrices
depend on S only: the general path of :mod:`censusdp.estimation.gls.tree` runs once per block with
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

**Structural zeros.** ``zeros`` (per level, per node, a mask over the schema's first axes)
holds cells at exactly 0 as noiseless measurements of 0 — the restricted least squares, each
node's belief conditioned onto its unmasked cells (docs/design.md § The Noisy Measurement File). The axes the masks vary over
are *split* (every value its own group, :meth:`MarginalBasis.for_queries`), so every block
contains them whole and a mask is a 0/1 diagonal inside it: the problem stays
block-diagonal (``pl94`` with hhgq × votingage masks: four blocks of 16, two of them repeated
over cenrace's 62 contrasts), and the kernel applies each node's mask
(:class:`~censusdp.estimation.gls.kernel.LevelInputs` ``Z``). Held cells come out ``== 0``
with zero variance; covariances (areas included) are those of the restricted estimate.

**Split passes.** :func:`structured_setup` fixes everything but the values (basis, weights,
blocks, identified subspace, privacy statement); :func:`structured_upward` runs the upward
pass of every block over a forest (a partition's levels below a cut, or the levels above it
from the partitions' messages), :func:`structured_top` smooths from the root and
:func:`structured_downward` a partition from its cut-level nodes; :func:`structured_output`
moves a forest's levels back to cell tensors. :func:`structured_gls` is these on the whole
tree; :mod:`censusdp.pipelines.structured_stream` runs them partition by partition with the
same bits (every per-node operation is independent of the batch it is in).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.covariance import BlockCovariance, identified_rows
from censusdp.estimation.gls.block_kernels import eigh, matmul
from censusdp.estimation.gls.kernel import (
    LevelInputs,
    concat_messages,
    general_down,
    general_up,
    root_start,
)
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis, node_axis_product
from censusdp.estimation.gls.tree import check_invariants
from censusdp.estimation.release import ReleaseBase
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.privacy import check_statement
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    checked_values,
    product_privacy,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant, check_float_exact, exact_release_note
from censusdp.schema import Schema
from censusdp.timing import stage

__all__ = [
    "StructuredPiece",
    "StructuredRelease",
    "StructuredSetup",
    "StructuredUpward",
    "structured_gls",
    "structured_setup",
    "structured_upward",
    "structured_top",
    "structured_downward",
    "structured_output",
    "structured_residuals",
    "BlockEstimates",
    "add_adjoint",
    "axes_label",
    "block_error",
    "block_zeros",
    "resolve_zeros",
    "gather_block",
    "range_basis",
]

Geometry = Literal["weighted", "euclidean"]

#: Eigenvalues below this fraction of a block's largest count as zero (ranges of Grams).
_RANGE_RTOL = 1e-10


class BlockEstimates(ReleaseBase):
    """A structured estimate as a member of the release family
    (:class:`~censusdp.estimation.release.ReleaseBase`): cell tensors per level with a
    :class:`~censusdp.estimation.covariance.BlockCovariance` (the nodes' blocks in the
    marginal basis), marginal estimates and identified rows; intervals and the summary are
    by table (``query``, ``"total"`` by default: a schema histogram is published as
    tables). Subclasses hold ``schema``, ``basis``, ``estimates``, ``covariances``,
    ``identified``, ``_rows`` and map a level to an index of ``estimates`` (:meth:`_index`)
    and name their levels (:meth:`_level_names`)."""

    estimator = "structured_gls"
    default_query = "total"
    schema: Schema
    basis: MarginalBasis
    estimates: tuple[np.ndarray, ...]
    covariances: tuple[BlockDiagonal, ...] | None
    identified: BlockDiagonal
    _rows: dict

    def _index(self, level: str | int) -> int:
        raise NotImplementedError

    def _level_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def level_index(self, level: str | int) -> int:
        return self._index(level)

    @property
    def level_names(self) -> tuple[str, ...]:
        return self._level_names()

    def level(self, level: str | int) -> np.ndarray:
        """Cell-tensor estimates of one level, ``(n_nodes, *schema.shape)``."""
        return self.estimates[self._index(level)]

    @property
    def cell_labels(self) -> tuple[str, ...]:
        return self.schema.cells

    def resolve_query(self, query: ProductQuery | str) -> ProductQuery:
        """``query`` parsed over the schema, or checked to be over it."""
        return schema_query(self.schema, query)

    _query = resolve_query

    @property
    def covariance(self) -> BlockCovariance | None:
        """The nodes' blocks per level, with the identified subspace; None for the Euclidean
        geometry with unequal noise scales."""
        if self.covariances is None:
            return None
        n_nodes = tuple(e.shape[0] for e in self.estimates)
        return BlockCovariance(tuple(self.covariances), self.identified, n_nodes, self._rows)

    def no_covariance(self) -> SpecError:
        return SpecError(
            "this release has no covariances: the Euclidean projection with unequal noise "
            "scales has no tree-pass covariance; use geometry='weighted'"
        )

    def identified_rows(self, query: ProductQuery | str) -> np.ndarray:
        """Per row of ``query`` (measured or not), True when it is identified.

        A row ``q`` is identified when it lies in ``W``: ``‖(I − Π_W) q‖² ≤ 1e-9 ‖q‖²``,
        computed per block like a variance (:meth:`BlockDiagonal.query_variances`).
        """
        return identified_rows(self.basis, self.identified, self._query(query), self._rows)

    def query_estimates(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Estimates of every row of ``query`` at every node, ``(n_nodes, n_rows)``.

        Rows that touch an unidentified component are NaN (not released).
        """
        q = self._query(query)
        out = q.apply(self.level(level))
        return np.where(self.identified_rows(q)[None, :], out, np.nan)

    def node_covariance(self, level: str | int, node: int) -> BlockDiagonal:
        """One node's covariance blocks (no node axis), e.g. for ``dense_cells()``."""
        if self.covariances is None:
            raise SpecError("this release has no covariances (see query_variances)")
        cov = self.covariances[self._index(level)]
        return BlockDiagonal(self.basis, {m: b[node] for m, b in cov.blocks.items()})


@dataclass(frozen=True, eq=False)
class StructuredRelease(BlockEstimates):
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
    #: The value-free setup (what :mod:`censusdp.estimation.gls.areas` reruns the covariance
    #: passes from for sums of leaves); None when built otherwise.
    setup: StructuredSetup | None = dataclasses.field(default=None, repr=False, compare=False)

    def _index(self, level: str | int) -> int:
        return self.hierarchy.level_index(level)

    def _level_names(self) -> tuple[str, ...]:
        return tuple(self.hierarchy.names)

    def level_codes(self, level: str | int) -> np.ndarray:
        return self.hierarchy.levels[self._index(level)].codes

    def __repr__(self) -> str:
        levels = ", ".join(f"{lv.name}={lv.size}" for lv in self.hierarchy.levels)
        se = "with SEs" if self.covariances is not None else "no SEs"
        return (
            f"<StructuredRelease {self.schema.name}: {self.schema.n_cells} cells, levels "
            f"{levels}, {se}; {self.privacy.guarantee}>"
        )


@dataclass(frozen=True, eq=False)
class StructuredPiece(BlockEstimates):
    """Some levels of a structured estimate over node ranges: a partition's levels below the
    cut, or the levels down to the cut (:mod:`censusdp.pipelines.structured_stream`).

    Attributes
    ----------
    names : tuple of str
        The levels held, top first.
    first : int
        Hierarchy index of ``names[0]``.
    ranges : tuple of (int, int)
        Per level held, the node range (hierarchy indices) of ``estimates``' rows.
    schema, basis, estimates, covariances, identified
        As for :class:`StructuredRelease`, for these levels and nodes.
    partition : int or None
        The partition's index (None for the levels down to the cut).
    """

    names: tuple[str, ...]
    first: int
    ranges: tuple[tuple[int, int], ...]
    schema: Schema
    basis: MarginalBasis
    estimates: tuple[np.ndarray, ...]
    covariances: tuple[BlockDiagonal, ...] | None
    identified: BlockDiagonal
    partition: int | None = None
    _rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def _index(self, level: str | int) -> int:
        if isinstance(level, str):
            if level not in self.names:
                raise SpecError(f"level {level!r} is not in this piece (levels {self.names})")
            return self.names.index(level)
        k = int(level) - self.first
        if not 0 <= k < len(self.names):
            raise SpecError(f"level {level} is not in this piece (levels {self.names})")
        return k

    def _level_names(self) -> tuple[str, ...]:
        return self.names

    def level_codes(self, level: str | int) -> np.ndarray:
        """The hierarchy indices of the nodes held (a piece holds no codes)."""
        lo, hi = self.ranges[self._index(level)]
        return np.arange(lo, hi, dtype=np.int64)

    def __repr__(self) -> str:
        pairs = zip(self.names, self.ranges, strict=True)
        levels = ", ".join(f"{n}={hi - lo}" for n, (lo, hi) in pairs)
        where = "top" if self.partition is None else f"partition {self.partition}"
        return f"<StructuredPiece {where}: {self.schema.n_cells} cells, levels {levels}>"


# ----------------------------------------------------------------------------- blocks
def _block_index(basis: MarginalBasis, mask: int) -> tuple[tuple, list[int]]:
    """Index of block ``S``'s coordinates and the permutation putting copies first."""
    k = len(basis.axes)
    inside = [i + 1 for i in range(k) if mask >> i & 1]
    outside = [i + 1 for i in range(k) if not mask >> i & 1]
    return (slice(None), *basis._index(mask)), [0, *outside, *inside]


def gather_block(basis: MarginalBasis, y: np.ndarray, mask: int) -> np.ndarray:
    """Block ``S`` of coefficient tensors ``(n, *shape)`` as ``(n, mult_S, n_S)``."""
    idx, perm = _block_index(basis, mask)
    sub = np.transpose(y[idx], perm)
    return sub.reshape(y.shape[0], basis.multiplicity(mask), basis.block_size(mask))


def _scatter(basis: MarginalBasis, out: np.ndarray, mask: int, vals: np.ndarray) -> None:
    """Write ``(n, mult_S, n_S)`` values into block ``S`` of ``out`` (inverse of
    :func:`gather_block`)."""
    idx, perm = _block_index(basis, mask)
    shape = [out[idx].shape[p] for p in perm]
    out[idx] = np.transpose(vals.reshape(shape), np.argsort(perm))


def range_basis(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal basis of the range of a symmetric PSD matrix, and its eigenvalues."""
    ev, v = eigh(0.5 * (m + m.T))
    keep = ev > _RANGE_RTOL * max(float(ev.max(initial=0.0)), 1e-300)
    return v[:, keep], ev[keep]


def axes_label(schema: Schema, mask: int) -> str:
    """The attributes of block ``mask`` (bit i: attribute i) as ``{name, ...}``."""
    names = [a.name for i, a in enumerate(schema.attributes) if mask >> i & 1]
    return "{" + ", ".join(names) + "}"


# ----------------------------------------------------------------------------- inputs
@dataclass(frozen=True, eq=False)
class StructuredSetup:
    """Everything of a structured GLS problem but the values: what every pass shares.

    Built by :func:`structured_setup` from the measured (level, query, variance) and the
    invariant (level, query) pairs alone, so that every partition of a streamed run, and the
    levels above its cut, work with the same basis, weights, blocks and identified subspace
    (and hence the same floating-point operations as the single-process run).

    Attributes
    ----------
    hierarchy : Hierarchy
    schema : Schema
    basis : MarginalBasis
    geometry : str
    tau : float
        Noise scale the passes work in (variances / τ²).
    vscale : float or None
        Converts scaled covariances back (None: Euclidean with unequal scales).
    heads : tuple
        Per measurement, in order: ``(level index, query, weight)`` with ``weight`` (1,) or
        (n_nodes,) = τ²/σ² (or 1 for the Euclidean geometry).
    inv_heads : tuple
        Per invariant, in order: ``(level index, query)``.
    J, GH : tuple
        Per level: mask → information blocks ``(1|n, n_S, n_S)`` of its measurements, and
        mask → Gram blocks of its invariants (None where the level has none).
    V : dict
        Mask → orthonormal basis of the identified part of the block (None: all of it).
    ident : dict
        Mask → the projector onto the identified part (blocks).
    dropped : dict
        Axis label → number of unidentified dimensions.
    statement : PrivacyStatement
        The derived statement with the invariants, geometry and notes.
    zeros : tuple
        Per level, None or ``(n_nodes, *[d_a for a in split])`` bool: the cells held at
        exactly 0 at each node (structural zeros), over the split axes (constant over the
        others).
    split : tuple of int
        The axes every value of which is its own group in ``basis`` (those the zeros vary
        over): every block contains them all, so a node's zeros are diagonal in it.
    """

    hierarchy: Hierarchy
    schema: Schema
    basis: MarginalBasis
    geometry: str
    tau: float
    vscale: float | None
    heads: tuple
    inv_heads: tuple
    J: tuple
    GH: tuple
    V: dict
    ident: dict
    dropped: dict
    statement: PrivacyStatement
    zeros: tuple = ()
    split: tuple = ()

    def k(self, mask: int) -> int:
        """Identified dimension of block ``mask``."""
        v = self.V[mask]
        return self.basis.block_size(mask) if v is None else v.shape[1]


def add_adjoint(
    basis: MarginalBasis, query: ProductQuery, answers: np.ndarray, out: np.ndarray
) -> None:
    """``out += (⊗_a B_a)ᵀ Qᵀ answers``: a query's adjoint straight into basis coordinates.

    Per axis the factor is ``B_aᵀ R_eᵀ``; ``R_e`` annihilates the within-group contrasts of
    every element but the detailed one, so on such an axis only the ``r_a`` group
    coordinates are nonzero and the product is computed on them alone: a marginal's
    information vector costs its own size, not the histogram's. Axes are taken in the order
    that keeps the tensor smallest (those that shrink it first), each node by node
    (:func:`~censusdp.estimation.gls.marginal_basis.node_axis_product`).
    """
    z = answers.reshape((answers.shape[0], *query.row_shape))
    if all(f.is_detailed for f in query.factors):
        out += basis.to_basis(z)
        return
    idx: list[slice] = [slice(None)]
    mats = []
    for a, f in zip(basis.axes, query.factors, strict=True):
        if f.is_detailed:
            mats.append(None)  # B_aᵀ itself: one reflection per group
            idx.append(slice(None))
        else:
            mats.append(matmul(a.basis[:, : a.r].T, f.matrix.T))
            idx.append(slice(0, a.r))
    growth = [1.0 if m is None else m.shape[0] / m.shape[1] for m in mats]
    for ax in sorted(range(len(mats)), key=lambda i: growth[i]):
        if mats[ax] is None:
            z = basis.axes[ax].coefficients(z, ax + 1)
        else:
            z = node_axis_product(z, ax + 1, np.ascontiguousarray(mats[ax]))
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


def schema_query(schema: Schema, query: ProductQuery | str) -> ProductQuery:
    """``query`` parsed over ``schema``, or checked to be over it."""
    if isinstance(query, str):
        return ProductQuery.parse(schema, query)
    if query.schema is not schema:
        raise SpecError(f"query {query.name!r} is over another schema than {schema.name!r}")
    return query


def resolve_products(
    hierarchy: Hierarchy,
    schema: Schema,
    items: Sequence[ProductMeasurement | ProductInvariant],
    what: str,
    check_values: bool = True,
) -> list:
    """``items`` with their levels as indices, checked to be over ``schema``, their values
    (and any per-node variances) checked against the level's size; errors name ``what``,
    the query and the level."""
    out = []
    for it in items:
        k = hierarchy.level_index(it.level)
        name = hierarchy.names[k]
        if it.query.schema is not schema:
            raise SpecError(
                f"{what} {it.query.name!r} at level {name!r} is over schema "
                f"{it.query.schema.name!r}, not {schema.name!r}"
            )
        changes: dict = {"level": k}
        if check_values:
            changes["values"] = checked_values(
                it.values, hierarchy.levels[k].size, it.query, what, name
            )
        nv = getattr(it, "node_variance", None)
        if nv is not None:
            nv = np.asarray(nv, dtype=np.float64).reshape(-1)
            # +inf: the node is not measured by this query (weight 0, no information)
            if nv.shape != (hierarchy.levels[k].size,) or not np.all(nv > 0):
                raise SpecError(
                    f"level {name!r}, query {it.query.name!r}: node_variance must be "
                    f"({hierarchy.levels[k].size},) positive values (+inf where a node is "
                    "not measured)"
                )
            changes["node_variance"] = nv
        out.append(dataclasses.replace(it, **changes))
    return out


def _exact_release_levels(
    hierarchy: Hierarchy,
    basis: MarginalBasis,
    heads: Sequence[tuple],
    GH: Sequence[dict | None],
    grams: dict,
) -> dict[str, tuple[str, ...]]:
    """Levels whose every measured query lies in the span of the invariants at or below.

    The block form of :func:`~censusdp.mechanisms.queries.exactly_released`: a query's rows
    are in the span of the invariant rows iff, block by block, the range of its Gram is in
    the range of the invariants' Gram.
    """
    out: dict[str, tuple[str, ...]] = {}
    levels = sorted({k for k, _, _ in heads})
    for k in levels:
        below = [g for j, g in enumerate(GH) if j >= k and g is not None]
        if not below:
            continue
        proj = {}
        for mask in basis.subsets:
            u, _ = range_basis(sum(g[mask] for g in below))
            proj[mask] = u @ u.T
        ok = True
        for lvl, q, _ in heads:
            if lvl != k:
                continue
            for mask, blk in grams[_key(q)].blocks.items():
                resid = blk - proj[mask] @ blk
                if np.abs(resid).max(initial=0.0) > 1e-9 * max(1.0, np.abs(blk).max()):
                    ok = False
        if ok:
            out[hierarchy.names[k]] = tuple(q.name for lvl, q, _ in heads if lvl == k)
    return out


def structured_setup(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    invariants: Sequence[ProductInvariant] = (),
    *,
    geometry: Geometry = "weighted",
    privacy: PrivacyStatement | None = None,
    delta: float | None = None,
    acknowledge_exact_release: bool = False,
    check_values: bool = True,
    zeros: Mapping[str | int, np.ndarray] | None = None,
) -> StructuredSetup:
    """The value-free part of :func:`structured_gls` (see there for the parameters).

    ``check_values=False`` reads only the levels, queries, laws and node variances of
    ``measurements`` and ``invariants`` (their values may be empty): what a streamed run
    knows before it measures. The privacy statement, the exact-release guard, the basis,
    every information and invariant block and the identified subspace are fixed here.
    """
    if geometry not in ("weighted", "euclidean"):
        raise SpecError(f"geometry must be 'weighted' or 'euclidean', got {geometry!r}")
    names = hierarchy.names
    meas = resolve_products(hierarchy, schema, measurements, "measurement", check_values)
    invs = resolve_products(hierarchy, schema, invariants, "invariant", check_values)
    derived = product_privacy(meas, level_names=names, delta=delta)
    if privacy is not None:
        check_statement(privacy, derived)

    variances = [np.atleast_1d(np.asarray(m.variance, dtype=np.float64)) for m in meas]
    var_all = np.concatenate(variances)
    # a node variance of +inf is a node the query does not measure: weight 0 in either
    # geometry (the same estimate as leaving its answers out); scales come from the rest
    var_all = var_all[np.isfinite(var_all)]
    if var_all.size == 0:
        raise SpecError("no measurement has a finite variance at any node: nothing is measured")
    equal = bool(np.all(var_all == var_all[0]))
    tau2 = float(np.median(var_all)) if geometry == "weighted" else 1.0
    vscale = tau2 if geometry == "weighted" else (float(var_all[0]) if equal else None)
    weights = [
        tau2 / v
        if geometry == "weighted"
        else (np.ones(1) if np.isfinite(v).all() else np.isfinite(v).astype(np.float64))
        for v in variances
    ]
    heads = tuple((m.level, m.query, w) for m, w in zip(meas, weights, strict=True))
    inv_heads = tuple((i.level, i.query) for i in invs)

    level_zeros, split = resolve_zeros(hierarchy, schema, zeros)
    basis = MarginalBasis.for_queries(schema, [x.query for x in [*meas, *invs]], split)
    D = hierarchy.depth
    J: list[dict | None] = [None] * D
    GH: list[dict | None] = [None] * D
    grams: dict[tuple, BlockDiagonal] = {}
    measured = {m: np.zeros((basis.block_size(m),) * 2) for m in basis.subsets}
    for _, q, *_ in [*heads, *inv_heads]:
        if _key(q) not in grams:
            grams[_key(q)] = basis.gram(q)
    for k, q, w in heads:
        g = grams[_key(q)]
        for mask, blk in g.blocks.items():
            if np.any(w > 0):  # a query measured at no node identifies nothing
                measured[mask] = measured[mask] + blk
        wg = g * w if w.shape[0] > 1 else g * float(w[0])
        blocks = {mask: (b if b.ndim == 3 else b[None]) for mask, b in wg.blocks.items()}
        J[k] = blocks if J[k] is None else {mask: J[k][mask] + blocks[mask] for mask in blocks}
    for k, q in inv_heads:
        g = grams[_key(q)].blocks
        GH[k] = g if GH[k] is None else {mask: GH[k][mask] + g[mask] for mask in g}

    determined = _exact_release_levels(hierarchy, basis, heads, GH, grams)
    notes: tuple[str, ...] = ()
    if len(determined) == len({k for k, _, _ in heads}):
        if not acknowledge_exact_release:
            held = ", ".join(f"{names[k]}: {q.name}" for k, q in inv_heads)
            lvls = ", ".join(repr(x) for x in determined)
            raise SpecError(
                f"the invariants ({held}) determine every measured value (at level(s) {lvls}): "
                "the release would be exact, with no privacy protection, whatever the budget "
                "says; hold fewer statistics invariant, or pass acknowledge_exact_release=True "
                "to release them exactly on purpose"
            )
        notes = (exact_release_note(determined),)

    V: dict[int, np.ndarray | None] = {}
    ident: dict[int, np.ndarray] = {}
    dropped: dict[str, int] = {}
    for mask in basis.subsets:
        nS, C = basis.block_size(mask), basis.multiplicity(mask)
        v, _ = range_basis(sum([measured[mask]] + [g[mask] for g in GH if g is not None]))
        kS = v.shape[1]
        # a fully identified block is solved in its own coordinates (no rotation)
        V[mask] = None if kS == nS else v
        ident[mask] = np.eye(nS) if kS == nS else matmul(v, v.T)
        if kS < nS:
            dropped[axes_label(schema, mask)] = (nS - kS) * C
            if any(z is not None for z in level_zeros):
                raise SpecError(
                    "structural zeros need every combination of cells identified (measure "
                    "the detailed query at the leaves); the block of the group parts of "
                    f"attributes {axes_label(schema, mask)} has {nS - kS} unidentified "
                    "dimensions"
                )
    labels = tuple(dict.fromkeys(f"{names[k]}: {q.name}" for k, q in inv_heads))
    # the derived statement names every invariant the computation holds
    statement = dataclasses.replace(
        derived, invariants=labels, geometry=geometry, notes=derived.notes + notes
    )
    return StructuredSetup(
        hierarchy, schema, basis, geometry, float(np.sqrt(tau2)), vscale, heads, inv_heads,
        tuple(J), tuple(GH), V, ident, dropped, statement, level_zeros, split,
    )  # fmt: skip


def resolve_zeros(
    hierarchy: Hierarchy, schema: Schema, zeros: Mapping[str | int, np.ndarray] | None
) -> tuple[tuple, tuple[int, ...]]:
    """Structural zeros per level, reduced to the axes they vary over.

    ``zeros`` maps a level (name or index) to ``(n_nodes, d_0, …, d_{k−1})`` bool over the
    first ``k`` axes of the schema (True: every cell with these values is 0 at that node;
    constant over the remaining axes). Returns per level None or the mask over the *split*
    axes — those among the first ``k`` along which some level's mask varies — and the
    split axes (docs/design.md § The Noisy Measurement File: for the NMF's hhgq and nursing-under-18 zeros, hhgq ×
    votingage; hispanic is never masked alone, so it keeps its basis).

    Raises
    ------
    SpecError
        A mask of the wrong shape or type, or masks over different numbers of axes.
    """
    out: list[np.ndarray | None] = [None] * hierarchy.depth
    if not zeros:
        return tuple(out), ()
    masks: dict[int, np.ndarray] = {}
    lead: tuple[int, ...] | None = None
    for level, z in zeros.items():
        k = hierarchy.level_index(level)
        name = hierarchy.names[k]
        z = np.asarray(z)
        n = hierarchy.levels[k].size
        if z.dtype != bool or z.ndim < 2 or z.shape[0] != n:
            raise SpecError(
                f"structural zeros at level {name!r}: give a bool array (n_nodes={n}, "
                f"d_0, …) over the first axes of schema {schema.name!r}, got {z.dtype} "
                f"{z.shape}"
            )
        if z.shape[1:] != schema.shape[: z.ndim - 1] or (lead and z.shape[1:] != lead):
            raise SpecError(
                f"structural zeros at level {name!r}: shape {z.shape[1:]} is not that of the "
                f"schema's first axes {schema.shape[: z.ndim - 1]} (the same at every level)"
            )
        lead = z.shape[1:]
        masks[k] = masks[k] | z if k in masks else z
    assert lead is not None
    split = tuple(
        a
        for a in range(len(lead))
        if any(np.any(z != z.take([0], axis=a + 1)) for z in masks.values())
    )
    for k, z in masks.items():
        sel = tuple(slice(None) if a in split else slice(0, 1) for a in range(len(lead)))
        red = z[(slice(None), *sel)].reshape(z.shape[0], *(lead[a] for a in split))
        out[k] = red if red.any() else None
    return tuple(out), split


def block_zeros(
    setup: StructuredSetup, mask: int, k: int, rows: tuple[int, int]
) -> np.ndarray | None:
    """``(n, n_S)`` 0/1: block ``mask``'s coordinates held at 0 at nodes ``rows`` of level
    ``k`` (None: no zeros there). Every block holds the split axes' values in its
    coordinates (C order over the block's axes, each split axis by value): the mask of a
    coordinate is the node's mask at its split-axis values."""
    z = setup.zeros[k] if setup.zeros else None
    if z is None:
        return None
    basis = setup.basis
    z = z[rows[0] : rows[1]]
    inside = [a for a in range(len(basis.axes)) if mask >> a & 1]
    shape = [basis.axes[a].r if a in setup.split else 1 for a in inside]
    full = [basis.axes[a].r for a in inside]
    zz = np.broadcast_to(z.reshape(z.shape[0], *shape), (z.shape[0], *full))
    return zz.reshape(z.shape[0], -1).astype(np.float64)


def _vectors(
    setup: StructuredSetup,
    k: int,
    rows: tuple[int, int],
    meas_values: Sequence[np.ndarray | None],
    inv_values: Sequence[np.ndarray | None],
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Information vector ``h`` and invariant coefficients ``b`` (basis, scaled units) of
    nodes ``rows`` of level ``k``; ``meas_values[i]`` / ``inv_values[i]`` are the rows of
    measurement / invariant ``i`` (None for other levels)."""
    basis, tau = setup.basis, setup.tau
    lo, hi = rows
    h = b = None
    for (lvl, q, w), vals in zip(setup.heads, meas_values, strict=True):
        if lvl != k:
            continue
        if h is None:
            h = np.zeros((hi - lo, *basis.shape))
        scale = (w / tau) if w.shape[0] == 1 else (w[lo:hi] / tau)
        scale = np.broadcast_to(scale, (hi - lo,))
        for s in _node_chunks(hi - lo, q.n_rows):
            answers = np.asarray(vals[s], np.float64) * scale[s, None]
            add_adjoint(basis, q, answers, h[s])
    for (lvl, q), vals in zip(setup.inv_heads, inv_values, strict=True):
        if lvl != k:
            continue
        if b is None:
            b = np.zeros((hi - lo, *basis.shape))
        for s in _node_chunks(hi - lo, q.n_rows):
            add_adjoint(basis, q, np.asarray(vals[s], np.float64) / tau, b[s])
    return h, b


def _block_level(
    setup: StructuredSetup,
    mask: int,
    k: int,
    rows: tuple[int, int],
    h: np.ndarray | None,
    b: np.ndarray | None,
) -> LevelInputs:
    """Level ``k`` (nodes ``rows``) of block ``mask``'s tree problem."""
    basis, V, kS = setup.basis, setup.V[mask], setup.k(mask)
    n = rows[1] - rows[0]
    C = basis.multiplicity(mask)
    Jk, H, U, ev = block_matrices(setup, mask, k, rows)
    if h is None:
        hk = np.zeros((n, C, kS))
    else:
        hk = gather_block(basis, h, mask)
        hk = hk if V is None else matmul(hk, V)
    t = np.zeros((n, C, 0))
    if H.shape[0]:
        t = matmul(gather_block(basis, b, mask), U) / ev
    Z = block_zeros(setup, mask, k, rows)
    return LevelInputs(Jk, hk, H, t, Jk.shape[0] == 1, Z=Z)


def block_matrices(
    setup: StructuredSetup, mask: int, k: int, rows: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The value-free part of level ``k`` (nodes ``rows``) of block ``mask``'s tree problem,
    in its identified coordinates: the information matrices ``(1|n, k_S, k_S)``, the
    invariant rows ``H`` ``(n_H, k_S)``, and the basis ``U`` and eigenvalues ``ev`` of the
    invariants' Gram block that turn invariant coefficients into values of ``H``."""
    V, kS = setup.V[mask], setup.k(mask)
    J = setup.J[k]
    if J is None:
        Jk = np.zeros((1, kS, kS))
    else:
        Jm = J[mask] if J[mask].shape[0] == 1 else J[mask][rows[0] : rows[1]]
        Jk = Jm if V is None else matmul(matmul(V.T, Jm), V)
    H = np.zeros((0, kS))
    U, ev = np.zeros((setup.basis.block_size(mask), 0)), np.zeros(0)
    if setup.GH[k] is not None:
        U, ev = range_basis(setup.GH[k][mask])
        if U.shape[1]:
            H = U.T if V is None else matmul(U.T, V)
    return Jk, H, U, ev


def block_error(schema: Schema, mask: int, err: SpecError) -> SpecError:
    """``err`` of block ``mask``'s tree problem, naming the block by its attributes."""
    return SpecError(f"{err} (block of the group parts of attributes {axes_label(schema, mask)})")


@dataclass(eq=False)
class StructuredUpward:
    """The upward pass of the structured GLS over one forest, block by block.

    ``ups[mask]`` is :func:`~censusdp.estimation.gls.kernel.general_up`'s per-level state of block
    ``mask`` (None for unidentified blocks); :meth:`messages` is what the forest's top
    level sends to the levels above (per block: mean, covariance, flat directions).
    """

    forest: Forest
    rows: tuple[tuple[int, int], ...]
    ups: dict

    def messages(self) -> dict:
        return {m: (None if u is None else u[0].message()) for m, u in self.ups.items()}

    def nbytes(self) -> int:
        """Bytes held by the arrays of the upward state (what caching it costs)."""
        total = 0
        for u in self.ups.values():
            for lv in u or ():
                for f in dataclasses.fields(lv):
                    v = getattr(lv, f.name)
                    if isinstance(v, np.ndarray) and v.base is None:
                        total += v.nbytes
        return total


def structured_upward(
    setup: StructuredSetup,
    forest: Forest,
    rows: Sequence[tuple[int, int]],
    meas_values: Sequence[Sequence[np.ndarray | None]],
    inv_values: Sequence[Sequence[np.ndarray | None]],
    bottom: Sequence[dict] | None = None,
) -> StructuredUpward:
    """The upward pass over ``forest`` (levels ``forest.first ..``, node ranges ``rows``).

    Parameters
    ----------
    setup : StructuredSetup
    forest : Forest
        A partition's forest (cut .. leaf), the top forest (0 .. cut, with ``bottom``) or
        the whole tree.
    rows : sequence of (lo, hi)
        The forest's node range at each of its levels.
    meas_values, inv_values : sequences
        Per forest level, per measurement / invariant of ``setup`` (in order): its values at
        the level's rows, None for other levels (see :func:`_vectors`). With ``bottom``, the
        forest's last level is not read.
    bottom : sequence of dict, optional
        Every partition's :meth:`StructuredUpward.messages`, in partition (node) order: the
        cut level's beliefs, for the levels above a cut (the forest's last level).

    References
    ----------
    Hay et al. (2010), §4; Rauch, Tung & Striebel (1965).
    """
    D = forest.depth
    last = D - 1 if bottom is not None else D
    hb = [
        _vectors(setup, forest.first + j, rows[j], meas_values[j], inv_values[j])
        for j in range(last)
    ]
    ups: dict = {}
    for mask in setup.basis.subsets:
        kS = setup.k(mask)
        if kS == 0:
            ups[mask] = None
            continue
        levels = [_block_level(setup, mask, forest.first + j, rows[j], *hb[j]) for j in range(last)]
        msg = None
        if bottom is not None:
            levels.append(None)
            parts = [b[mask] for b in bottom]
            msg = concat_messages(parts, kS) if len(parts) > 1 else parts[0]
        try:
            ups[mask] = general_up(forest, levels, kS, msg)
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
    return StructuredUpward(forest, tuple(rows), ups)


def structured_top(setup: StructuredSetup, up: StructuredUpward) -> dict:
    """The smoothed root and levels of ``up``'s forest (it must start at the root).

    Returns mask → ``(zhat, Phat)`` per level of the forest (scaled units, block
    coordinates), for :func:`structured_downward` below a cut and :func:`structured_output`.

    Raises
    ------
    SpecError
        Some combination of cells is measured nowhere (naming the block).
    """
    names = setup.hierarchy.names
    out: dict = {}
    for mask, ups in up.ups.items():
        if ups is None:
            out[mask] = None
            continue
        kS = setup.k(mask)
        try:
            z0, P0 = root_start(ups, kS, names[0])
            out[mask] = general_down(up.forest, ups, kS, z0, P0)
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
    return out


def structured_downward(setup: StructuredSetup, up: StructuredUpward, cut: dict) -> dict:
    """Smoothing of a partition's forest from its cut-level nodes' smoothed blocks.

    ``cut`` is mask → ``(z, P)`` of the partition's cut-level nodes (rows of
    :func:`structured_top`'s last level). Returns mask → ``(zhat, Phat)`` per forest level,
    the cut level first, as :func:`structured_top` does.
    """
    out: dict = {}
    for mask, ups in up.ups.items():
        if ups is None:
            out[mask] = None
            continue
        z, P = cut[mask]
        try:
            out[mask] = general_down(up.forest, ups, setup.k(mask), z, P)
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
    return out


def structured_output(
    setup: StructuredSetup, smoothed: dict, levels: Sequence[int], sizes: Sequence[int]
) -> tuple[list[np.ndarray], list[BlockDiagonal] | None]:
    """Cell-tensor estimates and covariance blocks of the smoothed levels ``levels`` (indices
    into each block's lists) with ``sizes`` nodes each, level by level so that one
    coefficient tensor is held at a time besides the estimates."""
    basis, tau, vscale = setup.basis, setup.tau, setup.vscale
    estimates: list[np.ndarray] = []
    covs: list[dict[int, np.ndarray]] = []
    for j, n in zip(levels, sizes, strict=True):
        coef = np.zeros((n, *basis.shape))
        cov: dict[int, np.ndarray] = {}
        for mask in basis.subsets:
            nS = basis.block_size(mask)
            if smoothed[mask] is None:
                cov[mask] = np.zeros((n, nS, nS))
                continue
            zhat, Phat = smoothed[mask][0][j], smoothed[mask][1][j]
            V = setup.V[mask]
            _scatter(basis, coef, mask, (zhat if V is None else matmul(zhat, V.T)) * tau)
            P = np.broadcast_to(Phat, (n, *Phat.shape[1:]))
            cov[mask] = (P if V is None else matmul(matmul(V, P), V.T)) * (
                vscale if vscale is not None else np.nan
            )
        estimates.append(basis.from_basis(coef))
        del coef
        covs.append(cov)
    return estimates, (None if vscale is None else [BlockDiagonal(basis, c) for c in covs])


def _values_by_level(
    items: Sequence, first: int, ranges: Sequence[tuple[int, int]]
) -> list[list[np.ndarray | None]]:
    """Per forest level, per item: its values' rows in that level's range (or None)."""
    out = []
    for j, (lo, hi) in enumerate(ranges):
        out.append([it.values[lo:hi] if it.level == first + j else None for it in items])
    return out


def structured_residuals(
    setup: StructuredSetup,
    forest: Forest,
    rows: Sequence[tuple[int, int]],
    estimates: Sequence[np.ndarray],
    invariants: Sequence[ProductInvariant],
) -> tuple[float, float, float, str]:
    """Largest consistency residual (parent − Σ children) within ``forest`` and the largest
    invariant residual and value of its levels (with the level of the worst), for
    estimates of its levels (first level first; invariants resolved, full levels)."""
    names = setup.hierarchy.names
    cons = 0.0
    for j in range(forest.depth - 1):
        d = np.abs(forest.sum_children(j, estimates[j + 1]) - estimates[j])
        cons = max(cons, float(d.max(initial=0.0)))
    inv_res, inv_val, worst = 0.0, 0.0, ""
    for inv in invariants:
        j = inv.level - forest.first
        if not 0 <= j < forest.depth:
            continue
        lo, hi = rows[j]
        vals = inv.values[lo:hi]
        r = float(np.abs(inv.query.apply(estimates[j]) - vals).max(initial=0.0))
        inv_val = max(inv_val, float(np.abs(vals).max(initial=0.0)))
        if r >= inv_res:
            inv_res, worst = r, names[inv.level]
    return cons, inv_res, inv_val, worst


def check_residuals(inv_res: float, inv_val: float, worst: str) -> None:
    """Refuse a release whose invariants do not hold (they contradict each other)."""
    if inv_res > 1e-6 * (1.0 + inv_val):
        raise DataError(
            "the invariants contradict each other (they cannot all hold with parent = sum of "
            f"children); largest violation at level {worst!r}"
        )


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
    zeros: Mapping[str | int, np.ndarray] | None = None,
) -> StructuredRelease:
    """The GLS estimate of a consistent schema histogram, block by block in the marginal basis.

    Parameters
    ----------
    hierarchy : Hierarchy
    schema : Schema
    measurements : sequence of ProductMeasurement
        Noisy answers ``(n_nodes, n_rows)`` of a product query at every node of a level,
        with their noise law (and optional per-node variances; ``+inf`` marks a node the
        query does not measure: weight 0, the same estimate as without its answers).
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
    zeros : mapping of level → numpy.ndarray, optional
        Structural zeros (docs/design.md § The Noisy Measurement File): per level a bool ``(n_nodes, d_0, …, d_{k−1})`` over
        the schema's first ``k`` axes, True where every cell with those values is 0 at that
        node (each node its own mask). They are held exactly (``== 0`` in the release) as
        noiseless measurements of 0: the restricted least squares, i.e. each node's belief
        conditioned onto its unmasked cells. The axes the masks vary over are *split*
        (every value its own group, :meth:`MarginalBasis.for_queries`), so each block
        contains them whole and a mask is diagonal in it: the problem stays block-diagonal
        (for ``pl94`` with hhgq × votingage masks, four blocks of 16 instead of sixteen of
        1 and 3). Needs every block identified (the detailed query at the leaves).

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

    Notes
    -----
    The same passes run partition by partition in
    :func:`censusdp.pipelines.structured_stream.structured_stream`, with identical results:
    every per-node operation here (moves into and out of the basis included) gives a node
    the same bits whatever other nodes it is batched with.

    References
    ----------
    Hay et al. (2010); Rauch, Tung & Striebel (1965); docs/design.md § The structured algebra (the block algebra); Gao,
    Gong & Yu (2022), Def. 6 and Thm. 22.
    """
    clock: dict[str, float] = {}
    with stage(clock, "setup"):
        meas = resolve_products(hierarchy, schema, measurements, "measurement")
        setup = structured_setup(
            hierarchy, schema, meas, invariants, geometry=geometry, privacy=privacy, delta=delta,
            acknowledge_exact_release=acknowledge_exact_release, check_values=False, zeros=zeros,
        )  # fmt: skip
        invs = check_structured_invariants(hierarchy, schema, invariants)
    with stage(clock, "solve"):
        forest = whole_forest(hierarchy)
        rows = [(0, n) for n in hierarchy.sizes]
        up = structured_upward(
            setup, forest, rows, _values_by_level(meas, 0, rows), _values_by_level(invs, 0, rows)
        )
        del meas
        smoothed = structured_top(setup, up)
        del up
    with stage(clock, "output"):
        estimates, covariances = structured_output(
            setup, smoothed, range(hierarchy.depth), hierarchy.sizes
        )
        del smoothed
    cons, inv_res, inv_val, worst = structured_residuals(setup, forest, rows, estimates, invs)
    check_residuals(inv_res, inv_val, worst)
    diagnostics = _gls_diagnostics(setup, schema, geometry, (cons, inv_res, inv_val), clock)
    return StructuredRelease(
        hierarchy=hierarchy,
        schema=schema,
        basis=setup.basis,
        estimates=tuple(estimates),
        covariances=None if covariances is None else tuple(covariances),
        identified=BlockDiagonal(setup.basis, setup.ident),
        privacy=floating_point_note(setup.statement),
        diagnostics=diagnostics,
        setup=setup,
    )


EUCLIDEAN_NOTE = (
    "euclidean geometry with unequal noise scales: the tree passes give the estimate "
    "but not its sandwich covariance"
)


def _gls_diagnostics(
    setup: StructuredSetup,
    schema: Schema,
    geometry: Geometry,
    residuals: tuple[float, float, float],
    clock: Mapping[str, float],
) -> dict:
    """The diagnostics of :func:`structured_gls`: the geometry, the basis blocks, the
    unidentified subspaces and split axes, the largest consistency and invariant residuals
    (``residuals``: consistency, invariant, the largest invariant value; docs/design.md
    § The structured algebra) and the wall seconds of the stages ``setup``, ``solve`` and
    ``output`` in ``clock`` (:func:`censusdp.timing.stage`; their CPU seconds are left out)."""
    cons, inv_res, inv_val = residuals
    diagnostics = {
        "estimator": "structured_gls",
        "geometry": geometry,
        "blocks": {axes_label(schema, m): setup.basis.block_size(m) for m in setup.basis.subsets},
        "unidentified": setup.dropped,
        "zeros_split_axes": [schema.attributes[a].name for a in setup.split],
        "max_consistency_residual": cons,
        "max_invariant_residual": inv_res,
        "max_invariant_value": inv_val,
        "seconds_setup": clock["setup"],
        "seconds_solve": clock["solve"],
        "seconds_output": clock["output"],
    }
    if setup.vscale is None:
        diagnostics["note"] = EUCLIDEAN_NOTE
    return diagnostics


def check_structured_invariants(
    hierarchy: Hierarchy, schema: Schema, invariants: Sequence[ProductInvariant]
) -> list[ProductInvariant]:
    """Invariants resolved to level indices, exact in float64 and consistent (parent totals
    equal their children's sums)."""
    invs = resolve_products(hierarchy, schema, invariants, "invariant")
    names = hierarchy.names
    for inv in invs:
        check_float_exact(inv.values, f"invariant {inv.query.name!r} at level {names[inv.level]!r}")
    # exact consistency of the invariants (rows are small: totals and marginals)
    check_invariants(hierarchy, [Invariant(i.level, i.query.to_query(), i.values) for i in invs])
    return invs
