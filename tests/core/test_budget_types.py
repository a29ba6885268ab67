"""Typed privacy losses: composition, splitting, claims, and their use by accountants and
statements (Dwork & Roth 2014, Thm. 3.16; Bun & Steinke 2016, Prop. 1.4 and Lemma 2.3)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import (
    ZCDP,
    PureDP,
    ZCDPAccountant,
    compose,
    loss,
    statement_for,
    zcdp_to_dp_cks,
)
from censusdp.errors import BudgetError

amounts = st.floats(1e-4, 10.0, allow_nan=False, allow_infinity=False)
kinds = st.sampled_from([PureDP, ZCDP])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(kinds, amounts), min_size=1, max_size=8), st.randoms())
def test_composition_is_order_free_and_adds_the_right_unit(items, rnd) -> None:
    losses = [kind(a) for kind, a in items]
    total = compose(losses)
    shuffled = list(losses)
    rnd.shuffle(shuffled)
    assert compose(shuffled) == total
    if all(isinstance(x, PureDP) for x in losses):
        assert isinstance(total, PureDP)
        assert total.epsilon == math.fsum(x.epsilon for x in losses)
    else:
        assert isinstance(total, ZCDP)
        want = math.fsum(x.epsilon**2 / 2 if isinstance(x, PureDP) else x.rho for x in losses)
        assert total.rho == want
    for x in losses:
        assert total.covers(x)


@settings(max_examples=40, deadline=None)
@given(kinds, amounts, st.lists(st.floats(0.05, 1.0), min_size=1, max_size=6))
def test_split_composes_back_to_the_budget(kind, amount, weights) -> None:
    budget = kind(amount)
    s = math.fsum(weights)
    shares = {f"q{i}": w / s for i, w in enumerate(weights)}
    shares[f"q{len(weights) - 1}"] = 1.0 - math.fsum(list(shares.values())[:-1])
    pieces = budget.split(shares)
    assert set(pieces) == set(shares)
    assert all(type(p) is kind for p in pieces.values())
    back = compose(list(pieces.values()))
    assert back.amount == pytest.approx(budget.amount, rel=1e-12)
    assert budget.covers(back)


def test_covers_refuses_a_smaller_claim_and_zcdp_under_a_pure_claim() -> None:
    assert ZCDP(0.5).covers(ZCDP(0.5))
    assert not ZCDP(0.5).covers(ZCDP(0.5 * 1.0001))
    assert ZCDP(0.5).covers(PureDP(1.0))  # ε = 1 is ρ = 1/2
    assert not ZCDP(0.49).covers(PureDP(1.0))
    assert PureDP(1.0).covers(PureDP(0.999))
    assert not PureDP(1.0).covers(PureDP(1.001))
    assert not PureDP(100.0).covers(ZCDP(1e-6))  # no pure guarantee from zCDP noise


def test_pure_plus_zcdp_is_zcdp_and_bad_items_are_refused() -> None:
    assert PureDP(2.0) + ZCDP(1.0) == ZCDP(3.0)
    assert PureDP(1.0) + PureDP(2.0) == PureDP(3.0)
    with pytest.raises(BudgetError, match="at least one"):
        compose([])
    with pytest.raises(BudgetError, match="only PureDP and ZCDP"):
        compose([ZCDP(1.0), 0.5])  # type: ignore[list-item]
    with pytest.raises(BudgetError, match="outside the supported range"):
        ZCDP(1e30)
    with pytest.raises(BudgetError, match="accounting must be"):
        loss("approx", 1.0)
    with pytest.raises(BudgetError, match="sum to 1"):
        ZCDP(1.0).split({"a": 0.5, "b": 0.4})


def test_approx_dp_is_the_cks_conversion() -> None:
    assert ZCDP(0.5).approx_dp(1e-10) == zcdp_to_dp_cks(0.5, 1e-10)


def test_accountant_spends_typed_losses_and_refuses_zcdp_from_a_pure_budget() -> None:
    acc = ZCDPAccountant(1.0)
    acc.spend(ZCDP(0.25), "a")
    acc.spend(PureDP(1.0), "b")  # ρ = 0.5
    assert acc.spent == 0.75
    assert acc.budget == ZCDP(1.0)
    with pytest.raises(BudgetError, match="exceed"):
        acc.spend(ZCDP(0.5), "c")
    pure = loss("pure", 1.0)
    from censusdp.budget import PureAccountant

    with pytest.raises(BudgetError, match="pure ε budget"):
        PureAccountant(pure.epsilon).spend(ZCDP(0.1), "d")


def test_statement_from_a_typed_budget_round_trips() -> None:
    st_ = statement_for(ZCDP(0.25), delta=1e-10, invariants=["state: total"])
    assert st_.budget == ZCDP(0.25)
    assert st_ == statement_for("zcdp", 0.25, 1e-10, ["state: total"])
    assert "ρ = 0.25 (zCDP)" in st_.text()
    assert statement_for(PureDP(1.0)).budget == PureDP(1.0)
    with pytest.raises(BudgetError, match="carries its own total"):
        statement_for(ZCDP(0.25), 0.25)
    with pytest.raises(BudgetError, match="give the total"):
        statement_for("zcdp")
