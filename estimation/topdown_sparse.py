"""One parent's TopDown-style sub-problem on a schema histogram, as sparse matrices.

The Census Bureau's 2020 TopDown algorithm fixes a level's integer histograms, then solves the
children of every parent jointly in two steps, each in several passes (Abowd et al. 2022,
§§5–6; ``das_decennial`` ``l2_dataIndep_npass_optimizer.py`` and ``multipass_rounder.py``):

**L2 step** (:func:`l2_multipass`, non-negative weighted least squares). Pass ``p`` minimises
``Σ_{q ∈ pass p} Σ_i w_{q,i} ‖Q_q x_i − y_{q,i}‖²`` over the children's cell vectors
``x_i ≥ 0`` with ``Σ_i x_i = parent`` cell by cell, the children's invariants ``H x_i = t_i``
exactly, and every query of an earlier pass held within a band around that pass's answers:
``|Q_q x_i − a_{q,i}| ≤ τ``. The Bureau's band (``DataIndNPass_toleranceType = opt_tol``,
``opt_tol_slack = 0.1``) is the smallest tolerance with which the constraints are feasible
plus an additive slack; since the previous pass's solution satisfies them, that smallest
tolerance is its own constraint residual, which is what is used here (in counts) plus
``slack``.

**L1 step** (:func:`l1_multipass`, controlled rounding). With ``F = ⌊x̃⌋`` and
``f = x̃ − F`` of the L2 solution ``x̃``, the children are ``F + Y`` with ``Y`` binary.
Pass ``p`` minimises ``Σ_{q ∈ pass p} ‖Q_q Y_i − round(Q_q f_i)‖₁`` (plus
``Σ (1 − 2f)·Y`` when the detailed query is in the pass), subject to ``Σ_i Y_i = parent −
Σ_i F_i``, the invariants, and every earlier pass's query answers fixed at that pass's
integer values. It is a mixed-integer program (binaries), solved by HiGHS.

Only the *active* cells enter a problem: the cells where the parent is positive and no
structural zero is declared (every child is zero elsewhere, since children are non-negative
and sum to the parent). A query's matrix is built sparse once (the Kronecker product of its
per-attribute 0/1 factors, ``nnz`` = cells for a partitioning query) and restricted to the
active columns, dropping rows without an active column; the children's block is
``I_n ⊗ Q_a``. No cells × cells matrix appears. The L2 problem is posed for Clarabel's native
API with one residual variable per answer (``r_q = Q_q x``), so its Hessian is diagonal and
every pass shares the same equality block; only the costs and the band rows change.

References
----------
Abowd, Ashmead, Cumings-Menon, Garfinkel, Heineman, Heiss, Johns, Kifer, Leclerc,
Machanavajjhala, Moran, Sexton, Spence & Zhuravlev (2022), "The 2020 Census Disclosure
Avoidance System TopDown Algorithm", Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021), DAS_2020_Redistricting_Production_Code,
``programs/optimization/{l2_dataIndep_npass_optimizer,multipass_rounder}.py`` and
``configs/production/pl94/person_{US,default}.ini``.
Goulart & Chen (2024), "Clarabel: An interior-point solver for conic programs with quadratic
objectives" (the L2 solver); Huangfu & Hall (2018), "Parallelizing the dual revised simplex
method", Math. Prog. Comp. (HiGHS, the L1 solver).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce

import clarabel
import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from censusdp.errors import SolverError
from censusdp.estimation.topdown_problem import _repair, _scale
from censusdp.mechanisms.product_query import ProductQuery

__all__ = [
    "sparse_matrix",
    "ChildrenLayout",
    "L2Pass",
    "L1Pass",
    "l2_multipass",
    "l1_multipass",
    "DEFAULT_SLACK",
]

#: The Bureau's additive slack on the L2 band (``opt_tol_slack``, production pl94), in counts.
DEFAULT_SLACK = 0.1

_L2_OK = ("Solved", "AlmostSolved")
#: A rounding solution further than this from an integer is a solver failure.
_INTEGRAL = 1e-6

_SPARSE_CACHE: dict[int, tuple[ProductQuery, sp.csc_matrix]] = {}


def sparse_matrix(query: ProductQuery) -> sp.csc_matrix:
    """The (rows × cells) 0/1 matrix ``⊗_a R_a`` of ``query``, sparse (CSC), cached.

    Built as the Kronecker product of the sparse per-attribute factors, so its size is its
    number of non-zeros (one per cell for a query whose every factor partitions its
    attribute), never rows × cells dense.
    """
    hit = _SPARSE_CACHE.get(id(query))
    if hit is not None and hit[0] is query:
        return hit[1]
    mats = [sp.csr_matrix(f.matrix.astype(np.float64)) for f in query.factors]
    m = reduce(lambda a, b: sp.kron(a, b, format="csr"), mats, sp.csr_matrix(np.ones((1, 1))))
    out = sp.csc_matrix(m)
    _SPARSE_CACHE[id(query)] = (query, out)
    return out


@dataclass(frozen=True, eq=False)
class _Block:
    """One query restricted to a parent's active cells (rows without one dropped)."""

    query: ProductQuery
    rows: np.ndarray  # kept row indices of the query
    mat: sp.csr_matrix  # (len(rows), n_active)
    identity: bool  # the detailed query: the block is the identity


