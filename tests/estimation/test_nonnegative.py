"""The non-negative product (estimation.nonnegative).

Projections (simplex lanes, the top's atoms, each parent's transportation polytope)
against a slow cvxpy reference on hypothesis cases; the product integer, non-negative,
consistent cell by cell, invariants ``==``, the same integers for every cut and
partitioning; children's totals equal the totals pass's integers exactly; an empty area
gets a total of the order of its noise (the per-cell projection gave it hundreds);
noiseless consistent non-negative integers come back unchanged; and its bias is real
(small cells pushed up) where the unbiased rounding has none.
"""

from __future__ import annotations

from types import SimpleNamespace

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import censusdp.estimation.integer.nonnegative as nn
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.tree import Forest
from censusdp.estimation.integer.controlled import round_children, round_structured
from censusdp.estimation.integer.laminar import uniform_draws
from censusdp.estimation.integer.nonnegative import (
    nonnegative_partition,
    nonnegative_structured,
    nonnegative_top,
    project_children,
    project_transport,
)
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema
from tests.schema_strategies import schemas


def _case(gen, schema, fanouts, noise=1.5, invariant_levels=(0, 1), marginal=None, mean=2):
    """A tree of small counts (many zeros), consistent real GLS-like estimates (truth + noise,
    summed up from the leaves, centred per level-1 node so that the invariants hold) and
    the invariants at ``invariant_levels``."""
    h = random_hierarchy(gen, fanouts)
    K = schema.n_cells
    truth = gen.poisson(mean, size=(h.leaves.size, K)) * (gen.random((h.leaves.size, K)) < 0.5)
    e = gen.normal(0.0, noise, size=truth.shape)
    anc = h.ancestor_index(-1, 1) if h.depth > 1 else np.zeros(h.leaves.size, np.int64)
    n1 = h.levels[1].size if h.depth > 1 else 1
    q = ProductQuery.parse(schema, marginal or "total")
    # centre the noise within each (level-1 node, invariant row) so the invariants hold
    rows = q.dense().astype(bool)
    for r in rows:
        s = np.bincount(anc, weights=e[:, r].sum(axis=1), minlength=n1)
        n = np.bincount(anc, minlength=n1) * int(r.sum())
        e[:, r] -= (s / n)[anc][:, None]
    est = h.aggregate(truth + e)
    tru = h.aggregate(truth)
    invs = [
        ProductInvariant(k, q, q.apply(tru[k].reshape(-1, *schema.shape)))
        for k in invariant_levels
        if k < h.depth
    ]
    rel = SimpleNamespace(
        hierarchy=h, schema=schema, estimates=[x.reshape(-1, *schema.shape) for x in est]
    )
    return h, rel, invs, tru


def _check(h, schema, counts, invs):
    K = schema.n_cells
    for k in range(h.depth):
        c = counts[k].reshape(-1, K)
        assert c.dtype == np.int64
        assert c.min(initial=0) >= 0, k
        if k:
            assert np.array_equal(h.aggregate_up(k, c), counts[k - 1].reshape(-1, K)), k
    for iv in invs:
        k = h.level_index(iv.level)
        assert np.array_equal(iv.query.apply(counts[k]), iv.values)


# -- projections against cvxpy ------------------------------------------------------------------
_TIGHT = {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12}


def _reference_children(x, parent, count):
    X = cp.Variable(x.shape)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    cons = [X >= 0]
    for p, (s, n) in enumerate(zip(start, count, strict=True)):
        if n:
            cons.append(cp.sum(X[s : s + n], axis=0) == parent[p])
    cp.Problem(cp.Minimize(cp.sum_squares(X - x)), cons).solve(solver=cp.CLARABEL, **_TIGHT)
    return X.value


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    count=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    K=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    chunk=st.sampled_from([1, 7, 1 << 20]),
)
def test_children_projection_matches_cvxpy(count, K, seed, chunk):
    gen = np.random.default_rng(seed)
    count = np.asarray(count, np.int64)
    x = gen.normal(0.5, 2.0, size=(int(count.sum()), K))
    parent = gen.integers(0, 6, size=(count.size, K)) * (count > 0)[:, None]
    got = project_children(x, parent, count, chunk=chunk)
    if x.shape[0]:
        ref = _reference_children(x, parent, count)
        assert np.max(np.abs(got - ref)) < 1e-6
    assert got.min(initial=0.0) >= 0.0
    sums = np.zeros((count.size, K))
    np.add.at(sums, np.repeat(np.arange(count.size), count), got)
    assert np.allclose(sums, parent, atol=1e-9, rtol=0)
    # batching changes no bit
    assert np.array_equal(got, project_children(x, parent, count, chunk=3))


