"""Unbiased integer rounding of a consistent real-valued release.

Every rounding here is *dependent randomized rounding*: each value becomes ⌊x⌋ or ⌈x⌉ with
E[rounded] = x exactly, while chosen sums are kept within ⌊·⌋/⌈·⌉ of their real sums — and
exactly equal when the real sum is an integer (the invariants). It is post-processing of a
private output: the privacy statement is unchanged. Rounding adds p(1 − p) ≤ 1/4 to the
variance of a value with fractional part p (:func:`rounding_variance`).

* :func:`pipage_round` — pipage rounding on a laminar family given as nested groups: inside a
  group, fractional parts are merged in pairs (one of each pair becomes integral, the sum is
  kept), and the one fractional part left in a group is passed up to the enclosing group.
  Vectorised: the pairs of all groups are merged at once, ⌈log₂ fan-out⌉ rounds per level.
* :func:`round_tree` — the hierarchy as a laminar family: ``mode="cells"`` keeps every
  (node, cell) sum within floor/ceil (each cell separately); ``mode="totals"`` keeps every node
  total and every leaf cell (node totals exact when integer, e.g. invariant state totals).
  Its randomness is keyed by (level, node): merge number c inside node v's group uses
  uniform number (first child of v) + c of the level's keyed stream, so the rounding of a
  subtree depends on nothing outside it. :func:`round_part` rounds the subtrees of a
  partition up to a cut level and :func:`round_top` the levels above from the leftovers;
  ``round_tree`` is the one-partition case, and every split gives the same integers.
* :func:`round_bipartite` — both at once on the two-level structure of each parent of the
  leaves (two crossing laminar families: the children's totals and the parent's cells):
  controlled rounding by cycle cancelling (Cox 1987; Gandhi et al. 2006).

References
----------
Ageev & Sviridenko, "Pipage rounding", J. Comb. Optim. 8, 2004.
Srinivasan, "Distributions on level-sets with applications to approximation algorithms",
FOCS 2001 (dependent rounding; laminar families).
Gandhi, Khuller, Parthasarathy & Srinivasan, "Dependent rounding and its applications to
approximation algorithms", J. ACM 53(3), 2006 — bipartite dependent rounding (§2).
Cox, "A constructive procedure for unbiased controlled rounding", JASA 82(398), 1987.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from censusdp.errors import SpecError
from censusdp.estimation.gls import Forest, whole_forest
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.rng import KeyedRNG

__all__ = [
    "pipage_round",
    "round_tree",
    "round_bipartite",
    "round_release",
    "rounding_variance",
    "RoundPart",
    "round_part",
    "round_top",
    "round_bipartite_part",
    "finish_rounding",
    "add_rounding_variance",
]

TOL = 1e-7


def _split(values: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Integer part and fractional part in [0, 1), fractions within ``tol`` of 0/1 snapped."""
    v = np.asarray(values, dtype=float)
    base = np.floor(v)
    frac = v - base
    up = frac > 1.0 - tol
    base = base + up
    frac = np.where(up | (frac < tol), 0.0, frac)
    return base.astype(np.int64), frac


def rounding_variance(values: np.ndarray, tol: float = TOL) -> np.ndarray:
    """Variance p(1 − p) ≤ 1/4 added by unbiased rounding of values with fractional part p."""
    v = np.asarray(values, dtype=float)
    p = v - np.floor(v)  # the fractional part of _split, without the integer part
    p[(p < tol) | (p > 1.0 - tol)] = 0.0
    np.multiply(p, 1.0 - p, out=p)
    return p


Draw = Callable[[np.ndarray], np.ndarray]


