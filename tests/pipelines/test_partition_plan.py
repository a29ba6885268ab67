"""Partitions cover every level exactly; plans allocate budgets and compute sensitivities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import BudgetError, SpecError
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.plan import build_plan, sensitivity


@st.composite
def trees(draw):
    depth = draw(st.integers(2, 4))
    codes, parents = [["root"]], [None]
    for k in range(1, depth):
        n_up = len(codes[-1])
        fan = draw(st.lists(st.integers(1, 4), min_size=n_up, max_size=n_up))
        parents.append(np.repeat(np.arange(n_up), fan))
        codes.append([f"L{k}n{i}" for i in range(int(sum(fan)))])
    return Hierarchy.from_parents([f"l{k}" for k in range(depth)], codes, parents)


@settings(max_examples=60, deadline=None)
@given(trees(), st.integers(1, 20), st.data())
def test_partitions_tile_every_level_with_descendant_ranges(h, n_parts, data):
    cut = data.draw(st.integers(0, h.depth - 1))
    parts = partition_units(h, cut, n_parts)
    assert 1 <= len(parts) <= n_parts
    for k in range(cut, h.depth):
        spans = [p.range(k) for p in parts]
        assert spans[0][0] == 0 and spans[-1][1] == h.levels[k].size
        assert all(a[1] == b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))
    for p in parts:
        a, b = p.units
        anc = h.ancestor_index(h.depth - 1, cut)
        lo, hi = p.range(h.depth - 1)
        assert np.all((anc[lo:hi] >= a) & (anc[lo:hi] < b))


CELLS = ["a", "b", "c"]


def test_sensitivities_are_computed_from_the_matrices():
    q = Query.marginal("m", CELLS, {"ab": ["a", "b"], "bc": ["b", "c"]})
    assert sensitivity(q, 1) == 2.0 and sensitivity(q, 2) == pytest.approx(np.sqrt(2))
    assert sensitivity(Query.detailed(CELLS), 1) == 1.0


def test_plan_allocates_shares_and_skips_queries_implied_by_invariants():
    plan = build_plan(
        ["nation", "state", "county"],
        {
            "nation": [Query.total(CELLS)],
            "state": [Query.total(CELLS), Query.detailed(CELLS)],
            "county": [Query.total(CELLS), Query.detailed(CELLS)],
        },
        {"nation": [Query.total(CELLS)], "state": [Query.total(CELLS)]},
        accounting="pure",
        total=2.0,
        level_shares={"state": 0.25, "county": 0.75},
        query_shares={"county": {"total": 0.5, "detailed": 0.5}},
        noise="laplace",
    )
    got = [(p.level, p.query.name, p.budget) for p in plan.measured]
    assert got == [(1, "detailed", 0.5), (2, "total", 0.75), (2, "detailed", 0.75)]
    assert all(isinstance(p.law, Laplace) for p in plan.measured)
    assert plan.measured[1].law.scale == pytest.approx(1 / 0.75)
    assert plan.privacy.guarantee == "induced subspace differential privacy"
    assert "state: total" in plan.privacy.text()


def test_zcdp_plan_calibrates_gaussian():
    plan = build_plan(
        ["n", "c"],
        {"c": [Query.detailed(CELLS)]},
        {},
        accounting="zcdp",
        total=0.5,
        level_shares={"c": 1.0},
        noise="gaussian",
    )
    (p,) = plan.measured
    assert isinstance(p.law, Gaussian) and p.law.sigma == pytest.approx(1.0)
    assert plan.privacy.guarantee == "differential privacy"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"level_shares": {"c": 0.9}}, BudgetError, "level shares sum to 0.9"),
        ({"total": 0.0}, BudgetError, "positive finite"),
        ({"noise": "gaussian"}, SpecError, "composes under 'zcdp'"),
        ({"level_shares": {"c": 0.5, "x": 0.5}}, SpecError, "level 'x' is not one of"),
        ({"query_shares": {"c": {"detailed": 0.7}}}, BudgetError, "query shares sum to 0.7"),
        (
            {"level_shares": {"c": 0.5, "n": 0.5}},
            BudgetError,
            "level 'n' has a budget share but measures nothing",
        ),
    ],
)
def test_bad_allocations_are_refused(kwargs, error, match):
    args = dict(accounting="pure", total=1.0, level_shares={"c": 1.0}, noise="laplace")
    args.update(kwargs)
    with pytest.raises(error, match=match):
        build_plan(["n", "c"], {"c": [Query.detailed(CELLS)]}, {}, **args)
