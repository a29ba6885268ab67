"""One TopDown-style sub-problem: the children of one parent, solved jointly.

Given the parent's *integer* histogram (already fixed by the level above), the children's noisy
measurements and their invariants, :func:`solve_children` returns the children's integer
histograms: non-negative, summing exactly to the parent cell by cell, and meeting every
invariant exactly. It is a pure function of its inputs, so a scheduler (Dask, Spark in the
Bureau's production system) may map it over all parents of a level in any order.

Two steps, each a sequence of passes, as in the Bureau's 2020 production code:

1. **L2 step** (Clarabel, or OSQP with polishing): real-valued ``X ≥ 0`` (children × cells),
   ``Σ_c X[c, :] = parent``, the children's invariants as equalities.
   Pass 1 minimises the inverse-variance weighted squared error of the *primary* queries
   (at least the children's totals); pass 2 minimises the weighted squared error of every other
   measured query (the detailed cells, marginals) while each primary answer stays within
   ``± tol · max(1, |pass-1 value|)`` of its pass-1 value.
2. **Rounding step** (HiGHS): ``X = ⌊X̃⌋ + Y`` with ``Y`` binary, ``Σ_c Y[c, :] = parent −
   Σ_c ⌊X̃⌋[c, :]``, the invariants as equalities. Pass A minimises the L1 distance of the
   children's totals to their fractional targets; pass B fixes those totals and minimises the
   L1 distance of the cells to their fractional parts, ``Σ (1 − 2 f) Y`` up to a constant.
   The total distance ``|s − t|`` of an integer ``s`` is written with integer breakpoints
   (``s − ⌊t⌋ = g + h⁺ − h⁻``, ``0 ≤ g ≤ 1``), so both passes are linear programs over a
   network (bipartite transportation) matrix: totally unimodular, so the simplex vertex HiGHS
   returns is integral. Marginal invariants can break total unimodularity; the LP solution is
   then checked and, if fractional, the same pass is re-solved as a MILP with
   :func:`scipy.optimize.milp` (HiGHS branch and bound), and the fallback is recorded.

Speed: each distinct problem *shape* (children, cells, query and invariant structure) is built
once as a cvxpy problem with Parameters (disciplined parametrized programming, DPP) and cached
per thread; later parents of the same shape only set parameter values, which skips cvxpy's
canonicalisation. The choice against one block-diagonal problem per level is documented in
:mod:`censusdp.estimation.topdown`.

References
----------
Abowd, Ashmead, Cumings-Menon, Garfinkel, Heineman, Heiss, Johns, Kifer, Leclerc,
Machanavajjhala, Moran, Sexton, Spence & Zhuravlev (2022), "The 2020 Census Disclosure
Avoidance System TopDown Algorithm", Harvard Data Science Review, Special Issue 2, §§5–6
(the L2 multi-pass optimisation and the L1 controlled rounder).
U.S. Census Bureau, DAS 2020 production code (``das_decennial``,
``programs/optimization/l2_plus_rounder``, ``l2_dataIndep_npass_optimizer``,
``l1_controlled_rounder``), github.com/uscensusbureau/DAS_2020_Redistricting_Production_Code.
Schrijver (1986), *Theory of Linear and Integer Programming*, §19 (network matrices are
totally unimodular).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from censusdp.errors import SolverError
from censusdp.estimation.quiet import quiet_options
from censusdp.mechanisms.queries import Invariant, Measurement
from censusdp.timing import stage

__all__ = [
    "DEFAULT_TOL",
    "ChildrenSolution",
    "solve_children",
    "solve_children_report",
    "clear_problem_cache",
    "repair_round_off",
    "solver_unit",
]

#: Default relative tolerance of the pass-2 band around the pass-1 primary answers.
DEFAULT_TOL = 1e-6

#: |x − round(x)| below this is treated as the integer (solver round-off, not signal).
_SNAP = 1e-6

#: Tolerance of the integrality check of the rounding LP's solution.
_INTEGRAL = 1e-6

#: Compiled problems kept per thread (LRU).
_CACHE_SIZE = 128

_L2_OK = (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


@dataclass
class ChildrenSolution:
    """The integer histograms of one parent's children and how they were obtained.

    Attributes
    ----------
    counts : numpy.ndarray
        int64 (children, cells).
    l2_status : list of str
        cvxpy status of each L2 pass that ran.
    l1_status : list of str
        Status of each rounding pass (``"optimal"`` or ``"milp:<message>"``).
    milp_fallback : bool
        True when a rounding LP solution was fractional and the MILP was used.
    seconds_l2, seconds_l1 : float
        Wall time of the two steps.
    """

    counts: np.ndarray
    l2_status: list[str] = field(default_factory=list)
    l1_status: list[str] = field(default_factory=list)
    milp_fallback: bool = False
    seconds_l2: float = 0.0
    seconds_l1: float = 0.0


# ---------------------------------------------------------------------------------- helpers
def _qkey(matrix: np.ndarray) -> tuple:
    m = np.ascontiguousarray(matrix, dtype=np.int64)
    return (m.shape, m.tobytes())


def _is_identity(q: np.ndarray) -> bool:
    return q.shape[0] == q.shape[1] and bool(np.array_equal(q, np.eye(q.shape[0], dtype=q.dtype)))


def _is_total(q: np.ndarray) -> bool:
    return q.shape[0] == 1 and bool(np.all(q == 1))


def _apply(x: cp.Expression, q: np.ndarray) -> cp.Expression:
    """``x @ q.T`` for a (children × cells) expression, with the identity and total cheap."""
    if _is_identity(q):
        return x
    if _is_total(q):
        return cp.sum(x, axis=1, keepdims=True)
    return x @ q.T.astype(np.float64)


class _Cache:
    """A per-thread LRU of compiled problems (cvxpy problems are not thread-safe)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _store(self) -> OrderedDict:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = OrderedDict()
        return store

    def get(self, key: tuple, build):
        store = self._store()
        if key in store:
            store.move_to_end(key)
            return store[key]
        obj = build()
        store[key] = obj
        if len(store) > _CACHE_SIZE:
            store.popitem(last=False)
        return obj

    def clear(self) -> None:
        self._store().clear()