def _margins(gen, count, K, zero_share=0.3):
    """Integer row targets (children) and column targets (parents) with equal sums."""
    cols = gen.integers(0, 6, size=(count.size, K)) * (gen.random((count.size, K)) > zero_share)
    cols *= (count > 0)[:, None]
    rows = np.zeros(int(count.sum()), np.int64)
    start = np.concatenate([[0], np.cumsum(count)])
    for p in np.flatnonzero(count):  # a random composition of the parent's total
        cut = np.sort(gen.integers(0, int(cols[p].sum()) + 1, size=count[p] - 1))
        rows[start[p] : start[p + 1]] = np.diff(np.concatenate([[0], cut, [cols[p].sum()]]))
    return rows, cols


_TRANSPORT_CASES = dict(
    count=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    K=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    chunk=st.sampled_from([1, 13, 1 << 20]),
)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(**_TRANSPORT_CASES)
def test_transport_projection_matches_cvxpy(count, K, seed, chunk):
    """Each parent's matrix onto {X ≥ 0, row sums = children's totals, column sums = the
    parent's cells}: the dual block-coordinate ascent equals the QP solved by Clarabel."""
    gen = np.random.default_rng(seed)
    count = np.asarray(count, np.int64)
    rows, cols = _margins(gen, count, K)
    z = gen.normal(0.3, 2.0, size=(int(count.sum()), K))
    got, sweeps = project_transport(z, rows, cols, count, chunk=chunk)
    start = np.concatenate([[0], np.cumsum(count)])
    for p in np.flatnonzero(count):
        X = cp.Variable((int(count[p]), K))
        sl = slice(start[p], start[p + 1])
        cons = [X >= 0, cp.sum(X, axis=1) == rows[sl], cp.sum(X, axis=0) == cols[p]]
        cp.Problem(cp.Minimize(cp.sum_squares(X - z[sl])), cons).solve(solver=cp.CLARABEL, **_TIGHT)
        assert np.max(np.abs(got[sl] - X.value)) < 1e-6
    assert got.min(initial=0.0) >= 0.0
    assert np.allclose(got.sum(axis=1), rows, atol=1e-9, rtol=0)
    # batching changes no bit
    assert np.array_equal(got, project_transport(z, rows, cols, count, chunk=3)[0])


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True)
@given(**_TRANSPORT_CASES)
def test_transport_projection_matches_cvxpy_more_cases(count, K, seed, chunk):
    test_transport_projection_matches_cvxpy.hypothesis.inner_test(count, K, seed, chunk)


