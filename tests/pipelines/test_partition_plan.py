"""Partitions cover every level exactly; plans allocate budgets and compute sensitivities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import allocate
from censusdp.errors import BudgetError, SpecError
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.plan import build_plan


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
    assert q.sensitivity(1) == 2.0 and q.sensitivity(2) == pytest.approx(np.sqrt(2))
    assert Query.detailed(CELLS).sensitivity(1) == 1.0


def test_plan_calibrates_each_measured_query_from_the_allocation():
    alloc = allocate(
        2.0,
        {"state": 0.25, "county": 0.75},
        {"state": {"detailed": 1.0}, "county": {"total": 0.5, "detailed": 0.5}},
    )
    plan = build_plan(
        ["nation", "state", "county"],
        {"state": [Query.detailed(CELLS)], "county": [Query.total(CELLS), Query.detailed(CELLS)]},
        {"nation": [Query.total(CELLS)], "state": [Query.total(CELLS)]},
        alloc,
        accounting="pure",
        noise="laplace",
    )
    got = [(p.level, p.query.name, p.budget) for p in plan.measured]
    assert got == [(1, "detailed", 0.5), (2, "total", 0.75), (2, "detailed", 0.75)]
    assert all(isinstance(p.law, Laplace) for p in plan.measured)
    assert plan.measured[1].law.scale == pytest.approx(1 / 0.75)
    assert plan.privacy.epsilon == pytest.approx(2.0)
    assert plan.privacy.guarantee == "induced subspace differential privacy"
    assert "state: total" in plan.privacy.text()


def test_zcdp_plan_calibrates_gaussian():
    plan = build_plan(
        ["n", "c"],
        {"c": [Query.detailed(CELLS)]},
        {},
        {("c", "detailed"): 0.5},
        accounting="zcdp",
        noise="gaussian",
    )
    (p,) = plan.measured
    assert isinstance(p.law, Gaussian) and p.law.sigma == pytest.approx(1.0)
    assert plan.privacy.guarantee == "differential privacy"


@pytest.mark.parametrize(
    ("queries", "invariants", "alloc", "noise", "error", "match"),
    [
        (
            {"c": ["detailed"]},
            {},
            {("c", "detailed"): 1.0},
            "gaussian",
            SpecError,
            "composes under 'zcdp'",
        ),
        (
            {"x": ["detailed"]},
            {},
            {("x", "detailed"): 1.0},
            "laplace",
            SpecError,
            "level 'x' is not one of",
        ),
        (
            {"c": ["detailed"]},
            {},
            {},
            "laplace",
            BudgetError,
            "'detailed' is measured but has no budget",
        ),
        (
            {"c": ["detailed"]},
            {},
            {("c", "detailed"): 0.5, ("c", "total"): 0.5},
            "laplace",
            BudgetError,
            r"\('c', 'total'\)",
        ),
        (
            {"c": ["total"]},
            {"c": ["detailed"]},
            {("c", "total"): 1.0},
            "laplace",
            SpecError,
            "fixed by the level's invariants",
        ),
    ],
)
def test_bad_plans_are_refused(queries, invariants, alloc, noise, error, match):
    named = {"detailed": Query.detailed(CELLS), "total": Query.total(CELLS)}
    q = {lvl: [named[n] for n in names] for lvl, names in queries.items()}
    i = {lvl: [named[n] for n in names] for lvl, names in invariants.items()}
    with pytest.raises(error, match=match):
        build_plan(["n", "c"], q, i, alloc, accounting="pure", noise=noise)
