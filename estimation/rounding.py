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

from collections.abc import Sequence
from typing import Literal

import numpy as np

from censusdp.errors import SpecError
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.rng import KeyedRNG

__all__ = [
    "pipage_round",
    "round_tree",
    "round_bipartite",
    "round_release",
    "rounding_variance",
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
    _, p = _split(values, tol)
    return p * (1.0 - p)


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
        while item.size > 1:
            first = np.r_[True, grp[1:] != grp[:-1]]
            start = np.flatnonzero(first)
            rank = np.arange(item.size) - start[np.cumsum(first) - 1]
            i = np.flatnonzero((rank % 2 == 0)[:-1] & (grp[1:] == grp[:-1]))
            if i.size == 0:
                break
            a, b = val[i], val[i + 1]
            s = a + b
            u = gen.random(i.size)
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

    Parameters
    ----------
    hierarchy : Hierarchy
    leaf_values : (n_leaves, K) float
        Real-valued leaf estimates (e.g. GLS).
    rng : KeyedRNG
        Randomness from stream ``label``.
    mode : {"cells", "totals"}
        ``"cells"``: every (node, cell) sum is the floor or ceiling of its real value
        (exact when integer). ``"totals"``: every node total is, and every leaf cell.

    Returns
    -------
    list of numpy.ndarray
        int64 counts per level (root first), the sums of the rounded leaves.

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004).
    """
    x = np.asarray(leaf_values, dtype=float)
    if x.ndim != 2 or x.shape[0] != hierarchy.leaves.size:
        raise SpecError(f"leaf_values must be (n_leaves={hierarchy.leaves.size}, n_cells)")
    K = x.shape[1]
    if mode not in ("cells", "totals"):
        raise SpecError(f"mode must be 'cells' or 'totals', got {mode!r}")
    gen = rng.generator(label)
    groups = _tree_groups(hierarchy, mode, K)
    if mode == "cells":
        flat = pipage_round(x.T.reshape(-1), groups, gen, tol=tol)
        leaves = flat.reshape(K, -1).T.copy()
    else:
        leaves = pipage_round(x.reshape(-1), groups, gen, tol=tol).reshape(x.shape)
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
    cycle cancelling.

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
    gen = rng.generator(label)
    up = h.levels[-2]
    out = np.empty(x.shape, dtype=np.int64)
    for p in np.flatnonzero(up.child_count):  # one small matrix per parent (see Notes)
        lo, hi = int(up.child_start[p]), int(up.child_start[p] + up.child_count[p])
        out[lo:hi] = _cancel_cycles(_bordered(x[lo:hi], tol), gen, tol)[:-1, :-1]
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


def round_release(
    release: Release,
    rng: KeyedRNG,
    *,
    method: Literal["cells", "totals", "bipartite"] = "cells",
    label: str | None = None,
    tol: float = TOL,
) -> Release:
    """An integer :class:`Release` from a real-valued one (rounding its leaf estimates).

    The variances become the estimator's plus the rounding variance p(1 − p) of each value
    (exact for the sums the method keeps within floor/ceil; see :func:`rounding_variance`),
    reported separately in ``diagnostics["rounding_variance_max"]``.
    """
    leaves = release.estimates[-1]
    lab = label or f"rounding/{method}"
    if method == "bipartite":
        counts = round_bipartite(release.hierarchy, leaves, rng, label=lab, tol=tol)
    else:
        counts = round_tree(release.hierarchy, leaves, rng, mode=method, label=lab, tol=tol)
    rv = [rounding_variance(e, tol) for e in release.estimates]
    variances = (
        None
        if release.variances is None
        else [v + r for v, r in zip(release.variances, rv, strict=True)]
    )
    diag = dict(release.diagnostics)
    diag.update(
        rounding=method,
        rounding_variance_max=float(max(r.max(initial=0.0) for r in rv)),
    )
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