_CACHE = _Cache()


def clear_problem_cache() -> None:
    """Drop this thread's compiled problems (frees memory; the next solves recompile)."""
    _CACHE.clear()


# ---------------------------------------------------------------------------------- L2 step
class _L2Problem:
    """Both L2 passes for one shape, built once with cvxpy Parameters (DPP)."""

    def __init__(
        self,
        n: int,
        m: int,
        has_parent: bool,
        primary: Sequence[np.ndarray],
        secondary: Sequence[np.ndarray],
        inv: Sequence[np.ndarray],
    ) -> None:
        x = cp.Variable((n, m), nonneg=True)
        self.x = x
        cons = []
        self.parent = None
        if has_parent:
            self.parent = cp.Parameter(m)
            cons.append(cp.sum(x, axis=0) == self.parent)
        self.inv = []
        for q in inv:
            p = cp.Parameter((n, q.shape[0]))
            cons.append(_apply(x, q) == p)
            self.inv.append(p)

        def terms(mats):
            ws, ys, out = [], [], []
            for q in mats:
                w = cp.Parameter(nonneg=True)
                y = cp.Parameter((n, q.shape[0]))
                out.append(cp.sum_squares(w * _apply(x, q) - y))
                ws.append(w)
                ys.append(y)
            return ws, ys, out

        self.w1, self.y1, t1 = terms(primary)
        self.w2, self.y2, t2 = terms(secondary)
        self.pass1 = cp.Problem(cp.Minimize(cp.sum(t1)), cons) if t1 else None
        band = []
        self.centre, self.halfwidth = [], []
        if t1:
            for q in primary:
                c = cp.Parameter((n, q.shape[0]))
                h = cp.Parameter((n, q.shape[0]), nonneg=True)
                a = _apply(x, q)
                band += [a - c <= h, c - a <= h]
                self.centre.append(c)
                self.halfwidth.append(h)
        # Without secondary queries the cells are not identified by any measurement: the
        # minimum-norm split among the pass-1 optima is taken (documented in topdown()).
        obj2 = cp.sum(t2) if t2 else cp.sum_squares(x)
        self.pass2 = cp.Problem(cp.Minimize(obj2), cons + band) if (t2 or not t1) else None
        self.primary = [np.asarray(q) for q in primary]


