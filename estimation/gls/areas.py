"""Off-spine areas (places, districts) as sums of leaves, with exact GLS standard errors.

An area ``α`` (a set of leaves from a block → area equivalency,
:mod:`censusdp.hierarchy.equivalency`) is released as the sum of its leaves' estimates; since
the GLS release is consistent this is also the sum of any partition of the area into nodes.
Its error covariance is ``Σ_{l,l' ∈ α} Cov(e_l, e_l')``, a quadratic form of the whole
leaves × leaves covariance — never formed here. Instead it is accumulated in one pass up
the tree from the Rauch–Tung–Striebel (backward) representation of the smoother.

**The algebra.** Let ``P_c`` be node c's upward covariance (its estimate from its own subtree,
after its measurements and invariants), ``S_p = Σ_{c ∈ ch(p)} P_c`` and, per family, the
smoother's family inverse ``A_p = S_p⁺``
(:func:`~censusdp.estimation.gls.kernel.family_inverse_plain`).
The downward pass is ``ẑ_c = m_c + G_c (ẑ_p − Σ m)`` with ``G_c = P_c A_p``, so the errors
``e = ẑ − z`` satisfy ``e_c = G_c e_p + η_c`` with innovations ``η`` independent of every
error above the family and of other families, but *not* of their siblings': given the
parent, children are conditioned on their sum, ``Cov(η_c, η_c') = δ_cc' P_c − P_c A_p P_c'``
(so ``Σ_c η_c = 0`` on the identified part; the diagonal is the smoother's ``P_c − G_c P_c``).
Unrolling, ``Σ_{l∈α} e_l = M_root e_root + Σ_{c ≠ root} M_c η_c`` with ``M_leaf = 1{leaf ∈ α} I``
and ``M_p = Σ_c M_c G_c``, hence

    Var_α = M_root P̂_root M_rootᵀ + Σ_{c ≠ root} M_c P_c M_cᵀ − Σ_{p internal} Q_p A_p Q_pᵀ,
    Q_p = Σ_{c ∈ ch(p)} M_c P_c  (and M_p = Q_p A_p).

Invariants make ``P`` singular on the held directions: ``A_p`` is a pseudo-inverse and
``P_c A_p S_p = P_c`` since ``range P_c ⊆ range S_p``, so the formula holds as written; the
root term carries the root's smoothed covariance (zero on invariant directions). Children
with *flat* directions (a combination measured above them only, e.g. an only child) use the
bordered family inverse ``Y_p`` (:func:`~censusdp.estimation.gls.kernel.family_inverse_bordered`):
with ``F_c = [P_c, Ñ_c]`` the gain is ``F_c Y_p[:, :K]``, the family covariance
``δ_cc' P_c − F_c Y_p F_c'ᵀ``, and ``Q_p = Σ_c M_c F_c`` in the last term — the limit of the
plain formula as the flat directions' prior variance grows.

Everything is per block of the marginal basis (docs/design.md § The structured algebra: every covariance is
block-diagonal, identical over a block's copies), on ``(node, area)`` pairs: a level holds
one ``K × K`` matrix ``M`` per pair of a node and an area meeting its subtree, pairs go up by
one ``numpy.unique`` of (parent, area) keys and entry-wise ``bincount`` sums; the work is
``O(Σ_levels pairs · K³)``, at most (leaves in areas) + depth × areas pairs, with no loop over
nodes or areas and no dense matrix. The same pass runs on the structured GLS's own tree
(:func:`area_release`, :func:`structured_area_covariance`) and, for predictions before any
noise, with per-node matrices looked up from shape classes
(:func:`censusdp.estimation.gls.predict.predict_errors` with ``areas``).

The streamed form falls out of the same sweep: per partition (:func:`area_partition`) the
sweep runs over its forest from its leaves to its cut nodes and sends up the partial sums and
the cut-level pairs ``(node, area, M)`` (at most one per cut node and area), with the cut
nodes' upward covariance message; the top (:func:`area_top`) continues from those pairs. It is
not wired into :mod:`censusdp.pipelines.structured_stream` here.

Usage::

    eq = read_equivalency("baf.csv", hierarchy, block_column="BLOCKID",
                          area_column="PLACEFP", name="place")
    places = area_release(structured_gls(hierarchy, schema, meas, invs), eq)
    places.query_estimates("place", "total"), places.query_standard_errors("place", "total")
    predict_errors(hierarchy, schema, plan, invs, areas=eq).areas  # before any noise

References
----------
Rauch, Tung & Striebel (1965). Maximum likelihood estimates of linear dynamic systems — the
    backward representation of the smoother.
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm —
    off-spine geographies (places, AIAN areas) as unions of blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
from scipy import sparse

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls.kernel import (
    LevelInputs,
    UpwardBelief,
    concat_messages,
    family_inverse_bordered,
    family_inverse_plain,
    general_up,
    root_start,
)
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.gls.structured import (
    BlockEstimates,
    StructuredRelease,
    StructuredSetup,
    block_error,
    block_matrices,
    block_zeros,
)
from censusdp.estimation.gls.tree import Geometry, gls_plan, level_inputs
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.equivalency import Equivalency
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant, Measurement
from censusdp.options import with_keywords
from censusdp.schema import Schema

__all__ = [
    "AreaEstimates",
    "AreaPairs",
    "AreaPartial",
    "area_cross_sweep",
    "area_pairs",
    "area_query_covariance",
    "query_block_rows",
    "area_partition",
    "area_release",
    "area_sweep",
    "area_top",
    "SweepOptions",
    "structured_area_covariance",
    "tree_area_covariance",
]


def _scatter_sum(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """``out[i] = Σ_{index[p] = i} values[p]`` for matrices ``(p, a, b)``: one sparse
    product of the ``(n, p)`` incidence with the flattened matrices. Each output entry is
    summed in increasing ``p`` from 0 (scipy's CSR kernel, columns sorted within rows), as
    ``bincount`` sums its weights: the same floats, without a ``bincount`` per entry."""
    flat = values.reshape(values.shape[0], int(np.prod(values.shape[1:])))  # 0 rows too
    p = flat.shape[0]
    inc = sparse.csr_array((np.ones(p), (np.asarray(index, np.int64), np.arange(p))),
                           shape=(n, p))  # fmt: skip
    inc.has_sorted_indices = True  # (row, p) built in increasing p within every row
    out = np.asarray(inc @ flat) if p else np.zeros((n, flat.shape[1]))
    return out.reshape((n, *values.shape[1:]))


def _packed_flat(u: UpwardBelief, ch: UpwardBelief, K: int) -> np.ndarray:
    """``Ñ_c`` of every child row: its flat directions in its packed columns of the parent."""
    n = ch.m.shape[0]
    out = np.zeros((n, K, K))
    if ch.N is None:
        return out
    ci, i = np.nonzero(np.arange(K)[None, :] < ch.r[:, None])
    out[ci, :, u.off[ci] + i] = ch.N[ci, :, i]
    return out


@dataclass(frozen=True, eq=False)
class AreaPairs:
    """The (node, area) pairs of every level of a sweep, shared by every tree problem (the
    blocks of the marginal basis): per level from the bottom, the pairs' nodes and areas and
    each pair's parent pair (``up``, into the next level's pairs)."""

    node: tuple[np.ndarray, ...]
    area: tuple[np.ndarray, ...]
    up: tuple[np.ndarray, ...]


def area_pairs(
    forest: Forest,
    leaf: np.ndarray,
    area: np.ndarray,
    n_areas: int,
    start: tuple[np.ndarray, np.ndarray] | None = None,
) -> AreaPairs:
    """The pairs of :func:`area_sweep` over ``forest``: the leaves' (or ``start``'s pairs at
    the last level), then one ``numpy.unique`` of (parent, area) keys per level."""
    node, ar = (np.asarray(leaf, np.int64), np.asarray(area, np.int64)) if start is None else start
    nodes, areas, ups = [node], [ar], []
    for j in range(forest.depth - 1, 0, -1):
        key = forest.parent(j)[node] * n_areas + ar
        uniq, inv = np.unique(key, return_inverse=True)
        node, ar = uniq // n_areas, uniq % n_areas
        nodes.append(node)
        areas.append(ar)
        ups.append(inv.reshape(-1))
    return AreaPairs(tuple(nodes), tuple(areas), tuple(ups))


@dataclass(frozen=True, eq=False)
class SweepOptions:
    """How :func:`area_sweep` reads its tree problem and where it starts and stops.

    Attributes
    ----------
    rows : sequence of numpy.ndarray, optional
        Per level, the row of ``ups`` of every node (shape classes: ``node_class``).
    up_forest : Forest, optional
        The forest ``ups`` ran on (for the bordered family inverse and its messages).
    start : (node, area, M), optional
        Pairs at the forest's last level to start from instead of ``leaf, area`` (the cut
        level's pairs that partitions send up); ``leaf`` and ``area`` are then ignored.
    to_root : bool
        False for a partition's forest (its top level is a cut, not the root): stop at the
        top level and return the partial sums with its pairs (``P_root`` is not read).
    pairs : AreaPairs, optional
        :func:`area_pairs` of the same forest and areas, computed once for several problems.
    """

    rows: Sequence[np.ndarray] | None = None
    up_forest: Forest | None = None
    start: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    to_root: bool = True
    pairs: AreaPairs | None = None


def area_sweep(
    forest: Forest,
    ups: Sequence[UpwardBelief],
    K: int,
    leaf: np.ndarray,
    area: np.ndarray,
    n_areas: int,
    P_root: np.ndarray,
    *,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> np.ndarray | tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Error covariances ``(n_areas, K, K)`` of sums of leaves, in one pass up the tree.

    Parameters
    ----------
    forest : Forest
        The tree (whole, from the root): its ``parent`` arrays move pairs up.
    ups : sequence of UpwardBelief
        The upward pass of one tree problem (:func:`~censusdp.estimation.gls.kernel.general_up`,
        scaled units), per level; rows indexed by ``rows`` (default: the forest's nodes).
    K : int
        The problem's dimension.
    leaf, area : numpy.ndarray
        The incidence as pairs: leaf index and area index (each leaf at most once).
    n_areas : int
    P_root : numpy.ndarray
        The root's smoothed covariance ``(1, K, K)``.
    options : SweepOptions, optional
        Class rows, the forest ``ups`` ran on, a start from the cut, a partial sweep and
        shared pairs (:class:`SweepOptions`; default: none of them). The same names given
        as keyword arguments (``**legacy``, as before the options existed) are applied over
        it for one release.

    Returns
    -------
    numpy.ndarray, or (numpy.ndarray, (node, area, M))
        ``Var(Σ_{l∈α} ẑ_l − z_l)`` per area (see the module docstring), scaled units; with
        ``to_root=False`` the terms of the levels below the forest's top and its pairs.
    """
    o = with_keywords(SweepOptions, options, legacy, "area_sweep")
    acc = np.zeros((n_areas, K, K))

    def emit(node: np.ndarray, ar: np.ndarray, left: np.ndarray, right: np.ndarray,
             sign: float) -> None:  # fmt: skip
        nonlocal acc
        term = _scatter_sum(ar, left @ right.swapaxes(-1, -2), n_areas)
        acc = acc + term if sign > 0 else acc - term

    top = _carry(forest, ups, K, leaf, area, n_areas, o, emit)
    if not o.to_root:
        return acc, top
    node, ar, M = top
    emit(node, ar, M @ P_root, M, 1.0)
    return 0.5 * (acc + acc.swapaxes(-1, -2))


