"""The NMF route's non-negative integer product: consistent, non-negative integer P1–P5
tables from the same GLS estimate as the unbiased release, with the file's structural zeros
held, the state total exact and children summing to their parents (issue 35, build 4).

:func:`nmf_integers` runs :func:`~censusdp.estimation.integer.nonnegative.nonnegative_structured`
(top down, per parent: the children's totals by a simplex projection, then their cells by a
transportation projection, each rounded with its margins exact; no commercial solver) on a
state's :class:`~censusdp.pipelines.products.nmf_release.NMFStateRelease`, with the state total
invariant and every structural zero of the file (hhgq upper bounds of 0, nursing facilities
holding no one under 18) as a cell fixed at 0 (``held``: closed upward, a cell held at
every child is held at the parent). What it checks and reports:

* non-negative int64 at every spine node, every node the sum of its children (by
  construction; :func:`check_integers` verifies it), the state total ``==`` the published
  one across the state's two parts, every held cell ``== 0``;
* the hhgq *bounds* of the file, ``lower ≤ persons of hhgq type t at the node ≤ upper`` at
  every node that has them (the upper bounds of 0 are structural zeros, held by the
  projections), ``==``-checked by :func:`check_bounds`.

**Imposing the bounds.** The projections do not know the bounds above 0, so
:func:`impose_bounds` repairs their integers top down, with no commercial solver:

1. *Effective bounds* (:func:`effective_bounds`, bottom up): a node's persons of type t are
   the sum of its children's, so its bounds tighten to ``max(lower, Σ children's lower)``
   and ``min(upper, Σ children's upper)``. A node where they cross, or a state whose
   published total lies outside the sum over types, is infeasible: DataError naming the
   geocode, the type and the constraint (exit 2).
2. *Repair* (top down): at the state, its cells move to put every type within its effective
   bounds with the total unchanged; at every parent ``p`` and type ``t`` whose cells changed
   or whose children are outside their effective bounds, the children's cells of type t are
   re-chosen as the integer matrix ``X ≥ 0`` nearest the projections' integers ``X⁰`` in a
   weighted ℓ1 norm, with ``Σ_i X_ic`` = the parent's (repaired) cell ``c`` and
   ``lower_i ≤ Σ_c X_ic ≤ upper_i``, structural zeros and cells the parent does not hold
   fixed at 0 — a transportation problem with bounded row sums, whose constraint matrix is a
   bipartite incidence matrix (totally unimodular), solved as an integer program by scipy's
   HiGHS (Huangfu & Hall 2018), which finds it integral at the root. Moving a unit costs
   ``1 ± ½·clip(X⁰ − z, −1, 1)`` (``z`` the GLS estimate): among the nearest matrices,
   units go preferably where the GLS estimate exceeds the integer and leave where it falls
   short. Because every parent's type totals lie within its effective bounds, the sum of
   its children's bounds brackets them (and the structural zeros are closed upward), so
   the problem is feasible at every parent; an infeasible one is still refused (DataError
   naming parent and type).

Parents whose type ``t`` was not touched and whose children are within bounds keep the
projections' integers exactly. Nation-level bounds (the US folder) are not applied to a
state's release (they bound the nation, not the state).

The product is **biased** (:data:`~censusdp.estimation.integer.nonnegative.BIASED_NOTE`: small counts
up, large ones down, as TopDown's) and has no standard errors; its bias by size class is
measured by simulation on a synthetic NMF (:func:`censusdp.pipelines.products.nmf_evaluate.integer_bias`).
Privacy: post-processing of the same published measurements, under the release's statement.

References
----------
Huangfu, Q. & Hall, J. A. J. (2018). Parallelizing the dual revised simplex method.
    Mathematical Programming Computation 10 (HiGHS).
Heller, I. & Tompkins, C. B. (1956). An extension of a theorem of Dantzig's. Linear
    Inequalities and Related Systems (bipartite incidence matrices are totally unimodular).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (non-negative least squares per parent,
    structural zeros and hhgq bounds as constraints).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.sparse import csr_array

from censusdp.errors import DataError
from censusdp.estimation.integer.nonnegative import nonnegative_structured
from censusdp.pipelines.io.nmf import LOWER_BOUND, SPINE_LEVEL, UPPER_BOUND
from censusdp.pipelines.products.pl94_tables import pl94_codebook
from censusdp.rng import KeyedRNG
from censusdp.spreadsheet import write_csv

__all__ = [
    "INTEGER_FOLDER",
    "NO_UPPER",
    "NMFIntegers",
    "bound_violations",
    "check_bounds",
    "check_integers",
    "effective_bounds",
    "group_sums",
    "held_cells",
    "impose_bounds",
    "nearest_bounded_transport",
    "nmf_integers",
    "write_integers",
]

#: The product's folder inside the release folder.
INTEGER_FOLDER = "nonnegative"
_LABEL = "nmf/nonnegative"


def group_sums(index: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """``out[i] = Σ_{index[p] = i} x[p]`` of integer rows (any trailing shape): one sparse
    product of the ``(n, p)`` 0/1 incidence, exact in int64 (what ``numpy.add.at`` gives,
    without its per-element dispatch: the children's sums of a level, the tabulation sums
    of the blocks)."""
    x = np.asarray(x)
    flat = x.reshape(x.shape[0], -1).astype(np.int64, copy=False)
    inc = csr_array((np.ones(index.size, np.int64), (index, np.arange(index.size))),
                    shape=(n, index.size))  # fmt: skip
    return np.asarray(inc @ flat).reshape((n, *x.shape[1:]))


@dataclass(frozen=True, eq=False)
class NMFIntegers:
    """One state's non-negative integer histograms.

    Attributes
    ----------
    state : str
    counts : tuple of numpy.ndarray
        Per spine level (nation … block), int64 ``(n_nodes, 8, 2, 2, 63)``.
    bound_violations : dict of str → dict
        Per NMF level, ``{"below_lower": n, "above_upper": n}``: (node, hhgq type) pairs of
        the released integers outside the file's bounds — 0 everywhere (imposed, and
        checked by :func:`check_bounds`).
    bounds_repaired : dict of str → dict
        The same counts for the projections' integers before :func:`impose_bounds`: how many
        (node, type) pairs the bound step moved inside their bounds.
    """

    state: str
    counts: tuple[np.ndarray, ...]
    bound_violations: dict
    bounds_repaired: dict


def held_cells(state) -> list[np.ndarray]:
    """Per spine level, ``(n_nodes, 2016)`` bool: the structural zeros of the level's nodes
    (:meth:`~censusdp.pipelines.io.nmf.NMFMeasurements.zeros`), closed upward (a cell held
    at every child is held at the parent; the GLS estimate is then exactly 0 there too)."""
    h = state.hierarchy
    zeros = state.measurements.zeros()
    out: list[np.ndarray] = [np.zeros(0)] * h.depth
    for k in range(h.depth - 1, -1, -1):
        n = h.levels[k].size
        own = zeros.get(h.names[k])
        cells = (
            np.zeros((n, 2016), bool)
            if own is None
            else np.broadcast_to(own[..., None], (n, 8, 2, 2, 63)).reshape(n, 2016)
        )
        if k < h.depth - 1:
            par = h.levels[k + 1].parent
            every = group_sums(par, ~out[k + 1], n) == 0  # no child leaves the cell free
            cells = cells | every
        out[k] = cells
    return out


def nmf_integers(state, rng: KeyedRNG) -> NMFIntegers:
    """The non-negative integer product of one state's GLS release (see the module doc).

    Parameters
    ----------
    state : NMFStateRelease
        From :func:`~censusdp.pipelines.products.nmf_release.estimate_state`.
    rng : KeyedRNG
        The rounding's uniforms (streams ``nmf/nonnegative/...``).

    Raises
    ------
    DataError
        Structural zeros that cannot be held with the state total and the parents' integers;
        hhgq bounds infeasible with each other or with the state total
        (:func:`effective_bounds`), naming the geocode, the type and the constraint.
    """
    rel = state.release
    held = held_cells(state)
    invs = state.measurements.invariants()
    lower, upper = effective_bounds(state)
    nn = nonnegative_structured(rel, rng, invariants=invs, label=_LABEL, held=held)
    projected = tuple(np.asarray(c).reshape(-1, 8, 2, 2, 63) for c in nn.counts)
    counts = impose_bounds(state, projected, held, lower, upper)
    check_integers(state, counts, held)
    check_bounds(state, counts)
    return NMFIntegers(
        state.state,
        counts,
        bound_violations(state, counts),
        bound_violations(state, projected),
    )


#: The effective upper bound of a node without one (beyond any count; sums of it stay in int64).
NO_UPPER = 1 << 40
#: The hhgq types, for messages (the ``pl94`` schema's order).
_HHGQ_NAMES = ("household", "correctional", "juvenile", "nursing", "other institutional",
               "college", "military", "other non-institutional")  # fmt: skip
#: Most entries (integer variables / 2) of one integer program of :func:`impose_bounds`;
#: the (parent, type) problems are independent and batched up to this size, in order.
_LP_ENTRIES = 1 << 17
#: Weight of the tie-break toward the GLS estimate in the repair's ℓ1 cost.
_TOWARD_GLS = 0.5


def _own_bounds(state, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Spine level ``k``'s own (n, 8) lower and upper bounds (0 and :data:`NO_UPPER` where a
    node has none, or the level has no NMF level)."""
    h = state.hierarchy
    n = h.levels[k].size
    lo = np.zeros((n, 8), np.int64)
    hi = np.full((n, 8), NO_UPPER, np.int64)
    for name, lvl in state.measurements.levels.items():
        if SPINE_LEVEL[name] == h.names[k] and name != "US":
            has = lvl.has_bounds
            lo[has] = lvl.lower[has]
            hi[has] = np.minimum(lvl.upper[has], NO_UPPER)
    return lo, hi