def test_transport_projection_refuses_margins_that_disagree():
    count = np.array([2])
    with pytest.raises(DataError, match="do not sum"):
        project_transport(np.zeros((2, 2)), np.array([1.0, 1.0]), np.array([[1.0, 2.0]]), count)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    marginal=st.sampled_from(["total", "sex", "age", "sex * age"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_top_projection_with_marginal_invariants_matches_cvxpy(marginal, seed):
    """Each state's cells onto {x ≥ 0, invariant rows = their values}: the per-atom simplex
    projection equals the joint QP."""
    schema = Schema.from_dict(
        {
            "name": "t",
            "attributes": [
                {"name": "sex", "labels": ["m", "f"]},
                {"name": "age", "labels": ["0", "1", "2", "3"]},
            ],
        }
    )
    gen = np.random.default_rng(seed)
    h, rel, invs, _ = _case(gen, schema, [(5, 5), (2, 3)], marginal=marginal, noise=3.0)
    shape = nn.top_shape(h, schema, invs)
    atoms, fixed = nn._atoms(shape, 1, schema.n_cells)
    x = rel.estimates[1].reshape(-1, schema.n_cells)
    got = nn._project_top(x, atoms, fixed, "state")
    X = cp.Variable(x.shape)
    q = np.asarray(invs[1].query.dense(), float)
    cons = [X >= 0, X @ q.T == invs[1].values]
    cp.Problem(cp.Minimize(cp.sum_squares(X - x)), cons).solve(solver=cp.CLARABEL, **_TIGHT)
    assert np.max(np.abs(got - X.value)) < 1e-6
    assert np.min(x) < 0  # the case has something to project


# -- the product ------------------------------------------------------------------------------
_PRODUCT_CASES = dict(
    schema=schemas(max_attributes=3, max_domain=4, max_cells=24),
    depth=st.integers(2, 4),
    inv=st.sampled_from([(), (0,), (0, 1), (1,)]),
    seed=st.integers(0, 2**31 - 1),
    cut=st.integers(0, 3),
    per=st.integers(1, 3),
)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(**_PRODUCT_CASES)
def test_integer_nonnegative_consistent_invariant_and_partition_independent(
    schema, depth, inv, seed, cut, per
):
    gen = np.random.default_rng(seed)
    fan = [(2, 4), (1, 4), (1, 5)][: depth - 1]
    h, rel, invs, _ = _case(gen, schema, fan, invariant_levels=inv)
    rng = KeyedRNG.reproducible(seed % 97, warn=False)
    whole = nonnegative_structured(rel, rng, invariants=invs)
    _check(h, schema, whole.counts, invs)
    lowest = 1 if 1 in inv else 0
    cut = max(lowest, min(cut, h.depth - 1))
    top = nonnegative_top(h, schema, rel.estimates[: cut + 1], rng, invariants=invs)
    parts: list[list[np.ndarray]] = [[] for _ in range(h.depth - cut - 1)]
    n_cut = h.levels[cut].size
    for a in range(0, n_cut if cut < h.depth - 1 else 0, per):
        ranges = [(a, min(a + per, n_cut))]
        for k in range(cut, h.depth - 1):
            r0 = h.descendant_range(k, ranges[-1][0], k + 1)[0]
            r1 = h.descendant_range(k, ranges[-1][1] - 1, k + 1)[1]
            ranges.append((r0, r1))
        got = nonnegative_partition(
            Forest.of(h, cut, ranges),
            [r[0] for r in ranges],
            h.sizes[cut:],
            schema,
            top.counts[cut][slice(*ranges[0])],
            [rel.estimates[cut + 1 + j][slice(*ranges[j + 1])] for j in range(len(parts))],
            rng,
        )
        for j, c in enumerate(got.counts):
            parts[j].append(c)
    split = top.counts + [np.concatenate(p) for p in parts]
    for a, b in zip(whole.counts, split, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(**_PRODUCT_CASES)
def test_integer_nonnegative_consistent_invariant_and_partition_independent_more_cases(
    schema, depth, inv, seed, cut, per
):
    test_integer_nonnegative_consistent_invariant_and_partition_independent.hypothesis.inner_test(
        schema, depth, inv, seed, cut, per
    )


@pytest.mark.parametrize("inv", [(0,), (0, 1)])
def test_childrens_totals_are_the_totals_pass_integers(inv, seed=11):
    """Pass 1 by hand (each parent's children's GLS totals projected onto the simplex of the
    parent's integer total, rounded by the conditioned systematic sampling from the product's
    own stream): the product's children's totals are those integers, exactly."""
    schema = Schema.load("sex_age5")
    gen = np.random.default_rng(seed)
    h, rel, invs, _ = _case(gen, schema, [(2, 3), (1, 4), (2, 5)], invariant_levels=inv)
    rng = KeyedRNG.reproducible(seed % 89, warn=False)
    counts = nonnegative_structured(rel, rng, invariants=invs).counts
    K = schema.n_cells
    f = nn.whole_forest(h, 0, h.depth - 1)
    for j in range(max(inv) + 1, h.depth):
        parent = counts[j - 1].reshape(-1, K).sum(axis=1)[:, None]
        count = h.levels[j - 1].child_count
        x = rel.estimates[j].reshape(-1, K).sum(axis=1)[:, None]
        t = project_children(x, parent, count)
        n = parent.shape[0]
        v = rng.draw(f"{nn.LABEL}/{h.names[j]}/total", n, 0, n, uniform_draws).reshape(n, 1)
        want, _ = round_children(parent, t, count, v, None, (h.names[j], f, j - 1, ["t"]), 1e-7)
        assert np.array_equal(counts[j].reshape(-1, K).sum(axis=1), want[:, 0]), j


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True)
@given(inv=st.sampled_from([(0,), (0, 1)]), seed=st.integers(0, 2**31 - 1))
def test_childrens_totals_are_the_totals_pass_integers_more_cases(inv, seed):
    test_childrens_totals_are_the_totals_pass_integers(inv, seed)


def test_an_empty_area_gets_a_total_of_the_order_of_its_noise():
    """A county with no persons, its 256 cells estimated with noise (SD 1 per block cell)
    but its total well measured (SD √6 over its 6 blocks): the non-negative product gives
    it a total within 4 SD of 0 (the totals pass), where projecting cell by cell gave it
    every cell's positive part — hundreds of persons (the defect this pass fixes)."""
    schema = Schema.from_dict(
        {"name": "t", "attributes": [{"name": a, "labels": list("abcd")} for a in "wxyz"]}
    )
    K = schema.n_cells
    for seed in range(4):
        gen = np.random.default_rng(seed)
        h = random_hierarchy(gen, [(4, 4), (6, 6)])
        truth = gen.poisson(3.0, size=(h.leaves.size, K))
        truth[:6] = 0  # county 0
        e = gen.normal(0.0, 1.0, size=truth.shape)
        noise = gen.normal(0.0, 1.0, size=(e.shape[0], 1))
        e += (noise - noise.mean() - e.sum(axis=1, keepdims=True)) / K  # root total exact
        est = [x.reshape(-1, *schema.shape) for x in h.aggregate(truth + e)]
        tru = h.aggregate(truth)
        q = ProductQuery.parse(schema, "total")
        invs = [ProductInvariant(0, q, q.apply(tru[0].reshape(-1, *schema.shape)))]
        rel = SimpleNamespace(hierarchy=h, schema=schema, estimates=est)
        out = nonnegative_structured(rel, KeyedRNG.reproducible(seed, warn=False), invariants=invs)
        empty = int(out.counts[1][0].sum())
        assert empty <= 4 * np.sqrt(6) + 1, seed
        assert int(out.counts[2][:6].sum()) == empty
        per_cell = project_children(est[1].reshape(-1, K), out.counts[0].reshape(1, K), [4])
        assert per_cell[0].sum() > 100  # what the per-cell projection gave it


def test_noiseless_nonnegative_integers_come_back_unchanged():
    schema = Schema.load("sex_age5")
    gen = np.random.default_rng(8)
    h = random_hierarchy(gen, [(3, 3), (2, 4), (2, 5)])
    truth = gen.poisson(1.0, size=(h.leaves.size, schema.n_cells))
    tru = [t.reshape(-1, *schema.shape) for t in h.aggregate(truth)]
    q = ProductQuery.parse(schema, "total")
    invs = [ProductInvariant(k, q, q.apply(tru[k])) for k in (0, 1)]
    rel = SimpleNamespace(hierarchy=h, schema=schema, estimates=[t.astype(float) for t in tru])
    out = nonnegative_structured(rel, KeyedRNG.reproducible(1, warn=False), invariants=invs)
    for a, b in zip(out.counts, tru, strict=True):
        assert np.array_equal(a, b)


def test_small_cells_are_biased_up_where_the_unbiased_rounding_is_not():
    """Zero cells under noise: the unbiased rounding averages to the truth (0), the
    non-negative product does not (it cannot go below 0) — the bias it is labelled with."""
    schema = Schema.from_dict(
        {"name": "t", "attributes": [{"name": "a", "labels": ["x", "y", "z", "w"]}]}
    )
    gen = np.random.default_rng(2)
    nn_zero, unb_zero = [], []
    for s in range(30):
        h, rel, invs, tru = _case(gen, schema, [(3, 3), (3, 4)], noise=1.0)
        rng = KeyedRNG.reproducible(s, warn=False)
        zero = tru[-1] == 0
        a = nonnegative_structured(rel, rng, invariants=invs).counts[-1].reshape(zero.shape)
        b = round_structured(rel, rng, invariants=invs).counts[-1].reshape(zero.shape)
        nn_zero.append(a[zero])
        unb_zero.append(b[zero])
    nz, uz = np.concatenate(nn_zero), np.concatenate(unb_zero)
    se = uz.std() / np.sqrt(uz.size)
    assert abs(uz.mean()) < 4 * se  # unbiased rounding of unbiased estimates: no bias at 0
    assert nz.mean() > 4 * se and nz.min() == 0  # the non-negative product: biased up


def test_refusals_name_what_is_wrong():
    schema = Schema.from_dict({"name": "t", "attributes": [{"name": "a", "labels": ["x", "y"]}]})
    gen = np.random.default_rng(0)
    h, rel, invs, tru = _case(gen, schema, [(2, 2), (2, 3)], invariant_levels=(0, 1, 2))
    with pytest.raises(SpecError, match="deeper"):
        nonnegative_structured(rel, KeyedRNG.reproducible(0, warn=False), invariants=invs)
    h, rel, invs, tru = _case(gen, schema, [(2, 2), (2, 3)])
    bad = [x.copy() for x in rel.estimates]
    bad[1][0, 0] += 0.5  # the state no longer meets its total
    bad[0][0, 0] += 0.5
    rel2 = SimpleNamespace(hierarchy=h, schema=schema, estimates=bad)
    with pytest.raises(DataError, match="invariants"):
        nonnegative_structured(rel2, KeyedRNG.reproducible(0, warn=False), invariants=invs)
    with pytest.raises(SpecError, match="non-negative integers"):
        nonnegative_partition(
            Forest.of(h, 1, [(0, 1), h.descendant_range(1, 0, 2)]),
            [0, 0],
            h.sizes[1:],
            schema,
            -np.ones((1, 2), np.int64),
            [rel.estimates[2][slice(*h.descendant_range(1, 0, 2))]],
            KeyedRNG.reproducible(0, warn=False),
        )
