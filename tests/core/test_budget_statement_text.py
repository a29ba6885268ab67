"""What a privacy statement says: the spend (after σ² rounding) beside the allocation's target,
the tighter (Canonne–Kamath–Steinke) ε with the simple bound labelled, the privacy unit and
neighbour relation with the cost of changing one record under invariants, the areas exact
through the invariants, and one wording per product derived from its steps."""

from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import (
    PrivacyStatement,
    Product,
    Step,
    with_products,
    zcdp_to_dp,
    zcdp_to_dp_cks,
)
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.privacy import derive_statement
from censusdp.pipelines.release_statement import change_factor, exact_through_invariants
from censusdp.schema import Schema

LEVELS = ("nation", "state", "county", "tract", "block_group", "block")


@pytest.fixture(scope="module")
def production():
    """The 2020 production plan (pl94 allocation, ρ = 2.556...) and its derived statement."""
    schema = Schema.load("pl94")
    plan = allocation_plan(schema)
    stmt = derive_statement(
        LEVELS, [(LEVELS.index(lv), q, law) for lv, q, law in plan], delta=1e-10
    )
    return schema, plan, stmt


def test_the_statement_states_the_rho_spent_not_the_allocation(production):
    schema, plan, stmt = production
    spent = sum(Fraction(q.l1_sensitivity) / (2 * law.sigma2) for _, q, law in plan)
    assert abs(stmt.rho - float(spent)) <= 1e-15 * float(spent)  # Σ Δ²/(2σ²) of the actual σ²
    assert f"{float(spent):.7f}"[:8] == "2.554618"  # the audit's 2.554619
    target = float(schema.allocation.rho)
    assert target > stmt.rho and f"{target:.4g}" == "2.556"
    said = dataclasses.replace(stmt, target=target).text()
    assert f"exactly ρ = {stmt.rho:.7g}" in said and f"target was ρ = {target:.7g}" in said
    # no target line when the spend is the target (or none is given)
    assert "target" not in dataclasses.replace(stmt, target=stmt.rho).budget_text()
    assert "target" not in stmt.budget_text()


def test_the_epsilon_quoted_is_the_cks_conversion(production):
    _, _, stmt = production
    cks, simple = stmt.epsilons()
    assert cks == zcdp_to_dp_cks(stmt.rho, 1e-10) and simple == zcdp_to_dp(stmt.rho, 1e-10)
    assert f"{cks:.4g}" == "17.14" and f"{simple:.4g}" == "17.89" and cks < simple
    text = stmt.budget_text()
    # the first ε quoted is the CKS one; the simple bound only as the labelled second figure
    first = text.index("ε = ")
    assert text[first:].startswith("ε = 17.14, δ = 1e-10) by the Canonne–Kamath–Steinke")
    assert "the simple bound ρ + 2√(ρ ln(1/δ)) gives ε = 17.89" in text
    d = stmt.to_dict()
    assert d["epsilon_cks"] == cks and d["epsilon_simple_bound"] == simple


def test_the_statement_names_unit_and_relation_and_the_change_cost():
    plain = PrivacyStatement("zcdp", rho=0.5, mechanism="discrete_gaussian", unit="trip")
    text = plain.text()
    assert "privacy unit: one trip" in text and "adding or removing one trip's record" in text
    assert "changing" not in text  # no invariants: the relation needs no qualification
    held = dataclasses.replace(
        plain,
        invariants=("state: total",),
        delta=1e-6,
        change_factor=change_factor(plain.mechanism),
    )
    text = held.text()
    assert "share the invariants differ at least by changing one trip's record" in text
    assert "at most 2ρ: ρ = 1 (zCDP)" in text and f"ε = {zcdp_to_dp_cks(1.0, 1e-6):.4g}" in text
    assert held.change_loss().rho == 1.0
    # pure: 2ε; zCDP with a pure (Laplace) law inside: group privacy, 4ρ
    pure = PrivacyStatement("pure", epsilon=0.25, invariants=("a: total",), mechanism="laplace")
    assert pure.change_loss().epsilon == 0.5 and "at most 2ε" in pure.text()
    assert change_factor("discrete_gaussian, laplace") is None
    mixed = dataclasses.replace(held, mechanism="discrete_gaussian, laplace", change_factor=None)
    assert mixed.change_loss().rho == 2.0 and "at most 4ρ" in mixed.text()
    # no unit given: says one input record, and "changing one record" (not "one record's record")
    assert "one input record" in PrivacyStatement("zcdp", rho=1.0).text()
    anon = dataclasses.replace(held, unit=None).text()
    assert "differ at least by changing one record (a removal" in anon
    assert "record's record" not in anon


