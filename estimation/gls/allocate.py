"""Choose a budget allocation before spending it: minimise predicted GLS error under total ρ.

The structured GLS release's error covariance is a function of the per-(level, query)
precisions ``τ_i = 1/σ_i²``, the invariants and the tree's shape only
(:func:`~censusdp.estimation.gls.predict.predict_errors`). With ``F(τ) = Σ_i τ_i W_i`` the
information (``W_i`` the query's Gram at every node of its level) and ``C(τ)`` the
constrained covariance (Z (ZᵀFZ)⁻¹ Zᵀ under the invariants), the variance of a linear
functional ``wᵀẑ`` is ``wᵀ C(τ) w``: convex and decreasing in τ (the matrix inverse is
operator convex, Kiefer 1974; Boyd & Vandenberghe 2004, §7.5). Under zCDP the discrete or
continuous Gaussian measurement of query ``i`` spends ``ρ_i = Δ_i²/(2σ_i²)`` (Bun & Steinke
2016; Canonne, Kamath & Steinke 2020), linear in ``τ_i``, so composition ``Σ_i ρ_i = ρ`` is
a linear constraint and every objective below is convex in the ρ shares.

**Objective.** A target is a (level, product query) pair; its *relative variance* is the
mean over the level's nodes and the query's rows of ``Var / size²``, ``size`` the expected
count of a row: the declared typical population of the level times the row's declared share
of it (default ``1 / rows``). The objective is ``Σ_j w_j f_j`` (``sum``) or ``max_j w_j f_j``
(``max``).

**Gradient, exactly and cheaply.** ``∂(wᵀCw)/∂τ_i = −tr(W_i C wwᵀ C)``; summed over the
target's nodes this is ``−tr(W_i C W_T C)`` with ``W_T`` the target query's Gram at every
node of the target's level, and by symmetry of the trace it equals ``d/dε tr(W_i C_ε)``
where ``C_ε`` is the covariance after adding precision ε of the target's Gram at its level.
So four extra predictions (``±ε, ±2ε``: Richardson's fourth-order central difference)
give the derivative of the objective with respect to all 65 (level, query) precisions of
``pl94`` at once, through the same shape-class tree passes, instead of one prediction per
variable.

**Solver and certificate.** The multiplicative algorithm of optimal design (Silvey,
Titterington & Torsney 1978; monotone for these linear criteria, Yu 2010) on the shares above
the floor (see :func:`optimise_allocation`). Every iterate is certified by a Lagrangian lower
bound: for the polytope ``P = {x ≥ floor, Σ x = 1}`` and any weights λ on the simplex,
convexity gives ``min_P max_j h_j ≥ Σ_j λ_j (h_j(x) − ∇h_jᵀx) + min_v Σ_j λ_j ∇h_jᵀ v``
over P's vertices ``v``; the best λ is a small linear program (HiGHS). For ``sum`` this is
the Frank–Wolfe duality gap (Jaggi 2013). The solver stops when ``(F_best − bound)/F_best ≤
tolerance``, the best bound over all iterates.

**Floor.** A query the objective does not need would be driven to share 0 and its tables
would no longer be identified; every measured (level, query) keeps at least ``floor`` times
its share in the starting allocation (1% by default), and queries the start does not measure
(e.g. the nation's invariant total) stay unmeasured.

References
----------
Kiefer, J. (1974). General equivalence theory for optimum designs. Ann. Statist. 2(5).
Bun, M. & Steinke, T. (2016). Concentrated differential privacy. TCC.
Canonne, C., Kamath, G. & Steinke, T. (2020). The discrete Gaussian for differential privacy.
Silvey, S. D., Titterington, D. M. & Torsney, B. (1978). An algorithm for optimal designs
    on a finite design space. Comm. Statist. A 7(14).
Yu, Y. (2010). Monotonic convergence of a general algorithm for computing optimal designs.
    Ann. Statist. 38(3).
Jaggi, M. (2013). Revisiting Frank–Wolfe: projection-free sparse convex optimization. ICML.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm —
    the production allocation used as the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import numpy as np
import scipy.optimize

from censusdp.errors import SpecError
from censusdp.estimation.gls.predict import Prediction, allocation_plan, predict_errors
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.shape_classes import ShapeClasses, shape_classes
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import level_position
from censusdp.schema import Allocation, Schema
from censusdp.timing import stage

__all__ = [
    "AllocationResult",
    "Objective",
    "Target",
    "allocation_from_shares",
    "evaluate_allocation",
    "optimise_allocation",
]

#: Relative size of the ±ε, ±2ε information of the directional derivative: large enough that
#: weakly coupled levels' variance sums (10⁻¹⁰ relative changes) survive cancellation, small
#: enough for the fourth-order difference's O(ε⁴) error (1e-8).
_ETA = 1e-2
#: Denominator of the exact shares written for an optimised allocation.
_DENOMINATOR = 1 << 32
#: Iterations without a better objective after which the solver stops (uncertified).
_STALL = 25


@dataclass(frozen=True)
class Target:
    """One term of the objective: a product query's rows at every node of a level.

    Attributes
    ----------
    level : str
    query : str
        A product-query text of the schema (``"total"``, ``"hispanic * cenrace"``, ``"adult"``).
    weight : float
        Its weight in the sum (or the scale of its term in the max).
    size : float
        The expected count of one row at one node (typical population × row share): the
        relative variance is ``Var / size²``.
    """

    level: str
    query: str
    weight: float = 1.0
    size: float = 1.0

    @property
    def label(self) -> str:
        return f"{self.level}: {self.query}"


@dataclass(frozen=True)
class Objective:
    """A weighted sum (``kind="sum"``) or maximum (``"max"``) of targets' relative variances."""

    targets: tuple[Target, ...]
    kind: Literal["sum", "max"] = "sum"

    def __post_init__(self) -> None:
        if self.kind not in ("sum", "max"):
            raise SpecError(f"objective kind {self.kind!r}: use 'sum' or 'max'")
        if not self.targets:
            raise SpecError("the objective has no target; give at least one (level, table)")
        for t in self.targets:
            if not (t.weight > 0 and np.isfinite(t.weight)):
                raise SpecError(f"target {t.label!r}: weight must be a positive number")
            if not (t.size > 0 and np.isfinite(t.size)):
                raise SpecError(f"target {t.label!r}: size must be a positive number")

    def combine(self, values: np.ndarray) -> float:
        """The objective from the targets' relative variances."""
        w = np.array([t.weight for t in self.targets]) * values
        return float(w.sum() if self.kind == "sum" else w.max())


