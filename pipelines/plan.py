"""From a budget allocation to a measurement plan: which query is measured at which level,
with which calibrated noise law, and which statistics are held invariant.

Sensitivities are computed from the query matrices, never asserted: one person changes one
cell of one leaf by one (add/remove), so a query's ℓ₁ sensitivity is its largest column ℓ₁
norm and its ℓ₂ sensitivity its largest column ℓ₂ norm (Dwork & Roth 2014, Def. 3.1; Bun &
Steinke 2016 for zCDP). A query implied by an invariant at the same level gets no budget.

The statement also carries the loss of *changing* one record, derived from the same
matrices (:func:`plan_change_factor`): 2× the add/remove loss when every measured query is a
counting query (non-negative entries), as the ``privatize`` routes state; otherwise the
group-privacy bound (4ρ under zCDP) that holds for any mechanism.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.budget import Accounting, PrivacyStatement
from censusdp.errors import BudgetError, SpecError
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.queries import Query, guard_exact_release
from censusdp.mechanisms.registry import law_info
from censusdp.pipelines.release_statement import change_factor

__all__ = ["MeasurementPlan", "PlannedQuery", "build_plan", "make_law", "plan_change_factor"]


def make_law(noise: str, budget: float, query: Query) -> NoiseLaw:
    """The noise law of ``noise`` calibrated to spend ``budget`` (ε or ρ, by the law's
    accounting) on ``query`` at the sensitivity its accounting reads (ℓ₁ or ℓ₂); an unknown
    name is a SpecError listing the registered laws (:mod:`censusdp.mechanisms.registry`)."""
    info = law_info(noise)
    if not budget > 0:
        raise BudgetError(f"query {query.name!r}: its budget share must be positive")
    return info.calibrate(budget, query.sensitivity(info.norm))


def plan_change_factor(noise: str, queries: Sequence[Query]) -> float | None:
    """The loss of changing one record as a multiple of the add/remove loss, for a plan that
    measures ``queries`` with the law ``noise``.

    A change moves one record from leaf cell c of node u to cell c' of node v; at every
    level the shift of the measured answers is Q e_c at one node minus Q e_c' at another
    (or the same) node. With non-negative Q (counting queries: every census table and
    marginal) ‖Q e_c − Q e_c'‖₂² ≤ ‖Q e_c‖² + ‖Q e_c'‖² ≤ 2Δ₂² (the cross term is ≥ 0), so
    a law with ρ = Δ₂²/(2σ²) loses at most 2ρ per measurement and 2ρ in total (Bun &
    Steinke 2016, Prop. 1.6 and Lemma 2.3); ‖·‖₁ ≤ 2Δ₁ gives 2ε for pure laws
    (:func:`censusdp.pipelines.release_statement.change_factor`). A query with a negative
    entry can reach ‖Q(e_c − e_c')‖₂² = 4Δ₂² within one node, so the factor is then None:
    the statement falls back to group privacy
    (:meth:`censusdp.budget.PrivacyStatement.change_loss`).

    Parameters
    ----------
    noise : str
        The registered law the plan calibrates.
    queries : sequence of Query
        Every measured query (invariants add no noise and need no factor).

    Returns
    -------
    float or None
    """
    if not all(bool((np.asarray(q.matrix) >= 0).all()) for q in queries):
        return None
    return change_factor(noise)


@dataclass(frozen=True, eq=False)
class PlannedQuery:
    """One measured query: level index, the query, its budget (ε or ρ) and calibrated law."""

    level: int
    query: Query
    budget: float
    law: NoiseLaw


@dataclass(frozen=True, eq=False)
class MeasurementPlan:
    """Everything a run measures and holds exact, plus its privacy statement."""

    measured: tuple[PlannedQuery, ...]
    invariants: tuple[tuple[int, Query], ...]
    privacy: PrivacyStatement

    def as_tuples(self) -> list[tuple[int, Query, NoiseLaw]]:
        """The ``plan`` argument of :func:`censusdp.mechanisms.queries.measure`."""
        return [(p.level, p.query, p.law) for p in self.measured]


def _implied(query: Query, invariant_queries: Sequence[Query]) -> bool:
    """True when every row of ``query`` is a linear combination of invariant rows."""
    if not invariant_queries:
        return False
    basis = np.vstack([q.matrix for q in invariant_queries]).astype(np.float64)
    stacked = np.vstack([basis, query.matrix.astype(np.float64)])
    return np.linalg.matrix_rank(stacked) == np.linalg.matrix_rank(basis)


def build_plan(
    level_names: Sequence[str],
    queries: Mapping[str, Sequence[Query]],
    invariants: Mapping[str, Sequence[Query]],
    allocation: Mapping[tuple[str, str], float],
    *,
    accounting: Accounting | str,
    noise: str,
    delta: float | None = None,
    acknowledge_exact_release: bool = False,
) -> MeasurementPlan:
    """Calibrate one noise law per measured (level, query) and name the invariants.

    Parameters
    ----------
    level_names : sequence of str
        The hierarchy's levels, root first.
    queries : mapping level name → queries measured at that level.
    invariants : mapping level name → queries held exact at that level.
    allocation : mapping (level, query name) → budget (ε or ρ)
        From :func:`censusdp.budget.allocate` (e.g. ``RunSpec.allocation()``), which checks
        that the shares add up; every measured query needs a positive entry.
    accounting : Accounting (or its string, read once here)
    noise : str
        A registered noise law (:mod:`censusdp.mechanisms.registry`) of ``accounting``.
    delta : float, optional
        δ at which a zCDP total is also reported as (ε, δ).
    acknowledge_exact_release : bool
        Allow invariants that determine every measured value; the statement then says
        those values carry no privacy protection
        (:func:`~censusdp.mechanisms.queries.guard_exact_release`).

    Raises
    ------
    SpecError
        Unknown level, a noise law inconsistent with the accounting, a measured query that
        an invariant at its level already fixes (its budget would be wasted), invariants
        that determine every measured value (unless acknowledged).
    BudgetError
        A measured query without budget, or budget for a query that is not measured.
    """
    accounting = Accounting.parse(accounting)
    if law_info(noise).accounting != accounting:
        raise SpecError(
            f"noise {noise!r} composes under {law_info(noise).accounting!r} accounting, "
            f"not {accounting!r}"
        )
    for name in list(queries) + list(invariants):
        if name not in level_names:
            raise SpecError(
                f"level {name!r} is not one of the hierarchy's levels {list(level_names)}"
            )
    measured: list[PlannedQuery] = []
    inv_list: list[tuple[int, Query]] = []
    used: set[tuple[str, str]] = set()
    for k, name in enumerate(level_names):
        inv_q = list(invariants.get(name, ()))
        inv_list.extend((k, q) for q in inv_q)
        for q in queries.get(name, ()):
            if _implied(q, inv_q):
                raise SpecError(
                    f"level {name!r}: query {q.name!r} is fixed by the level's invariants; "
                    "remove it from [queries] (its budget would be wasted)"
                )
            b = float(allocation.get((name, q.name), 0.0))
            if not b > 0:
                raise BudgetError(
                    f"level {name!r}: query {q.name!r} is measured but has no budget share"
                )
            used.add((name, q.name))
            measured.append(PlannedQuery(k, q, b, make_law(noise, b, q)))
    unused = sorted(set(allocation) - used)
    if unused:
        raise BudgetError(f"budget allocated to {unused}, which are not measured")
    total = float(sum(allocation.values()))
    inv_names = tuple(f"{level_names[k]}: {q.name}" for k, q in inv_list)
    privacy = PrivacyStatement(
        accounting=accounting,
        epsilon=total if accounting is Accounting.PURE else None,
        rho=total if accounting is Accounting.ZCDP else None,
        delta=delta,
        invariants=inv_names,
        mechanism=noise,
        change_factor=plan_change_factor(noise, [p.query for p in measured]),
    )
    privacy = guard_exact_release(
        level_names,
        [(p.level, p.query) for p in measured],
        inv_list,
        privacy,
        acknowledge=acknowledge_exact_release,
    )
    return MeasurementPlan(tuple(measured), tuple(inv_list), privacy)