counting = st.integers(1, 4).flatmap(
    lambda m: st.integers(2, 5).flatmap(
        lambda n: st.lists(
            st.lists(st.integers(0, 2), min_size=n, max_size=n), min_size=m, max_size=m
        ).map(np.array)  # fmt: skip
    )
)


def _worst_change(q: np.ndarray) -> float:
    """max over i ≠ j of ‖Q(e_i − e_j)‖²: the slow, obviously correct reference."""
    return max(
        float(((q[:, i] - q[:, j]) ** 2).sum())
        for i, j in itertools.permutations(range(q.shape[1]), 2)
    )


@settings(max_examples=60, deadline=None)
@given(q=counting, sigma2=st.fractions(Fraction(1, 4), 50))
def test_changing_one_record_costs_at_most_twice_rho_for_counting_queries(q, sigma2):
    """‖Q(e_i − e_j)‖² ≤ 2 max_i ‖Qe_i‖² for a non-negative Q: the 2ρ the statement quotes
    bounds the Gaussian loss of every change of one record (brute force over pairs)."""
    if not q.any():
        return
    delta2 = float((q**2).sum(axis=0).max())
    rho = delta2 / (2 * float(sigma2))
    stmt = PrivacyStatement(
        "zcdp", rho=rho, invariants=("x: total",), change_factor=change_factor(["gaussian"])
    )
    assert _worst_change(q) / (2 * float(sigma2)) <= stmt.change_loss().rho * (1 + 1e-12)


def test_the_2rho_bound_is_attained_and_fails_for_a_signed_query():
    """Power: the detailed query attains 2ρ (so no smaller factor is honest), and a query with
    a negative entry (not a counting query) breaks the bound, so the check can fail."""
    assert _worst_change(np.eye(3)) == 2 * 1.0
    signed = np.array([[1, -1]])
    assert _worst_change(signed) == 4 > 2 * float((signed**2).sum(axis=0).max())


def test_a_product_is_post_processing_exactly_when_no_step_reads_confidential_data():
    gls = Step("GLS", ("measurements", "invariants"))
    rnd = Step("rounding", ("measurements", "randomness"))
    leak = Step("blocks from the rows", ("confidential",), reveals="the occupied blocks")
    ok, bad = Product("a/", (gls, rnd)), Product("b/", (leak, gls))
    assert ok.post_processing and not bad.post_processing
    assert ok.wording().startswith("a/: post-processing") and "covers it unchanged" in ok.wording()
    assert "blocks from the rows read confidential data and reveals the occupied blocks" in (
        bad.wording()
    )
    base = PrivacyStatement("zcdp", rho=1.0)
    assert with_products(base, [ok]) == base
    both = with_products(base, [ok, bad])
    assert both.data_dependent and both.reveals == (
        "blocks from the rows reveals the occupied blocks",
    )
    assert "the occupied blocks" in both.text() and "not post-processing" in both.text()
    with pytest.raises(ValueError, match="say what it reveals"):
        Step("peek", ("confidential",))
    with pytest.raises(ValueError, match="reads must be among"):
        Step("peek", ("truth",))


def test_a_statement_round_trips_through_its_dict():
    s = PrivacyStatement(
        "zcdp", rho=0.3, delta=1e-9, invariants=("state: total",), unit="person", target=0.31,
        exact=("county 11001 (the only child of state 11): total",), reveals=("x reveals y",),
        data_dependent=True, parts=("a: ρ = 0.1 (zCDP)", "b: ρ = 0.2 (zCDP)"), mechanism="dg",
    )  # fmt: skip
    back = PrivacyStatement.from_dict(s.to_dict())
    assert back == s and back.text() == s.text()
    assert "county 11001 (the only child of state 11): total" in s.text()
    many = dataclasses.replace(s, exact=tuple(f"county {i}" for i in range(25)))
    assert "county 19" in many.text() and "county 20" not in many.text()
    assert "and 5 more (listed in the manifest)" in many.text()