def _l2_solve(problem: cp.Problem, solver: str, where: str, label: str) -> str:
    opts: dict = quiet_options(solver)
    if solver.upper() == "OSQP":
        opts |= {"polishing": True, "eps_abs": 1e-9, "eps_rel": 1e-9, "max_iter": 200_000}
    try:
        problem.solve(solver=solver, warm_start=False, **opts)
    except cp.error.SolverError as exc:
        raise SolverError(
            f"{where}: the TopDown L2 {label} failed in solver {solver} ({exc.__class__.__name__}); "
            "check that the invariants are consistent with the level above, or try "
            "solver_l2='OSQP'"
        ) from None
    if problem.status not in _L2_OK:
        raise SolverError(
            f"{where}: the TopDown L2 {label} ended with status {problem.status!r} in solver "
            f"{solver}; an infeasible status means the children's invariants cannot be met "
            "with non-negative counts summing to the parent (check the invariants)"
        )
    return str(problem.status)


# ---------------------------------------------------------------------------------- rounding
class _L1Problem:
    """Both rounding passes for one shape, as DPP linear programs."""

    def __init__(self, n: int, m: int, has_parent: bool, inv: Sequence[np.ndarray]) -> None:
        # Box bounds as variable bounds: HiGHS gets them as column bounds, not rows.
        y = cp.Variable((n, m), bounds=[0, 1])
        g = cp.Variable(n, bounds=[0, 1])
        hp = cp.Variable(n, nonneg=True)
        hm = cp.Variable(n, nonneg=True)
        self.y = y
        base = []
        self.r = None
        if has_parent:
            self.r = cp.Parameter(m)
            base.append(cp.sum(y, axis=0) == self.r)
        self.inv = []
        for q in inv:
            p = cp.Parameter((n, q.shape[0]))
            base.append(_apply(y, q) == p)
            self.inv.append(p)
        self.a = cp.Parameter(n)
        self.cost_g = cp.Parameter(n)
        rows = cp.sum(y, axis=1)
        self.pass_a = cp.Problem(
            cp.Minimize(self.cost_g @ g + cp.sum(hp) + cp.sum(hm)),
            base + [rows - g - hp + hm == self.a],
        )
        self.s = cp.Parameter(n)
        # A flat cost vector: ``c @ vec(y)`` canonicalises in milliseconds where the
        # elementwise ``sum(multiply(C, y))`` takes seconds for a few thousand cells.
        self.cost_y = cp.Parameter(n * m)
        self.pass_b = cp.Problem(
            cp.Minimize(self.cost_y @ cp.vec(y, order="C")), base + [rows == self.s]
        )


def _milp_round(
    n: int,
    m: int,
    r: np.ndarray | None,
    inv: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    stage: str,
    a: np.ndarray | None = None,
    cost_g: np.ndarray | None = None,
    s: np.ndarray | None = None,
    cost_y: np.ndarray | None = None,
) -> tuple[np.ndarray, str]:
    """The same rounding pass as a MILP (scipy.optimize.milp / HiGHS branch and bound).

    Variables: vec(Y) (row-major, n·m binaries), then for pass A g (n, integer in [0, 1]),
    h⁺ (n), h⁻ (n).
    """
    nm = n * m
    blocks, lo, hi = [], [], []
    extra = 3 * n if stage == "A" else 0

    def add(mat, rhs):
        blocks.append(sp.hstack([mat, sp.csr_matrix((mat.shape[0], extra))]).tocsr())
        lo.append(rhs)
        hi.append(rhs)

    if r is not None:
        add(sp.kron(np.ones((1, n)), sp.eye(m)), r)
    for q, rhs in inv:
        add(sp.kron(sp.eye(n), sp.csr_matrix(q.astype(np.float64))), rhs.reshape(-1))
    rows = sp.kron(sp.eye(n), np.ones((1, m)))
    if stage == "A":
        eye = sp.eye(n)
        blocks.append(sp.hstack([rows, -eye, -eye, eye]).tocsr())
        lo.append(a)
        hi.append(a)
        c = np.concatenate([np.zeros(nm), cost_g, np.ones(2 * n)])
        integrality = np.concatenate([np.ones(nm + n), np.zeros(2 * n)])
        ub = np.concatenate([np.ones(nm + n), np.full(2 * n, np.inf)])
    else:
        add(rows, s)
        c = cost_y.reshape(-1)
        integrality = np.ones(nm)
        ub = np.ones(nm)
    res = milp(
        c,
        constraints=LinearConstraint(
            sp.vstack(blocks).tocsr(), np.concatenate(lo), np.concatenate(hi)
        ),
        integrality=integrality,
        bounds=Bounds(np.zeros(c.size), ub),
    )
    if res.x is None:
        return np.empty((n, m)), f"milp:{res.message}"
    return np.rint(res.x[:nm]).reshape(n, m), "milp:optimal"