def effective_bounds(state) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """The bounds the file's hhgq bounds imply on every node's persons of each type.

    A node's persons of type t are the sum of its children's, so (bottom up, from the
    blocks to the state) its bounds are ``max(own lower, Σ children's)`` and
    ``min(own upper, Σ children's)`` (the own bounds of ``hhgq_total_lb_con`` /
    ``hhgq_total_ub_con``, 0 and :data:`NO_UPPER` where a node has none). Then the state's
    published total must lie between the sums over types of its bounds.

    Parameters
    ----------
    state : NMFStateRelease

    Returns
    -------
    lower, upper : list
        Per spine level, ``(n_nodes, 8)`` int64 (None above the state level: the nation's
        bounds, if read, bound the nation, not a state's release).

    Raises
    ------
    DataError
        A node where they cross, or a state total outside them: the bounds are infeasible
        with the held totals (naming the geocode, the hhgq type and the constraint).
    """
    h = state.hierarchy
    top = h.level_index("state")
    lower: list[np.ndarray | None] = [None] * h.depth
    upper: list[np.ndarray | None] = [None] * h.depth
    for k in range(h.depth - 1, top - 1, -1):
        lo, hi = _own_bounds(state, k)
        if k + 1 < h.depth:
            n = h.levels[k].size
            par = h.levels[k + 1].parent
            clo = group_sums(par, lower[k + 1], n)
            chi = np.minimum(group_sums(par, upper[k + 1], n), NO_UPPER)
            bad = np.argwhere(lo > chi)
            if bad.size:
                i, t = (int(v) for v in bad[0])
                raise DataError(
                    f"NMF hhgq bounds, {h.names[k]} {h.levels[k].codes[i]}, hhgq type {t} "
                    f"({_HHGQ_NAMES[t]}): {LOWER_BOUND} {int(lo[i, t])} exceeds the "
                    f"{int(chi[i, t])} persons its children's {UPPER_BOUND} allow; the bounds "
                    "are infeasible — correct the constraint rows of that node or its children"
                )
            bad = np.argwhere(clo > hi)
            if bad.size:
                i, t = (int(v) for v in bad[0])
                raise DataError(
                    f"NMF hhgq bounds, {h.names[k]} {h.levels[k].codes[i]}, hhgq type {t} "
                    f"({_HHGQ_NAMES[t]}): {UPPER_BOUND} {int(hi[i, t])} is below the "
                    f"{int(clo[i, t])} persons its children's {LOWER_BOUND} require; the "
                    "bounds are infeasible — correct the constraint rows of that node or its "
                    "children"
                )
            lo, hi = np.maximum(lo, clo), np.minimum(hi, chi)
        lower[k], upper[k] = lo, hi
    totals = state.measurements.state_totals
    for i, s in enumerate(h["state"].codes):
        if str(s) not in totals:
            continue
        t = totals[str(s)]
        need, room = int(lower[top][i].sum()), int(upper[top][i].sum())
        if t < need or t > room:
            con, b, verb = (
                (LOWER_BOUND, need, "require") if t < need else (UPPER_BOUND, room, "allow")
            )
            raise DataError(
                f"NMF hhgq bounds, state {s}: the published total {t} is "
                f"{'below' if t < need else 'above'} the {b} persons its nodes' {con} {verb} "
                "(summed over hhgq types); the bounds are infeasible with the state total — "
                "check the state totals file and the constraint rows"
            )
    return lower, upper


