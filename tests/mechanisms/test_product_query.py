"""Product queries: per-axis application against the dense Kronecker matrix; sensitivities."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schema_strategies import query_texts, schemas

from censusdp.errors import DataError, SpecError
from censusdp.mechanisms.product_query import (
    ProductQuery,
    QueryRows,
    apply_queries,
    max_weighted_column,
)
from censusdp.schema import Schema

PL94_QUERIES = Schema.load("pl94").strategy


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_product_query_matches_dense(data):
    s = data.draw(schemas())
    q = ProductQuery.parse(s, data.draw(query_texts(s)))
    m = q.dense()
    assert m.shape == (q.n_rows, s.n_cells)
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = gen.integers(0, 20, size=(3, *s.shape))
    assert np.array_equal(q.apply(x), x.reshape(3, -1) @ m.T)
    assert np.array_equal(q.apply(x[0]), m @ x[0].ravel())
    z = gen.integers(-5, 5, size=(2, q.n_rows))
    assert np.array_equal(q.adjoint(z).reshape(2, -1), z @ m)
    assert np.array_equal(q.column_counts().ravel(), m.sum(axis=0))
    assert q.l1_sensitivity == np.abs(m).sum(axis=0).max()
    assert q.l2_sensitivity == pytest.approx(np.sqrt((m.astype(float) ** 2).sum(axis=0).max()))
    assert len(q.labels) == q.n_rows == len(set(q.labels))
    for i, key in enumerate(q.row_keys):
        assert q.row_index(key) == i
    assert np.array_equal(q.to_query().matrix, m)
    sparse = q.sparse()
    assert sparse.dtype == np.int64 and np.array_equal(sparse.toarray(), m)
    # reparsing the canonical name gives the same query
    assert np.array_equal(ProductQuery.parse(s, q.name).dense(), m)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_lattice_answers_equal_each_querys_own(data):
    """apply_queries sums each marginal from the smallest one already summed: the same
    integers as every query applied on its own (and refuses floats, whose bits would not
    be the same)."""
    s = data.draw(schemas())
    texts = data.draw(st.lists(query_texts(s), min_size=1, max_size=5, unique=True))
    qs = [ProductQuery.parse(s, t) for t in texts]
    qs = list({q.name: q for q in qs}.values())
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = gen.integers(-3, 20, size=(4, *s.shape))
    got = apply_queries(qs, x)
    assert list(got) == [q.name for q in qs]
    for q in qs:
        assert np.array_equal(got[q.name], q.apply(x)), q.name
    with pytest.raises(DataError, match="must be integers"):
        apply_queries(qs, x.astype(float))


def test_pl94_production_queries():
    s = Schema.load("pl94")
    qs = [ProductQuery.parse(s, t) for t in PL94_QUERIES]
    assert sum(q.n_rows for q in qs) == 2603  # per geounit: docs/design.md § Census histograms
    assert all(q.l1_sensitivity == 1 and q.l2_sensitivity == 1.0 for q in qs)
    # each person counts once in each of the 11 queries
    assert max_weighted_column(qs, [1.0] * 11) == 11.0
    assert qs[4].labels == (
        "Household",
        "Institutionalized population",
        "Noninstitutionalized population",
    )
    assert qs[0].labels == ("total",)
    assert qs[9].labels[-1] == (
        "18 years and over × Hispanic or Latino × White; Black or African American; "
        "American Indian and Alaska Native; Asian; Native Hawaiian and Other Pacific Islander; "
        "Some Other Race"
    )


def test_subtotal_rows_have_computed_sensitivity():
    """P8-style rows (total, by number of races, two or more, 63 races) count people 3-4 times."""
    s = Schema.load("pl94")
    cr = s.attribute("cenrace")
    n = s.attribute("cenrace").elements["numraces"].labels
    rows = [("total", "total", [])]
    rows += [(f"n{i}", "numraces", [lab]) for i, lab in enumerate(n)]
    rows += [("two+", "race7", ["Two or More Races"])]
    rows += [(f"c{i}", "cenrace", [lab]) for i, lab in enumerate(cr.labels)]
    t = QueryRows.from_keys(s, rows)
    counts = t.column_counts()
    assert np.array_equal(np.unique(counts[0, 0, 0]), [3, 4])
    assert (counts[..., :6] == 3).all() and (counts[..., 6:] == 4).all()
    assert t.l1_sensitivity == 4 and t.l2_sensitivity == 2.0
    dense = t.dense()
    assert np.array_equal(dense.sum(axis=0), counts.ravel())
    assert np.array_equal(t.gram(), dense @ dense.T)
    x = np.random.default_rng(3).integers(0, 9, size=(4, *s.shape))
    assert np.array_equal(t.apply(x), x.reshape(4, -1) @ dense.T)
    # rows of one table at weights: the per-cell sum, not the sum of per-query maxima
    q1, q2 = ProductQuery.parse(s, "hhgq"), ProductQuery.parse(s, "cenrace")
    assert max_weighted_column([q1, q2, t], [0.5, 0.25, 1.0]) == 0.5 + 0.25 + 4


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_row_sets_and_weighted_columns_match_dense(data):
    s = data.draw(schemas(max_attributes=3, max_domain=5))
    texts = data.draw(st.lists(query_texts(s), min_size=1, max_size=4))
    qs = [ProductQuery.parse(s, t) for t in texts]
    w = data.draw(st.lists(st.floats(0.1, 10), min_size=len(qs), max_size=len(qs)))
    dense = [q.dense() for q in qs]
    expect = max(sum(wi * m.sum(axis=0) for wi, m in zip(w, dense, strict=True)))
    assert max_weighted_column(qs, w) == pytest.approx(expect, rel=1e-12)
    rows = [
        (f"{i}:{j}", q.name, key)
        for i, q in enumerate(qs)
        for j, key in enumerate(q.row_keys)
        if data.draw(st.booleans())
    ]
    if rows:
        t = QueryRows.from_keys(s, rows)
        d = t.dense()
        assert np.array_equal(t.gram(), d @ d.T)
        assert t.l1_sensitivity == d.sum(axis=0).max()


def test_errors():
    s = Schema.load("sex_age5")
    q = ProductQuery.parse(s, "sex * ageband")
    with pytest.raises(DataError, match=r"expected \(2, 18\) or \(n_nodes, 2, 18\)"):
        q.apply(np.zeros((3, 36)))
    with pytest.raises(SpecError, match="no row 'X'"):
        q.row_index(["X", "0-19"])
    with pytest.raises(SpecError, match="needs one label for each of"):
        q.row_index(["M"])
    with pytest.raises(DataError, match="answers have shape"):
        q.adjoint(np.zeros(3))
    assert ProductQuery.parse(s, "seniors").labels == ("65+",)
    assert ProductQuery.parse(s, "seniors * sex").name == "sex * seniors"


def test_dense_query_feeds_the_existing_estimators(rng):
    """``to_query`` hands a product query to the flat-cell pipeline (small schemas)."""
    from censusdp.estimation.gls.tree import tree_gls
    from censusdp.hierarchy.synthetic import random_hierarchy
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import invariant, measure

    s = Schema.load("sex_age5")
    gen = np.random.default_rng(11)
    h = random_hierarchy(gen, [(2, 3), (2, 4)])
    leaves = gen.integers(0, 30, size=(h.levels[-1].size, s.n_cells))
    counts = h.aggregate(leaves)
    law = DiscreteGaussian(4)
    plan = [
        (2, ProductQuery.parse(s, "detailed").to_query(), law),
        (1, ProductQuery.parse(s, "sex * ageband").to_query(), law),
        (1, ProductQuery.parse(s, "seniors").to_query(), law),
    ]
    meas = measure(h.names, counts, plan, rng)
    inv = [invariant(counts, 0, ProductQuery.parse(s, "total").to_query())]
    rel = tree_gls(h, s.cells, meas, inv)
    assert rel.level(0).sum() == pytest.approx(counts[0].sum(), abs=1e-6)
    # the product query reads the release's cells in the schema's order
    q = ProductQuery.parse(s, "sex")
    est = q.apply(rel.level(2).reshape(-1, *s.shape))
    assert est.shape == (h.levels[-1].size, 2)
    assert np.allclose(est.sum(axis=0), q.apply(rel.level(0).reshape(-1, *s.shape))[0])


# docs/design.md § Census histograms: the 2020 redistricting persons allocation (levels US … Block, query shares in
# the order of PL94_QUERIES; the US level has no total), as the schema ships it
PL94_ALLOCATION = Schema.load("pl94").allocation
PL94_RHO = PL94_ALLOCATION.rho
PL94_LEVEL_SHARES = list(PL94_ALLOCATION.levels.values())
PL94_QUERY_SHARES = [
    [x if x != 0 else None for x in shares] for shares in PL94_ALLOCATION.queries.values()
]


def test_pl94_strategy_privacy_is_derived_from_its_queries():
    """ρ composed from the queries' column counts equals the production budget by hand.

    Each query at a level gets ρ_q = ρ · level share · query share (σ_q² = 1/(2ρ_q)); a person
    is in one node per level, so ρ = Σ_levels max_cell Σ_q ρ_q · (rows of q counting the cell).
    """
    s = Schema.load("pl94")
    qs = [ProductQuery.parse(s, t) for t in PL94_QUERIES]
    derived = 0.0
    for level_share, shares in zip(PL94_LEVEL_SHARES, PL94_QUERY_SHARES, strict=True):
        assert sum(x for x in shares if x is not None) == 1
        used = [
            (q, float(PL94_RHO * level_share * x))
            for q, x in zip(qs, shares, strict=True)
            if x is not None
        ]
        derived += max_weighted_column([q for q, _ in used], [w for _, w in used])
    assert derived == pytest.approx(float(PL94_RHO), rel=1e-12)
    assert PL94_RHO == Fraction(293764, 114921) and PL94_LEVEL_SHARES[0] == Fraction(104, 4099)
    # the same per-query budget spent on rows that count a person several times costs more
    t = QueryRows.from_keys(
        s,
        [
            ("total", "total", []),
            ("two+", "race7", ["Two or More Races"]),
            ("n2", "numraces", ["Two races"]),
            ("wb", "cenrace", ["White; Black or African American"]),
        ],
    )
    assert max_weighted_column([t], [1.0]) == 4.0


def test_product_queries_measure_through_keyed_streams(rng):
    """ProductQuery plugs into measure_range: noise keyed by (level, query), any node range."""
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import measure_range

    s = Schema.load("pl94")
    q = ProductQuery.parse(s, "votingage * hispanic * cenrace")
    x = np.random.default_rng(5).integers(0, 3, size=(10, *s.shape))
    law = DiscreteGaussian(9)
    truth = q.apply(x)
    whole = measure_range(truth, "block", 10, 0, q, law, rng)
    parts = np.vstack(
        [
            measure_range(truth[:4], "block", 10, 0, q, law, rng),
            measure_range(truth[4:], "block", 10, 4, q, law, rng),
        ]
    )
    assert np.array_equal(whole, parts) and whole.shape == (10, 252)
    assert not np.array_equal(whole, truth)