def _lp_solve(problem: cp.Problem, solver: str) -> str:
    try:
        problem.solve(solver=solver, warm_start=False, **quiet_options(solver))
    except cp.error.SolverError:
        return "solver_error"
    return str(problem.status)


def _round(
    xt: np.ndarray,
    parent: np.ndarray | None,
    inv: Sequence[tuple[np.ndarray, np.ndarray]],
    solver: str,
    where: str,
) -> tuple[np.ndarray, list[str], bool]:
    """Controlled rounding of ``xt`` (children × cells) to integers; see the module docstring."""
    n, m = xt.shape
    floor = np.floor(xt)
    frac = xt - floor
    r = None
    if parent is not None:
        r = parent - floor.sum(axis=0)
        if np.any(r < 0) or np.any(r > n):
            raise SolverError(
                f"{where}: the TopDown rounding step is infeasible (the L2 solution does not "
                "sum to the parent within one unit per child); the L2 solve was inaccurate — "
                "try solver_l2='OSQP' or a smaller tol"
            )
    inv_rhs = [(q, np.rint(v - floor @ q.T)) for q, v in inv]
    key = ("L1", n, m, parent is not None, tuple(_qkey(q) for q, _ in inv))
    prob: _L1Problem = _CACHE.get(
        key, lambda: _L1Problem(n, m, parent is not None, [q for q, _ in inv])
    )
    if r is not None:
        prob.r.value = r
    for p, (_, rhs) in zip(prob.inv, inv_rhs, strict=True):
        p.value = rhs
    status: list[str] = []
    fallback = False

    def fail(label: str, st: str):
        return SolverError(
            f"{where}: the TopDown rounding {label} ended with status {st!r} in solver "
            f"{solver} and in the MILP fallback; check that the invariants are integers "
            "consistent with the level above"
        )

    # Pass A: the children's totals. Skipped when a total invariant fixes them.
    fixed_total = next((rhs[:, 0] for q, rhs in inv_rhs if _is_total(q)), None)
    if fixed_total is not None:
        s = fixed_total
    else:
        t = frac.sum(axis=1)
        a = np.floor(t)
        cost_g = 1.0 - 2.0 * (t - a)
        prob.a.value, prob.cost_g.value = a, cost_g
        st = _lp_solve(prob.pass_a, solver)
        ya = prob.y.value
        if st == cp.OPTIMAL and ya is not None and np.all(np.abs(ya - np.rint(ya)) <= _INTEGRAL):
            s = np.rint(ya).sum(axis=1)
            status.append(st)
        else:
            fallback = True
            ya, st = _milp_round(n, m, r, inv_rhs, stage="A", a=a, cost_g=cost_g)
            if st != "milp:optimal":
                raise fail("pass A (totals)", st)
            s = ya.sum(axis=1)
            status.append(st)
    # Pass B: the cells, totals fixed.
    cost_y = 1.0 - 2.0 * frac
    prob.s.value, prob.cost_y.value = s, cost_y.reshape(-1)
    st = _lp_solve(prob.pass_b, solver)
    y = prob.y.value
    if st == cp.OPTIMAL and y is not None and np.all(np.abs(y - np.rint(y)) <= _INTEGRAL):
        y = np.rint(y)
        status.append(st)
    else:
        fallback = True
        y, st = _milp_round(n, m, r, inv_rhs, stage="B", s=s, cost_y=cost_y)
        if st != "milp:optimal":
            raise fail("pass B (cells)", st)
        status.append(st)
    return (floor + y).astype(np.int64), status, fallback