def nearest_bounded_transport(
    x0: np.ndarray,
    est: np.ndarray,
    row: np.ndarray,
    row_lo: np.ndarray,
    row_hi: np.ndarray,
    col: np.ndarray,
    col_target: np.ndarray,
) -> np.ndarray | None:
    """The integers nearest ``x0`` with bounded row sums and fixed column sums.

    Minimises ``Σ_e w⁺_e (x_e − x0_e)⁺ + w⁻_e (x0_e − x_e)⁺`` over integers ``x ≥ 0`` with
    ``row_lo[r] ≤ Σ_{e: row_e = r} x_e ≤ row_hi[r]`` and ``Σ_{e: col_e = j} x_e =
    col_target[j]``, where ``w± = 1 ± ½·clip(x0 − est, −1, 1)`` (a unit is added preferably
    where the estimate exceeds ``x0``, removed where it falls short). Every entry is in one
    row and one column: the constraint matrix (with ``x = x0 + a − b``) is a bipartite
    incidence matrix, totally unimodular (Heller & Tompkins 1956), so HiGHS's integer
    program (Huangfu & Hall 2018) is integral at its LP root.

    Parameters
    ----------
    x0 : (E,) int64
        Current non-negative integers.
    est : (E,) float
        The estimates the tie-break leans toward.
    row, col : (E,) int
        Each entry's row (into ``row_lo``/``row_hi``) and column (into ``col_target``).
    row_lo, row_hi, col_target : int arrays

    Returns
    -------
    (E,) int64 or None
        None when no such integers exist.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array, hstack, vstack

    e = x0.size
    nr, nc = row_lo.size, col_target.size
    idx = np.arange(e)
    R = csr_array((np.ones(e), (row, idx)), shape=(nr, e))
    C = csr_array((np.ones(e), (col, idx)), shape=(nc, e))
    A = vstack([hstack([R, -R]), hstack([C, -C])]).tocsr()
    rx = R @ x0.astype(np.float64)
    cx = C @ x0.astype(np.float64)
    lo = np.concatenate([row_lo - rx, col_target - cx])
    hi = np.concatenate([np.minimum(row_hi, NO_UPPER) - rx, col_target - cx])
    lean = np.clip(x0 - est, -1.0, 1.0)
    cost = np.concatenate([1.0 + _TOWARD_GLS * lean, 1.0 - _TOWARD_GLS * lean])
    res = milp(
        cost,
        integrality=np.ones(2 * e),
        bounds=Bounds(np.zeros(2 * e), np.concatenate([np.full(e, np.inf), x0])),
        constraints=LinearConstraint(A, lo, hi),
    )
    if res.status != 0 or res.x is None:
        return None
    step = np.rint(res.x[:e] - res.x[e:]).astype(np.int64)
    return x0 + step


def _solve_groups(group: np.ndarray, n_groups: int, problem: dict, where) -> np.ndarray:
    """Solve the independent groups of entries (``group`` per entry, sorted) in batches of
    at most :data:`_LP_ENTRIES` entries; ``where(g)`` names group ``g`` in the error."""
    x0, est, row, col = problem["x0"], problem["est"], problem["row"], problem["col"]
    out = np.empty_like(x0)
    ends = np.searchsorted(group, np.arange(n_groups), side="right")
    starts = np.concatenate([[0], ends[:-1]])
    # batch boundaries: whole groups, each batch up to _LP_ENTRIES (a larger group alone)
    cuts = [0]
    while cuts[-1] < n_groups:
        a = cuts[-1]
        b = int(np.searchsorted(ends, starts[a] + _LP_ENTRIES, side="right"))
        cuts.append(max(b, a + 1))
    for a, b in zip(cuts[:-1], cuts[1:], strict=False):
        lo_e, hi_e = int(starts[a]), int(ends[b - 1])
        sl = slice(lo_e, hi_e)
        rows, rinv = np.unique(row[sl], return_inverse=True)
        cols, cinv = np.unique(col[sl], return_inverse=True)
        got = nearest_bounded_transport(x0[sl], est[sl], rinv, problem["row_lo"][rows],
                                 problem["row_hi"][rows], cinv, problem["col_target"][cols])  # fmt: skip
        if got is None:
            # error path only: find the first infeasible group of the batch
            for g in range(a, b):
                s2 = slice(int(starts[g]), int(ends[g]))
                r2, ri2 = np.unique(row[s2], return_inverse=True)
                c2, ci2 = np.unique(col[s2], return_inverse=True)
                if nearest_bounded_transport(x0[s2], est[s2], ri2, problem["row_lo"][r2],
                                      problem["row_hi"][r2], ci2,
                                      problem["col_target"][c2]) is None:  # fmt: skip
                    raise DataError(where(g))
            raise DataError(where(a))  # pragma: no cover - a batch fails only through a group
        out[sl] = got
    return out


def impose_bounds(
    state,
    counts: tuple[np.ndarray, ...],
    held: list[np.ndarray],
    lower: list[np.ndarray | None],
    upper: list[np.ndarray | None],
) -> tuple[np.ndarray, ...]:
    """The projections' integers repaired top down to meet the effective hhgq bounds (see
    the module doc): the state's cells with its total kept, then per (parent, type) the
    children's cells by a bounded-row transportation problem, nearest the projections'
    integers; untouched (parent, type) blocks are kept exactly.

    Parameters
    ----------
    state : NMFStateRelease
    counts : tuple of numpy.ndarray
        Per spine level, int64 ``(n, 8, 2, 2, 63)``: non-negative, consistent, held cells 0.
    held : list of numpy.ndarray
        :func:`held_cells`.
    lower, upper : list
        :func:`effective_bounds`.

    Returns
    -------
    tuple of numpy.ndarray
        The repaired integers: every node with bounds within them, children summing to
        their parents cell by cell, the state totals and held cells unchanged.

    Raises
    ------
    DataError
        A (parent, type) whose children's bounds cannot be met with its structural zeros.
    """
    h = state.hierarchy
    top = h.level_index("state")
    out = [np.asarray(c, np.int64).reshape(c.shape[0], 8, 252).copy() for c in counts]
    est = state.release.estimates
    # the state: its total fixed, every type within its bounds
    x = out[top]
    ok = (x.sum(axis=2) >= lower[top]) & (x.sum(axis=2) <= upper[top])
    fix = np.flatnonzero(~ok.all(axis=1))
    if fix.size:
        free = ~held[top].reshape(-1, 8, 252)[fix]
        i, t, c = np.nonzero(free)
        node = fix[i]
        z = np.asarray(est[top]).reshape(-1, 8, 252)
        problem = {
            "x0": x[node, t, c], "est": z[node, t, c],
            "row": node * 8 + t, "row_lo": lower[top].reshape(-1),
            "row_hi": upper[top].reshape(-1),
            "col": node, "col_target": x.sum(axis=(1, 2)),
        }  # fmt: skip
        x[fix] = 0
        x[node, t, c] = _solve_groups(
            i, fix.size, problem,
            lambda g: f"non-negative product, state {h['state'].codes[fix[g]]}: its hhgq "
            "bounds cannot be met with its structural zeros and total",
        )  # fmt: skip
    for k in range(top + 1, h.depth):
        par = h.levels[k].parent
        new_p, old_p = out[k - 1], np.asarray(counts[k - 1], np.int64).reshape(-1, 8, 252)
        x = out[k]
        s = x.sum(axis=2)
        outside = (s < lower[k]) | (s > upper[k])
        touched = np.any(new_p != old_p, axis=2) | (group_sums(par, outside, new_p.shape[0]) > 0)
        if not touched.any():
            continue
        pos = new_p > 0
        mask = touched[par][:, :, None] & pos[par] & ~held[k].reshape(-1, 8, 252)
        # entries in (parent, type) order, so each group is contiguous
        i, t, c = np.nonzero(mask)
        gkey = par[i] * 8 + t
        srt = np.lexsort((c, i, gkey))
        i, t, c, gkey = i[srt], t[srt], c[srt], gkey[srt]
        groups, ginv = np.unique(gkey, return_inverse=True)
        # every touched (child, type) row must have its lower bound reachable
        rows_touched = touched[par]
        has_var = np.zeros((par.size, 8), bool)
        has_var[i, t] = True
        stuck = np.argwhere(rows_touched & ~has_var & (lower[k] > 0))
        z = np.asarray(est[k]).reshape(-1, 8, 252)
        code_up = h.levels[k - 1].codes
        if stuck.size:
            ci, ct = (int(v) for v in stuck[0])
            raise DataError(
                f"non-negative product, {h.names[k - 1]} {code_up[par[ci]]}, hhgq type {ct} "
                f"({_HHGQ_NAMES[ct]}): a child's {LOWER_BOUND} cannot be met (no cell of the "
                "type is free at both); the structural zeros contradict the bounds"
            )
        problem = {
            "x0": x[i, t, c], "est": z[i, t, c],
            "row": i * 8 + t, "row_lo": lower[k].reshape(-1), "row_hi": upper[k].reshape(-1),
            "col": (par[i] * 8 + t) * 252 + c, "col_target": new_p.reshape(-1),
        }  # fmt: skip
        sol = _solve_groups(
            ginv, groups.size, problem,
            lambda g, lv=h.names[k - 1], cu=code_up, gr=groups: f"non-negative product, "
            f"{lv} {cu[gr[g] // 8]}, hhgq type {gr[g] % 8} ({_HHGQ_NAMES[gr[g] % 8]}): its "
            "children's hhgq "
            "bounds cannot be met with its cells and their structural zeros",
        )  # fmt: skip
        x[touched[par]] = 0
        x[i, t, c] = sol
    for k in range(top - 1, -1, -1):
        out[k] = group_sums(h.levels[k + 1].parent, out[k + 1], out[k].shape[0])
    return tuple(c.reshape(-1, 8, 2, 2, 63) for c in out)


def check_bounds(state, counts) -> None:
    """Refuse integers outside the file's hhgq bounds at any node that has them (DataError
    naming the level, geocode, type and constraint; the bounds are public)."""
    h = state.hierarchy
    for name, lvl in state.measurements.levels.items():
        if name == "US":
            continue
        k = h.level_index(SPINE_LEVEL[name])
        c = np.asarray(counts[k])
        s = c.reshape(c.shape[0], 8, -1).sum(axis=2)
        has = lvl.has_bounds[:, None]
        for con, bad in (
            (LOWER_BOUND, has & (s < lvl.lower)),
            (UPPER_BOUND, has & (s > lvl.upper)),
        ):
            if bad.any():
                i, t = (int(v) for v in np.argwhere(bad)[0])
                raise DataError(
                    f"non-negative product, {name} {h.levels[k].codes[i]}, hhgq type {t}: "
                    f"outside its {con}"
                )


def check_integers(state, counts, held=None) -> None:
    """Refuse integers that break what the product promises: non-negative, children sum to
    parents cell by cell, the state total, held cells 0 (AssertionError-free: DataError)."""
    h = state.hierarchy
    held = held_cells(state) if held is None else held
    for k, c in enumerate(counts):
        if c.dtype.kind not in "iu" or (c.size and int(c.min()) < 0):
            raise DataError(f"non-negative product, level {h.names[k]!r}: a negative count")
        if np.any(c.reshape(c.shape[0], -1)[held[k]] != 0):
            raise DataError(f"non-negative product, level {h.names[k]!r}: a held cell is not 0")
        if k + 1 < len(counts):
            sums = group_sums(h.levels[k + 1].parent, counts[k + 1], c.shape[0])
            if not np.array_equal(sums, c):
                raise DataError(
                    f"non-negative product, level {h.names[k]!r}: children do not sum to parents"
                )
    k = h.level_index("state")
    for i, s in enumerate(h["state"].codes):
        if int(counts[k][i].sum()) != state.measurements.state_totals[str(s)]:
            raise DataError(f"non-negative product, state {s}: the total is not the published one")


def bound_violations(state, counts) -> dict:
    """Per NMF level read, ``{"below_lower": n, "above_upper": n}``: the (node, hhgq type)
    pairs whose persons in ``counts`` (per spine level, ``(n, 8, 2, 2, 63)``) lie outside
    the file's own bounds, at the nodes that have them."""
    h = state.hierarchy
    out = {}
    for name, lvl in state.measurements.levels.items():
        c = counts[h.level_index(SPINE_LEVEL[name])]
        hhgq = c.reshape(c.shape[0], 8, -1).sum(axis=2)
        has = lvl.has_bounds[:, None]
        out[name] = {
            "below_lower": int((has & (hhgq < lvl.lower)).sum()),
            "above_upper": int((has & (hhgq > lvl.upper)).sum()),
        }
    return out