@dataclass(eq=False)
class ChildrenLayout:
    """The active cells of one parent and its queries restricted to them.

    Parameters
    ----------
    n_children : int
    n_cells : int
    parent : numpy.ndarray or None
        The parent's integer histogram (flat, ``n_cells``), or None for the root.
    zero : numpy.ndarray or None
        Flat boolean mask of structural zeros (cells every node must leave at zero).
    """

    n_children: int
    n_cells: int
    parent: np.ndarray | None
    zero: np.ndarray | None = None
    active: np.ndarray = field(init=False)
    _blocks: dict[int, _Block] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        keep = np.ones(self.n_cells, bool)
        if self.parent is not None:
            keep &= np.asarray(self.parent) > 0
        if self.zero is not None:
            keep &= ~np.asarray(self.zero, bool)
        self.active = np.flatnonzero(keep)

    @property
    def n_active(self) -> int:
        return int(self.active.size)

    def block(self, query: ProductQuery) -> _Block:
        """``query`` restricted to the active columns, its empty rows dropped (cached)."""
        b = self._blocks.get(id(query))
        if b is None:
            full = sparse_matrix(query)[:, self.active].tocsr()
            rows = np.flatnonzero(np.diff(full.indptr) > 0)
            mat = full[rows]
            ident = query.name == "detailed"
            b = _Block(query, rows, mat, ident)
            self._blocks[id(query)] = b
        return b

    def kron(self, query: ProductQuery) -> sp.csr_matrix:
        """``I_n ⊗ Q_a``: the children's answers of ``query`` from the stacked ``x``."""
        return sp.kron(sp.identity(self.n_children, format="csr"), self.block(query).mat, "csr")

    def parent_rows(self) -> sp.csr_matrix:
        """``1_nᵀ ⊗ I_a``: the children's sum of every active cell."""
        return sp.kron(np.ones((1, self.n_children)), sp.identity(self.n_active), "csr")

    def expand(self, x_active: np.ndarray) -> np.ndarray:
        """(children, active) → (children, cells), zero off the active cells."""
        out = np.zeros((self.n_children, self.n_cells), dtype=x_active.dtype)
        out[:, self.active] = x_active
        return out


@dataclass(frozen=True)
class L2Pass:
    """What one L2 pass did: the queries it fitted, its objective (in counts²), its band."""

    queries: tuple[str, ...]
    objective: float
    status: str
    tol: float
    answers: dict[str, np.ndarray]


@dataclass(frozen=True)
class L1Pass:
    """What one rounding pass did: its queries, its L1 objective and the solver status."""

    queries: tuple[str, ...]
    objective: float
    status: str