@dataclass(frozen=True)
class AllocationResult:
    """The optimised allocation, its certificate and the before/after values.

    Attributes
    ----------
    allocation : Allocation
        Exact shares (denominator 2³², sums exactly 1), the start's ρ.
    start : Allocation
    objective : Objective
    before, after : float
        The objective at the start and at ``allocation`` (exact discrete Gaussian plans).
    targets_before, targets_after : ndarray
        Each target's relative variance.
    bound : float
        A certified lower bound on the optimum of the continuous problem.
    gap : float
        ``(F(x) − bound) / F(x)`` at the solver's point.
    certified : bool
        ``gap ≤ tolerance``.
    iterations, evaluations : int
        Solver iterations and predictions made (each iteration 1 + 4 predictions for
        ``sum``, 1 + 4·targets for ``max``).
    floor : float
    seconds : float
    """

    allocation: Allocation
    start: Allocation
    objective: Objective
    before: float
    after: float
    targets_before: np.ndarray
    targets_after: np.ndarray
    bound: float
    gap: float
    certified: bool
    iterations: int
    evaluations: int
    floor: float
    tolerance: float
    seconds: float
    history: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def improvement(self) -> float:
        """``1 − after/before``."""
        return 1.0 - self.after / self.before


def _queries(schema: Schema, start: Allocation) -> list[tuple[str, ProductQuery, Fraction]]:
    """(level, query, share of ρ) of every (level, query) the start measures."""
    out = []
    for lvl, shares in start.queries.items():
        for text, s in zip(schema.strategy, shares, strict=True):
            if s != 0:
                out.append((lvl, ProductQuery.parse(schema, text), start.levels[lvl] * s))
    return out


