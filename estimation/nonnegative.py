"""The non-negative product: non-negative, integer, consistent histograms from a GLS release.

The unbiased release (structured GLS, then unbiased rounding,
:mod:`censusdp.estimation.structured_rounding`) has negative counts in small areas, as any
unbiased estimate of small counts must. Consistent, non-negative integer microdata cannot
also be unbiased (the uncertainty principle for private microdata), so a release ships both
products from one run and says which is which. This module makes the second one from the
*same* GLS estimates — post-processing, hence under the same privacy statement — top down,
in the shape of the unbiased rounding: :func:`nonnegative_top` for the levels down to a cut
level, :func:`nonnegative_partition` for one partition's subtrees below it from its cut
nodes' integers (memory of one partition; the integers do not depend on the partitioning).

**One level down.** Given a parent's non-negative integer histogram ``N`` and its children's
GLS estimates ``z``, the children's real values are the Euclidean projection of ``z`` onto
``{x ≥ 0, Σ_children x = N}`` cell by cell. The set is a product of scaled simplices, one
per (parent, cell), so the projection is exact by sorting (Held, Wolfe & Crowder 1974;
Duchi, Shalev-Shwartz, Singer & Chandra 2008): ``x_i = max(z_i − θ, 0)`` with ``θ`` from the
sorted values' running sums, for every (parent, cell) at once (:func:`project_children`).
They are then rounded by the conditioned systematic sampling of the unbiased rounding
(Madow 1949): every child cell goes to ⌊x⌋ or ⌈x⌉ with mean ``x``, and the children sum to
their parent's integer cell by cell, so every cell is non-negative and every marginal of
every node is the sum of its children's.

**The top.** The invariants (pl94: the nation and state totals) are held at the root and its
children as the unbiased rounding holds them. Each node of the level that carries them (the
root's children when they have invariants, else the root) has its cells projected onto
``{x ≥ 0, Σ_{atom} x = t_atom}``, an atom being a set of cells that every invariant row holds
or leaves whole (:func:`~censusdp.estimation.structured_rounding.top_shape`) and ``t_atom``
its sum, fixed by the invariants. Atoms are disjoint, so this is one simplex projection per
(node, atom) (cells in no invariant row are clipped at zero). The projected values are then
rounded by :func:`~censusdp.estimation.structured_rounding.round_structured_top` itself
(controlled rounding of the children, or pipage rounding of the root, on the invariants'
laminar family), which keeps every invariant ``==``; the root is the sum of its children.

**Bias.** The projection moves mass from cells estimated below zero to the rest of their
parent: small cells are biased up, and large ones down (the small-area bias of the Census
Bureau's TopDown algorithm, which solves the same kind of non-negative least-squares
problem level by level). The rounding adds no bias to the projection. This product is
labelled biased (:data:`BIASED_NOTE`) and carries no standard errors; its bias per size class
is estimated by simulation from the released numbers
(:mod:`censusdp.pipelines.size_class_report`).

References
----------
Held, M., Wolfe, P. & Crowder, H. P. (1974). Validation of subgradient optimization. Math.
    Programming 6 (projection onto a simplex by sorting).
Duchi, J., Shalev-Shwartz, S., Singer, Y. & Chandra, T. (2008). Efficient projections onto
    the ℓ1-ball for learning in high dimensions. ICML.
Madow, W. G. (1949). On the theory of systematic sampling, II. Ann. Math. Stat. 20(3).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (non-negative least squares per parent).
Gong, R., Groshen, E. L. & Vadhan, S. (eds.) (2022); Kifer, D. et al. (2022), on the
    impossibility of microdata that are consistent, non-negative and unbiased.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls import Forest, whole_forest
from censusdp.estimation.rounding import TOL, uniform_draws
from censusdp.estimation.structured_rounding import (
    RoundedLevels,
    cell_matrix,
    check_roundable,
    round_children,
    round_structured_top,
    top_shape,
)
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

__all__ = [
    "BIASED_NOTE",
    "LABEL",
    "nonnegative_partition",
    "nonnegative_structured",
    "nonnegative_top",
    "project_children",
    "project_simplex",
]

LABEL = "nonnegative/structured"
#: How the product is labelled wherever it is written.
BIASED_NOTE = (
    "non-negative product: non-negative, integer and consistent (every table sums from the "
    "block histograms, invariants exact), made from the same GLS estimates as the unbiased "
    "product (post-processing, same privacy statement); it is BIASED (small counts up, large "
    "ones down) and has no standard errors — use the unbiased product, with its standard "
    "errors, for estimates and intervals"
)

#: Padded values worked on at a time by :func:`project_children` (float64s per temporary).
_CHUNK_VALUES = 1 << 20


def project_simplex(z: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Euclidean projection of every lane ``z[p, :, c]`` onto ``{v ≥ 0, Σ v = total[p, c]}``.

    Parameters
    ----------
    z : (P, m, K) float array
        Values along axis 1, padded with ``-inf`` (padding stays 0 in the result).
    total : (P, K) array, non-negative

    Returns
    -------
    (P, m, K) float array
        ``max(z − θ, 0)`` with ``θ`` the sorting threshold (Held et al. 1974; Duchi et al.
        2008). Each lane's result depends on that lane alone (sorts and running sums along
        axis 1), so it does not depend on how lanes are batched.
    """
    m = z.shape[1]
    u = -np.sort(-z, axis=1)
    finite = np.isfinite(u)
    css = np.cumsum(np.where(finite, u, 0.0), axis=1) - total[:, None, :]
    j = np.arange(1, m + 1, dtype=np.float64)[None, :, None]
    k = np.maximum(np.sum(finite & (u - css / j > 0.0), axis=1), 1)  # total 0: θ = max z
    theta = np.take_along_axis(css, (k - 1)[:, None, :], axis=1)[:, 0, :] / k
    return np.maximum(z - theta[:, None, :], 0.0)


