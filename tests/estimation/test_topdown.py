"""TopDown-style baseline: integer, non-negative, consistent, invariants exact (==)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import censusdp.estimation.topdown.schema as tsch
import censusdp.estimation.topdown.sparse as ts
from censusdp.errors import DataError, SolverError
from censusdp.estimation.topdown.flat import TopDownOptions, topdown
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms import Gaussian, Laplace, Query, invariant, measure
from censusdp.mechanisms.queries import Invariant, Measurement
from censusdp.pipelines.execute import SyncExecutor
from censusdp.rng import KeyedRNG


def build(branching: list[list[int]], seed: int) -> Hierarchy:
    """A hierarchy from per-level child counts: branching[k][i] children of node i."""
    names = ["L0"] + [f"L{k + 1}" for k in range(len(branching))]
    codes, parents = [["R"]], [None]
    for k, counts in enumerate(branching):
        par = np.repeat(np.arange(len(counts)), counts)
        parents.append(par)
        codes.append([f"{k + 1}-{i:03d}" for i in range(par.size)])
    return Hierarchy.from_parents(names, codes, parents)


def implied(h: Hierarchy, invs: list[Invariant]) -> list[Invariant]:
    """Every invariant and its sums at each level above it (the slow reference)."""
    out = []
    for iv in invs:
        k, v = h.level_index(iv.level), np.asarray(iv.values)
        out.append(Invariant(k, iv.query, v))
        for j in range(k, 0, -1):
            v = h.aggregate_up(j, v)
            out.append(Invariant(j - 1, iv.query, v))
    return out


def check_release(rel, h: Hierarchy, invs: list[Invariant]) -> None:
    """Integer, non-negative, consistent; every given and implied invariant met ``==``."""
    assert rel.integer and rel.estimator == "topdown" and rel.variances is None
    for k, est in enumerate(rel.estimates):
        assert est.dtype == np.int64
        assert (est >= 0).all()
        if k > 0:
            assert np.array_equal(h.aggregate_up(k, est), rel.estimates[k - 1])
    for inv in implied(h, invs):
        assert np.array_equal(inv.query.apply(rel.estimates[inv.level]), inv.values)


@st.composite
def problems(draw):
    depth = draw(st.integers(2, 3))
    branching = [[draw(st.integers(1, 4))]]
    for _ in range(depth - 1):
        branching.append([draw(st.integers(1, 4)) for _ in range(sum(branching[-1]))])
    n_cells = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    sigma = draw(st.sampled_from([0.5, 3.0, 20.0]))
    laplace = draw(st.booleans())
    inv_levels = draw(st.sets(st.integers(0, depth), max_size=2))
    detailed_inv = draw(st.booleans())
    return branching, n_cells, seed, sigma, laplace, sorted(inv_levels), detailed_inv


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(problems())
def test_random_hierarchies_integer_consistent_invariants_exact(spec):
    branching, n_cells, seed, sigma, laplace, inv_levels, detailed_inv = spec
    h = build(branching, seed)
    cells = [f"c{j}" for j in range(n_cells)]
    gen = np.random.default_rng(seed)
    # Many small and zero cells: where non-negativity binds.
    leaf = gen.poisson(
        gen.choice([0.3, 3.0, 40.0], size=(h.leaves.size, 1)), (h.leaves.size, n_cells)
    )
    counts = h.aggregate(leaf.astype(np.int64))
    law = Laplace(sigma) if laplace else Gaussian(sigma)
    plan = [
        (k, q, law) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))
    ]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(seed, warn=False))
    invs = [invariant(counts, k, Query.total(cells)) for k in inv_levels]
    if detailed_inv:
        invs.append(invariant(counts, 1, Query.detailed(cells)))
    rel = topdown(h, cells, meas, invs, None)
    check_release(rel, h, invs)
    assert rel.diagnostics["milp_fallbacks"] == 0


def small_table(seed: int = 3, n_cells: int = 3):
    h = build([[3], [2, 3, 1], [2, 1, 3, 2, 2, 4]], seed)
    cells = [f"c{j}" for j in range(n_cells)]
    gen = np.random.default_rng(seed)
    leaf = gen.integers(0, 40, size=(h.leaves.size, n_cells))
    leaf[::3] = 0  # a few empty leaves
    return h, cells, h.aggregate(leaf.astype(np.int64))


def test_noiseless_consistent_measurements_come_back_unchanged():
    h, cells, counts = small_table()
    marg = Query.marginal("first_two", cells, {"a": ["c0", "c1"], "b": ["c2"]})
    meas = [
        Measurement(k, q, q.apply(counts[k]).astype(np.float64), Gaussian(2.0))
        for k in range(h.depth)
        for q in (Query.total(cells), Query.detailed(cells), marg)
    ]
    invs = [invariant(counts, 1, Query.total(cells))]
    rel = topdown(h, cells, meas, invs, None)
    for k in range(h.depth):
        assert np.array_equal(rel.estimates[k], counts[k])


def test_three_levels_with_noise_and_release_fields(rng):
    h, cells, counts = small_table(seed=5, n_cells=4)
    law = Gaussian(3.0)
    plan = [
        (k, q, law) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))
    ]
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 1, Query.total(cells))]
    rel = topdown(h, cells, meas, invs, None)
    check_release(rel, h, invs)
    assert rel.estimates[0].sum() == counts[0].sum()  # implied root invariant
    assert "post-processing" in rel.privacy.text()
    d = rel.diagnostics["levels"]
    assert set(d) == set(h.names)
    assert sum(d["L1"]["l2_status"].values()) == 2  # one parent, two L2 passes
    assert d["L3"]["trivial_single_child"] == 1  # the node of L2 with one child
    ok = ("closed-form", "structured", "Solved", "AlmostSolved", "fallback Solved")
    assert all(s in ok for lv in d.values() for s in lv["l2_status"])


def test_single_child_and_zero_parent_need_no_solver(rng):
    h = build([[1], [1], [3]], 0)
    cells = ["a", "b"]
    counts = h.aggregate(np.zeros((3, 2), dtype=np.int64))
    law = Gaussian(5.0)
    plan = [
        (k, q, law) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))
    ]
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 0, Query.total(cells))]  # root total 0 forces all zeros
    rel = topdown(h, cells, meas, invs, None)
    for est in rel.estimates:
        assert not est.any()
    levels = rel.diagnostics["levels"]
    assert levels["L1"]["trivial_single_child"] == 1 and levels["L1"]["parents_solved"] == 0
    assert levels["L3"]["trivial_zero_parent"] == 1 and levels["L3"]["parents_solved"] == 0


def test_release_does_not_depend_on_the_shared_structures(rng):
    """Every parent's problem is a pure function of its inputs: the structures shared
    between parents of one pattern change the speed, never the integers."""
    h, cells, counts = small_table(seed=11, n_cells=3)
    law = Gaussian(4.0)
    plan = [(k, q, law) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))]  # fmt: skip
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 1, Query.total(cells))]
    a = topdown(h, cells, meas, invs, None)
    b = topdown(h, cells, meas, invs, None)  # shared structures reused
    ts.clear_pattern_cache()
    assert ts.pattern_cache_stats() == {"hits": 0, "misses": 0, "entries": 0}
    c = topdown(h, cells, meas, invs, None)  # rebuilt
    for x, y, z in zip(a.estimates, b.estimates, c.estimates, strict=True):
        assert np.array_equal(x, y) and np.array_equal(x, z)
    assert np.array_equal(a.estimates[1].sum(axis=1), counts[1].sum(axis=1))


def _lp_refused(real):
    """``_highs_solve`` that reports every LP relaxation (no integer variables) unsolved,
    so every rounding pass goes to the MILP."""

    def solve(c, A, rhs, ub, n_integer):
        if n_integer == 0:
            return None, float("nan"), "refused by the test"
        return real(c, A, rhs, ub, n_integer)

    return solve


def test_milp_fallback_when_the_lp_fails(monkeypatch, rng):
    monkeypatch.setattr(ts, "_highs_solve", _lp_refused(ts._highs_solve))
    h, cells, counts = small_table(seed=7)
    law = Gaussian(4.0)
    plan = [
        (k, q, law) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))
    ]
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 2, Query.total(cells))]
    rel = topdown(h, cells, meas, invs, None)
    check_release(rel, h, invs)
    assert rel.diagnostics["milp_fallbacks"] > 0
    assert rel.diagnostics["levels"]["L2"]["l1_status"]["milp"] > 0
    assert "lp" not in rel.diagnostics["levels"]["L2"]["l1_status"]


def test_milp_and_lp_roundings_agree(monkeypatch, rng):
    h, cells, counts = small_table(seed=9)
    law = Gaussian(4.0)
    plan = [
        (k, q, law) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))
    ]
    meas = measure(h.names, counts, plan, rng)
    lp = topdown(h, cells, meas, [], None)
    assert lp.diagnostics["milp_fallbacks"] == 0
    monkeypatch.setattr(ts, "_highs_solve", _lp_refused(ts._highs_solve))
    mi = topdown(h, cells, meas, [], None)
    assert mi.diagnostics["milp_fallbacks"] > 0
    # Same L1 objective; ties could differ, but the totals pass is unique here.
    for a, b in zip(lp.estimates, mi.estimates, strict=True):
        assert np.array_equal(a.sum(axis=1), b.sum(axis=1))


def test_solver_error_names_level_and_parent(monkeypatch, rng):
    h, cells, counts = small_table()
    plan = [(k, Query.detailed(cells), Gaussian(1.0)) for k in range(h.depth)]
    meas = measure(h.names, counts, plan, rng)
    real = tsch.l2_multipass
    calls = {"n": 0}

    def fail_at(n):
        def l2(layout, meas, invs, passes, *, slack, where):
            calls["n"] += 1
            if calls["n"] == n:
                raise SolverError(f"{where}: the L2 pass failed")
            return real(layout, meas, invs, passes, slack=slack, where=where)

        return l2

    monkeypatch.setattr(tsch, "l2_multipass", fail_at(1))
    with pytest.raises(SolverError, match=r"level 'L0', root 'R'"):
        topdown(h, cells, meas, [], None)
    # A failure below the root names the parent's code.
    calls["n"] = 0
    monkeypatch.setattr(tsch, "l2_multipass", fail_at(3))
    with pytest.raises(SolverError, match=r"level 'L2', parent '1-000' \(level 'L1'\)"):
        topdown(h, cells, meas, [], None)


def test_invariants_propagate_and_must_nest():
    """Leaf totals held hold every level's totals; invariants that do not nest, or are not
    integers, are refused naming the level and node."""
    h, cells, counts = small_table()
    plan = [(k, q, Gaussian(2.0)) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))]  # fmt: skip
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(3, warn=False))
    leaf = invariant(counts, 3, Query.total(cells))
    rel = topdown(h, cells, meas, [leaf], None)
    check_release(rel, h, [leaf])
    for k in range(h.depth):
        assert np.array_equal(rel.estimates[k].sum(axis=1), counts[k].sum(axis=1))
    bad = invariant(counts, 1, Query.total(cells))
    bad = Invariant(1, bad.query, bad.values + np.array([[1], [0], [-1]]))
    with pytest.raises(DataError, match="level 'L1', node '1-000'"):
        topdown(h, cells, meas, [leaf, bad], None)
    frac = Invariant(0, Query.total(cells), np.array([[2.5]]))
    with pytest.raises(DataError, match="not integer-valued"):
        topdown(h, cells, meas, [frac], None)


def test_solution_does_not_depend_on_earlier_solves_of_the_same_shape():
    """Cached problems must not warm-start from another parent's solution: a parent's answer
    would then depend on which parents one process solved before (Dask partitions). Solving
    the same table twice in one process is the smallest case that showed it."""
    from censusdp.hierarchy.synthetic import synthetic_us
    from censusdp.mechanisms.discrete import DiscreteGaussian

    table = synthetic_us(3, states=4, counties=20, tracts=60, blocks=300, population=60_000)
    h, cells = table.hierarchy, table.cells
    counts = table.all_levels()
    plan = [(k, Query.detailed(cells), DiscreteGaussian(3)) for k in (2, 3, 4)]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(1, warn=False))
    invs = [invariant(counts, 1, Query.total(cells))]
    ts.clear_pattern_cache()
    first = topdown(h, cells, meas, invs, None)
    again = topdown(h, cells, meas, invs, None)
    assert all(np.array_equal(a, b) for a, b in zip(first.estimates, again.estimates, strict=True))


def test_options_given_one_by_one_as_before_equal_topdown_options(rng):
    """Keyword arguments run over ``options`` and give the same release; a keyword that is
    no option is refused."""
    h, cells, counts = small_table(seed=4)
    plan = [(k, q, Gaussian(2.0)) for k in range(h.depth) for q in (Query.total(cells), Query.detailed(cells))]  # fmt: skip
    meas = measure(h.names, counts, plan, rng)
    seen: list[int] = []

    class Counting(SyncExecutor):
        def map(self, fn, items, *shared):
            seen.append(len(items))
            return super().map(fn, items, *shared)

    ex = Counting()
    base = topdown(h, cells, meas, [], None, TopDownOptions(slack=0.05, chunks=2, executor=ex))
    legacy = topdown(h, cells, meas, [], None, TopDownOptions(slack=0.05), chunks=2, executor=ex)
    assert all(np.array_equal(a, b) for a, b in zip(base.estimates, legacy.estimates, strict=True))
    assert legacy.diagnostics["slack"] == 0.05 and seen and max(seen) <= 2
    with pytest.raises(TypeError, match="'chunk'; its options are the fields of TopDownOptions"):
        topdown(h, cells, meas, [], None, chunk=2)