def _check_invariants(
    layout: ChildrenLayout, invariants: Sequence[tuple[ProductQuery, np.ndarray]], where: str
) -> list[tuple[_Block, np.ndarray]]:
    """The invariants on the kept rows; a dropped row (no active cell) must be zero."""
    out = []
    for q, vals in invariants:
        b = layout.block(q)
        v = np.asarray(vals).reshape(layout.n_children, q.n_rows)
        dropped = np.setdiff1d(np.arange(q.n_rows), b.rows)
        if dropped.size and np.any(v[:, dropped] != 0):
            raise SolverError(
                f"{where}: invariant {q.name!r} is positive in a row whose cells are all zero in "
                "the parent or declared structural zeros; the invariants cannot be met (check "
                "that they nest and agree with the structural zeros)"
            )
        out.append((b, v[:, b.rows]))
    return out


def l2_multipass(
    layout: ChildrenLayout,
    measurements: Sequence[tuple[ProductQuery, np.ndarray, np.ndarray]],
    invariants: Sequence[tuple[ProductQuery, np.ndarray]],
    passes: Sequence[Sequence[str]],
    *,
    slack: float = DEFAULT_SLACK,
    where: str = "node",
) -> tuple[np.ndarray, list[L2Pass]]:
    """The Bureau's multi-pass non-negative least squares for one parent's children.

    Parameters
    ----------
    layout : ChildrenLayout
    measurements : sequence of (ProductQuery, values, variance)
        The children's noisy answers ``(n_children, rows)`` and their noise variance (a
        float or one per child).
    invariants : sequence of (ProductQuery, values)
        Exact answers ``(n_children, rows)``, met as equalities.
    passes : sequence of sequence of str
        Query names per pass, in order (e.g. ``[["total"], [every other query]]``); a name
        not measured here is skipped, a pass left empty is skipped.
    slack : float
        Additive band slack in counts (the Bureau's ``opt_tol_slack``).
    where : str
        Location for error messages.

    Returns
    -------
    x : numpy.ndarray
        float64 (children, cells): the last pass's solution with round-off repaired
        (non-negative, children summing to the parent exactly in floating point).
    passes : list of L2Pass

    Raises
    ------
    SolverError
        When Clarabel does not solve a pass (the message names ``where`` and the pass).
    """
    n, na = layout.n_children, layout.n_active
    by_name = {q.name: (q, np.asarray(v, np.float64), var) for q, v, var in measurements}
    inv = _check_invariants(layout, invariants, where)
    scale = _scale(
        layout.parent,
        n,
        [v for _, v, _ in by_name.values()] + [v for _, v in inv],
    )
    # Variables: x (n·na, child-major), then one residual block r_q = (I ⊗ Q_a) x per
    # non-detailed measured query.
    offs: dict[str, tuple[int, int]] = {}
    pos = n * na
    rdef = []
    for name, (q, _, _) in by_name.items():
        b = layout.block(q)
        if b.identity:
            offs[name] = (0, n * na)
            continue
        size = n * b.rows.size
        offs[name] = (pos, size)
        rdef.append((pos, size, layout.kron(q)))
        pos += size
    nv = pos
    eq_rows, eq_rhs = [], []
    if layout.parent is not None:
        eq_rows.append(sp.hstack([layout.parent_rows(), sp.csr_matrix((na, nv - n * na))]))
        eq_rhs.append(np.asarray(layout.parent, np.float64)[layout.active] / scale)
    for b, v in inv:
        k = sp.kron(sp.identity(n), b.mat, "csr")
        eq_rows.append(sp.hstack([k, sp.csr_matrix((k.shape[0], nv - n * na))]))
        eq_rhs.append(v.reshape(-1).astype(np.float64) / scale)
    for p0, size, k in rdef:
        sel = sp.csr_matrix(
            (-np.ones(size), (np.arange(size), np.arange(p0, p0 + size))), shape=(size, nv)
        )
        eq_rows.append(sp.hstack([k, sp.csr_matrix((size, nv - n * na))]) + sel)
        eq_rhs.append(np.zeros(size))
    A_eq = sp.vstack(eq_rows, "csr") if eq_rows else sp.csr_matrix((0, nv))
    b_eq = np.concatenate(eq_rhs) if eq_rhs else np.zeros(0)
    A_nn = sp.hstack([-sp.identity(n * na), sp.csr_matrix((n * na, nv - n * na))], "csr")

    def rows_of(name: str) -> np.ndarray:
        q, v, var = by_name[name]
        return v[:, layout.block(q).rows]

    def weights(name: str) -> np.ndarray:
        q, _, var = by_name[name]
        r = layout.block(q).rows.size
        w = 1.0 / np.broadcast_to(np.asarray(var, np.float64).reshape(-1, 1), (n, 1))
        return np.repeat(w, r, axis=1).reshape(-1)

    bands: list[tuple[str, np.ndarray, float]] = []  # (query, scaled answers, scaled tol)
    done: list[L2Pass] = []
    x = None
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    for names in passes:
        names = [nm for nm in dict.fromkeys(names) if nm in by_name]
        if not names:
            continue
        pdiag = np.zeros(nv)
        lin = np.zeros(nv)
        const = 0.0
        for nm in names:
            p0, size = offs[nm]
            w = weights(nm) * scale**2
            y = rows_of(nm).reshape(-1) / scale
            pdiag[p0 : p0 + size] += w
            lin[p0 : p0 + size] -= w * y
            const += 0.5 * float(np.sum(w * y * y))
        A_in, b_in = [A_nn], [np.zeros(n * na)]
        for nm, a, tol in bands:
            p0, size = offs[nm]
            sel = sp.csr_matrix(
                (np.ones(size), (np.arange(size), np.arange(p0, p0 + size))), shape=(size, nv)
            )
            A_in += [sel, -sel]
            b_in += [a + tol, -(a - tol)]
        A = sp.vstack([A_eq, *A_in], "csc")
        b = np.concatenate([b_eq, *b_in])
        P = sp.diags(pdiag, format="csc")
        cones = [
            clarabel.ZeroConeT(A_eq.shape[0]),
            clarabel.NonnegativeConeT(A.shape[0] - A_eq.shape[0]),
        ]
        if A_eq.shape[0] == 0:
            cones = cones[1:]
        sol = clarabel.DefaultSolver(P, lin, A, b, cones, settings).solve()
        status = str(sol.status).split(".")[-1]
        if status not in _L2_OK:
            raise SolverError(
                f"{where}: the TopDown L2 pass {len(done)} ({', '.join(names)}) ended with "
                f"status {status!r} in Clarabel; an infeasible status means the children's "
                "invariants or structural zeros cannot be met with non-negative counts summing "
                "to the parent"
            )
        z = np.asarray(sol.x)
        x = z[: n * na]
        resid = float(np.max(np.abs(A_eq @ z - b_eq), initial=0.0))
        resid = max(resid, float(np.max(-x, initial=0.0)))
        tol = resid + slack / scale
        answers = {}
        for nm in names:
            p0, size = offs[nm]
            ans = z[p0 : p0 + size].copy()
            answers[nm] = ans.reshape(n, -1) * scale
            bands.append((nm, ans, tol))
        obj = (0.5 * float(z @ (pdiag * z)) + float(lin @ z) + const) * 2.0
        done.append(L2Pass(tuple(names), obj, status, tol * scale, answers))
    if x is None:
        raise SolverError(
            f"{where}: no L2 pass has a measured query; give passes naming the level's "
            "measured queries"
        )
    xt = layout.expand(x.reshape(n, na) * scale)
    return _repair(xt, None if layout.parent is None else np.asarray(layout.parent)), done


