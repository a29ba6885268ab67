"""Top-down streaming rounding of schema histograms (estimation.structured_rounding).

Exact ``==`` for integrality, consistency and invariants on hypothesis cases; unbiasedness
within a Bonferroni bound at α = 1e-6 with power against a biased start and a floor; the
same integers for every cut and partitioning; the rounding-variance bound against
simulation; refusals that name what is wrong.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

import censusdp.estimation.integer.controlled as sr
from censusdp.errors import DataError, SpecError
from censusdp.estimation.integer.controlled import (
    round_structured,
    rounding_variance_bound,
)
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema
from tests.schema_strategies import schemas

ALPHA = 1e-6


def _case(gen, schema, fanouts, noise=0.8, invariant_levels=(0, 1), marginal=None):
    """A tree, consistent real estimates (truth + noise, summed up from the leaves, the
    noise centred within each level-1 node so that its totals are integers) and invariants
    (the total, or ``marginal``, at ``invariant_levels``)."""
    h = random_hierarchy(gen, fanouts)
    K = schema.n_cells
    truth = gen.integers(0, 5, size=(h.leaves.size, K))
    e = gen.normal(0.0, noise, size=truth.shape)
    if h.depth > 1:
        anc = h.ancestor_index(-1, 1)
        sums = np.bincount(anc, weights=e.sum(axis=1), minlength=h.levels[1].size)
        size = np.bincount(anc, minlength=h.levels[1].size) * K
        e -= (sums / size)[anc][:, None]
    else:
        e -= e.mean()
    est = h.aggregate(truth + e)
    tru = h.aggregate(truth)
    q = ProductQuery.parse(schema, marginal or "total")
    invs = [
        ProductInvariant(k, q, q.apply(tru[k].reshape(-1, *schema.shape)))
        for k in invariant_levels
        if k < h.depth
    ]
    rel = SimpleNamespace(
        hierarchy=h, schema=schema, estimates=[x.reshape(-1, *schema.shape) for x in est]
    )
    return h, rel, invs


def _check(h, rel, out, invs):
    K = rel.schema.n_cells
    for k in range(h.depth):
        c = out.counts[k].reshape(-1, K)
        x = rel.estimates[k].reshape(-1, K)
        assert c.dtype == np.int64
        assert np.all((c == np.floor(x)) | (c == np.ceil(x))), k
        if k:
            assert np.array_equal(h.aggregate_up(k, c), out.counts[k - 1].reshape(-1, K)), k
    for iv in invs:
        k = h.level_index(iv.level)
        assert np.array_equal(iv.query.apply(out.counts[k]), iv.values)


def _check_totals_within_one(h, rel, out, cut):
    """Below the cut's children every node's total is within one of its real total plus its
    share of the cut's cell errors; where the cut's cells are integers (no error to share)
    exactly its floor or ceiling."""
    K = rel.schema.n_cells
    xc = rel.estimates[cut].reshape(-1, K)
    exact_cut = np.all(np.abs(xc - np.rint(xc)) < 1e-9, axis=1)
    for k in range(cut + 1, h.depth):
        t = out.counts[k].reshape(-1, K).sum(axis=1)
        x = rel.estimates[k].reshape(-1, K).sum(axis=1)
        sel = exact_cut[h.ancestor_index(k, cut)]
        assert np.all((t[sel] == np.floor(x[sel] + 1e-9)) | (t[sel] == np.ceil(x[sel] - 1e-9))), k


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    schema=schemas(max_attributes=3, max_domain=4, max_cells=24),
    depth=st.integers(2, 4),
    inv=st.sampled_from([(), (0,), (0, 1), (1,)]),
    seed=st.integers(0, 2**31 - 1),
    cut=st.integers(0, 3),
    per=st.integers(1, 3),
)
def test_integral_consistent_invariant_and_partition_independent(
    schema, depth, inv, seed, cut, per
):
    gen = np.random.default_rng(seed)
    fan = [(2, 4), (1, 4), (1, 5)][: depth - 1]
    h, rel, invs = _case(gen, schema, fan, invariant_levels=inv)
    rng = KeyedRNG.reproducible(seed % 97, warn=False)
    lowest = 1 if 1 in inv else 0
    cut = max(lowest, min(cut, h.depth - 1))
    # the subtrees of the cut's nodes are rounded as networks: the law depends on the cut,
    # the integers not on how the cut's nodes are grouped into partitions
    whole = round_structured(rel, rng, invariants=invs, cut=cut, nodes_per_partition=10**6)
    _check(h, rel, whole, invs)
    split = round_structured(rel, rng, invariants=invs, cut=cut, nodes_per_partition=per)
    for a, b in zip(whole.counts, split.counts, strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(whole.spread, split.spread, strict=True):
        assert np.array_equal(a, b)
    _check_totals_within_one(h, rel, whole, cut)


def test_systematic_sampling_row_and_rank_running_sums_give_the_same_bits(monkeypatch):
    """round_children (the non-negative product's one-level-down sampling): running sums
    child row by child row or rank by rank, in one chunk or many, give the same bits."""
    gen = np.random.default_rng(5)
    schema = Schema.from_dict({"name": "t", "attributes": [{"name": "a", "labels": list("abcd")}]})
    h, rel, invs = _case(gen, schema, [(3, 3), (2, 6), (5, 40)])
    out = round_structured(rel, KeyedRNG.reproducible(2, warn=False), invariants=invs)
    k = h.depth - 1
    parent = out.counts[k - 1].reshape(-1, 4)
    x = rel.estimates[k].reshape(-1, 4)
    count = np.bincount(h.ancestor_index(k, k - 1), minlength=parent.shape[0])
    v = gen.random(parent.shape)
    where = (h.names[k], None, k - 1, schema.cells)
    monkeypatch.setattr(sr, "_ROW_LOOP_CELLS", 10**9)
    by_rank, _ = sr.round_children(parent, x, count, v, None, where, 1e-7)
    monkeypatch.setattr(sr, "_ROW_LOOP_CELLS", 1)
    monkeypatch.setattr(sr, "_CHUNK_CELLS", 16)  # many chunks of whole parent groups
    by_row, _ = sr.round_children(parent, x, count, v, None, where, 1e-7)
    assert np.array_equal(by_rank, by_row)
    assert np.all((by_row == np.floor(x)) | (by_row == np.ceil(x)))
    assert np.array_equal(h.aggregate_up(k, by_row), parent)


def test_marginal_invariants_at_the_root_children_hold_exactly():
    gen = np.random.default_rng(11)
    schema = Schema.from_dict(
        {
            "name": "t",
            "attributes": [
                {"name": "sex", "labels": ["m", "f"]},
                {"name": "age", "labels": ["0", "1", "2"]},
            ],
        }
    )
    h, rel, invs = _case(gen, schema, [(4, 6), (2, 5)], invariant_levels=(0, 1), marginal="sex")
    # the noise is centred per state over all cells: make each sex's sum exact instead
    K = schema.n_cells
    for seed in range(5):
        est = [x.reshape(-1, K).copy() for x in rel.estimates]
        leaf = est[-1]
        anc = h.ancestor_index(-1, 1)
        for s in range(2):
            cols = slice(3 * s, 3 * s + 3)
            want = invs[1].values[:, s]
            have = np.bincount(anc, weights=leaf[:, cols].sum(1), minlength=h.levels[1].size)
            n = np.bincount(anc, minlength=h.levels[1].size) * 3
            leaf[:, cols] += ((want - have) / n)[anc][:, None]
        est = h.aggregate(leaf)
        rel2 = SimpleNamespace(
            hierarchy=h, schema=schema, estimates=[x.reshape(-1, 2, 3) for x in est]
        )
        out = round_structured(rel2, KeyedRNG.reproducible(seed, warn=False), invariants=invs)
        _check(h, rel2, out, invs)


def _bonferroni_z(m: int) -> float:
    return float(norm.isf(ALPHA / (2 * m)))


def _mean_z(rel, invs, n: int, **kw) -> float:
    """Largest |mean − x| / SE over every cell of every level, n keyed draws."""
    K = rel.schema.n_cells
    sums = [np.zeros(x.reshape(-1, K).shape) for x in rel.estimates]
    for s in range(n):
        out = round_structured(rel, KeyedRNG.reproducible(1000 + s, warn=False), invariants=invs)
        for acc, c in zip(sums, out.counts, strict=True):
            acc += c.reshape(-1, K)
    worst = 0.0
    for acc, x in zip(sums, rel.estimates, strict=True):
        x = x.reshape(-1, K)
        f = x - np.floor(x)
        var = f * (1 - f)
        live = var > 1e-3
        z = np.abs(acc / n - x)[live] / np.sqrt(var[live] / n)
        worst = max(worst, float(z.max(initial=0.0)))
    return worst


def _small():
    gen = np.random.default_rng(3)
    schema = Schema.from_dict(
        {"name": "t", "attributes": [{"name": "a", "labels": ["x", "y", "z"]}]}
    )
    h, rel, invs = _case(gen, schema, [(3, 3), (2, 3), (2, 3)])
    m = sum(x.size for x in rel.estimates)
    return rel, invs, m


def test_every_cell_at_every_level_is_unbiased():
    rel, invs, m = _small()
    assert _mean_z(rel, invs, 400) < _bonferroni_z(m)


def test_unbiasedness_test_has_power_against_a_biased_start(monkeypatch):
    rel, invs, m = _small()
    monkeypatch.setattr(sr, "aes_uniform_draws", lambda g, n: g.random(n) ** 1.5)
    assert _mean_z(rel, invs, 400) > _bonferroni_z(m)


def test_unbiasedness_test_has_power_against_flooring():
    rel, invs, m = _small()
    K = rel.schema.n_cells
    n = 400
    # flooring is deterministic: its mean misses every fractional cell by f
    worst = 0.0
    for x in rel.estimates:
        x = x.reshape(-1, K)
        f = x - np.floor(x)
        live = f * (1 - f) > 1e-3
        worst = max(worst, float((f[live] / np.sqrt(f[live] * (1 - f[live]) / n)).max()))
    assert worst > _bonferroni_z(m)


@pytest.mark.parametrize("n", [400, pytest.param(4000, marks=pytest.mark.slow)])
def test_variance_bound_holds_and_is_exact_for_cells(n):
    gen = np.random.default_rng(8)
    schema = Schema.from_dict(
        {
            "name": "t",
            "attributes": [
                {"name": "a", "labels": ["x", "y", "z"]},
                {"name": "b", "labels": ["p", "q"]},
            ],
        }
    )
    h, rel, invs = _case(gen, schema, [(3, 3), (2, 3), (2, 3)])
    level = h.depth - 1
    draws = {q: [] for q in ("detailed", "a", "total")}
    for s in range(n):
        out = round_structured(rel, KeyedRNG.reproducible(s, warn=False), invariants=invs)
        for q in draws:
            draws[q].append(ProductQuery.parse(schema, q).apply(out.counts[level]))
    out = round_structured(rel, KeyedRNG.reproducible(0, warn=False), invariants=invs)
    assert out.negative  # controlled rounding of the states
    for q, d in draws.items():
        query = ProductQuery.parse(schema, q)
        bound, exact = rounding_variance_bound(h, rel.estimates, out, level, query)
        emp = np.var(np.array(d), axis=0, ddof=1)
        # the sample variance of a sum R of ``width`` bits has SD ≤ width · sqrt(Var R / n)
        # (its fourth central moment is at most width² Var R); Bonferroni at α = 1e-6
        width = query.dense().sum(axis=1)[None, :]
        z = _bonferroni_z(emp.size)
        slack = z * width * np.sqrt(np.maximum(bound, 1e-4) / n)
        assert np.all(emp <= bound + slack), q
        if q == "detailed":
            assert exact.all()
            assert np.all(np.abs(emp - bound) <= slack)
        else:
            assert not exact.any()


def test_invariant_near_2_53_is_held_exactly():
    schema = Schema.from_dict({"name": "t", "attributes": [{"name": "a", "labels": ["x", "y"]}]})
    h = random_hierarchy(np.random.default_rng(0), [(2, 2), (2, 2)])
    top = 2**53 - 1
    leaf = np.array([[float(top) - 20.3, 10.0], [10.3, 0.0], [1.6, 2.4], [3.0, 5.0]])
    est = h.aggregate(leaf)
    anc = h.ancestor_index(-1, 1)
    t1 = np.array([[top], [12]])
    assert anc.tolist() == [0, 0, 1, 1]
    q = ProductQuery.parse(schema, "total")
    invs = [ProductInvariant(1, q, t1), ProductInvariant(0, q, np.array([[top + 12]]))]
    rel = SimpleNamespace(hierarchy=h, schema=schema, estimates=[x.reshape(-1, 2) for x in est])
    for seed in range(10):
        out = round_structured(rel, KeyedRNG.reproducible(seed, warn=False), invariants=invs)
        assert out.counts[1].sum(axis=1).tolist() == [top, 12]
        assert int(out.counts[0].sum()) == top + 12
        assert np.array_equal(h.aggregate_up(2, out.counts[2]), out.counts[1])


def test_inconsistent_estimates_are_refused_naming_level_node_and_cell():
    gen = np.random.default_rng(1)
    schema = Schema.from_dict({"name": "t", "attributes": [{"name": "a", "labels": ["x", "y"]}]})
    h, rel, invs = _case(gen, schema, [(2, 2), (2, 3)], invariant_levels=())
    bad = [x.copy() for x in rel.estimates]
    bad[-1][0, 1] += 3.0  # a leaf that no longer sums to its parent
    rel = SimpleNamespace(hierarchy=h, schema=schema, estimates=bad)
    with pytest.raises(DataError, match=r"level .*node .*cell 'y'.* not consistent"):
        round_structured(rel, KeyedRNG.reproducible(0, warn=False))
    bad[-1][0, 0] = np.nan
    with pytest.raises(DataError, match="not finite"):
        round_structured(rel, KeyedRNG.reproducible(0, warn=False))


def test_unsupported_invariants_are_refused_naming_them():
    gen = np.random.default_rng(2)
    schema = Schema.from_dict(
        {
            "name": "t",
            "attributes": [
                {"name": "a", "labels": ["x", "y"]},
                {"name": "b", "labels": ["p", "q"]},
            ],
        }
    )
    h, rel, _ = _case(gen, schema, [(2, 2), (2, 3)], invariant_levels=())
    tot = ProductQuery.parse(schema, "total")
    deep = ProductInvariant(2, tot, np.zeros((h.levels[2].size, 1)))
    with pytest.raises(SpecError, match=r"level '.*', query 'total' is deeper"):
        round_structured(rel, KeyedRNG.reproducible(0, warn=False), invariants=[deep])
    qa, qb = ProductQuery.parse(schema, "a"), ProductQuery.parse(schema, "b")
    cross = [
        ProductInvariant(1, qa, np.zeros((h.levels[1].size, 2))),
        ProductInvariant(1, qb, np.zeros((h.levels[1].size, 2))),
    ]
    with pytest.raises(SpecError, match="cross"):
        round_structured(rel, KeyedRNG.reproducible(0, warn=False), invariants=cross)
    with pytest.raises(SpecError, match="cross"):  # a root marginal inside a state total
        round_structured(
            rel,
            KeyedRNG.reproducible(0, warn=False),
            invariants=[
                ProductInvariant(1, tot, np.zeros((h.levels[1].size, 1))),
                ProductInvariant(0, qa, np.zeros((1, 2))),
            ],
        )
    sliced = Schema.from_dict(
        {
            "name": "s",
            "attributes": [
                {
                    "name": "a",
                    "labels": ["x", "y", "z"],
                    "slices": [{"name": "ax", "of": "a", "groups": ["x"]}],
                },
                {"name": "b", "labels": ["p", "q"]},
            ],
        }
    )
    h, rel, _ = _case(gen, sliced, [(2, 2), (2, 3)], invariant_levels=())
    ax, a3 = ProductQuery.parse(sliced, "ax"), ProductQuery.parse(sliced, "a")
    across = [
        ProductInvariant(1, ax, np.zeros((h.levels[1].size, 1))),
        ProductInvariant(0, a3, np.zeros((1, 3))),
    ]
    with pytest.raises(SpecError, match="cuts across"):
        round_structured(rel, KeyedRNG.reproducible(0, warn=False), invariants=across)


def test_a_structured_gls_release_rounds_with_invariants_and_labelled_variances():
    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.estimation.integer.controlled import rounded_query_variances
    from censusdp.mechanisms.laws import Gaussian
    from censusdp.mechanisms.product_measure import measure_products, product_invariant

    gen = np.random.default_rng(4)
    schema = Schema.from_dict(
        {
            "name": "t",
            "attributes": [
                {"name": "a", "labels": ["x", "y", "z"]},
                {"name": "b", "labels": ["p", "q"]},
            ],
        }
    )
    h = random_hierarchy(gen, [(3, 3), (2, 3), (2, 4)])
    leaf = gen.integers(0, 9, size=(h.leaves.size, *schema.shape))
    lc = dict(zip(h.names, h.aggregate(leaf), strict=True))
    det = ProductQuery.parse(schema, "detailed")
    plan = [(name, det, Gaussian(1.5)) for name in h.names]
    meas = measure_products(lc, plan, KeyedRNG.reproducible(6, warn=False))
    tot = ProductQuery.parse(schema, "total")
    invs = [product_invariant(lc, h.names[0], tot), product_invariant(lc, h.names[1], tot)]
    rel = structured_gls(h, schema, meas, invs)
    out = round_structured(rel, KeyedRNG.reproducible(7, warn=False), invariants=invs)
    _check(h, rel, out, invs)
    var, exact = rounded_query_variances(rel, out, h.names[-1], "a")
    assert var.shape == (h.leaves.size, 3) and not exact.any()
    assert np.all(var >= rel.query_variances(h.names[-1], "a"))
    var, exact = rounded_query_variances(rel, out, h.names[-1], "detailed")
    assert exact.all()


def test_children_totals_move_by_about_one_person_not_by_the_cells_noise():
    """The controlled rounding's point: a node's total moves by about its parent's total
    error shared out plus less than one, not by the sum of its cells' independent errors
    (sd √Σ f(1 − f), about 3.3 persons for 64 cells, which this threshold rejects)."""
    gen = np.random.default_rng(12)
    schema = Schema.from_dict(
        {
            "name": "t",
            "attributes": [
                {"name": "a", "labels": [str(i) for i in range(8)]},
                {"name": "b", "labels": [str(i) for i in range(8)]},
            ],
        }
    )
    h, rel, invs = _case(gen, schema, [(3, 3), (2, 4), (3, 6)], invariant_levels=(0,))
    sq = np.zeros(h.depth)
    independent = np.zeros(h.depth)
    reps = 20
    for s in range(reps):
        out = round_structured(rel, KeyedRNG.reproducible(s, warn=False), invariants=invs)
        for k in range(1, h.depth):
            x = rel.estimates[k].reshape(-1, 64)
            d = out.counts[k].reshape(-1, 64).sum(axis=1) - x.sum(axis=1)
            sq[k] += float(d @ d) / d.size / reps
            f = x - np.floor(x)
            independent[k] = float(np.mean((f * (1 - f)).sum(axis=1)))
    rms = np.sqrt(sq[1:])
    assert np.all(rms < 1.2), rms
    assert np.all(np.sqrt(independent[1:]) > 2.5)  # what per-cell rounding would give
