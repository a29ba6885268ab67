"""The non-negative product: non-negative, integer, consistent histograms from a GLS release.

The unbiased release (structured GLS, then unbiased rounding,
:mod:`censusdp.estimation.integer.controlled`) has negative counts in small areas, as any
unbiased estimate of small counts must. Consistent, non-negative integer microdata cannot
also be unbiased (the uncertainty principle for private microdata), so a release ships both
products from one run and says which is which. This module makes the second one from the
*same* GLS estimates — post-processing, hence under the same privacy statement — top down,
in the shape of the unbiased rounding: :func:`nonnegative_top` for the levels down to a cut
level, :func:`nonnegative_partition` for one partition's subtrees below it from its cut
nodes' integers (memory of one partition; the integers do not depend on the partitioning).

**One level down: totals first, then the detail.** Given a parent's non-negative integer
histogram ``N`` (total ``n``) and its children's GLS estimates ``z``, as the Census Bureau's
TopDown algorithm solves each parent's children (Abowd et al. 2022):

1. *Totals.* The children's GLS totals ``z_i = Σ_c z_ic`` are projected onto
   ``{t ≥ 0, Σ_i t_i = n}`` — one simplex projection per parent, exact by sorting (Held,
   Wolfe & Crowder 1974; Duchi, Shalev-Shwartz, Singer & Chandra 2008) — and rounded by
   the conditioned systematic sampling of the unbiased rounding (Madow 1949): integers
   ``T_i ∈ {⌊t_i⌋, ⌈t_i⌉}`` with mean ``t_i`` and ``Σ T_i = n`` exactly. An empty area's
   total is its GLS total's positive part, of the order of that total's noise.
2. *Cells.* The (children × cells) matrix ``z`` is projected in Euclidean norm onto the
   transportation polytope ``{X ≥ 0, Σ_c X_ic = T_i, Σ_i X_ic = N_c}`` (non-empty: both
   margins sum to ``n``) by exact dual block-coordinate ascent (:func:`project_transport`:
   ``X = max(0, z + α_i + β_c)``, each row's and each column's step a simplex threshold;
   Ohuchi & Kaji 1984; Gaffke & Mathar 1989; linear convergence, Luo & Tseng 1993), to
   every row sum within :data:`TRANSPORT_TOL` × the parent's total, and rounded with both
   margins exact by dependent rounding of its fractional parts (Gandhi, Khuller,
   Parthasarathy & Srinivasan 2006, :mod:`~censusdp.estimation.integer.dependent`):
   every entry ``⌊X⌋`` or ``⌈X⌉`` with mean ``X``, every child's total ``T_i``, and the
   children sum to the parent cell by cell.

So every cell is non-negative, every marginal of every node is the sum of its children's,
and each child's total is the one pass 1 gave it. Projecting each (parent, cell) onto its
own simplex instead (the previous construction) leaves the totals free: clipping the
negative cells of an empty area adds mass cell after cell (a county with no persons got
396 on a synthetic state). Uniforms are keyed by level and global node index (the
totals' by parent, the cells' by child row), so the integers do not depend on the
partitioning.

**The top.** The invariants (pl94: the nation and state totals) are held at the root and its
children as the unbiased rounding holds them. Each node of the level that carries them (the
root's children when they have invariants, else the root) has its cells projected onto
``{x ≥ 0, Σ_{atom} x = t_atom}``, an atom being a set of cells that every invariant row holds
or leaves whole (:func:`~censusdp.estimation.integer.controlled.top_shape`) and ``t_atom``
its sum, fixed by the invariants. Atoms are disjoint, so this is one simplex projection per
(node, atom) (cells in no invariant row are clipped at zero). The projected values are then
rounded by :func:`~censusdp.estimation.integer.controlled.round_structured_top` itself
(controlled rounding of the children, or pipage rounding of the root, on the invariants'
laminar family), which keeps every invariant ``==``; the root is the sum of its children.

**Bias.** The projection moves mass from cells estimated below zero to the rest of their
parent: small cells are biased up, and large ones down (the small-area bias of the Census
Bureau's TopDown algorithm, which solves the same kind of non-negative least-squares
problem level by level); the totals pass does the same to the children's totals. The
rounding adds no bias to the projections (beyond entries within the rounding's float
tolerance of an integer, which it takes as integral). This product is
labelled biased (:data:`BIASED_NOTE`) and carries no standard errors; its bias per size class
is estimated by simulation from the released numbers
(:mod:`censusdp.pipelines.size_class_report`).

*How well that estimate holds* (measured, ``benchmarks/nonnegative_product.py --bias-check
8``: a synthetic state of 4,000 blocks, seed 1, the 2020 allocation; bias at the truth =
mean signed block error of 8 releases, simulated = of 8 replicates from release 0, ± their
standard errors): by block size class 0 / 1–9 / 10–99 / 100–999 persons the bias at the
truth was +6.74 ± 0.05, +3.46 ± 0.15, −6.27 ± 0.12, −13.21 ± 0.57 and the simulation gave
+6.23 ± 0.16, +3.69 ± 0.19, −8.51 ± 0.17, −12.10 ± 0.82: every sign right, 0.92, 1.07, 1.36
and 0.92 times the size — too small in some classes and too large in others, not uniformly
smaller (seed 2, 6 runs: 0.99, 1.00, 1.42, 1.13; the 10–99 class is overstated in both, and
an audit's run saw 0.82–1.71). The release is not a smoothed truth: the totals projection
sets to zero every block whose GLS total lies below its parent's threshold, so the release
has *more* empty blocks than the truth (2,092 against 1,267; seed 2: 2,057 against 1,257)
and far fewer of 1–9 persons (340 against 1,064). The simulation thus runs at a truth with
more zeros and fewer small blocks, and the bias there differs from the bias at the real
truth in either direction: read its sign and its order of magnitude, not its size to better
than a factor of about 2.

References
----------
Held, M., Wolfe, P. & Crowder, H. P. (1974). Validation of subgradient optimization. Math.
    Programming 6 (projection onto a simplex by sorting).
Duchi, J., Shalev-Shwartz, S., Singer, Y. & Chandra, T. (2008). Efficient projections onto
    the ℓ1-ball for learning in high dimensions. ICML.
Madow, W. G. (1949). On the theory of systematic sampling, II. Ann. Math. Stat. 20(3).
Ohuchi, A. & Kaji, I. (1984). Lagrangian dual coordinatewise maximization algorithm for
    network transportation problems with quadratic costs. Networks 14(4).
Dykstra, R. L. (1983). An algorithm for restricted least squares regression. JASA 78(384).
Gaffke, N. & Mathar, R. (1989). A cyclic projection algorithm via duality. Metrika 36
    (Dykstra's cyclic projections as dual coordinate ascent).
Luo, Z.-Q. & Tseng, P. (1993). On the convergence rate of dual ascent methods for linearly
    constrained convex minimization. Math. Oper. Res. 18(4).
Gandhi, R., Khuller, S., Parthasarathy, S. & Srinivasan, A. (2006). Dependent rounding and
    its applications to approximation algorithms. J. ACM 53(3).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (non-negative least squares per parent).
Gong, R., Groshen, E. L. & Vadhan, S. (eds.) (2022); Kifer, D. et al. (2022), on the
    impossibility of microdata that are consistent, non-negative and unbiased.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from censusdp.errors import ConvergenceError, DataError, SpecError
from censusdp.estimation.integer.controlled import (
    RoundedLevels,
    cell_matrix,
    check_roundable,
    round_children,
    round_structured_top,
    top_shape,
)
from censusdp.estimation.integer.dependent import (
    DR_TOL,
    dependent_round,
    keyed_uniforms,
    settle_margins,
)
from censusdp.estimation.integer.laminar import TOL, uniform_draws
from censusdp.estimation.integer.transport_kernel import transport_batch
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.rng import KeyedRNG, SubKeys, chunk_range
from censusdp.schema import Schema

__all__ = [
    "BIASED_NOTE",
    "LABEL",
    "nonnegative_partition",
    "partition_keys",
    "nonnegative_structured",
    "nonnegative_top",
    "project_children",
    "project_simplex",
    "project_transport",
]

LABEL = "nonnegative/structured"
#: How the product is labelled wherever it is written.
BIASED_NOTE = (
    "non-negative product: non-negative, integer and consistent (every table sums from the "
    "block histograms, invariants exact), made from the same GLS estimates as the unbiased "
    "product (what that makes it, privacy-wise, privacy.md says); it is BIASED (small counts up, large "
    "ones down) and has no standard errors — use the unbiased product, with its standard "
    "errors, for estimates and intervals"
)

#: Padded values worked on at a time by :func:`project_children` and
#: :func:`project_transport` (float64s per temporary).
_CHUNK_VALUES = 1 << 20
#: :func:`project_transport` stops once every row sum is within this × max(1, parent total).
TRANSPORT_TOL = 1e-13
#: Sweeps of :func:`project_transport` before a ConvergenceError.
TRANSPORT_MAX_SWEEPS = 100_000


def _threshold(z: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The simplex threshold of every lane ``z[p, :, c]`` (``-inf`` padding): the ``θ`` with
    ``Σ max(z − θ, 0) = total[p, c]`` (Held et al. 1974; Duchi et al. 2008), from the sorted
    lane's running sums. The sums run along axis 1 one element after another, so a lane's
    ``θ`` depends on that lane alone, not on the other lanes nor on padding at its end."""
    m = z.shape[1]
    u = -np.sort(-z, axis=1)
    finite = np.isfinite(u)
    css = np.cumsum(np.where(finite, u, 0.0), axis=1) - total[:, None, :]
    j = np.arange(1, m + 1, dtype=np.float64)[None, :, None]
    k = np.maximum(np.sum(finite & (u - css / j > 0.0), axis=1), 1)  # total 0: θ = max z
    return np.take_along_axis(css, (k - 1)[:, None, :], axis=1)[:, 0, :] / k


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
    return np.maximum(z - _threshold(z, total)[:, None, :], 0.0)


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