def l1_multipass(
    layout: ChildrenLayout,
    xt: np.ndarray,
    invariants: Sequence[tuple[ProductQuery, np.ndarray]],
    passes: Sequence[Sequence[ProductQuery]],
    *,
    where: str = "node",
) -> tuple[np.ndarray, list[L1Pass]]:
    """The Bureau's multi-pass controlled rounding of one parent's L2 solution.

    Parameters
    ----------
    layout : ChildrenLayout
    xt : numpy.ndarray
        (children, cells) non-negative L2 solution summing to the parent.
    invariants : sequence of (ProductQuery, values)
        Exact integer answers ``(n_children, rows)``; met with ``==``.
    passes : sequence of sequence of ProductQuery
        Rounder queries per pass (the Bureau's: ``total``; then ``hhgq``, ``hhgq *
        hispanic``, …, ``detailed``); duplicates by name are kept once.
    where : str

    Returns
    -------
    counts : numpy.ndarray
        int64 (children, cells): non-negative, summing to the parent, invariants exact.
    passes : list of L1Pass

    Raises
    ------
    SolverError
        When a pass has no integer solution (inconsistent invariants) or HiGHS fails.
    """
    n, na = layout.n_children, layout.n_active
    xa = np.asarray(xt, np.float64)[:, layout.active]
    floor = np.floor(xa)
    frac = xa - floor
    nb = n * na
    eq_rows, eq_rhs = [], []
    if layout.parent is not None:
        r = np.asarray(layout.parent, np.float64)[layout.active] - floor.sum(axis=0)
        if np.any(r < 0) or np.any(r > n):
            raise SolverError(
                f"{where}: the TopDown rounding is infeasible (the L2 solution does not sum to "
                "the parent within one unit per child); the L2 solve was inaccurate"
            )
        eq_rows.append(layout.parent_rows())
        eq_rhs.append(r)
    for b, v in _check_invariants(layout, invariants, where):
        rhs = v - (b.mat @ floor.T).T
        eq_rows.append(sp.kron(sp.identity(n), b.mat, "csr"))
        eq_rhs.append(np.rint(rhs).reshape(-1))
    fixed: list[tuple[sp.csr_matrix, np.ndarray]] = []
    done: list[L1Pass] = []
    y = None
    for qs in passes:
        qs = list({q.name: q for q in qs}.values())
        if not qs:
            continue
        pen = [(layout.kron(q), q) for q in qs]
        n_pen = sum(k.shape[0] for k, _ in pen)
        nv = nb + 2 * n_pen
        blocks, lo = [], []
        for k, rhs in [*zip(eq_rows, eq_rhs, strict=True), *fixed]:
            blocks.append(sp.hstack([k, sp.csr_matrix((k.shape[0], 2 * n_pen))]))
            lo.append(rhs)
        p0 = nb
        for k, _ in pen:
            m = k.shape[0]
            ep = sp.csr_matrix((np.ones(m), (np.arange(m), np.arange(p0, p0 + m))), shape=(m, nv))
            em = sp.csr_matrix(
                (np.ones(m), (np.arange(m), np.arange(p0 + m, p0 + 2 * m))), shape=(m, nv)
            )
            blocks.append(sp.hstack([k, sp.csr_matrix((m, 2 * n_pen))]) - ep + em)
            lo.append(np.rint(k @ frac.reshape(-1)))
            p0 += 2 * m
        c = np.concatenate([np.zeros(nb), np.ones(2 * n_pen)])
        if any(q.name == "detailed" for q in qs):
            c[:nb] += 1.0 - 2.0 * frac.reshape(-1)
        A = sp.vstack(blocks, "csr")
        rhs = np.concatenate(lo)
        res = milp(
            c,
            constraints=LinearConstraint(A, rhs, rhs),
            integrality=np.concatenate([np.ones(nb), np.zeros(2 * n_pen)]),
            bounds=Bounds(np.zeros(nv), np.concatenate([np.ones(nb), np.full(2 * n_pen, np.inf)])),
        )
        if res.x is None or res.status != 0:
            raise SolverError(
                f"{where}: the TopDown rounding pass {len(done)} "
                f"({', '.join(q.name for q in qs)}) found no integer solution (HiGHS: "
                f"{res.message}); check that the invariants are integers consistent with the "
                "level above"
            )
        yv = res.x[:nb]
        if np.any(np.abs(yv - np.rint(yv)) > _INTEGRAL):
            raise SolverError(f"{where}: HiGHS returned a non-integral rounding")
        y = np.rint(yv)
        done.append(L1Pass(tuple(q.name for q in qs), float(res.fun), "optimal"))
        fixed += [(k, k @ y) for k, _ in pen]
    if y is None:
        raise SolverError(f"{where}: the rounder has no pass; give at least one rounder query")
    counts = (floor + y.reshape(n, na)).astype(np.int64)
    return layout.expand(counts), done
