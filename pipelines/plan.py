"""From a budget allocation to a measurement plan: which query is measured at which level,
with which calibrated noise law, and which statistics are held invariant.

Sensitivities are computed from the query matrices, never asserted: one person changes one
cell of one leaf by one (add/remove), so a query's ℓ₁ sensitivity is its largest column ℓ₁
norm and its ℓ₂ sensitivity its largest column ℓ₂ norm (Dwork & Roth 2014, Def. 3.1; Bun &
Steinke 2016 for zCDP). A query implied by an invariant at the same level gets no budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import BudgetError, SpecError
from censusdp.mechanisms.laws import Gaussian, Laplace, NoiseLaw
from censusdp.mechanisms.queries import Query
from censusdp.mechanisms.subspace import l1_sensitivity, l2_sensitivity

__all__ = ["MeasurementPlan", "PlannedQuery", "build_plan", "sensitivity", "make_law", "NOISE_LAWS"]

#: Noise law names and the accounting each belongs to.
NOISE_LAWS = {
    "laplace": "pure",
    "discrete_laplace": "pure",
    "gaussian": "zcdp",
    "discrete_gaussian": "zcdp",
}


def sensitivity(query: Query, norm: int) -> float:
    """Largest column ℓ₁ (norm=1) or ℓ₂ (norm=2) norm of the query matrix (a column is the
    change one person makes)."""
    return l1_sensitivity(query.matrix) if norm == 1 else l2_sensitivity(query.matrix)


def make_law(noise: str, budget: float, query: Query) -> NoiseLaw:
    """The noise law of ``noise`` calibrated to spend ``budget`` (ε or ρ) on ``query``."""
    if noise not in NOISE_LAWS:
        raise SpecError(f"unknown noise law {noise!r}; choose one of {sorted(NOISE_LAWS)}")
    if not budget > 0:
        raise BudgetError(f"query {query.name!r}: its budget share must be positive")
    if noise == "laplace":
        return Laplace.from_epsilon(budget, sensitivity(query, 1))
    if noise == "gaussian":
        return Gaussian.from_rho(budget, sensitivity(query, 2))
    from censusdp.mechanisms import discrete

    if noise == "discrete_laplace":
        return discrete.DiscreteLaplace.from_epsilon(budget, sensitivity(query, 1))
    return discrete.DiscreteGaussian.from_rho(budget, sensitivity(query, 2))


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
    *,
    accounting: str,
    total: float,
    level_shares: Mapping[str, float],
    query_shares: Mapping[str, Mapping[str, float]] | None = None,
    noise: str,
    delta: float | None = None,
) -> MeasurementPlan:
    """Allocate ``total`` (ε for pure, ρ for zCDP) to every (level, query) and calibrate.

    Parameters
    ----------
    level_names : sequence of str
        The hierarchy's levels, root first.
    queries : mapping level name → queries measured at that level.
    invariants : mapping level name → queries held exact at that level.
    accounting : {"pure", "zcdp"}
    total : float
        Total ε or ρ. Sequential composition: the shares' budgets add up to it.
    level_shares : mapping level name → share of ``total``; must sum to 1 over the levels
        that measure something.
    query_shares : mapping level → (query name → share of the level's budget); default:
        equal shares among the level's measured queries.
    noise : str
        A key of :data:`NOISE_LAWS`, consistent with ``accounting``.
    delta : float, optional
        δ at which a zCDP total is also reported as (ε, δ).

    Raises
    ------
    BudgetError
        Non-positive total, shares that do not sum to 1, shares for levels that measure nothing.
    SpecError
        Unknown level, noise law inconsistent with the accounting.
    """
    if NOISE_LAWS.get(noise) != accounting:
        raise SpecError(
            f"noise {noise!r} composes under {NOISE_LAWS.get(noise, '?')!r} accounting, not {accounting!r}"
        )
    if not (total > 0 and math.isfinite(total)):
        raise BudgetError("the total privacy budget must be a positive finite number")
    for name in list(queries) + list(invariants) + list(level_shares):
        if name not in level_names:
            raise SpecError(
                f"level {name!r} is not one of the hierarchy's levels {list(level_names)}"
            )
    query_shares = query_shares or {}
    measured: list[PlannedQuery] = []
    inv_list: list[tuple[int, Query]] = []
    share_sum = 0.0
    for k, name in enumerate(level_names):
        inv_q = list(invariants.get(name, ()))
        inv_list.extend((k, q) for q in inv_q)
        todo = [q for q in queries.get(name, ()) if not _implied(q, inv_q)]
        share = float(level_shares.get(name, 0.0))
        if share < 0:
            raise BudgetError(f"level {name!r}: negative budget share")
        if not todo:
            if share > 0:
                raise BudgetError(
                    f"level {name!r} has a budget share but measures nothing (its queries are "
                    "invariant or none are listed); give its share to another level"
                )
            continue
        if share == 0:
            raise BudgetError(
                f"level {name!r} measures {[q.name for q in todo]} but has no budget share"
            )
        share_sum += share
        qs = query_shares.get(name) or {q.name: 1.0 / len(todo) for q in todo}
        unknown = set(qs) - {q.name for q in todo}
        if unknown:
            raise SpecError(
                f"level {name!r}: query shares for {sorted(unknown)}, which the level does not measure"
            )
        if abs(sum(qs.values()) - 1.0) > 1e-9:
            raise BudgetError(f"level {name!r}: query shares sum to {sum(qs.values()):.12g}, not 1")
        for q in todo:
            if qs.get(q.name, 0.0) <= 0:
                raise BudgetError(f"level {name!r}: query {q.name!r} has no positive share")
            b = total * share * qs[q.name]
            measured.append(PlannedQuery(k, q, b, make_law(noise, b, q)))
    if abs(share_sum - 1.0) > 1e-9:
        raise BudgetError(f"level shares sum to {share_sum:.12g}, not 1")
    inv_names = tuple(f"{level_names[k]}: {q.name}" for k, q in inv_list)
    privacy = PrivacyStatement(
        accounting=accounting,
        epsilon=total if accounting == "pure" else None,
        rho=total if accounting == "zcdp" else None,
        delta=delta,
        invariants=inv_names,
        mechanism=noise,
    )
    return MeasurementPlan(tuple(measured), tuple(inv_list), privacy)