#: What a sweep step hands its emitter: the pairs' nodes and areas, the left and right
#: factors (a term ``left @ rightᵀ`` per pair) and the sign of the term.
Emit = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float], None]


def _carry(
    forest: Forest,
    ups: Sequence[UpwardBelief],
    K: int,
    leaf: np.ndarray,
    area: np.ndarray,
    n_areas: int,
    o: SweepOptions,
    emit: Emit,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Carry the pairs' gains ``M`` (``(pairs, L, K)``: ``L = K`` for the whole block, ``L =
    1`` for a functional's row) from the leaves to the forest's top level, handing every
    level's terms of the module docstring's formula to ``emit``: ``+ M_c P_c M_cᵀ`` per
    pair, ``− Q_p A_p Q_pᵀ`` per parent pair (or ``Q_p Y_p Q_pᵀ`` with flat children).
    Returns the top level's pairs ``(node, area, M)``."""
    rows, start, pairs = o.rows, o.start, o.pairs
    uf = forest if o.up_forest is None else o.up_forest
    if pairs is None:
        pairs = area_pairs(forest, leaf, area, n_areas, None if start is None else start[:2])
    if start is None:
        M = np.broadcast_to(np.eye(K), (pairs.node[0].size, K, K))
    else:
        M = start[2]
    for i, j in enumerate(range(forest.depth - 1, 0, -1)):
        node, ar, inv = pairs.node[i], pairs.area[i], pairs.up[i]
        pnode, parea = pairs.node[i + 1], pairs.area[i + 1]
        ch, u = ups[j], ups[j - 1]
        r = node if rows is None else rows[j][node]
        Pc = ch.P if ch.P.shape[0] == 1 else ch.P[r]
        MP = M @ Pc
        emit(node, ar, MP, M, 1.0)
        n_up = pnode.size
        pr = pnode if rows is None else rows[j - 1][pnode]
        bord = u.rc > 0
        if not bord.any():
            Q = _scatter_sum(inv, MP, n_up)
            Mp = Q @ family_inverse_plain(u.S)[pr]
            emit(pnode, parea, Mp, Q, -1.0)
        else:
            Y = np.zeros((bord.size, 2 * K, 2 * K))
            if not bord.all():
                Y[~bord, :K, :K] = family_inverse_plain(u.S[~bord])
            Y[bord] = family_inverse_bordered(uf, j - 1, u, np.flatnonzero(bord), K)
            Nt = _packed_flat(u, ch, K)[r]
            F = np.concatenate([np.broadcast_to(Pc, Nt.shape), Nt], axis=2)
            Q = _scatter_sum(inv, M @ F, n_up)
            Yp = Y[pr]
            Mp = Q @ Yp[:, :, :K]
            emit(pnode, parea, Q @ Yp, Q, -1.0)
        M = Mp
    return pairs.node[-1], pairs.area[-1], M


def _same_node_terms(
    node: np.ndarray, ar: np.ndarray, left: np.ndarray, right: np.ndarray, n_areas: int
) -> np.ndarray:
    """``out[α, β] = Σ left_i right_jᵀ`` over every two pairs ``i`` (area α) and ``j`` (area β)
    of the same node: the cross terms of one level, ``(n_areas, n_areas, L, L)``. The
    combinations are built by ``repeat`` within runs of equal nodes (Σ m² of them, m the
    areas meeting a node), no loop over nodes."""
    order = np.argsort(node, kind="stable")
    _, first, count = np.unique(node[order], return_index=True, return_counts=True)
    m = np.repeat(count, count)  # per sorted pair: its node's number of pairs
    base = np.repeat(first, count)
    i = np.repeat(np.arange(order.size), m)
    j = np.repeat(base, m) + (np.arange(i.size) - np.repeat(np.cumsum(m) - m, m))
    i, j = order[i], order[j]
    L = left.shape[1]
    vals = np.einsum("pak,pbk->pab", left[i], right[j]).reshape(i.size, L * L)
    key = ar[i] * n_areas + ar[j]
    out = np.empty((n_areas * n_areas, L * L))
    for e in range(L * L):
        out[:, e] = np.bincount(key, weights=vals[:, e], minlength=n_areas * n_areas)
    return out.reshape(n_areas, n_areas, L, L)


def area_cross_sweep(
    forest: Forest,
    ups: Sequence[UpwardBelief],
    K: int,
    rows: np.ndarray,
    leaf: np.ndarray,
    area: np.ndarray,
    n_areas: int,
    P_root: np.ndarray,
    *,
    options: SweepOptions | None = None,
) -> np.ndarray:
    """Error covariances between the sums of leaves of *disjoint* areas, of the functionals
    ``rows`` ``(L, K)``: ``(n_areas, n_areas, L, L)``, ``out[α, β] = R Cov(e_α, e_β) Rᵀ``.

    The sweep of :func:`area_sweep` with the gains' rows ``R M`` carried instead of the
    gains (``R M_p = (Σ_c R M_c P_c) A_p`` is linear in ``R M_c``: ``L × K`` per pair, not
    ``K × K``), and each level's terms taken between every two pairs of the same node:
    ``e_α = M^α_root e_root + Σ_c M^α_c η_c`` and ``Cov(η_c, η_c') = δ_cc' P_c −
    P_c A_p P_c'`` (module docstring) give ``Cov(e_α, e_β) = Σ_c M^α_c P_c M^βᵀ_c −
    Σ_p Q^α_p A_p Q^βᵀ_p + M^α_root P̂_root M^βᵀ_root``, every sum over the nodes whose
    subtrees meet both areas (for α ≠ β no leaf term: the areas are disjoint). The diagonal
    is :func:`area_sweep`'s variance of ``R``'s rows (up to summation order). Cost
    ``O(Σ_levels Σ_nodes m² · L K + pairs · K²)``, ``m`` the areas meeting a node: one
    sweep, where the unions of every two areas took ``n_areas − 1`` sweeps of their blocks.

    Parameters
    ----------
    forest, ups, K, leaf, area, n_areas, P_root, options
        As :func:`area_sweep` (``options.start``'s ``M``, if given, are the rows ``R M``;
        ``options.to_root`` must be True: ``P_root`` is the top node's smoothed covariance,
        for a forest whose top level is one node).
    rows : numpy.ndarray
        ``(L, K)``: the functionals, in the problem's (scaled, identified) coordinates.

    Returns
    -------
    numpy.ndarray
        Symmetric in ``(α, a) ↔ (β, b)``.
    """
    o = options or SweepOptions()
    if not o.to_root:
        raise SpecError("area_cross_sweep: give the top node's covariance (to_root=True)")
    R = np.asarray(rows, dtype=np.float64)
    if o.start is None:
        leaf = np.asarray(leaf, np.int64)
        start = (leaf, np.asarray(area, np.int64), np.broadcast_to(R, (leaf.size, *R.shape)))
        o = dataclasses.replace(o, start=start)
    acc = np.zeros((n_areas, n_areas, R.shape[0], R.shape[0]))

    def emit(node: np.ndarray, ar: np.ndarray, left: np.ndarray, right: np.ndarray,
             sign: float) -> None:  # fmt: skip
        nonlocal acc
        term = _same_node_terms(node, ar, left, right, n_areas)
        acc = acc + term if sign > 0 else acc - term

    node, ar, M = _carry(forest, ups, K, leaf, area, n_areas, o, emit)
    emit(node, ar, M @ P_root, M, 1.0)
    return 0.5 * (acc + acc.transpose(1, 0, 3, 2))


def structured_area_covariance(setup: StructuredSetup, equivalency: Equivalency) -> BlockDiagonal:
    """Error covariance blocks ``(n_areas, n_S, n_S)`` of every area's sum of leaves under the
    structured GLS of ``setup`` (weighted geometry, or equal noise scales).

    The upward covariance pass is rerun from the setup with zero information vectors (the
    covariances do not depend on the values), one copy per block, then :func:`area_sweep`.

    Raises
    ------
    SpecError
        No covariance (Euclidean geometry with unequal noise scales), an equivalency of
        another hierarchy, or a problem that is not identifiable (naming level and block).
    """
    _check(setup, equivalency)
    h = setup.hierarchy
    forest = whole_forest(h)
    basis = setup.basis
    nA = equivalency.n_areas
    pairs = area_pairs(forest, equivalency.leaf, equivalency.area, nA)
    blocks: dict[int, np.ndarray] = {}
    for mask in basis.subsets:
        nS, kS = basis.block_size(mask), setup.k(mask)
        if kS == 0:
            blocks[mask] = np.zeros((nA, nS, nS))
            continue
        try:
            ups = general_up(forest, covariance_levels(setup, mask, 0, forest.sizes), kS, None)
            P0 = root_start(ups, kS, h.names[0])[1]
            cov = area_sweep(
                forest,
                ups,
                kS,
                equivalency.leaf,
                equivalency.area,
                nA,
                P0,
                options=SweepOptions(pairs=pairs),
            )
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
        blocks[mask] = _to_cells(setup, mask, cov)
    return BlockDiagonal(basis, blocks)


def query_block_rows(basis: MarginalBasis, query: ProductQuery) -> dict[int, np.ndarray]:
    """Per block ``S`` of ``basis``, ``(n_rows, n_S)``: row ``i`` of ``query`` as a functional
    of the block, weighted so that a row's variance under a covariance ``C`` is
    ``Σ_S r_S,i C_S r_S,iᵀ`` (:meth:`~censusdp.estimation.gls.marginal_basis.BlockDiagonal.
    query_variances`' terms: the group parts ``⊗_{a∈S} T_a[i_a, :r_a]`` times
    ``√∏_{a∉S} w_a[i_a]``, the within-group norms of the axes outside S). Blocks with no
    component are left out. The same holds for a cross covariance between two areas: every
    covariance of the basis repeats a block identically over its contrast indices."""
    if query.schema is not basis.schema:
        raise SpecError(f"query {query.name!r} is over another schema than {basis.schema.name!r}")
    t = [f.matrix @ a.basis for a, f in zip(basis.axes, query.factors, strict=True)]
    group = [ti[:, : a.r] for ti, a in zip(t, basis.axes, strict=True)]
    within = [(ti[:, a.r :] ** 2).sum(axis=1) for ti, a in zip(t, basis.axes, strict=True)]
    shape = query.row_shape
    idx = np.indices(shape).reshape(len(shape), -1)  # every row's per-axis index, C order
    out: dict[int, np.ndarray] = {}
    for mask in basis.subsets:
        ins = [a for a in range(len(t)) if mask >> a & 1]
        outs = [a for a in range(len(t)) if not mask >> a & 1]
        if any(not within[a].any() for a in outs):
            continue  # rows of whole groups on an axis outside S: no component here
        g = reduce(np.kron, [group[a] for a in ins], np.ones((1, 1)))
        gi = np.ravel_multi_index(idx[ins], [shape[a] for a in ins]) if ins else 0
        w = np.prod([within[a][idx[a]] for a in outs], axis=0) if outs else 1.0
        out[mask] = g[gi].reshape(query.n_rows, -1) * np.sqrt(w).reshape(-1, 1)
    return out


def area_query_covariance(
    setup: StructuredSetup,
    equivalency: Equivalency,
    query: ProductQuery,
    *,
    first: int = 0,
    top: dict[int, np.ndarray | None] | None = None,
) -> np.ndarray:
    """Error covariances between disjoint areas' sums of leaves, row by row of ``query``:
    ``(n_areas, n_areas, n_rows)`` (each row's covariance matrix of the areas; its diagonal
    the areas' variances of :func:`area_release`, up to summation order).

    One :func:`area_cross_sweep` per block of the basis that the rows touch
    (:func:`query_block_rows`), on the covariance upward pass rerun from ``setup``.

    Parameters
    ----------
    setup : StructuredSetup
    equivalency : Equivalency
        Disjoint areas (each leaf at most once).
    query : ProductQuery
        Over the setup's schema (e.g. the total: the areas' total populations).
    first : int
        The sweep's top level: 0 (the root, its smoothed covariance from the upward pass) or a
        level of one node whose smoothed covariance ``top`` gives (e.g. a state under the
        national pass, smoothed from the nation).
    top : dict, optional
        Block mask → ``(1, k_S, k_S)`` smoothed covariance of the level-``first`` node
        (scaled units), None for a block with nothing identified there.

    Raises
    ------
    SpecError
        As :func:`structured_area_covariance`; ``first > 0`` without ``top``.
    """
    _check(setup, equivalency)
    if first and top is None:
        raise SpecError("area_query_covariance: give the top node's covariance (first > 0)")
    h = setup.hierarchy
    ranges = [(0, n) for n in h.sizes[first:]]
    forest = Forest.of(h, first, ranges)
    nA = equivalency.n_areas
    shared = area_pairs(forest, equivalency.leaf, equivalency.area, nA)
    assert setup.vscale is not None
    out = np.zeros((nA, nA, query.n_rows))
    for mask, rows in query_block_rows(setup.basis, query).items():
        kS = setup.k(mask)
        if kS == 0 or (top is not None and top[mask] is None):
            continue
        V = setup.V[mask]
        R = rows if V is None else rows @ V
        try:
            ups = general_up(forest, covariance_levels(setup, mask, first, ranges), kS, None)
            P0 = root_start(ups, kS, h.names[0])[1] if top is None else top[mask]
            cov = area_cross_sweep(forest, ups, kS, R, equivalency.leaf, equivalency.area, nA,
                                   P0, options=SweepOptions(pairs=shared))  # fmt: skip
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
        out += np.diagonal(cov, axis1=2, axis2=3) * setup.vscale
    return out


def _check(setup: StructuredSetup, equivalency: Equivalency) -> None:
    h = setup.hierarchy
    if setup.vscale is None:
        raise SpecError(
            "this release has no covariances: the Euclidean projection with unequal noise "
            "scales has no tree-pass covariance; use geometry='weighted'"
        )
    if equivalency.n_leaves != h.leaves.size:
        raise SpecError(
            f"{equivalency.source}: the equivalency was read for {equivalency.n_leaves} leaves, "
            f"the release's hierarchy has {h.leaves.size}; read it against this hierarchy"
        )


def covariance_levels(
    setup: StructuredSetup, mask: int, first: int, ranges: Sequence[tuple[int, int]] | Sequence[int]
) -> list[LevelInputs]:
    """Block ``mask``'s levels ``first ..`` (node ranges, or whole levels of these sizes) with
    zero information vectors: what the covariance passes read."""
    kS = setup.k(mask)
    out = []
    for j, r in enumerate(ranges):
        rows = (0, int(r)) if np.isscalar(r) else (int(r[0]), int(r[1]))
        n = rows[1] - rows[0]
        J, H, _, _ = block_matrices(setup, mask, first + j, rows)
        Z = block_zeros(
            setup, mask, first + j, rows
        )  # structural zeros (docs/design.md § The Noisy Measurement File)
        out.append(LevelInputs(J, np.zeros((n, kS)), H, np.zeros((n, H.shape[0])),
                               J.shape[0] == 1, Z=Z))  # fmt: skip
    return out


def _to_cells(setup: StructuredSetup, mask: int, cov: np.ndarray) -> np.ndarray:
    """Scaled covariances in identified coordinates → the block's coordinates, variances."""
    V = setup.V[mask]
    assert setup.vscale is not None
    return (cov if V is None else V @ cov @ V.T) * setup.vscale


@dataclass(eq=False)
class AreaPartial:
    """What one partition sends up for the areas: per block, the partial sums of the levels
    below the cut ``(n_areas, k_S, k_S)``, the cut-level pairs ``(node, area, M)`` (node
    indices of the whole cut level) and the cut nodes' upward covariance message."""

    acc: dict
    pairs: dict
    messages: dict


def area_partition(
    setup: StructuredSetup,
    equivalency: Equivalency,
    cut: int,
    ranges: Sequence[tuple[int, int]],
) -> AreaPartial:
    """The streamed form, per partition: the area sweep over one partition's forest (levels
    ``cut ..`` leaf, node ranges ``ranges``) from its leaves' pairs up to its cut nodes.

    Partitions are independent (run them anywhere); :func:`area_top` finishes from all of
    them, in partition order, with the same result as :func:`structured_area_covariance`
    (up to floating-point summation order).
    """
    _check(setup, equivalency)
    forest = Forest.of(setup.hierarchy, cut, ranges)
    lo, hi = ranges[-1]
    inside = (equivalency.leaf >= lo) & (equivalency.leaf < hi)
    leaf, area = equivalency.leaf[inside] - lo, equivalency.area[inside]
    shared = area_pairs(forest, leaf, area, equivalency.n_areas)
    acc, pairs, messages = {}, {}, {}
    for mask in setup.basis.subsets:
        kS = setup.k(mask)
        if kS == 0:
            continue
        try:
            ups = general_up(forest, covariance_levels(setup, mask, cut, ranges), kS, None)
            acc[mask], (node, ar, M) = area_sweep(
                forest, ups, kS, leaf, area, equivalency.n_areas, np.zeros((1, kS, kS)),
                options=SweepOptions(to_root=False, pairs=shared),
            )  # fmt: skip
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
        pairs[mask] = (node + ranges[0][0], ar, M)
        messages[mask] = ups[0].message()
    return AreaPartial(acc, pairs, messages)


def area_top(
    setup: StructuredSetup, equivalency: Equivalency, cut: int, partials: Sequence[AreaPartial]
) -> BlockDiagonal:
    """The streamed form, top: the levels ``0 .. cut`` from every partition's
    :class:`AreaPartial` (in partition order, tiling the cut level)."""
    _check(setup, equivalency)
    h = setup.hierarchy
    forest = whole_forest(h, 0, cut)
    nA = equivalency.n_areas
    blocks: dict[int, np.ndarray] = {}
    for mask in setup.basis.subsets:
        nS, kS = setup.basis.block_size(mask), setup.k(mask)
        if kS == 0:
            blocks[mask] = np.zeros((nA, nS, nS))
            continue
        msg = concat_messages([p.messages[mask] for p in partials], kS)
        levels: list = [*covariance_levels(setup, mask, 0, h.sizes[:cut]), None]
        start = tuple(np.concatenate([p.pairs[mask][i] for p in partials]) for i in range(3))
        try:
            ups = general_up(forest, levels, kS, msg)
            P0 = root_start(ups, kS, h.names[0])[1]
            cov = area_sweep(
                forest, ups, kS, start[0], start[1], nA, P0, options=SweepOptions(start=start)
            )
        except SpecError as err:
            raise block_error(setup.schema, mask, err) from None
        cov = cov + sum(p.acc[mask] for p in partials)
        blocks[mask] = _to_cells(setup, mask, 0.5 * (cov + cov.swapaxes(-1, -2)))
    return BlockDiagonal(setup.basis, blocks)


@dataclass(frozen=True, eq=False)
class AreaEstimates(BlockEstimates):
    """Estimates of off-spine areas (sums of leaves) with their exact error covariances.

    Query it as a level named ``name`` (or 0): ``query_estimates(name, q)``,
    ``query_standard_errors(name, q)``, ``node_covariance(name, a)``; rows that touch an
    unidentified component are NaN, as for the release's levels.

    Attributes
    ----------
    name : str
        What the areas are (``"place"``).
    codes : numpy.ndarray
        Area codes, area ``a`` is ``codes[a]``.
    leaves : numpy.ndarray
        Number of leaves of every area.
    schema, basis, identified
        As for :class:`~censusdp.estimation.gls.structured.StructuredRelease`.
    estimates : tuple of one numpy.ndarray
        ``(n_areas, *schema.shape)`` (empty for a prediction).
    covariances : tuple of one BlockDiagonal
        Blocks ``(n_areas, n_S, n_S)``.
    privacy : PrivacyStatement or None
        The release's (post-processing: unchanged).
    """

    name: str
    codes: np.ndarray
    leaves: np.ndarray
    schema: Schema
    basis: MarginalBasis
    estimates: tuple[np.ndarray, ...]
    covariances: tuple[BlockDiagonal, ...] | None
    identified: BlockDiagonal
    privacy: PrivacyStatement | None = None
    _rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def _index(self, level: str | int) -> int:
        if level in (self.name, 0):
            return 0
        raise SpecError(f"these are the {self.name!r} areas; ask for level {self.name!r}")

    def _level_names(self) -> tuple[str, ...]:
        return (self.name,)

    def level_codes(self, level: str | int) -> np.ndarray:
        self._index(level)
        return self.codes

    @property
    def n_areas(self) -> int:
        return int(self.codes.shape[0])

    def level(self, level: str | int) -> np.ndarray:
        if not self.estimates:
            raise SpecError(
                f"a prediction has standard errors of the {self.name!r} areas but no estimates "
                "(no noise was drawn)"
            )
        return super().level(level)

    def query_variances(self, level: str | int, query: ProductQuery | str) -> np.ndarray:
        """Error variances of every row of ``query`` for every area, ``(n_areas, n_rows)``;
        NaN for unidentified rows."""
        self._index(level)
        q = self._query(query)
        assert self.covariances is not None
        var = np.maximum(self.covariances[0].query_variances(q), 0.0)
        return np.where(self.identified_rows(q)[None, :], var, np.nan)


def area_release(release: StructuredRelease, equivalency: Equivalency) -> AreaEstimates:
    """Every area's estimate (the sum of its leaves' estimates) and exact error covariance.

    Parameters
    ----------
    release : StructuredRelease
        From :func:`~censusdp.estimation.gls.structured.structured_gls` (it keeps its setup).
    equivalency : Equivalency
        Read against ``release.hierarchy``.

    Returns
    -------
    AreaEstimates
        Post-processing of the release: the same privacy statement.

    Raises
    ------
    SpecError
        A release without its setup or covariances, or an equivalency of another hierarchy.
    """
    if release.setup is None:
        raise SpecError("this release does not carry its setup; build it with structured_gls")
    cov = structured_area_covariance(release.setup, equivalency)
    return AreaEstimates(
        name=equivalency.name,
        codes=equivalency.codes,
        leaves=equivalency.leaves_per_area(),
        schema=release.schema,
        basis=release.basis,
        estimates=(equivalency.sum_leaves(release.estimates[-1]),),
        covariances=(cov,),
        identified=release.identified,
        privacy=release.privacy,
    )


def tree_area_covariance(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    equivalency: Equivalency,
    *,
    geometry: Geometry = "weighted",
) -> np.ndarray:
    """Error covariances ``(n_areas, K, K)`` of sums of leaves under the tree GLS of plain
    tables (:func:`~censusdp.estimation.gls.tree.tree_gls`, e.g. one-cell population counts).

    The same sweep on the kernel's upward covariance pass (its levels built as
    :func:`~censusdp.estimation.gls.tree.gls_upward` builds them). Cost
    ``O(nodes · K³)``: meant for tables of few cells (schema histograms: the structured form).

    Raises
    ------
    SpecError
        As :func:`~censusdp.estimation.gls.tree.tree_gls`; no covariance (Euclidean geometry
        with unequal noise scales); an equivalency of another hierarchy.
    """
    plan, meas, invs = gls_plan(hierarchy, cells, measurements, invariants, geometry)
    if plan.vscale is None:
        raise SpecError(
            "the Euclidean projection with unequal noise scales has no tree-pass covariance; "
            "use geometry='weighted'"
        )
    if equivalency.n_leaves != hierarchy.leaves.size:
        raise SpecError(
            f"{equivalency.source}: the equivalency was read for {equivalency.n_leaves} leaves, "
            f"the hierarchy has {hierarchy.leaves.size}; read it against this hierarchy"
        )
    forest = whole_forest(hierarchy)
    K = plan.K
    ups = general_up(forest, level_inputs(forest, plan, meas, invs), K, None)
    cov = area_sweep(
        forest, ups, K, equivalency.leaf, equivalency.area, equivalency.n_areas,
        root_start(ups, K, hierarchy.names[0])[1],
    )  # fmt: skip
    return cov * plan.vscale
