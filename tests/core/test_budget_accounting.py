"""Accountants, allocation of a budget per level and query, and privacy statements."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import (
    Budget,
    PrivacyStatement,
    PureAccountant,
    ZCDPAccountant,
    accountant_for,
    allocate,
    statement_for,
    zcdp_to_dp,
    zcdp_to_dp_cks,
)
from censusdp.errors import BudgetError


def test_pure_accountant_adds_epsilon():
    acc = PureAccountant(1.0)
    acc.spend(0.25, "state/total")
    acc.spend(0.5, "county/detailed")
    assert acc.spent == 0.75
    assert acc.remaining == 0.25
    assert [(e.label, e.amount) for e in acc.ledger] == [
        ("state/total", 0.25),
        ("county/detailed", 0.5),
    ]
    assert acc.accounting == "pure" and acc.unit == "epsilon"


def test_overspend_names_label_and_amounts():
    acc = ZCDPAccountant(1.0)
    acc.spend(0.75, "state/total")
    with pytest.raises(BudgetError) as err:
        acc.spend(0.5, "county/detailed")
    msg = str(err.value)
    assert "'county/detailed'" in msg and "rho = 0.5" in msg
    assert "0.75 already spent of 1" in msg and "0.25 left" in msg
    assert len(acc.ledger) == 1  # the refused spend is not recorded


@pytest.mark.parametrize("total", [0.0, -1.0, math.inf, math.nan])
def test_non_positive_budgets_are_refused(total):
    with pytest.raises(BudgetError, match="positive finite"):
        PureAccountant(total)
    with pytest.raises(BudgetError, match="positive finite"):
        ZCDPAccountant(total)


@pytest.mark.parametrize("amount", [0.0, -0.1, math.nan])
def test_non_positive_spends_are_refused(amount):
    with pytest.raises(BudgetError, match="'q'"):
        PureAccountant(1.0).spend(amount, "q")


def test_zcdp_accountant_reports_epsilon():
    acc = ZCDPAccountant(0.5, delta=1e-10)
    acc.spend(0.2, "a")
    assert acc.epsilon(tight=False) == zcdp_to_dp(0.5, 1e-10)
    assert acc.epsilon() == zcdp_to_dp_cks(0.5, 1e-10)
    assert acc.epsilon(spent=True) == zcdp_to_dp_cks(0.2, 1e-10)
    assert ZCDPAccountant(0.5).epsilon() is None
    with pytest.raises(BudgetError, match="delta"):
        ZCDPAccountant(0.5, delta=1.5)


def test_accountant_for():
    assert isinstance(accountant_for("pure", 1.0), PureAccountant)
    assert accountant_for("zcdp", 1.0, 1e-5).delta == 1e-5
    with pytest.raises(BudgetError, match="'renyi'"):
        accountant_for("renyi", 1.0)


def test_allocate_multiplies_shares():
    out = allocate(
        4.0,
        {"state": 0.25, "county": 0.75},
        {"state": {"total": 1.0}, "county": {"total": 0.5, "detailed": 0.5}},
    )
    assert out == {("state", "total"): 1.0, ("county", "total"): 1.5, ("county", "detailed"): 1.5}


@pytest.mark.parametrize(
    "total, levels, queries, match",
    [
        (
            1.0,
            {"a": 0.5, "b": 0.4},
            {"a": {"t": 1}, "b": {"t": 1}},
            "level shares: shares sum to 0.9",
        ),
        (1.0, {"a": 1.0}, {"a": {"t": 0.7, "d": 0.2}}, "at level 'a': shares sum to 0.9"),
        (1.0, {"a": 1.2, "b": -0.2}, {"a": {"t": 1}, "b": {"t": 1}}, "share of 'b' is -0.2"),
        (1.0, {"a": 1.0, "b": 0.0}, {"a": {"t": 1}, "b": {"t": 1}}, "share of 'b' is 0.0"),
        (0.0, {"a": 1.0}, {"a": {"t": 1}}, "total budget"),
        (-2.0, {"a": 1.0}, {"a": {"t": 1}}, "total budget"),
        (1.0, {"a": 1.0}, {}, r"no query shares for level\(s\) \['a'\]"),
        (1.0, {"a": 1.0}, {"a": {"t": 1}, "z": {"t": 1}}, r"level\(s\) \['z'\]"),
        (1.0, {}, {}, "no shares"),
    ],
)
def test_allocate_refuses_bad_shares(total, levels, queries, match):
    with pytest.raises(BudgetError, match=match):
        allocate(total, levels, queries)


@settings(max_examples=100, deadline=None)
@given(
    total=st.floats(1e-3, 100.0),
    weights=st.lists(
        st.lists(st.floats(0.01, 1.0), min_size=1, max_size=4), min_size=1, max_size=5
    ),
)
def test_allocated_pieces_can_all_be_spent(total, weights):
    level_w = [sum(w) for w in weights]
    levels = {f"l{i}": lw / sum(level_w) for i, lw in enumerate(level_w)}
    queries = {
        f"l{i}": {f"q{j}": x / sum(w) for j, x in enumerate(w)} for i, w in enumerate(weights)
    }
    pieces = allocate(total, levels, queries)
    assert math.fsum(pieces.values()) == pytest.approx(total, rel=1e-12)
    acc = PureAccountant(total)
    for (level, query), amount in pieces.items():
        acc.spend(amount, f"{level}/{query}")
    assert acc.remaining == pytest.approx(0.0, abs=1e-9 * total)
    with pytest.raises(BudgetError):
        acc.spend(1e-6 * total, "one more")


def test_budget_dataclass():
    b = Budget("zcdp", 2.0, {"s": 1.0}, {"s": {"total": 0.5, "detailed": 0.5}}, delta=1e-10)
    assert b.allocation() == {("s", "total"): 1.0, ("s", "detailed"): 1.0}
    acc = b.accountant()
    assert isinstance(acc, ZCDPAccountant) and acc.total == 2.0 and acc.delta == 1e-10
    with pytest.raises(BudgetError, match="sum to"):
        Budget("pure", 1.0, {"s": 0.5}, {"s": {"total": 1.0}})
    with pytest.raises(BudgetError, match="accounting"):
        Budget("approx", 1.0, {"s": 1.0}, {"s": {"total": 1.0}})


def test_statement_for_with_invariants_is_subspace_dp():
    st_ = statement_for("zcdp", 1.0, 1e-10, {"nation": "total"}, "discrete_gaussian")
    assert isinstance(st_, PrivacyStatement)
    assert st_.rho == 1.0 and st_.epsilon is None and st_.invariants == ("nation: total",)
    assert st_.guarantee == "induced subspace differential privacy"
    assert "not plain DP" in st_.text()


def test_statement_for_without_invariants_is_plain_dp():
    st_ = statement_for("pure", 0.5, mechanism="laplace", geometry="weighted")
    assert st_.epsilon == 0.5 and st_.rho is None
    assert st_.guarantee == "differential privacy"
    assert st_.to_dict()["accounting"] == "pure"


@pytest.mark.parametrize(
    "statement",
    [
        statement_for("pure", 0.5, mechanism="laplace", geometry="weighted"),
        PrivacyStatement(
            "zcdp",
            rho=0.25,
            delta=1e-10,
            invariants=("nation: total", "state: total"),
            data_dependent=True,
            mechanism="discrete_gaussian",
            notes=("MCMC total variation <= 0.005",),
        ),
    ],
)
def test_statement_survives_its_dict(statement):
    assert PrivacyStatement.from_dict(statement.to_dict()) == statement


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"accounting": "pure", "total": 0.0}, "total epsilon"),
        ({"accounting": "zcdp", "total": 1.0, "delta": 2.0}, "delta"),
        ({"accounting": "zcdp", "total": 1.0, "geometry": "sphere"}, "geometry"),
        ({"accounting": "approx", "total": 1.0}, "accounting"),
    ],
)
def test_statement_for_refuses_inconsistency(kwargs, match):
    with pytest.raises(BudgetError, match=match):
        statement_for(**kwargs)