class _Evaluator:
    """Targets' relative variances and their gradients in the shares, by predictions."""

    def __init__(
        self,
        classes: ShapeClasses,
        schema: Schema,
        variables: list[tuple[str, ProductQuery, Fraction]],
        invariants: Sequence[tuple[str, ProductQuery]],
        objective: Objective,
        rho: float,
    ) -> None:
        self.classes, self.schema, self.invariants = classes, schema, list(invariants)
        self.objective, self.rho = objective, rho
        self.levels = [lvl for lvl, _, _ in variables]
        self.queries = [q for _, q, _ in variables]
        self.sens = [q.sensitivity(2) for q in self.queries]
        names = list(classes.names)
        self.tk = [level_position(names, t.level, f"target {t.label!r}") for t in objective.targets]
        self.tq = [ProductQuery.parse(schema, t.query) for t in objective.targets]
        n = classes.n_nodes()
        # f_j = S_j / (nodes · rows · size²): the mean over nodes and rows of Var / size²
        self.scale = np.array(
            [
                1.0 / (n[k] * q.n_rows * t.size**2)
                for k, q, t in zip(self.tk, self.tq, objective.targets, strict=True)
            ]
        )
        self.weights = np.array([t.weight for t in objective.targets])
        self._grams: dict[tuple, dict] = {}
        self.predictions = 0
        self.level_index = [names.index(lvl) for lvl in self.levels]

    def plan(self, x: np.ndarray) -> list:
        """The calibrated plan at shares ``x`` (continuous Gaussian: the optimiser needs σ²
        as a smooth function of ρ; the reported values use :func:`allocation_plan`)."""
        return [
            (lvl, q, Gaussian.from_rho(self.rho * float(s), d))
            for lvl, q, s, d in zip(self.levels, self.queries, x, self.sens, strict=True)
        ]

    def _predict(self, plan: list, information: list) -> Prediction:
        self.predictions += 1
        zero = [(t, q, 0.0) for t, q in zip(self.tk, self.tq, strict=True)]  # one basis for all
        return predict_errors(
            self.classes, self.schema, plan, self.invariants, information=zero + information
        )

    def _gram(self, pred: Prediction, q: ProductQuery) -> dict:
        basis = pred.basis
        key = (tuple(a.basis.tobytes() for a in basis.axes), tuple(id(f) for f in q.factors))
        if key not in self._grams:
            mult = {m: float(basis.multiplicity(m)) for m in basis.subsets}
            self._grams[key] = {m: b * mult[m] for m, b in basis.gram(q).blocks.items()}
        return self._grams[key]

    def level_sums(self, pred: Prediction, pairs: Sequence[tuple[int, ProductQuery]]) -> np.ndarray:
        """``Σ_nodes Σ_rows Var`` of each (level, query): ``tr(W C)`` from the blocks."""
        w = [c.astype(np.float64) for c in self.classes.weight]
        summed: dict[int, dict] = {}
        out = np.empty(len(pairs))
        for i, (k, q) in enumerate(pairs):
            if k not in summed:
                blocks = pred.covariances[k].blocks
                summed[k] = {
                    m: (w[k] @ b.reshape(b.shape[0], -1) if b.shape[0] == w[k].size
                        else w[k].sum() * b.reshape(-1)).reshape(b.shape[1:])
                    for m, b in blocks.items()
                }  # fmt: skip
            g = self._gram(pred, q)
            out[i] = sum(float(np.vdot(g[m], summed[k][m])) for m in g)
        return out

    def values(self, pred: Prediction) -> np.ndarray:
        """Every target's relative variance (0 for a target held exactly by the invariants:
        a mean cell variance below ``1e-12 τ²`` is rounding residue, as in :class:`Prediction`)."""
        sums = self.level_sums(pred, list(zip(self.tk, self.tq, strict=True)))
        n = self.classes.n_nodes()
        cells = np.array([n[k] * q.n_rows for k, q in zip(self.tk, self.tq, strict=True)])
        return self.scale * np.where(sums > 1e-12 * pred.tau2 * cells, sums, 0.0)

    def check_identified(self, pred: Prediction) -> None:
        for t, q in zip(self.objective.targets, self.tq, strict=True):
            if not pred.identified_rows(q).all():
                raise SpecError(
                    f"target {t.label!r}: some rows of {q.name!r} are not identified by the "
                    "strategy (measured nowhere); choose a table the strategy measures"
                )

    def __call__(self, x: np.ndarray, directions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Targets' relative variances at ``x`` and, per row ``u`` of ``directions``
        (weights over targets), the gradient of ``Σ_j u_j f_j`` in ``x``."""
        plan = self.plan(x)
        tau = np.array([1.0 / law.variance for _, _, law in plan])
        f = self.values(self._predict(plan, []))
        pairs = list(zip(self.level_index, self.queries, strict=True))
        grads = np.empty((directions.shape[0], x.size))
        for r, u in enumerate(directions):
            coef = u * self.scale
            # ε per target: η times the level's smallest measured precision, relative
            ref = np.array([tau[[i for i, k in enumerate(self.level_index) if k == kk]].min()
                            for kk in self.tk])  # fmt: skip
            eps = _ETA / np.max(np.where(coef > 0, coef / ref, 0.0))
            sums = {}
            for m in (1.0, -1.0, 2.0, -2.0):
                info = [
                    (k, q, m * eps * c)
                    for k, q, c in zip(self.tk, self.tq, coef, strict=True)
                    if c > 0
                ]
                sums[m] = self.level_sums(self._predict(plan, info), pairs)
            # ∂(Σ u_j f_j)/∂τ_i: Richardson's fourth-order central difference
            dtau = (8 * (sums[1.0] - sums[-1.0]) - (sums[2.0] - sums[-2.0])) / (12 * eps)
            grads[r] = dtau * tau / x  # τ_i is linear in ρ_i under zCDP
        return f, grads


def allocation_from_shares(
    schema: Schema, start: Allocation, x: np.ndarray, denominator: int = _DENOMINATOR
) -> Allocation:
    """An exact allocation from shares of ρ per measured (level, query) of ``start``.

    Level shares and each level's query shares are rounded to multiples of
    ``1/denominator`` by largest remainders (so they sum to exactly 1) and every measured
    query keeps at least ``1/denominator``.
    """

    def exact(v: np.ndarray) -> list[Fraction]:
        v = np.asarray(v, np.float64) / v.sum() * denominator
        n = np.maximum(np.floor(v).astype(np.int64), 1)
        rest = denominator - int(n.sum())
        order = np.argsort(-(v - np.floor(v)), kind="stable")
        if rest >= 0:
            n[order[:rest]] += 1
        else:
            for i in np.argsort(-n, kind="stable")[:-rest]:
                n[i] -= 1
        return [Fraction(int(k), denominator) for k in n]

    pairs = _queries(schema, start)
    per_level: dict[str, list[float]] = {lvl: [] for lvl in start.levels}
    for (lvl, _, _), s in zip(pairs, x, strict=True):
        per_level[lvl].append(float(s))
    level_shares = exact(np.array([sum(v) for v in per_level.values()]))
    levels = dict(zip(start.levels, level_shares, strict=True))
    queries: dict[str, tuple[Fraction, ...]] = {}
    for lvl, shares in start.queries.items():
        q = iter(exact(np.array(per_level[lvl])))
        queries[lvl] = tuple(Fraction(0) if s == 0 else next(q) for s in shares)
    return Allocation(rho=start.rho, levels=levels, queries=queries)


def evaluate_allocation(
    hierarchy: Hierarchy | ShapeClasses,
    schema: Schema,
    allocation: Allocation,
    objective: Objective,
    invariants: Sequence[tuple[str, ProductQuery]] = (),
) -> tuple[float, np.ndarray, Prediction]:
    """The objective and each target's relative variance under an allocation's exact
    discrete Gaussian plan (:func:`~censusdp.estimation.gls.predict.allocation_plan`)."""
    classes = hierarchy if isinstance(hierarchy, ShapeClasses) else shape_classes(hierarchy)
    plan = allocation_plan(schema, allocation, levels=classes.names)
    ev = _Evaluator(classes, schema, [], invariants, objective, float(allocation.rho))
    pred = ev._predict(plan, [])
    ev.check_identified(pred)
    values = ev.values(pred)
    return objective.combine(values), values, pred


def _lp_weights(
    h: np.ndarray, G: np.ndarray, x: np.ndarray, lo: np.ndarray
) -> tuple[float, np.ndarray]:
    """(bound, λ) of :func:`_bound`'s linear program (λ: the dual weights of the targets)."""
    free = 1.0 - lo.sum()
    c = h - G @ x + G @ lo
    V = free * G.T
    m = h.size
    if m == 1:
        return float(c[0] + V[:, 0].min()), np.ones(1)
    res = scipy.optimize.linprog(
        np.concatenate([-c, [-1.0]]),
        A_ub=np.hstack([-V, np.ones((V.shape[0], 1))]),
        b_ub=np.zeros(V.shape[0]),
        A_eq=np.concatenate([np.ones(m), [0.0]])[None, :],
        b_eq=[1.0],
        bounds=[(0, None)] * m + [(None, None)],
        method="highs",
    )
    if res.status != 0:  # pragma: no cover - feasible and bounded by construction
        return -np.inf, np.full(m, 1.0 / m)
    lam = np.clip(res.x[:m], 0.0, None)
    return float(-res.fun), lam / lam.sum()


def optimise_allocation(
    hierarchy: Hierarchy | ShapeClasses,
    schema: Schema,
    objective: Objective,
    invariants: Sequence[tuple[str, ProductQuery]] = (),
    *,
    start: Allocation | None = None,
    floor: float = 0.01,
    tolerance: float = 1e-3,
    max_iterations: int = 300,
) -> AllocationResult:
    """Level and query shares minimising ``objective`` at the start's total ρ.

    The shares above the floor, ``x = lo + (1 − Σ lo) w`` with ``w`` on the simplex, are
    updated multiplicatively, ``w_i ← w_i (−∂Φ/∂x_i)^p / Σ_k w_k (−∂Φ/∂x_k)^p``: the
    algorithm of Silvey, Titterington & Torsney (1978) for optimal designs, monotone for
    linear (A/L-optimality) criteria with ``p = 1/2`` (Yu 2010), which every target's summed
    variance ``tr(W_T C)`` is (invariants included: ``C = Z (ZᵀFZ)⁻¹ Zᵀ``). It starts with
    the bolder ``p = 1`` (about twice as fast here) and falls back to the monotone ``1/2``
    for good at the first step that raises the objective. For ``sum`` ``Φ`` is the
    objective; for ``max`` it is ``Σ_j λ_j w_j f_j`` with λ the running average of the dual
    weights of the certificate's linear program (fictitious play). It is invariant to the scale of
    the shares, so a query with a tiny starting share moves as fast as a large one. Each
    iterate's Lagrangian bound (module docstring) is a valid lower bound on the optimum; the
    run stops at the first iterate whose value is within ``tolerance`` (relative) of the
    best bound so far.

    Parameters
    ----------
    hierarchy : Hierarchy or ShapeClasses
        Only the shape is read.
    schema : Schema
    objective : Objective
    invariants : sequence of (level, ProductQuery)
    start : Allocation, optional
        Default: the schema's own (``pl94``: the 2020 production allocation). Its ρ is kept,
        its measured (level, query) pairs are the variables.
    floor : float
        Every measured (level, query) keeps at least ``floor`` × its starting share, so every
        table stays identified (0 < floor < 1).
    tolerance : float
        Stop when the certified relative duality gap is at most this.
    max_iterations : int
        Also stops after 25 iterations without a better objective (the result then says
        ``certified=False`` and carries the gap reached).

    Returns
    -------
    AllocationResult
        Never worse than the start: the start is returned when no better point was found.

    Raises
    ------
    SpecError
        No allocation, unknown levels or queries, a floor outside (0, 1), unidentified targets.

    References
    ----------
    Silvey, S. D., Titterington, D. M. & Torsney, B. (1978). An algorithm for optimal designs
        on a finite design space. Comm. Statist. A 7(14).
    Yu, Y. (2010). Monotonic convergence of a general algorithm for computing optimal designs.
        Ann. Statist. 38(3).
    """
    clock: dict[str, float] = {}
    with stage(clock, "seconds"):
        if not 0 < floor < 1:
            raise SpecError(f"floor = {floor}: give a fraction of each starting share in (0, 1)")
        if not 0 < tolerance < 1:
            raise SpecError(f"tolerance = {tolerance}: give a relative duality gap in (0, 1)")
        start = schema.allocation if start is None else start
        if start is None:
            raise SpecError(f"schema {schema.name!r} has no allocation; give a starting one")
        classes = hierarchy if isinstance(hierarchy, ShapeClasses) else shape_classes(hierarchy)
        allocation_plan(schema, start, levels=classes.names)  # the start's levels are the tree's
        before, tb, pred = evaluate_allocation(classes, schema, start, objective, invariants)
        variables = _queries(schema, start)
        s0 = np.array([float(s) for _, _, s in variables])
        ev = _Evaluator(classes, schema, variables, invariants, objective, float(start.rho))
        run = _multiplicative_updates(ev, s0, floor * s0, objective, tolerance, max_iterations)
        after_alloc = allocation_from_shares(schema, start, run.best_x)
        after, ta, _ = evaluate_allocation(classes, schema, after_alloc, objective, invariants)
        if after >= before:  # never worse than the start
            after_alloc, after, ta = start, before, tb
    return AllocationResult(
        allocation=after_alloc,
        start=start,
        objective=objective,
        before=before,
        after=after,
        targets_before=tb,
        targets_after=ta,
        bound=run.bound,
        gap=float(run.gap),
        certified=bool(run.gap <= tolerance),
        iterations=run.iterations,
        evaluations=ev.predictions,
        floor=floor,
        tolerance=tolerance,
        seconds=clock["seconds"],
        history=run.history,
    )


@dataclass
class _Run:
    """Where the multiplicative updates stopped: the best shares, the best Lagrangian
    bound, the relative gap between them, the iterations and (objective, bound) of each."""

    best_x: np.ndarray
    bound: float
    gap: float
    iterations: int
    history: list[tuple[float, float]]


def _multiplicative_updates(
    ev: _Evaluator,
    s0: np.ndarray,
    lo: np.ndarray,
    objective: Objective,
    tolerance: float,
    max_iterations: int,
) -> _Run:
    """The iterations of :func:`optimise_allocation` from the starting shares ``s0`` with
    floors ``lo``: ``p = 1`` until a step raises the objective, then ``p = 1/2``."""
    weights = ev.weights
    free = 1.0 - lo.sum()
    w = (s0 - lo) / free
    dirs = weights[None, :] if objective.kind == "sum" else np.diag(weights)
    best_x, best_F, bound, gap = s0, np.inf, -np.inf, np.inf
    history: list[tuple[float, float]] = []
    iterations, power, lam_avg, stall = 0, 1.0, None, 0
    prev: tuple[np.ndarray, float, np.ndarray, np.ndarray] | None = None
    for it in range(1, max_iterations + 1):
        iterations = it
        x = lo + free * w
        f, G = ev(x, dirs)
        h = np.array([weights @ f]) if objective.kind == "sum" else weights * f
        F = float(h.max())
        lb, lam = _lp_weights(h, G, x, lo)
        bound = max(bound, lb)
        stall = 0 if F < best_F * (1 - 1e-9) else stall + 1
        if F < best_F:
            best_x, best_F = x, F
        gap = (best_F - bound) / best_F
        history.append((F, bound))
        if gap <= tolerance or stall >= _STALL:
            break
        if prev is not None and F > prev[1] and power > 0.5:
            w, F, lam_avg, G = prev  # the bolder step went up: back, and halve the power
            power = 0.5
        else:
            # dual weights for max: the running average of the LP's (fictitious play)
            lam_avg = lam if lam_avg is None else lam_avg + (lam - lam_avg) * 2.0 / (it + 1)
        prev = (w, F, lam_avg, G)
        d = np.maximum(-(lam_avg @ G), 0.0)
        step = w * d**power
        if not step.sum() > 0:
            break
        w = step / step.sum()
    return _Run(best_x, bound, gap, iterations, history)