# ---------------------------------------------------------------------------------- public
def solve_children_report(
    parent: np.ndarray | None,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    *,
    n_children: int | None = None,
    primary: Collection[str] = ("total",),
    tol: float = DEFAULT_TOL,
    solver_l2: str = "CLARABEL",
    solver_l1: str = "HIGHS",
    where: str = "node",
) -> ChildrenSolution:
    """:func:`solve_children`, also returning solver statuses and timings.

    Parameters are those of :func:`solve_children`.
    """
    meas = list(measurements)
    invs = list(invariants)
    if n_children is None:
        rows = [mm.values.shape[0] for mm in meas] + [iv.values.shape[0] for iv in invs]
        if not rows:
            raise ValueError(f"{where}: pass n_children when there are no measurements")
        n_children = rows[0]
    n = int(n_children)
    if parent is not None:
        parent = np.asarray(parent)
        m = parent.shape[0]
    else:
        qs = [mm.query for mm in meas] + [iv.query for iv in invs]
        if not qs:
            raise ValueError(f"{where}: the root needs at least one measurement or invariant")
        m = qs[0].n_cells
    for mm in meas:
        if mm.values.shape != (n, mm.query.n_rows) or mm.query.n_cells != m:
            raise ValueError(
                f"{where}: measurement {mm.query.name!r} must have shape "
                f"({n}, {mm.query.n_rows}) over {m} cells"
            )
    for iv in invs:
        if iv.values.shape != (n, iv.query.n_rows) or iv.query.n_cells != m:
            raise ValueError(
                f"{where}: invariant {iv.query.name!r} must have shape "
                f"({n}, {iv.query.n_rows}) over {m} cells"
            )

    prim = [mm for mm in meas if mm.query.name in primary]
    sec = [mm for mm in meas if mm.query.name not in primary]
    inv_pairs = [
        (np.asarray(iv.query.matrix, dtype=np.int64), np.asarray(iv.values)) for iv in invs
    ]
    key = (
        "L2",
        n,
        m,
        parent is not None,
        tuple(_qkey(mm.query.matrix) for mm in prim),
        tuple(_qkey(mm.query.matrix) for mm in sec),
        tuple(_qkey(q) for q, _ in inv_pairs),
    )
    clock: dict[str, float] = {}
    with stage(clock, "l2"):
        prob: _L2Problem = _CACHE.get(
            key,
            lambda: _L2Problem(
                n,
                m,
                parent is not None,
                [np.asarray(mm.query.matrix) for mm in prim],
                [np.asarray(mm.query.matrix) for mm in sec],
                [q for q, _ in inv_pairs],
            ),
        )
        # Work in units of the typical count so the solver sees numbers of order one (a nation
        # histogram of 3e8 people otherwise defeats the interior-point tolerances).
        scale = solver_unit(parent, n, [mm.values for mm in meas] + [v for _, v in inv_pairs])
        if parent is not None:
            prob.parent.value = parent.astype(np.float64) / scale
        for p, (_, v) in zip(prob.inv, inv_pairs, strict=True):
            p.value = v.astype(np.float64) / scale
        for ws, ys, ms in ((prob.w1, prob.y1, prim), (prob.w2, prob.y2, sec)):
            for w, y, mm in zip(ws, ys, ms, strict=True):
                sd = 1.0 / np.sqrt(mm.variance)
                w.value = sd
                y.value = np.asarray(mm.values, dtype=np.float64) * (sd / scale)
        l2_status = []
        if prob.pass1 is not None:
            l2_status.append(_l2_solve(prob.pass1, solver_l2, where, "pass 1 (primary queries)"))
            x1 = np.maximum(prob.x.value, 0.0)
            for c, h, q in zip(prob.centre, prob.halfwidth, prob.primary, strict=True):
                ans = x1 @ q.T
                c.value = ans
                h.value = tol * np.maximum(1.0 / scale, np.abs(ans))
            xt = x1
        if prob.pass2 is not None:
            l2_status.append(_l2_solve(prob.pass2, solver_l2, where, "pass 2 (other queries)"))
            xt = prob.x.value
        xt = np.asarray(xt, dtype=np.float64) * scale
    with stage(clock, "l1"):
        xt = repair_round_off(np.asarray(xt, dtype=np.float64), parent)
        counts, l1_status, fallback = _round(xt, parent, inv_pairs, solver_l1, where)
    return ChildrenSolution(counts, l2_status, l1_status, fallback, clock["l2"], clock["l1"])