def _ranges(first: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(first[i], first[i] + length[i])``."""
    n = int(length.sum())
    off = np.repeat(np.cumsum(length) - length, length)
    return np.repeat(first, length) + (np.arange(n) - off)


def project_transport(
    z: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    count: np.ndarray,
    *,
    tol: float = TRANSPORT_TOL,
    max_sweeps: int = TRANSPORT_MAX_SWEEPS,
    chunk: int = _CHUNK_VALUES,
    where: str = "",
) -> tuple[np.ndarray, int]:
    """Project each parent's (children × cells) matrix onto its transportation polytope.

    For parent ``p`` with children ``i`` and cells ``c``, the Euclidean projection of
    ``z`` onto ``{X ≥ 0, Σ_c X_ic = rows_i, Σ_i X_ic = cols_pc}`` (a quadratic
    transportation problem). Its Lagrangian dual is separable: ``X = max(0, z_ic + α_i +
    β_c)``, and maximising the dual over all ``α`` with ``β`` fixed is one simplex
    threshold per row (each row's sum is then exact), over all ``β`` with ``α`` fixed one
    per column — exact dual block-coordinate ascent (Ohuchi & Kaji 1984; the dual view of
    Dykstra's 1983 cyclic projections, Gaffke & Mathar 1989), which converges linearly for
    strictly convex quadratics under linear constraints (Luo & Tseng 1993). Each sweep ends
    on the columns, so the cells' sums are exact; the sweeps stop for a parent once every
    row sum is within ``tol · max(1, parent total)`` of its target (primal feasibility,
    checked on ``X`` itself).

    Rows with target 0 and columns with target 0 are 0 and left out; each parent works on
    its other rows × columns only, batched with parents of similar shape (powers of two),
    every batch vectorised, at most ``chunk`` padded values at a time. A parent's result
    depends on its own numbers alone (frozen when it converges; sums along lanes are
    sequential), so not on the batching.

    Parameters
    ----------
    z : (n_children, K) float
        Children sorted by parent.
    rows : (n_children,) non-negative
        Children's targets (integer totals).
    cols : (n_parents, K) non-negative
        Parents' targets (integer cells); ``Σ cols[p] = Σ rows of p's children``.
    count : (n_parents,) int
        Children per parent.
    where : str
        What the matrices are, for messages (e.g. ``"level 'tract'"``).

    Returns
    -------
    X : (n_children, K) float
    sweeps : int
        The largest number of sweeps any parent took.

    Raises
    ------
    DataError
        Negative targets, or a parent whose children's targets do not sum to its own.
    ConvergenceError
        A parent not within the tolerance after ``max_sweeps`` sweeps.
    """
    z = np.asarray(z, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    cols = np.asarray(cols, dtype=np.float64)
    count = np.asarray(count, dtype=np.int64)
    n_p, K = cols.shape
    par = np.repeat(np.arange(n_p), count)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    total = cols.sum(axis=1)
    bound = tol * np.maximum(1.0, total)
    _check_transport_targets(rows, cols, par, total, bound, where)
    out = np.zeros_like(z)
    act_r, act_c = rows > 0, cols > 0
    nr = np.bincount(par[act_r], minlength=n_p)
    kc = act_c.sum(axis=1)
    has = np.flatnonzero(nr > 0)
    if has.size == 0:
        return out, 0
    key = np.ceil(np.log2(nr[has])).astype(np.int64) * 64 + np.ceil(np.log2(kc[has]))
    most = 0
    for kv in np.unique(key):
        ps = has[key == kv]
        n, k = int(nr[ps].max()), int(kc[ps].max())
        step = max(1, chunk // (n * k))
        for a0 in range(0, ps.size, step):
            p = ps[a0 : a0 + step]
            children = _ranges(start[p], count[p])
            R, vr = _padded(
                np.repeat(np.arange(p.size), nr[p]), children[act_r[children]], nr[p], n
            )
            C, vc = _padded(*np.nonzero(act_c[p]), kc[p], k)
            valid = vr[:, :, None] & vc[:, None, :]
            zb = np.where(valid, z[R[:, :, None], C[:, None, :]], -np.inf)
            x, sweeps = transport_batch(
                zb,
                np.where(vr, rows[R], 0.0),
                np.where(vc, cols[p[:, None], C], 0.0),
                bound[p],
                nr[p],
                kc[p],
                max_sweeps,
            )
            if np.any(sweeps == 0):
                bad = int(p[np.flatnonzero(sweeps == 0)[0]])
                raise ConvergenceError(
                    f"transportation projection ({where}), parent #{bad}: the margins are not "
                    f"within {tol:g} × the total after {max_sweeps} sweeps; raise max_sweeps "
                    "or the tolerance"
                )
            most = max(most, int(sweeps.max()))
            rr = np.broadcast_to(R[:, :, None], valid.shape)[valid]
            out[rr, np.broadcast_to(C[:, None, :], valid.shape)[valid]] = x[valid]
    return out, most


def _check_transport_targets(
    rows: np.ndarray,
    cols: np.ndarray,
    par: np.ndarray,
    total: np.ndarray,
    bound: np.ndarray,
    where: str,
) -> None:
    """Refuse negative targets, or a parent whose children's targets (``rows``, children
    of parent ``par``) are not within ``bound`` of its total."""
    if rows.min(initial=0.0) < 0 or cols.min(initial=0.0) < 0:
        raise DataError(f"transportation projection ({where}): negative targets")
    off = np.abs(np.bincount(par, weights=rows, minlength=total.size) - total) > bound
    if off.any():
        raise DataError(
            f"transportation projection ({where}): the children's targets of parent "
            f"#{int(np.flatnonzero(off)[0])} do not sum to the parent's total; the row and "
            "column targets must describe the same number of persons"
        )


def _padded(
    batch: np.ndarray, values: np.ndarray, n_active: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """A batch's active rows (or columns) padded to ``width`` per parent: ``(B, width)``
    indices and validity, from ``values`` (the active indices, parent after parent), their
    parent in the batch ``batch`` and each parent's count ``n_active``."""
    pos = np.arange(values.size) - np.repeat(np.cumsum(n_active) - n_active, n_active)
    out = np.zeros((n_active.size, width), np.int64)
    out[batch, pos] = values
    valid = np.zeros((n_active.size, width), bool)
    valid[batch, pos] = True
    return out, valid


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


def _held_value(x: np.ndarray, parent_total: float = 0.0) -> float:
    """The value a held cell (structural zero) enters the projections with: ``−M`` with
    ``M`` beyond every multiplier of the projection (the data's scale and the parent's
    total, times 4), so the projection puts exactly 0 there whenever the other cells can
    carry the margins — the exact penalty of the constraint ``x = 0``."""
    return -4.0 * (1.0 + float(np.abs(x).max(initial=0.0)) + float(parent_total))


def _project_top(
    x: np.ndarray,
    atoms: np.ndarray,
    fixed: np.ndarray,
    level: str,
    held: np.ndarray | None = None,
) -> np.ndarray:
    """Each node's cells onto ``{x ≥ 0, Σ_atom x = t_atom}`` for the fixed atoms (sums of the
    GLS estimate, which meets the invariants, are the integers they fix); clipped elsewhere.
    ``held`` (n, K) cells are fixed at 0 (structural zeros)."""
    out = np.maximum(x, 0.0)
    xm = x if held is None else np.where(held, _held_value(x, float(np.abs(x).sum())), x)
    if held is not None:
        out[held] = 0.0
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
        out[:, cols] = project_simplex(xm[:, cols][:, :, None], t[:, None])[:, :, 0]
    return out


#: An entry left alone with a fraction in its row or its parent's column is float noise of
#: the projection, and is rounded to the nearest integer, when within this × max(1, total).
_LONE_TOL = 1e-8


def _snap(
    frac: np.ndarray,
    out: np.ndarray,
    count: np.ndarray,
    start: np.ndarray,
    tol: np.ndarray,
    total: np.ndarray,
    where: tuple[str, Forest, int, Sequence[str]],
) -> None:
    """Make the fractional parts fit the dependent rounding, in place (``out`` takes the
    units): entries within their parent's ``tol`` of 0 or 1 are integral; then, since every
    line sum is an integer, a row or a parent's column with a single fractional entry left
    holds float noise of the projection (entries that are integers in exact arithmetic,
    computed as ``z + α + β``): it goes to the nearest integer, repeatedly, while any line
    has one. An entry that is not within ``_LONE_TOL × max(1, parent total)`` of an integer
    is a real inconsistency (DataError naming level and node)."""
    name, forest, j, _ = where
    par = np.repeat(np.arange(count.size), count)
    t = tol[par][:, None]
    up = frac >= 1.0 - t
    out += up
    frac[up | (frac <= t)] = 0.0
    ends = (start + count - 1)[count > 0]
    loose = _LONE_TOL * np.maximum(1.0, total)[par]
    while True:
        fr = frac > 0.0
        lone = fr & (fr.sum(axis=1) == 1)[:, None]
        run = np.cumsum(fr, axis=0, dtype=np.int64)
        per = run[ends]
        per[1:] -= run[ends[:-1]]
        col_one = np.repeat(per == 1, count[count > 0], axis=0)
        lone |= fr & col_one
        if not lone.any():
            return
        i, c = np.nonzero(lone)
        v = frac[i, c]
        if np.any(np.minimum(v, 1.0 - v) > loose[i]):
            p = int(par[i[np.argmax(np.minimum(v, 1.0 - v) - loose[i])]])
            raise DataError(
                f"non-negative product, level {name!r}: the projected children of node "
                f"{forest.code(j, p)!r} do not meet their integer margins; check the "
                "estimates for consistency"
            )
        out[i, c] += v > 0.5
        frac[i, c] = 0.0


def _round_transport(
    x: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    count: np.ndarray,
    uniforms: np.ndarray,
    where: tuple[str, Forest, int, Sequence[str]],
) -> np.ndarray:
    """Each parent's projected (children × cells) matrix to integers with both margins
    exact: every entry ⌊x⌋ or ⌈x⌉ with mean ``x`` up to the projection's tolerance, by the
    dependent rounding of the fractional parts (Gandhi et al. 2006), whose column sums (the
    parent's integer cells minus the floors) and row sums (the children's integer totals minus
    the floors) are integers up to the projection's tolerance.

    Entries within :data:`~censusdp.estimation.integer.dependent.DR_TOL` of an integer count
    as integral (:func:`_snap`, which also settles lines left with one fractional entry), and
    :func:`~censusdp.estimation.integer.dependent.settle_margins` moves the fractional parts
    by the projection's residuals so every line sum is an integer to float resolution: the
    cycle cancelling then never strands an entry, and the integers depend on the parent alone.
    (Counting entries within a wider, parent-dependent tolerance as integral instead broke the
    line sums by up to that tolerance times the line's length and stranded the rows' slack.)
    Raises DataError, naming level and node, if a margin is not held."""
    name, forest, j, cells = where
    n_p, K = cols.shape
    fl = np.floor(x)
    frac = x - fl
    out = fl.astype(np.int64)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    _snap(frac, out, count, start, np.full(n_p, DR_TOL), cols.sum(axis=1), where)
    run = np.zeros((out.shape[0] + 1, K), np.int64)
    np.cumsum(out, axis=0, out=run[1:])
    col_target = (cols - (run[starts[1:]] - run[starts[:-1]])).astype(np.float64)
    row_target = (rows - out.sum(axis=1)).astype(np.float64)
    settle_margins(frac, starts, row_target, col_target)
    out += dependent_round(frac, starts, uniforms, tol=DR_TOL)
    nz = np.flatnonzero(count > 0)
    run = np.cumsum(out, axis=0)  # exact in int64; far faster than reduceat along axis 0
    sums = run[(start + count - 1)[nz]]
    sums[1:] -= run[(start + count - 1)[nz[:-1]]]
    bad = nz[np.any(sums != cols[nz], axis=1)]
    off = np.flatnonzero((out.sum(axis=1) != rows) | (out.min(axis=1, initial=0) < 0))
    if bad.size or off.size:
        p = int(bad[0]) if bad.size else int(np.repeat(np.arange(n_p), count)[off[0]])
        raise DataError(
            f"non-negative product, level {name!r}: the rounded children of node "
            f"{forest.code(j, p)!r} do not sum to it cell by cell, or a child's total is not "
            "its totals pass's integer; the projection did not meet its margins — check the "
            "estimates for consistency"
        )
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
    held: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """Levels ``1 ..`` of ``forest`` from the non-negative integers of its level 0: per
    parent, the children's totals first (simplex projection, rounded to integers summing
    to the parent's total), then their cells (transportation projection, rounded with both
    margins exact). ``held[j]`` (n_j, K) bool, per forest level: cells fixed at 0
    (structural zeros; a child with every cell held gets total 0)."""
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
        count = forest.child_count[j - 1]
        hj = None if held is None else held[j]
        # pass 1: the children's totals onto {t ≥ 0, Σ t = the parent's integer total}
        total = parent.sum(axis=1)[:, None]
        zt = x.sum(axis=1)[:, None]
        if hj is not None:  # a child that cannot hold anyone gets total 0
            big = _held_value(x, float(total.max(initial=0.0)))
            zt = np.where(hj.all(axis=1)[:, None], big, zt)
            x = np.where(hj, big, x)
        t = project_children(zt, total, count)
        v = rng.draw(f"{label}/{name}/total", n_global[j - 1], lo_up, lo_up + n_up, uniform_draws)
        totals, _ = round_children(
            total, t, count, v.reshape(n_up, 1), None, (name, forest, j - 1, ("total",)), tol
        )
        # pass 2: the cells onto {X ≥ 0, rows = those integers, columns = the parent's cells}
        u = keyed_uniforms(
            rng, f"{label}/{name}/cells", n_global[j], lo[j], lo[j] + forest.sizes[j], K
        )
        if hj is not None:
            parent = _descend_held(x, totals[:, 0], parent, count, hj, u, rng, label,
                                   (name, forest, j - 1, cells), (n_global[j], lo[j]))  # fmt: skip
            out.append(parent.reshape(-1, *schema.shape))
            continue
        proj, _ = project_transport(x, totals[:, 0], parent, count, where=f"level {name!r}")
        parent = _round_transport(
            proj, totals[:, 0], parent, count, u, (name, forest, j - 1, cells)
        )
        out.append(parent.reshape(-1, *schema.shape))
    return out


def _descend_held(
    x: np.ndarray,
    totals: np.ndarray,
    parent: np.ndarray,
    count: np.ndarray,
    held: np.ndarray,
    u: np.ndarray,
    rng: KeyedRNG,
    label: str,
    where: tuple,
    keys: tuple[int, int],
) -> np.ndarray:
    """Pass 2 with structural zeros: the transportation projection and rounding for the
    parents whose children's totals can carry the parent's cells on their free cells (per
    cell, the totals of the children free there reach the parent's count; per child, its
    total fits in the parent's cells free at it — necessary conditions), the per-cell route
    of :func:`_held_fallback` for the others, and for all of them if the projection does not
    converge or has to use a held cell (a subtler infeasibility: the ``−M`` penalty then
    buys feasibility with held cells). ``x`` holds the held cells at ``−M``."""
    n_p = count.size
    row_parent = np.repeat(np.arange(n_p), count)
    free = ~held
    ft = free * totals[:, None].astype(np.float64)
    cap = np.zeros(parent.shape)
    np.add.at(cap, row_parent, ft)
    fits = (free * parent[row_parent]).sum(axis=1) >= totals
    bad = np.any(parent > cap + 0.5, axis=1)
    bad[row_parent[~fits]] = True
    del ft, cap
    good = ~bad
    out = np.zeros(x.shape, np.int64)
    if good.any():
        g = good[row_parent]
        try:
            proj, _ = project_transport(
                x[g], totals[g], parent[good], count[good], where=f"level {where[0]!r}"
            )
            out[g] = _round_transport(proj, totals[g], parent[good], count[good], u[g], where)
        except ConvergenceError:
            bad[:] = True
        # the penalty keeps a projection feasible by using held cells when it must
        bad[row_parent[np.any((out != 0) & held, axis=1)]] = True
    if bad.any():
        out = _held_fallback(out, bad, held, x, parent, count, rng, label, where[0], keys)
    return out


def _held_fallback(
    counts: np.ndarray,
    bad: np.ndarray,
    held: np.ndarray,
    x: np.ndarray,
    parent: np.ndarray,
    count: np.ndarray,
    rng: KeyedRNG,
    label: str,
    name: str,
    where: tuple[int, int],
) -> np.ndarray:
    """The children of the parents ``bad`` whose totals pass left a held cell nowhere else
    to go (the totals pass does not know the zeros: a parent's group-quarters persons can
    need a child that it gave total 0): each (parent, cell) onto its simplex over the children
    (:func:`project_children`, held cells at ``−M``: 0 wherever another child may hold the
    cell, which closing the zeros upward guarantees), then the bipartite dependent rounding
    of the fractional parts — every column sum (the parent's cell) exact, each child's total
    the floor or ceiling of its projected total. Always feasible; those children's totals
    are no longer the totals pass's."""
    n_global, lo = where
    n_p = count.size
    row_parent = np.repeat(np.arange(n_p), count)
    rows = bad[row_parent]
    sub_count = count[bad]
    y = project_children(x[rows], parent[bad].astype(np.float64), sub_count)
    y[held[rows]] = 0.0
    fl = np.floor(y + DR_TOL)
    frac = np.clip(y - fl, 0.0, 1.0)
    starts = np.concatenate([[0], np.cumsum(sub_count)]).astype(np.int64)
    K = x.shape[1]
    u = keyed_uniforms(rng, f"{label}/{name}/held", n_global, lo, lo + rows.size, K)[rows]
    out = counts.copy()
    out[rows] = fl.astype(np.int64) + dependent_round(frac, starts, u, tol=DR_TOL)
    if np.any(out[held] != 0) or np.any(out < 0):
        i = lo + int(np.argwhere((out != 0) & held)[0][0]) if np.any(out[held]) else lo
        raise DataError(
            f"non-negative product, level {name!r}, node #{i}: its structural zeros cannot "
            "all be held (a parent's cell has no child that may hold it); the constraints "
            "contradict each other"
        )
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
    held: Sequence[np.ndarray | None] | None = None,
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
    held : sequence of arrays, optional
        Per level ``0 .. cut``, None or ``(n_nodes, n_cells)`` bool: cells fixed at 0
        (structural zeros, docs/design.md § The Noisy Measurement File). They enter the projections at ``−M`` (an exact
        penalty: 0 whenever the other cells can carry the margins); give them closed
        upward (a cell held at every child is held at the parent). A held cell that
        cannot stay 0 is refused.

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
    Held et al. (1974); Duchi et al. (2008); Madow (1949); Ohuchi & Kaji (1984); Gandhi et al.
    (2006); Cox (1987); Ageev & Sviridenko (2004).
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
    hs = list(held) if held is not None else [None] * len(estimates)
    proj = _project_top(xs[joint], atoms, fixed, hierarchy.names[joint], hs[joint])
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
            None if held is None else hs[start : cut + 1],
        )
    for k, (c, h) in enumerate(zip(counts, hs, strict=False)):
        if h is not None and np.any(c.reshape(h.shape)[h] != 0):
            raise DataError(
                f"non-negative product, level {hierarchy.names[k]!r}: its structural zeros "
                "cannot all be held with the invariants; the constraints contradict each other"
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


def partition_keys(
    rng: KeyedRNG, forest: Forest, lo: Sequence[int], n_cells: int, *, label: str = LABEL
) -> SubKeys:
    """The sub-keys :func:`nonnegative_partition` draws from for ``forest`` (global first
    nodes ``lo``; no structural zeros): per level below its first, the chunks of the
    ``label/<level>/total`` stream over its parents and of ``label/<level>/cells`` over its
    rows' ``n_cells + 1`` uniforms — what a task on another machine is sent instead of the
    key (a stream missed here fails loudly with :class:`~censusdp.rng.StreamNotHeld`)."""
    m = n_cells + 1
    streams: dict[str, list[int]] = {}
    for j in range(1, forest.depth):
        name = forest.names[j]
        streams[f"{label}/{name}/total"] = list(
            chunk_range(lo[j - 1], lo[j - 1] + forest.sizes[j - 1])
        )
        streams[f"{label}/{name}/cells"] = list(
            chunk_range(lo[j] * m, (lo[j] + forest.sizes[j]) * m)
        )
    return rng.restrict(streams)


def nonnegative_structured(
    release,
    rng: KeyedRNG,
    *,
    invariants: Sequence[ProductInvariant] = (),
    label: str = LABEL,
    tol: float = TOL,
    held: Sequence[np.ndarray | None] | None = None,
) -> RoundedLevels:
    """The non-negative product of a :class:`~censusdp.estimation.gls.structured.StructuredRelease`
    in memory (every level in one :func:`nonnegative_top`; the integers are those of any
    streamed run with the same ``rng``); ``held`` as there."""
    return nonnegative_top(
        release.hierarchy,
        release.schema,
        release.estimates,
        rng,
        invariants=invariants,
        label=label,
        tol=tol,
        held=held,
    )
