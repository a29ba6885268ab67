"""Privacy statements derived from the measurements, and claims checked against them.

A measurement is a noise law applied to a query at every node of one level. One person
changes one cell of one leaf by one (add/remove), which changes one node per level; so a
measurement's privacy loss is its law's privacy function at the query's sensitivity — the
largest column ℓ₁ norm for a pure law, ℓ₂ for a zCDP law (Dwork & Roth 2014, Def. 3.1;
Bun & Steinke 2016, Prop. 1.6) — and the losses of all measurements add (sequential
composition: ε adds under pure DP, ρ under zCDP, Bun & Steinke 2016, Lemma 2.3). Pure
measurements mixed with zCDP ones are composed in zCDP through ε-DP ⇒ (ε²/2)-zCDP (Bun &
Steinke 2016, Prop. 1.4). Statistics held invariant make the guarantee induced subspace DP
(Gao, Gong & Yu 2022, Def. 6), named in the statement by
:func:`~censusdp.budget.with_invariants`.

:func:`derive_statement` composes the statement; :func:`check_statement` refuses a statement
that claims less than the measurements spend (:class:`~censusdp.errors.BudgetError`), so a
release can never carry a guarantee its noise does not give.

References
----------
Dwork & Roth (2014), Def. 3.1 and Thm. 3.16; Bun & Steinke (2016), Prop. 1.4, Prop. 1.6 and
Lemma 2.3; Gao, Gong & Yu (2022), Def. 6.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from censusdp.budget import (
    ZCDP,
    Accounting,
    PrivacyLoss,
    PrivacyStatement,
    PureDP,
    compose,
    invariant_labels,
    loss,
    statement_for,
    with_invariants,
)
from censusdp.errors import BudgetError, SpecError
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.registry import law_info

__all__ = [
    "Spend",
    "check_statement",
    "checked_statement",
    "derive_statement",
    "spends",
]


@dataclass(frozen=True)
class Spend:
    """The privacy loss of one measurement.

    Attributes
    ----------
    label : str
        ``"level/query"``.
    noise : str
        The registered name of its law.
    accounting : Accounting
    sensitivity : float
        The query's computed ℓ₁ (pure) or ℓ₂ (zCDP) sensitivity.
    amount : float
        ε (pure) or ρ (zCDP).
    """

    label: str
    noise: str
    accounting: Accounting
    sensitivity: float
    amount: float

    @property
    def loss(self) -> PrivacyLoss:
        """The spend as a typed loss (:class:`~censusdp.budget.PureDP` or
        :class:`~censusdp.budget.ZCDP`)."""
        return loss(self.accounting, self.amount)


def _planned(measurements: Any) -> list[tuple[int, Any, Any]]:
    """(level, query, law) of every measurement: Measurement objects, a plan of
    ``(level, query, law)`` tuples, or partitioned measurements carrying ``plan``."""
    plan = getattr(measurements, "plan", None)
    if plan is not None:
        return [(int(k), q, law) for k, q, law in plan]
    return [
        (int(m[0]), m[1], m[2]) if isinstance(m, tuple) else (int(m.level), m.query, m.law)
        for m in measurements
    ]


def spends(level_names: Sequence[str], measurements: Any) -> list[Spend]:
    """What each measurement spends: its law's privacy at its query's computed sensitivity.

    Raises
    ------
    SpecError
        A law that is not registered (:mod:`censusdp.mechanisms.registry`).
    """
    out = []
    for level, query, law in _planned(measurements):
        info = law_info(law, f"measurement {level_names[level]}/{query.name}")
        sens = query.sensitivity(info.norm)
        out.append(
            Spend(
                f"{level_names[level]}/{query.name}",
                info.name,
                info.accounting,
                sens,
                float(law.privacy(sens)),
            )
        )
    return out


def derive_statement(
    level_names: Sequence[str],
    measurements: Any,
    invariants: Sequence = (),
    *,
    delta: float | None = None,
) -> PrivacyStatement:
    """The privacy statement the measurements (and invariants) actually give.

    Parameters
    ----------
    level_names : sequence of str
        The hierarchy's level names (``Hierarchy.names``).
    measurements : sequence of Measurement or of (level, query, law), or partitioned
        measurements with ``plan``
    invariants : sequence of Invariant
        Held exact: the guarantee becomes induced subspace DP and names them.
    delta : float, optional
        δ at which a zCDP total is also reported as (ε, δ)-DP.

    Returns
    -------
    PrivacyStatement
        Pure ε when every law is pure, else ρ-zCDP; ``mechanism`` names the laws; a note
        lists each measurement's computed spend; continuous laws add the floating-point note
        (Mironov 2012).

    Raises
    ------
    SpecError
        No measurements (nothing to derive a guarantee from) or an unregistered law.
    """
    items = spends(level_names, measurements)
    if not items:
        raise SpecError(
            "no measurements to derive a privacy statement from; measure at least one query"
        )
    total_loss = compose([s.loss for s in items])
    accounting, total = total_loss.accounting, total_loss.amount
    names = list(dict.fromkeys(s.noise for s in items))
    unit = total_loss.symbol
    detail = "; ".join(
        f"{s.label} {s.noise} {s.loss.symbol} = {s.amount:.6g} "
        f"(Δ{'₁' if s.accounting == Accounting.PURE else '₂'} = {s.sensitivity:g})"
        for s in items
    )
    statement = statement_for(
        total_loss,
        None,
        delta if accounting == Accounting.ZCDP else None,
        invariant_labels(level_names, invariants),
        mechanism=", ".join(names),
    ).with_notes(f"derived from the measurements: {unit} = {total:.6g} composed over {detail}")
    return floating_point_note(statement, continuous=any(not law_info(n).integer for n in names))


def check_statement(claimed: PrivacyStatement, derived: PrivacyStatement) -> PrivacyStatement:
    """``claimed`` when it claims at least what ``derived`` spends, with the derived
    invariants named.

    A pure-ε claim covers pure measurements of total ε' ≤ ε; no pure claim covers zCDP
    (Gaussian-type) measurements. A ρ claim covers zCDP measurements of ρ' ≤ ρ and pure ones
    of ε' with ε'²/2 ≤ ρ. A relative slack of :data:`~censusdp.budget.SPEND_TOLERANCE`
    absorbs float rounding of budget shares.

    Raises
    ------
    BudgetError
        The claim is smaller than the spend (naming both), or a pure claim on zCDP noise.
    """
    how = (
        "; pass no statement to use the derived one, or one that claims at least what the "
        "measurements spend"
    )
    said, spent = claimed.budget, derived.budget
    if not said.covers(spent):
        if isinstance(said, PureDP) and isinstance(spent, ZCDP):
            raise BudgetError(
                f"the privacy statement passed claims pure ε = {claimed.epsilon:g}-DP, but the "
                f"measurements use zCDP noise ({derived.mechanism}), which gives no pure ε-DP "
                f"guarantee: they spend ρ = {derived.rho:.6g}{how}"
            )
        what = f"{spent.symbol} = {spent.amount:.6g}"
        if isinstance(said, ZCDP) and isinstance(spent, PureDP):
            what += f" (ρ = ε²/2 = {spent.to_zcdp().rho:.6g})"
        raise BudgetError(
            f"the privacy statement passed claims {said}, but the measurements "
            f"({derived.mechanism}) spend {what}{how}"
        )
    return with_invariants(claimed, derived.invariants)


def checked_statement(
    level_names: Sequence[str],
    measurements: Any,
    invariants: Sequence = (),
    privacy: PrivacyStatement | None = None,
    *,
    delta: float | None = None,
) -> PrivacyStatement:
    """The statement of an estimator's release: derived from the measurements when
    ``privacy`` is None, else ``privacy`` checked against the derived one
    (:func:`check_statement`).

    Raises
    ------
    BudgetError
        ``privacy`` claims less than the measurements spend.
    """
    derived = derive_statement(level_names, measurements, invariants, delta=delta)
    if privacy is None:
        return derived
    return check_statement(privacy, derived)