def solver_unit(parent: np.ndarray | None, n: int, arrays: Sequence[np.ndarray]) -> float:
    """The solver's unit: the mean absolute entry of the data (a child's share of the parent
    for the parent histogram), at least 1."""
    parts = [np.abs(np.asarray(a, dtype=np.float64)).ravel() for a in arrays]
    if parent is not None:
        parts.append(np.abs(parent.astype(np.float64)) / n)
    allv = np.concatenate(parts) if parts else np.zeros(0)
    return float(max(1.0, allv.mean())) if allv.size else 1.0


def repair_round_off(xt: np.ndarray, parent: np.ndarray | None) -> np.ndarray:
    """Clip solver round-off: negatives to 0, near-integers to the integer, and rescale each
    cell so the children sum to the parent (a change of the order of the solver tolerance)."""
    xt = np.maximum(xt, 0.0)
    if parent is not None:
        col = xt.sum(axis=0)
        pos = col > 0
        xt[:, pos] *= parent[pos] / col[pos]
        # A cell the solver left at zero while the parent is not: spread it evenly.
        gap = (~pos) & (parent > 0)
        xt[:, gap] = parent[gap] / xt.shape[0]
    near = np.abs(xt - np.rint(xt)) <= _SNAP
    xt[near] = np.rint(xt[near])
    return xt


def solve_children(
    parent: np.ndarray | None,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    *,
    n_children: int | None = None,
    primary: Collection[str] = ("total",),
    tol: float = DEFAULT_TOL,
    solver_l2: str = "CLARABEL",
    solver_l1: str = "HIGHS",
    where: str = "node",
) -> np.ndarray:
    """Integer histograms of one parent's children (TopDown L2 step, then controlled rounding).

    A pure function of its inputs (compiled problems are cached per thread, which changes the
    speed, not the result): map it over the parents of a level in any order or process.

    Parameters
    ----------
    parent : numpy.ndarray or None
        The parent's integer histogram (cells,), or None for the root (no parent equality).
    measurements : sequence of Measurement
        The children's noisy answers, one row per child (``values`` of shape
        (children, query rows)); any noise law, weighted by the inverse of its variance.
    invariants : sequence of Invariant
        The children's exact answers, one row per child; met exactly.
    n_children : int, optional
        Number of children (inferred from the measurements or invariants when omitted).
    primary : collection of str
        Names of the queries of L2 pass 1 (default: the node totals).
    tol : float
        Pass-2 band: every primary answer stays within ``tol · max(1, |pass-1 value|)`` of
        its pass-1 value.
    solver_l2, solver_l1 : str
        cvxpy solver names for the L2 step (``"CLARABEL"`` or ``"OSQP"``) and the rounding
        LP (``"HIGHS"``).
    where : str
        Location used in error messages, e.g. ``"level 'county', parent '17'"``.

    Returns
    -------
    numpy.ndarray
        int64 (children, cells): non-negative, ``Σ_c = parent`` exactly, invariants exact.

    Raises
    ------
    SolverError
        When a solver fails or the problem is infeasible; the message names ``where``, never
        counts.

    References
    ----------
    Abowd et al. (2022), "The 2020 Census Disclosure Avoidance System TopDown Algorithm",
    Harvard Data Science Review, §§5–6; U.S. Census Bureau, DAS 2020 production code.
    """
    return solve_children_report(
        parent,
        measurements,
        invariants,
        n_children=n_children,
        primary=primary,
        tol=tol,
        solver_l2=solver_l2,
        solver_l1=solver_l1,
        where=where,
    ).counts