def write_integers(folder: Path, state, product: NMFIntegers, started: set[str]) -> list[str]:
    """Append the state's integer P1–P5 tables to ``folder`` (``nonnegative/`` of a release):
    ``pl94_state.csv``, ``pl94_spine_<level>.csv`` and ``pl94_block.csv`` (GEOID and spine
    geocode), and the tabulation county / tract / block group as sums of the blocks'
    integers. No ``_se`` columns: the product is biased and has none. Returns the names
    written (``started``: the names already begun, appended to)."""
    from censusdp.pipelines.products.nmf_release import (
        SPINE_OUTPUT_LEVELS,
        TABULATION_PREFIX,
        census_block_geoids,
    )

    book = pl94_codebook()
    cols = list(book.columns)
    h = state.hierarchy
    counts = product.counts

    def table(codes: dict, c: np.ndarray) -> pd.DataFrame:
        vals = book.rows.apply(c)
        frame = pd.DataFrame({k: np.asarray(v, dtype=object) for k, v in codes.items()})
        return pd.concat([frame, pd.DataFrame(vals.astype(np.int64), columns=cols)], axis=1)

    frames = {"pl94_state.csv": table({"GEOID": h["state"].codes}, counts[h.level_index("state")])}
    for level in SPINE_OUTPUT_LEVELS:
        frames[f"pl94_spine_{level}.csv"] = table(
            {"geocode": h[level].codes}, counts[h.level_index(level)]
        )
    blocks = counts[h.level_index("block")]
    geo = state.tabulation_geoids
    for level, width in TABULATION_PREFIX.items():
        keys, inv = np.unique(np.strings.slice(geo, 0, width), return_inverse=True)
        sums = group_sums(inv.reshape(-1), blocks, keys.size)
        frames[f"pl94_{level}.csv"] = table({"GEOID": keys}, sums)
    frames["pl94_block.csv"] = table(
        {"GEOID": census_block_geoids(geo), "geocode": h["block"].codes}, blocks
    )
    folder.mkdir(exist_ok=True)
    for name, frame in frames.items():
        first = name not in started
        write_csv(frame, folder / name, index=False, header=first, mode="w" if first else "a")
        started.add(name)
    return sorted(frames)