# -- areas exact through the invariants --------------------------------------------------------
def _tree(counts_per_level: list[list[int]]) -> Hierarchy:
    """A hierarchy whose level k+1 gives each level-k node ``counts[k][i]`` children."""
    names, codes, parents = ["L0"], [["r"]], [None]
    for k, counts in enumerate(counts_per_level):
        par = np.repeat(np.arange(len(counts)), counts)
        names.append(f"L{k + 1}")
        codes.append([f"{k + 1}.{i}" for i in range(par.size)])
        parents.append(par)
    return Hierarchy.from_parents(names, codes, parents)


def _exact_reference(h: Hierarchy, held: set[int]) -> list[str]:
    """Node by node: exact when held at its level, or its parent's only child and the parent
    exact; listed when exact but not held."""
    out, exact = [], {}
    for k in range(h.depth):
        for i in range(h.sizes[k]):
            if k in held:
                exact[k, i] = True
                continue
            p = int(h.levels[k].parent[i]) if k else -1
            only = k > 0 and int(h.levels[k - 1].child_count[p]) == 1
            exact[k, i] = bool(k > 0 and only and exact[k - 1, p])
            if exact[k, i]:
                out.append(
                    f"{h.names[k]} {h.levels[k].codes[i]} (the only child of {h.names[k - 1]} "
                    f"{h.levels[k - 1].codes[p]}): total"
                )
    return out


@st.composite
def trees(draw):
    depth = draw(st.integers(1, 4))
    counts, n = [], 1
    for _ in range(depth):
        c = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        counts.append(c)
        n = sum(c)
    return counts


@settings(max_examples=80, deadline=None)
@given(counts=trees(), data=st.data())
def test_exact_areas_match_a_node_by_node_reference(counts, data):
    h = _tree(counts)
    held = set(data.draw(st.lists(st.integers(0, h.depth - 1), max_size=2)))
    got = exact_through_invariants(h, [(h.names[k], "total") for k in sorted(held)])
    assert got == _exact_reference(h, held)


def test_dc_like_county_is_named_and_a_two_county_state_is_not():
    h = _tree([[2], [2, 1], [1, 2, 1]])  # state 1.1 has one county, whose only tract ...
    got = exact_through_invariants(h, [("L1", "total")])
    assert got == [
        "L2 2.2 (the only child of L1 1.1): total",
        "L3 3.3 (the only child of L2 2.2): total",
    ]
    assert exact_through_invariants(h, []) == []


def test_the_unit_of_census_tables_comes_from_their_universes():
    from censusdp.pipelines.release_statement import unit_of_universes

    assert unit_of_universes(["Total population", "Population 18 years and over"]) == "person"
    assert unit_of_universes(["Housing units", "Occupied housing units"]) == "housing unit"
    assert unit_of_universes(["Households"]) == "household"
    assert unit_of_universes(["Total population", "Housing units"]) == ""  # mixed: unknown
    assert unit_of_universes(["Taxi trips"]) == ""


def test_dc_is_the_one_county_exact_through_its_state_on_real_counties(shared_file, rng):
    """The 2010 counties (50 states, DC, Puerto Rico): with state totals invariant, only DC
    (11001, alone in state 11) is exact — its GLS variance is 0, every other county's is not —
    and it is the one area named."""
    import pandas as pd

    from censusdp.estimation.gls.tree import tree_gls
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import Query, invariant, measure

    d = pd.read_csv(shared_file("county_totalpop_2010.csv"), dtype=str)
    d = d.sort_values("fips").reset_index(drop=True)
    states = sorted(d.state_fips.unique())
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], states, list(d.fips)],
        [None, np.zeros(len(states), int), np.searchsorted(states, d.state_fips)],
    )
    assert exact_through_invariants(h, [("state", "total")]) == [
        "county 11001 (the only child of state 11): total"
    ]
    counts = h.aggregate(d.pop_sf2010.astype(np.int64).to_numpy()[:, None])
    cells = ["persons"]
    plan = [(2, Query.detailed(cells), DiscreteGaussian(10))]
    meas = measure(h.names, counts, plan, rng.child("dc"))
    rel = tree_gls(h, cells, meas, [invariant(counts, 1, Query.total(cells))])
    var = rel.variances[2][:, 0]
    dc = list(h.levels[2].codes).index("11001")
    assert var[dc] == 0 and (np.delete(var, dc) > 0).all()
    assert rel.estimates[2][dc, 0] == counts[2][dc, 0] == 601723