def project_children(
    x: np.ndarray, parent: np.ndarray, count: np.ndarray, *, chunk: int = _CHUNK_VALUES
) -> np.ndarray:
    """Project the children of every parent onto ``{x ≥ 0, Σ_children x = parent}``, cell by cell.

    Parameters
    ----------
    x : (n_children, K) float
        Children sorted by parent (``count[0]`` children of parent 0 first, ...).
    parent : (n_parents, K)
        Non-negative targets (the parents' integer cells).
    count : (n_parents,) int
        Children per parent.
    chunk : int
        Padded values per batch (memory bound).

    Returns
    -------
    (n_children, K) float
        The projection (:func:`project_simplex` per (parent, cell)). Only the lanes whose
        parent cell is positive are worked on (the others project to 0), gathered as rows of
        their children's values; parents are batched by their number of children (powers of
        two, so padding at most doubles the work). Each result depends on its own
        (parent, cell) alone, so not on the batching.
    """
    x = np.asarray(x, dtype=np.float64)
    count = np.asarray(count, dtype=np.int64)
    parent = np.asarray(parent, dtype=np.float64)
    out = np.zeros_like(x)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    has = np.flatnonzero(count > 0)
    if has.size == 0:
        return out
    bucket = np.ceil(np.log2(count[has])).astype(np.int64)
    for b in np.unique(bucket):
        ps = has[bucket == b]
        lane_p, lane_c = np.nonzero(parent[ps] > 0)
        m = int(count[ps].max())
        pos = np.arange(m)
        step = max(1, chunk // m)
        for a in range(0, lane_p.size, step):
            p = ps[lane_p[a : a + step]]
            c = lane_c[a : a + step]
            valid = pos[None, :] < count[p][:, None]
            rows = np.where(valid, start[p][:, None] + pos[None, :], 0)
            z = np.where(valid, x[rows, c[:, None]], -np.inf)
            v = project_simplex(z[:, :, None], parent[p, c][:, None])[:, :, 0]
            out[rows[valid], np.broadcast_to(c[:, None], rows.shape)[valid]] = v[valid]
    return out


def _atoms(shape, level: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Atom of every cell at ``level`` and whether each atom's sum is fixed by the invariants."""
    if level == 1:
        atoms = shape.atoms
    else:
        rows = [np.asarray(iv.query.matrix) != 0 for iv in shape.invariants if iv.level == 0]
        if not rows:
            return np.zeros(K, np.int64), np.zeros(1, bool)
        atoms = np.unique(np.vstack(rows).T, axis=0, return_inverse=True)[1].reshape(-1)
    held = np.zeros(K, bool)
    for iv in shape.invariants:
        if iv.level == level:
            held |= (np.asarray(iv.query.matrix) != 0).any(axis=0)
    n = int(atoms.max()) + 1
    return atoms, np.bincount(atoms, weights=held, minlength=n) > 0


def _project_top(x: np.ndarray, atoms: np.ndarray, fixed: np.ndarray, level: str) -> np.ndarray:
    """Each node's cells onto ``{x ≥ 0, Σ_atom x = t_atom}`` for the fixed atoms (sums of the
    GLS estimate, which meets the invariants, are the integers they fix); clipped elsewhere."""
    out = np.maximum(x, 0.0)
    for a in np.flatnonzero(fixed):
        cols = np.flatnonzero(atoms == a)
        s = x[:, cols].sum(axis=1)
        t = np.round(s)
        if np.any(np.abs(s - t) > 1e-6 * np.maximum(1.0, np.abs(t))) or np.any(t < 0):
            raise DataError(
                f"non-negative product, level {level!r}: the estimates do not meet the "
                "invariants (a held sum is not a non-negative integer); pass the invariants "
                "the GLS release was computed with"
            )
        out[:, cols] = project_simplex(x[:, cols][:, :, None], t[:, None])[:, :, 0]
    return out


def _descend(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    counts: np.ndarray,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    schema: Schema,
    label: str,
    tol: float,
) -> list[np.ndarray]:
    """Levels ``1 ..`` of ``forest`` from the non-negative integers of its level 0."""
    cells = schema.cells
    out = []
    parent = counts
    for j in range(1, forest.depth):
        name = forest.names[j]
        x = cell_matrix(schema, estimates[j - 1], f"level {name!r}").astype(np.float64, copy=False)
        if x.shape[0] != forest.sizes[j]:
            raise SpecError(
                f"level {name!r}: {x.shape[0]} estimate rows for {forest.sizes[j]} nodes"
            )
        check_roundable(x, name, None, cells)
        K = x.shape[1]
        n_up, lo_up = forest.sizes[j - 1], lo[j - 1]
        proj = project_children(x, parent, forest.child_count[j - 1])
        v = rng.draw(
            f"{label}/{name}", n_global[j - 1] * K, lo_up * K, (lo_up + n_up) * K, uniform_draws
        ).reshape(n_up, K)
        parent, _ = round_children(
            parent, proj, forest.child_count[j - 1], v, None, (name, forest, j - 1, cells), tol
        )
        out.append(parent.reshape(-1, *schema.shape))
    return out


def nonnegative_top(
    hierarchy: Hierarchy,
    schema: Schema,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    *,
    invariants: Sequence[ProductInvariant] = (),
    label: str = LABEL,
    tol: float = TOL,
) -> RoundedLevels:
    """The non-negative product's levels from the root down to a cut level.

    Parameters
    ----------
    hierarchy : Hierarchy
    schema : Schema
    estimates : sequence of arrays
        The GLS release's real consistent cell tensors ``(n_nodes, *schema.shape)`` of
        levels ``0 .. cut``.
    rng : KeyedRNG
        Draws from the streams ``label/...`` (keyed by parent node, as the unbiased
        rounding's: give a different ``label`` from it).
    invariants : sequence of ProductInvariant
        The invariants the GLS release meets, at the root and its children only; held ``==``.

    Returns
    -------
    RoundedLevels
        int64 non-negative counts of levels ``0 .. cut`` (no spreads); pass the cut level's
        rows of a partition to :func:`nonnegative_partition`.

    Raises
    ------
    SpecError
        Invariants the structured rounding cannot hold, shapes that do not match.
    DataError
        Non-finite estimates, or estimates that do not meet the invariants.

    References
    ----------
    Held et al. (1974); Duchi et al. (2008); Madow (1949); Cox (1987); Ageev & Sviridenko (2004).
    """
    shape = top_shape(hierarchy, schema, invariants)
    cut = len(estimates) - 1
    if cut < 0 or cut >= hierarchy.depth:
        raise SpecError(f"give the estimates of levels 0 .. cut (1 to {hierarchy.depth} levels)")
    if shape.atoms is not None and cut < 1:
        raise SpecError(
            f"the invariants at level {hierarchy.names[1]!r} are held with the root: the cut "
            "must be that level or deeper"
        )
    K = schema.n_cells
    xs = []
    for k, e in enumerate(estimates):
        x = cell_matrix(schema, e, f"level {hierarchy.names[k]!r}").astype(np.float64, copy=False)
        if x.shape[0] != hierarchy.levels[k].size:
            raise SpecError(
                f"level {hierarchy.names[k]!r}: {x.shape[0]} estimate rows for "
                f"{hierarchy.levels[k].size} nodes"
            )
        check_roundable(x, hierarchy.names[k], hierarchy.levels[k].codes, schema.cells)
        xs.append(x)
    joint = shape.joint_level
    atoms, fixed = _atoms(shape, joint, K)
    proj = _project_top(xs[joint], atoms, fixed, hierarchy.names[joint])
    top = [proj.sum(axis=0, keepdims=True), proj] if joint == 1 else [proj]
    shp = tuple(schema.shape)
    head = round_structured_top(
        hierarchy,
        schema,
        [t.reshape(-1, *shp) for t in top],
        rng,
        invariants=invariants,
        spreads=False,
        label=label,
        tol=tol,
    )
    counts = list(head.counts)
    start = len(counts) - 1
    if cut > start:
        f = whole_forest(hierarchy, start, cut)
        counts += _descend(
            f,
            [0] * f.depth,
            f.sizes,
            counts[-1].reshape(-1, K),
            estimates[start + 1 :],
            rng,
            schema,
            label,
            tol,
        )
    return RoundedLevels(counts[: cut + 1], None)


def nonnegative_partition(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    schema: Schema,
    cut_counts: np.ndarray,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    *,
    label: str = LABEL,
    tol: float = TOL,
) -> RoundedLevels:
    """One partition's levels below the cut, from its cut nodes' non-negative integers.

    Parameters
    ----------
    forest : Forest
        The partition's levels ``cut .. leaf`` (local indices; :meth:`Forest.of`).
    lo, n_global : sequences of int
        Per forest level, the global index of the partition's first node and the level's
        global size (draws are keyed by global parent node).
    schema : Schema
    cut_counts : (n_cut, *schema.shape) int64
        The partition's rows of :func:`nonnegative_top`'s last level.
    estimates : sequence of arrays
        The partition's GLS cell tensors of levels ``cut + 1 .. leaf``.
    rng, label, tol
        As for :func:`nonnegative_top` (the same ``rng`` and ``label``).

    Returns
    -------
    RoundedLevels
        Levels ``cut + 1 .. leaf``: the same integers, bit for bit, as any other
        partitioning (or none) gives for these nodes.
    """
    if len(estimates) != forest.depth - 1:
        raise SpecError(
            f"give the partition's estimates of the {forest.depth - 1} levels below the cut"
        )
    c = np.asarray(cell_matrix(schema, cut_counts, "cut counts"))
    if c.shape[0] != forest.sizes[0]:
        raise SpecError(f"cut counts have {c.shape[0]} rows for {forest.sizes[0]} cut nodes")
    if c.dtype.kind not in "iu" or (c.size and int(c.min()) < 0):
        raise SpecError("cut counts must be non-negative integers (nonnegative_top's output)")
    counts = _descend(forest, lo, n_global, c.astype(np.int64), estimates, rng, schema, label, tol)
    return RoundedLevels(counts, None)


def nonnegative_structured(
    release,
    rng: KeyedRNG,
    *,
    invariants: Sequence[ProductInvariant] = (),
    label: str = LABEL,
    tol: float = TOL,
) -> RoundedLevels:
    """The non-negative product of a :class:`~censusdp.estimation.structured_gls.StructuredRelease`
    in memory (every level in one :func:`nonnegative_top`; the integers are those of any
    streamed run with the same ``rng``)."""
    return nonnegative_top(
        release.hierarchy,
        release.schema,
        release.estimates,
        rng,
        invariants=invariants,
        label=label,
        tol=tol,
    )