def _merge(
    item: np.ndarray,
    val: np.ndarray,
    grp: np.ndarray,
    out: np.ndarray,
    draw: Draw,
    tol: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge fractional parts in pairs inside each group until each group holds at most one.

    ``item`` (positions in ``out``), ``val`` (fractional parts) and ``grp`` (non-decreasing
    group ids) list the live fractional values; ``draw(groups_of_pairs)`` returns one uniform
    per merged pair. Each merge keeps the pair's sum and both means, and makes at least one of
    the two integral (added to ``out``). Returns the values left over, one per group at most.
    """
    while item.size > 1:
        first = np.r_[True, grp[1:] != grp[:-1]]
        start = np.flatnonzero(first)
        rank = np.arange(item.size) - start[np.cumsum(first) - 1]
        i = np.flatnonzero((rank % 2 == 0)[:-1] & (grp[1:] == grp[:-1]))
        if i.size == 0:
            break
        a, b = val[i], val[i + 1]
        s = a + b
        u = draw(grp[i])
        low = s <= 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            pick_a = np.where(low, u * s < a, u * (2.0 - s) < 1.0 - b)
        hi_val = np.where(low, s, 1.0)
        lo_val = np.where(low, 0.0, s - 1.0)
        val[i] = np.where(pick_a, hi_val, lo_val)
        val[i + 1] = np.where(pick_a, lo_val, hi_val)
        done = (val < tol) | (val > 1.0 - tol)
        out[item[done]] += (val[done] > 0.5).astype(np.int64)
        keep = ~done
        item, val, grp = item[keep], val[keep], grp[keep]
    return item, val, grp


def pipage_round(
    values: np.ndarray,
    groups: Sequence[np.ndarray],
    gen: np.random.Generator,
    *,
    tol: float = TOL,
) -> np.ndarray:
    """Dependent rounding on a laminar family of contiguous groups.

    Parameters
    ----------
    values : (n,) float
        Real values, ordered so that every group is a contiguous range.
    groups : sequence of int arrays
        ``groups[0]`` (n,) the group of every value; ``groups[l]`` maps the groups of step
        ``l − 1`` to enclosing groups. Every map must be non-decreasing.
    gen : numpy.random.Generator
        One stream for every decision, in order (see :func:`round_tree` for randomness keyed
        by node, which does not depend on how the work is split).
    tol : float
        Fractional parts within ``tol`` of 0 or 1 count as integral (floating-point noise in
        sums that are integers, such as invariants).

    Returns
    -------
    numpy.ndarray
        int64 (n,): ⌊x⌋ or ⌈x⌉ with E = x; the sum over every group (at every step) is the
        floor or ceiling of its real sum, and exact when that real sum is an integer.

    References
    ----------
    Ageev & Sviridenko (2004); Srinivasan (2001).
    """
    out, frac = _split(values, tol)
    item = np.flatnonzero(frac > 0)
    val = frac[item]
    grp = np.asarray(groups[0])[item] if len(groups) else np.zeros(item.size, np.int64)
    for step in range(len(groups)):
        if step:
            grp = np.asarray(groups[step])[grp]
        item, val, grp = _merge(item, val, grp, out, lambda g: gen.random(g.size), tol)
    u = gen.random(item.size)
    out[item] += (u < val).astype(np.int64)
    return out


def _tree_groups(h: Hierarchy, order: str, K: int) -> list[np.ndarray]:
    if order == "cells":  # items j * n_leaves + leaf
        groups = []
        for k in range(h.depth - 1, 0, -1):
            n_up = h.levels[k - 1].size
            par = h.levels[k].parent
            groups.append((np.arange(K)[:, None] * n_up + par[None, :]).reshape(-1))
        return groups
    n_leaves = h.leaves.size  # items leaf * K + j
    groups = [np.repeat(np.arange(n_leaves), K)]
    for k in range(h.depth - 1, 0, -1):
        groups.append(h.levels[k].parent)
    return groups


# ----------------------------------------------------------------------------- keyed tree rounding
def _uniform(g: np.random.Generator, n: int) -> np.ndarray:
    return g.random(n)


def _keyed_draw(U: np.ndarray, slot_first: np.ndarray, slot_stop: np.ndarray) -> Draw:
    """Uniforms by slot: the c-th merge of group g uses ``U[slot_first[g] + c]``.

    A group's merges are fewer than the elements entering it, which are fewer than its slots
    (its children, or its cells), so every uniform is used at most once and the draw of a
    merge depends only on its group and rank — not on the other groups of the batch.
    """
    used = np.zeros(slot_first.size, np.int64)

    def draw(g: np.ndarray) -> np.ndarray:
        first = np.r_[True, g[1:] != g[:-1]]
        start = np.flatnonzero(first)
        slot = slot_first[g] + used[g] + np.arange(g.size) - start[np.cumsum(first) - 1]
        if np.any(slot >= slot_stop[g]):  # pragma: no cover - excluded by the merge count
            raise AssertionError("pipage rounding used more uniforms than a group has slots")
        used[:] += np.bincount(g, minlength=used.size)
        return U[slot]

    return draw


@dataclass(frozen=True)
class _Step:
    """One step up the laminar family: element → group map and the group's uniform slots."""

    gmap: np.ndarray  # element id -> group id (non-decreasing)
    slot_first: np.ndarray  # per group
    slot_stop: np.ndarray
    label: str  # keyed stream of the slots
    n_items: int  # global slot rows of the stream
    start: int  # first global row of this forest
    rows: int
    width: int
    cell_major: bool  # slots c * rows + row (else row * width + c)

    def uniforms(self, rng: KeyedRNG) -> np.ndarray:
        u = rng.draw(
            self.label, self.n_items, self.start, self.start + self.rows, _uniform, self.width
        )
        return u.T.reshape(-1) if self.cell_major else u.reshape(-1)


def _steps(
    f: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    K: int,
    mode: str,
    label: str,
    cells_step: bool,
) -> list[_Step]:
    """Steps from the forest's last level up to its first (global node offsets ``lo``)."""
    steps = []
    D = f.depth
    if mode == "totals" and cells_step:  # the cells of each leaf, items leaf * K + c
        n = f.sizes[D - 1]
        first = np.arange(n, dtype=np.int64) * K
        steps.append(
            _Step(
                np.repeat(np.arange(n, dtype=np.int64), K),
                first,
                first + K,
                f"{label}/{f.names[D - 1]}/cells",
                n_global[D - 1],
                lo[D - 1],
                n,
                K,
                False,
            )
        )
    for jc in range(D - 1, 0, -1):
        n_c, n_p = f.sizes[jc], f.sizes[jc - 1]
        par, cs, cc = f.parent(jc), f.child_start(jc - 1), f.child_count[jc - 1]
        if mode == "cells":  # elements c * n_c + node, groups c * n_p + parent
            cell = np.arange(K, dtype=np.int64)[:, None]
            gmap = (cell * n_p + par[None, :]).reshape(-1)
            first = (cell * n_c + cs[None, :]).reshape(-1)
            stop = first + np.tile(cc, K)
            width, cm = K, True
        else:
            gmap, first, stop, width, cm = par, cs, cs + cc, 1, False
        steps.append(
            _Step(gmap, first, stop, f"{label}/{f.names[jc]}", n_global[jc], lo[jc], n_c, width, cm)
        )
    return steps


@dataclass(frozen=True, eq=False)
class RoundPart:
    """One partition's rounding: its leaves and the fractional parts left at the cut.

    Attributes
    ----------
    leaves : (n_leaves, K) int64
        Rounded leaves of the partition, before the leftovers are settled.
    group : (m,) int64
        Global group id at the cut level of every leftover (``c * n_cut + node`` for
        ``"cells"``, ``node`` for ``"totals"``).
    leaf, cell : (m,) int64
        Global leaf index and cell of every leftover.
    value : (m,) float
        Its fractional part.
    """

    leaves: np.ndarray
    group: np.ndarray
    leaf: np.ndarray
    cell: np.ndarray
    value: np.ndarray


def round_part(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    leaf_values: np.ndarray,
    rng: KeyedRNG,
    *,
    mode: Literal["cells", "totals"] = "cells",
    label: str = "rounding/tree",
    tol: float = TOL,
) -> RoundPart:
    """Pipage rounding of one sub-forest's leaves up to its top (cut) level.

    Parameters
    ----------
    forest : Forest
        The partition's levels cut .. leaf.
    lo, n_global : sequences of int
        Global index of the forest's first node, and the level's global size, per level.
    leaf_values : (n_leaves, K) float
        The partition's leaf estimates.
    rng, mode, label, tol
        As for :func:`round_tree`.

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004).
    """
    x = np.asarray(leaf_values, dtype=float)
    n, K = x.shape
    cells = mode == "cells"
    out, frac = _split(x.T.reshape(-1) if cells else x.reshape(-1), tol)
    item = np.flatnonzero(frac > 0)
    val, grp = frac[item], item
    for st in _steps(forest, lo, n_global, K, mode, label, cells_step=True):
        grp = st.gmap[grp]
        item, val, grp = _merge(
            item, val, grp, out, _keyed_draw(st.uniforms(rng), st.slot_first, st.slot_stop), tol
        )
    n0 = forest.sizes[0]
    if cells:
        leaves = out.reshape(K, n).T.copy()
        cell, leaf = item // n, item % n
        group = (grp // n0) * n_global[0] + lo[0] + grp % n0
    else:
        leaves = out.reshape(n, K)
        leaf, cell = item // K, item % K
        group = lo[0] + grp
    return RoundPart(leaves, group, lo[-1] + leaf, cell, val)


def round_top(
    hierarchy: Hierarchy,
    cut: int,
    parts: Sequence[RoundPart],
    K: int,
    rng: KeyedRNG,
    *,
    mode: Literal["cells", "totals"] = "cells",
    label: str = "rounding/tree",
    tol: float = TOL,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round the levels 0 .. cut from the partitions' leftovers.

    Returns ``(leaf, cell, add)``: the leftovers' global leaf and cell and their 0/1 increment.
    """
    group = np.concatenate([p.group for p in parts])
    order = np.argsort(group, kind="stable")
    grp = group[order]
    leaf = np.concatenate([p.leaf for p in parts])[order]
    cell = np.concatenate([p.cell for p in parts])[order]
    val = np.concatenate([p.value for p in parts])[order]
    add = np.zeros(grp.size, np.int64)
    item = np.arange(grp.size)
    f = whole_forest(hierarchy, 0, cut)
    for st in _steps(f, [0] * f.depth, f.sizes, K, mode, label, cells_step=False):
        grp = st.gmap[grp]
        item, val, grp = _merge(
            item, val, grp, add, _keyed_draw(st.uniforms(rng), st.slot_first, st.slot_stop), tol
        )
    width = K if mode == "cells" else 1
    u = rng.draw(f"{label}/final", 1, 0, 1, _uniform, width).reshape(-1)
    add[item] += (u[grp] < val).astype(np.int64)
    return leaf, cell, add


def round_tree(
    hierarchy: Hierarchy,
    leaf_values: np.ndarray,
    rng: KeyedRNG,
    *,
    mode: Literal["cells", "totals"] = "cells",
    label: str = "rounding/tree",
    tol: float = TOL,
) -> list[np.ndarray]:
    """Unbiased integer rounding of leaf cells, consistent up the hierarchy.

    Pipage rounding on the laminar family of the tree: inside each group, fractional parts
    are merged in pairs; the one left over goes up to the enclosing group. The c-th merge
    inside the group of node ``v`` of level ``k`` draws uniform number ``first child of v + c``
    of the keyed stream ``f"{label}/{child level}"`` (``label/leaf/cells`` for the cells of a
    leaf in ``"totals"`` mode; ``label/final`` at the root), so the result depends on the key
    and the values only — never on how the tree is split into partitions
    (:func:`round_part` below a cut, :func:`round_top` above it; this function is the
    one-partition case, cut at the root).

    Parameters
    ----------
    hierarchy : Hierarchy
    leaf_values : (n_leaves, K) float
        Real-valued leaf estimates (e.g. GLS).
    rng : KeyedRNG
        Randomness from the streams ``label/...``.
    mode : {"cells", "totals"}
        ``"cells"``: every (node, cell) sum, at every level, is the floor or ceiling of its
        real value (exact when integer). ``"totals"``: every node total, at every level, and
        every leaf cell are (exact when integer, e.g. invariant state totals); non-leaf
        (node, cell) sums are not constrained.

    Returns
    -------
    list of numpy.ndarray
        int64 counts per level (root first), the sums of the rounded leaves; every leaf cell
        is ⌊x⌋ or ⌈x⌉ with E[rounded] = x.

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004).
    """
    x = np.asarray(leaf_values, dtype=float)
    if x.ndim != 2 or x.shape[0] != hierarchy.leaves.size:
        raise SpecError(f"leaf_values must be (n_leaves={hierarchy.leaves.size}, n_cells)")
    if mode not in ("cells", "totals"):
        raise SpecError(f"mode must be 'cells' or 'totals', got {mode!r}")
    f = whole_forest(hierarchy)
    part = round_part(f, [0] * f.depth, f.sizes, x, rng, mode=mode, label=label, tol=tol)
    leaf, cell, add = round_top(
        hierarchy, 0, [part], x.shape[1], rng, mode=mode, label=label, tol=tol
    )
    leaves = part.leaves
    leaves[leaf, cell] += add
    return hierarchy.aggregate(leaves)


def _cancel_cycles(X: np.ndarray, gen: np.random.Generator, tol: float) -> np.ndarray:
    """Round a matrix whose row and column sums are all integers, keeping them exactly.

    Walks the fractional entries (every row and column with one has at least two) until a
    vertex repeats, then shifts the cycle by +α/−α alternately, with the probabilities that
    keep every entry's mean (Gandhi et al. 2006, §2; Cox 1987).
    """
    base, F = _split(X, tol)
    nr, nc = F.shape
    Fl: list[list[float]] = F.tolist()
    rows: list[set[int]] = [set(np.flatnonzero(F[i]).tolist()) for i in range(nr)]
    cols: list[set[int]] = [set(np.flatnonzero(F[:, j]).tolist()) for j in range(nc)]
    live = [i for i in range(nr) if rows[i]]
    # The walk is a stack of vertices (0, row) / (1, col); after a cycle at its end is
    # cancelled the stack is cut back to the cycle's first vertex and the walk resumes there.
    stack: list[tuple[int, int]] = []
    pos: dict[tuple[int, int], int] = {}
    while True:
        while stack and not (rows if stack[-1][0] == 0 else cols)[stack[-1][1]]:
            del pos[stack.pop()]
        if not stack:
            while live and not rows[live[-1]]:
                live.pop()
            if not live:
                return base
            stack.append((0, live[-1]))
            pos[stack[0]] = 0
        side, idx = stack[-1]
        prev = stack[-2][1] if len(stack) > 1 else -1
        nbrs = rows[idx] if side == 0 else cols[idx]
        nxt_idx = next((j for j in nbrs if j != prev), None)
        if nxt_idx is None:  # pragma: no cover - integer line sums exclude it
            raise AssertionError("a line with a single fractional entry: sums are not integers")
        nxt = (1 - side, nxt_idx)
        if nxt not in pos:
            pos[nxt] = len(stack)
            stack.append(nxt)
            continue
        cyc = stack[pos[nxt] :] + [nxt]
        for v in stack[pos[nxt] + 1 :]:
            del pos[v]
        del stack[pos[nxt] + 1 :]
        ri = [u[1] if u[0] == 0 else v[1] for u, v in zip(cyc[:-1], cyc[1:], strict=True)]
        ci = [v[1] if u[0] == 0 else u[1] for u, v in zip(cyc[:-1], cyc[1:], strict=True)]
        f = [Fl[i][j] for i, j in zip(ri, ci, strict=True)]
        alpha = min(min(1.0 - v for v in f[0::2]), min(f[1::2]))
        beta = min(min(f[0::2]), min(1.0 - v for v in f[1::2]))
        step = alpha if gen.random() * (alpha + beta) < beta else -beta
        for e, (i, j) in enumerate(zip(ri, ci, strict=True)):
            v = f[e] + (step if e % 2 == 0 else -step)
            if v < tol or v > 1.0 - tol:
                Fl[i][j] = 0.0
                base[i, j] += int(v > 0.5)
                rows[i].discard(j)
                cols[j].discard(i)
            else:
                Fl[i][j] = v
        # the stack's edges before the cycle are untouched; drop a dangling tail vertex
        while len(stack) > 1:
            (s0, a0), (_, b0) = stack[-2], stack[-1]
            r_, c_ = (a0, b0) if s0 == 0 else (b0, a0)
            if c_ in rows[r_]:
                break
            del pos[stack.pop()]


def round_bipartite_part(
    leaf_values: np.ndarray,
    child_count: np.ndarray,
    first_parent: int,
    rng: KeyedRNG,
    *,
    label: str = "rounding/bipartite",
    tol: float = TOL,
) -> np.ndarray:
    """Controlled rounding of the leaves of a run of parents (``first_parent`` onwards).

    Parent ``p`` (global index) draws from its own generator ``rng.generator(label, p)``, so
    any split of the parents gives the same integers.
    """
    x = np.asarray(leaf_values, dtype=float)
    out = np.empty(x.shape, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(child_count)[:-1]])
    for p in np.flatnonzero(child_count):  # one small matrix per parent (see round_bipartite)
        lo, hi = int(start[p]), int(start[p] + child_count[p])
        gen = rng.generator(label, first_parent + int(p))
        out[lo:hi] = _cancel_cycles(_bordered(x[lo:hi], tol), gen, tol)[:-1, :-1]
    return out


def round_bipartite(
    hierarchy: Hierarchy,
    leaf_values: np.ndarray,
    rng: KeyedRNG,
    *,
    label: str = "rounding/bipartite",
    tol: float = TOL,
) -> list[np.ndarray]:
    """Controlled unbiased rounding of the leaves under each parent (two crossing families).

    For every parent of the leaf level, the (children × cells) matrix is rounded so that each
    leaf's total, each of the parent's cell sums and the parent's total are the floor or
    ceiling of their real values (exact when integer), and E[rounded] = value for every leaf
    cell. The matrix is bordered by a slack column (ceil(row sum) − row sum) and a slack row
    (ceil(column sum) − column sum), which makes every line sum an integer, and then rounded by
    cycle cancelling, with randomness keyed by the parent (:func:`round_bipartite_part`; this
    function is its one-partition case).

    Notes
    -----
    Sums two or more levels above the leaves are sums of rounded parent cells (each floor or
    ceil), not themselves guaranteed within floor/ceil, except totals of integer-valued parents
    (invariants), which stay exact. The cycle walk runs in Python, one parent at a time
    (cost ≈ fractional entries × cycle length ≤ 2(cells + 2)); use :func:`round_tree` at
    national scale.

    References
    ----------
    Gandhi, Khuller, Parthasarathy & Srinivasan (2006), §2; Cox (1987).
    """
    x = np.asarray(leaf_values, dtype=float)
    h = hierarchy
    if x.ndim != 2 or x.shape[0] != h.leaves.size:
        raise SpecError(f"leaf_values must be (n_leaves={h.leaves.size}, n_cells)")
    if h.depth < 2:
        return [_cancel_cycles(_bordered(x, tol), rng.generator(label), tol)[:-1, :-1]]
    out = round_bipartite_part(x, h.levels[-2].child_count, 0, rng, label=label, tol=tol)
    return h.aggregate(out)


def _bordered(X: np.ndarray, tol: float) -> np.ndarray:
    """X with a slack column and row making every row and column sum an integer."""
    r = X.sum(axis=1)
    c = X.sum(axis=0)
    rs = np.ceil(r - tol) - r
    cs = np.ceil(c - tol) - c
    corner = np.ceil(rs.sum() - tol) - rs.sum()
    B = np.zeros((X.shape[0] + 1, X.shape[1] + 1))
    B[:-1, :-1] = X
    B[:-1, -1] = np.maximum(rs, 0.0)
    B[-1, :-1] = np.maximum(cs, 0.0)
    B[-1, -1] = max(corner, 0.0)
    return B


def add_rounding_variance(
    estimates: Sequence[np.ndarray], variances: Sequence[np.ndarray] | None, tol: float = TOL
) -> tuple[list[np.ndarray] | None, float]:
    """The variances after unbiased rounding of ``estimates``, and the largest one added.

    Each value's variance becomes the estimator's plus the rounding variance p(1 − p) of
    its fractional part p (:func:`rounding_variance`).
    """
    rv = [rounding_variance(e, tol) for e in estimates]
    largest = float(max((r.max(initial=0.0) for r in rv), default=0.0))
    if variances is None:
        return None, largest
    return [v + r for v, r in zip(variances, rv, strict=True)], largest


def finish_rounding(
    release: Release, counts: list[np.ndarray], method: str, tol: float = TOL
) -> Release:
    """The integer :class:`Release` of rounded ``counts`` (per level) of ``release``.

    Variances become the estimator's plus the rounding variance p(1 − p) of each value.
    """
    variances, largest = add_rounding_variance(release.estimates, release.variances, tol)
    diag = dict(release.diagnostics)
    diag.update(rounding=method, rounding_variance_max=largest)
    return Release(
        estimator=release.estimator,
        hierarchy=release.hierarchy,
        cells=release.cells,
        estimates=counts,
        variances=variances,
        privacy=release.privacy,
        integer=True,
        diagnostics=diag,
        covariances=None,
    )


def round_release(
    release: Release,
    rng: KeyedRNG,
    *,
    method: Literal["cells", "totals", "bipartite"] = "cells",
    label: str | None = None,
    tol: float = TOL,
) -> Release:
    """An integer :class:`Release` from a real-valued one (rounding its leaf estimates).

    ``"cells"`` and ``"totals"`` are :func:`round_tree` (which sums keep floor/ceil: see
    there), ``"bipartite"`` is :func:`round_bipartite`. The variances become the
    estimator's plus the rounding variance p(1 − p) of each value (exact for the sums the
    method keeps within floor/ceil; see :func:`rounding_variance`), reported separately in
    ``diagnostics["rounding_variance_max"]``.
    """
    leaves = release.estimates[-1]
    lab = label or f"rounding/{method}"
    if method == "bipartite":
        counts = round_bipartite(release.hierarchy, leaves, rng, label=lab, tol=tol)
    elif method in ("cells", "totals"):
        counts = round_tree(release.hierarchy, leaves, rng, mode=method, label=lab, tol=tol)
    else:
        raise SpecError(f"method must be 'cells', 'totals' or 'bipartite', got {method!r}")
    return finish_rounding(release, counts, method, tol)
