"""The flat TopDown-style route is a front end of the schema engine: same integers (==).

A classic table is the one-attribute schema ``Schema.flat(cells)``. The flat route
(:func:`~censusdp.estimation.topdown.flat.topdown` on ``Query`` measurements from ``measure``) and
the schema route (:func:`~censusdp.estimation.topdown.schema.topdown_schema` on
``ProductQuery`` measurements from ``measure_products``), given the same table and the same
seed, must draw the same noise and release the same integers, statement and invariants.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from censusdp.errors import CensusDPError, DataError, SpecError
from censusdp.estimation.topdown.flat import flat_products, topdown
from censusdp.estimation.topdown.schema import (
    bureau_pl94_ordering,
    default_ordering,
    topdown_schema,
)
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms import Gaussian, Laplace, Query, invariant, measure
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_measure import measure_products, product_invariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema


def _hierarchy(branching: list[list[int]]) -> Hierarchy:
    names = ["L0"] + [f"L{k + 1}" for k in range(len(branching))]
    codes, parents = [["R"]], [None]
    for k, counts in enumerate(branching):
        par = np.repeat(np.arange(len(counts)), counts)
        parents.append(par)
        codes.append([f"{k + 1}-{i:03d}" for i in range(par.size)])
    return Hierarchy.from_parents(names, codes, parents)


def _schema(cells: list[str], pair: dict[str, list[str]] | None) -> Schema:
    """``Schema.flat(cells)``, with the recode ``pair`` when given (a marginal)."""
    attr: dict = {"name": "cell", "labels": cells}
    if pair:
        attr["recodes"] = [{"name": "pair", "groups": pair}]
    return Schema.from_dict({"name": "flat", "attributes": [attr]}, source="<test>")


@st.composite
def tables(draw):
    depth = draw(st.integers(2, 3))
    branching = [[draw(st.integers(1, 4))]]
    for _ in range(depth - 1):
        branching.append([draw(st.integers(1, 3)) for _ in range(sum(branching[-1]))])
    n_cells = draw(st.integers(1, 4))
    law = draw(st.sampled_from(["gaussian", "laplace", "discrete_gaussian"]))
    sigma = draw(st.sampled_from([0.7, 3.0, 15.0]))
    inv_levels = sorted(draw(st.sets(st.integers(0, depth), max_size=2)))
    marginal = n_cells >= 3 and draw(st.booleans())
    detailed_inv = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return branching, n_cells, law, sigma, inv_levels, marginal, detailed_inv, seed


def _law(name: str, sigma: float):
    if name == "gaussian":
        return Gaussian(sigma)
    if name == "laplace":
        return Laplace(sigma)
    return DiscreteGaussian(max(1, round(sigma * sigma)))


@settings(
    max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(tables())
def test_flat_front_end_and_schema_path_release_the_same_integers(spec):
    branching, n_cells, law_name, sigma, inv_levels, marginal, detailed_inv, seed = spec
    h = _hierarchy(branching)
    cells = [f"c{j}" for j in range(n_cells)]
    gen = np.random.default_rng(seed)
    # many small and zero cells: where non-negativity binds
    leaf = gen.poisson(gen.choice([0.3, 3.0, 40.0], size=(h.leaves.size, 1)), (h.leaves.size, n_cells))  # fmt: skip
    counts = h.aggregate(leaf.astype(np.int64))
    law = _law(law_name, sigma)
    pair = {"a": cells[:2], "b": cells[2:]} if marginal else None

    # the flat route
    flat_q = [Query.total(cells), Query.detailed(cells)]
    if pair:
        flat_q.append(Query.marginal("pair", cells, pair))
    plan = [(k, q, law) for k in range(h.depth) for q in flat_q]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(seed, warn=False))
    invs = [invariant(counts, k, Query.total(cells)) for k in inv_levels]
    if detailed_inv:
        invs.append(invariant(counts, 1, Query.detailed(cells)))
    flat = topdown(h, cells, meas, invs, None)

    # the schema route, built independently from the same table and seed
    schema = _schema(cells, pair)
    texts = ["total", "detailed", *(["pair"] if pair else [])]
    prod_q = [ProductQuery.parse(schema, t) for t in texts]
    by_level = dict(zip(h.names, counts, strict=True))
    pplan = [(lv, q, law) for lv in h.names for q in prod_q]
    pmeas = measure_products(by_level, pplan, KeyedRNG.reproducible(seed, warn=False))
    pinvs = [product_invariant(by_level, h.names[k], prod_q[0]) for k in inv_levels]
    if detailed_inv:
        pinvs.append(product_invariant(by_level, h.names[1], prod_q[1]))
    for a, b in zip(meas, pmeas, strict=True):  # the same seed draws the same noise
        assert a.query.name == b.query.name and np.array_equal(a.values, b.values)
    rel = topdown_schema(h, schema, pmeas, pinvs)

    assert flat.cells == rel.cells == tuple(cells)
    for k in range(h.depth):
        assert flat.estimates[k].dtype == rel.estimates[k].dtype == np.int64
        assert np.array_equal(flat.estimates[k], rel.estimates[k]), h.names[k]
        assert flat.estimates[k].min() >= 0
        if k:
            assert np.array_equal(h.aggregate_up(k, flat.estimates[k]), flat.estimates[k - 1])
    for iv in invs:  # given and implied invariants (sums up the levels), exactly
        k, v = h.level_index(iv.level), np.asarray(iv.values)
        for j in range(k, -1, -1):
            assert np.array_equal(iv.query.apply(flat.estimates[j]), v)
            v = h.aggregate_up(j, v) if j else v
    assert flat.privacy.text() == rel.privacy.text()
    assert flat.privacy.invariants == rel.privacy.invariants
    assert flat.diagnostics["milp_fallbacks"] == rel.diagnostics["milp_fallbacks"]


def _small():
    h = _hierarchy([[3], [2, 1, 2]])
    cells = ["x", "y", "z"]
    gen = np.random.default_rng(1)
    counts = h.aggregate(gen.integers(0, 9, size=(5, 3)).astype(np.int64))
    return h, cells, counts


def test_flat_queries_become_the_schema_queries():
    h, cells, counts = _small()
    marg = Query.marginal("xy", cells, {"xy": ["x", "y"], "z": ["z"]})
    plan = [(k, q, Gaussian(1.0)) for k in range(h.depth) for q in (Query.total(cells), marg)]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(3, warn=False))
    schema, pm, pi = flat_products(h, cells, meas, [invariant(counts, 1, Query.detailed(cells))])
    assert schema.cells == tuple(cells) and schema.shape == (3,)
    assert [m.query.name for m in pm[:2]] == ["total", "xy"] and pi[0].query.name == "detailed"
    for m, p in zip(meas, pm, strict=True):
        assert np.array_equal(p.query.dense(), m.query.matrix)
        assert p.values is m.values and p.level == m.level and p.law is m.law
    assert pm[0].query.factors[0].is_all and pi[0].query.factors[0].is_detailed
    assert pm[1].query is pm[3].query  # one product query per name


def _one_line(info, *words: str) -> None:
    msg = str(info.value)
    assert isinstance(info.value, CensusDPError) and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


def test_flat_front_end_refusals_are_one_line_and_name_the_query():
    h, cells, counts = _small()
    det = Query.detailed(cells)
    good = [(k, det, Gaussian(1.0)) for k in range(h.depth)]
    meas = measure(h.names, counts, good, KeyedRNG.reproducible(4, warn=False))
    weighted = Query("weighted", np.array([[1, 2, 0]]), ("w",))
    fake_total = Query("total", np.array([[1, 1, 0]]), ("total",))
    other_xy = Query.marginal("xy", cells, {"xy": ["x", "z"]})
    xy = Query.marginal("xy", cells, {"xy": ["x", "y"]})
    cases = [
        ([(0, weighted, Gaussian(1.0))], SpecError, ("'weighted'", "0 and 1")),
        ([(0, fake_total, Gaussian(1.0))], SpecError, ("'total'", "another name")),
        ([(0, xy, Gaussian(1.0)), (1, other_xy, Gaussian(1.0))], SpecError, ("'xy'", "own name")),
    ]
    for extra, err, words in cases:
        more = measure(h.names, counts, extra, KeyedRNG.reproducible(5, warn=False))
        with pytest.raises(err) as info:
            topdown(h, cells, [*meas, *more], [], None)
        _one_line(info, *words)
    wide = Query.detailed([*cells, "w"])
    bad = Invariant(1, wide, np.zeros((3, 4), np.int64))
    with pytest.raises(DataError) as info:
        topdown(h, cells, meas, [bad], None)
    _one_line(info, "'detailed'", "4 cells", "has 3")


def test_unidentified_level_is_refused_and_invariants_can_identify_it():
    """A level measured only by its totals is refused (naming the level and how to fix it);
    the same level is solved when a detailed invariant fixes its cells."""
    h, cells, counts = _small()
    tot, det = Query.total(cells), Query.detailed(cells)
    plan = [(0, tot, Gaussian(1.0)), (1, det, Gaussian(1.0)), (2, det, Gaussian(1.0))]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(6, warn=False))
    with pytest.raises(SpecError) as info:
        topdown(h, cells, meas, [], None)
    _one_line(info, "level 'L0'", "only 1 independent", '"detailed"')
    fixed = topdown(h, cells, meas, [invariant(counts, 0, det)], None)
    assert np.array_equal(fixed.estimates[0], counts[0])
    # a level with no measurement at all, fixed by its invariant
    rel = topdown(h, cells, meas[1:], [invariant(counts, 0, det)], None)
    assert np.array_equal(rel.estimates[0], counts[0])
    assert rel.diagnostics["levels"]["L0"]["l2_status"].keys() <= {"Solved", "AlmostSolved"}


def test_default_ordering_isolates_the_total_then_fits_the_rest():
    flat = Schema.flat(["x", "y"])
    o = default_ordering(flat, ["a", "b", "c"], [["total", "detailed"], ["detailed", "pair"], []])
    rounder = (("total",), ("detailed",))
    assert o == {
        "a": ((("total",), ("detailed",)), rounder),
        "b": ((("detailed", "pair"),), rounder),
        "c": ((), rounder),
    }
    names = ["nation", "state", "county"]
    assert default_ordering(Schema.load("pl94"), names, [[]] * 3) == bureau_pl94_ordering(names)
