"""Exact error prediction from the tree's shape: against the structured GLS, the dense
reference and simulated releases; shape classes against a slow reference; the allocation."""

from __future__ import annotations

import dataclasses
import importlib.util
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from censusdp.errors import HierarchyError, SpecError
from censusdp.estimation.gls.predict import allocation_plan, predict_errors, weighted_quantiles
from censusdp.estimation.gls.structured import structured_gls
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.shape_classes import shape_classes
from censusdp.hierarchy.synthetic import random_hierarchy, synthetic_state
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_measure import ProductInvariant, measure_products
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Allocation, Schema

_spec = importlib.util.spec_from_file_location(
    "_structured_gls_tests", Path(__file__).with_name("test_structured_gls.py")
)
_sgls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sgls)  # the dense reference and random cases of the structured GLS
dense_reference, cases, rel_close = _sgls.dense_reference, _sgls.cases, _sgls.rel_close


def _plan_of(meas):
    return [(m.level, m.query, m.law) for m in meas]


# ----------------------------------------------------------------------------- exactness
def _compare(h, schema, meas, invs, extra):
    """predict_errors == structured_gls == the dense reference (or all refuse)."""
    meas = [dataclasses.replace(m, node_variance=None) for m in meas]  # one scale per level
    plan, inv_plan = _plan_of(meas), [(i.level, i.query) for i in invs]
    ref = dense_reference(h, schema, meas, invs)
    if ref is None:
        with pytest.raises(SpecError, match="not identifiable at level"):
            predict_errors(h, schema, plan, inv_plan)
        return False
    _, covs, proj, _ = ref
    pred = predict_errors(h, schema, plan, inv_plan)
    rel = structured_gls(h, schema, meas, invs, acknowledge_exact_release=True)
    rel_close(pred.identified.dense_cells(), proj)
    ok = pred.identified_rows(extra)
    assert np.array_equal(ok, rel.identified_rows(extra))
    qd = extra.dense().astype(float)
    for lvl in range(h.depth):
        for node in range(h.levels[lvl].size):
            rel_close(pred.node_covariance(lvl, node).dense_cells(), covs[lvl][node])
        var = pred.query_variances(lvl, extra)
        assert np.isnan(var[:, ~ok]).all()
        ref_var = np.einsum("ij,njk,ik->ni", qd, covs[lvl], qd)
        rel_close(var[:, ok], ref_var[:, ok])
        rel_close(var[:, ok], rel.query_variances(lvl, extra)[:, ok])
    return True


def _exactness(n_cases: int) -> dict:
    """Hypothesis cases (random schemas ≤ 20 cells, workloads, budgets, invariants, trees of
    depth 2–4 with repeated subtree shapes): the covariance of every node from the shape
    classes equals the structured GLS's and the dense KKT's (1e-9); cases the dense
    reference finds not identifiable are refused."""
    seen = {"compared": 0, "refused": 0, "merged": 0}

    @settings(
        max_examples=n_cases,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases())
    def run(case):
        h = case[0]
        ok = _compare(*case)
        seen["compared" if ok else "refused"] += 1
        seen["merged"] += ok and sum(shape_classes(h).sizes) < sum(h.sizes)

    run()
    return seen


def test_predicted_covariances_equal_structured_gls_and_dense_reference():
    """Fast form: 50 cases, at least 35 compared and 10 with classes standing for several
    nodes."""
    seen = _exactness(50)
    assert seen["compared"] >= 35 and seen["merged"] >= 10, seen


@pytest.mark.slow
def test_predicted_covariances_equal_structured_gls_and_dense_reference_many():
    """300 cases: at least 200 compared, some refused, 50 with merged classes."""
    seen = _exactness(300)
    assert seen["compared"] >= 200 and seen["refused"] >= 1 and seen["merged"] >= 50, seen


def _sex_age(h: Hierarchy, sigma=(1.0, 2.0, 1.5)):
    s = Schema.load("sex_age5")
    q = {t: ProductQuery.parse(s, t) for t in ["total", "sex * ageband", "age65", "sex"]}
    n = h.names
    plan = [
        (n[0], q["total"], Gaussian(sigma[0])),
        (n[1], q["sex * ageband"], Gaussian(sigma[1])),
        (n[-1], q["age65"], Gaussian(sigma[2])),
        (n[-1], q["sex * ageband"], Gaussian(sigma[0])),
    ]
    return s, q, plan


def test_many_identical_subtrees_equal_structured_gls():
    """A 4-level tree of 1,000+ nodes collapses to a few dozen classes, with the same
    per-node variances as the structured GLS on the whole tree (1e-9)."""
    h = random_hierarchy(np.random.default_rng(4), [(6, 6), (2, 3), (3, 4), (2, 2)])
    s, q, plan = _sex_age(h)
    inv = [ProductInvariant(h.names[1], q["total"], np.zeros((h.sizes[1], 1)))]
    counts = [np.zeros((n, *s.shape)) for n in h.sizes]
    meas = measure_products(counts, plan, KeyedRNG.reproducible(1, warn=False), level_names=h.names)
    rel = structured_gls(h, s, meas, inv)
    pred = predict_errors(h, s, plan, [(h.names[1], q["total"])])
    assert sum(pred.classes.sizes) * 2 < sum(h.sizes)
    for lvl in h.names:
        for t in ("total", "sex * ageband", "age65", "sex"):
            rel_close(pred.query_variances(lvl, t), rel.query_variances(lvl, t))
    assert np.all(pred.query_variances(h.names[1], "total") == 0.0)  # invariant: exactly 0


# ----------------------------------------------------------------------------- shape classes
def _signature(h: Hierarchy, k: int, node: int) -> str:
    """Slow reference: the canonical string of a node's subtree shape."""
    if k == h.depth - 1:
        return "()"
    lv = h.levels[k]
    start, count = int(lv.child_start[node]), int(lv.child_count[node])
    kids = sorted(_signature(h, k + 1, c) for c in range(start, start + count))
    return "(" + "".join(kids) + ")"


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.sampled_from([(1, 1), (1, 2), (2, 2), (0, 2), (1, 3)]), min_size=1, max_size=4),
    st.integers(0, 2**32 - 1),
)
def test_shape_classes_against_slow_reference(fan, seed):
    """Two nodes share a class iff their subtree shapes are equal and their parents share a
    class; weights count nodes; multiplicities count a node's children per child class."""
    try:
        h = random_hierarchy(np.random.default_rng(seed), fan)
    except HierarchyError:  # a level left empty by fan-outs of 0
        reject()
    c = shape_classes(h)
    for k in range(h.depth):
        assert c.weight[k].sum() == h.sizes[k] and c.sizes[k] == c.weight[k].size
        sig = np.array([_signature(h, k, v) for v in range(h.sizes[k])])
        parent_cls = (
            np.zeros(h.sizes[k], np.int64)
            if k == 0
            else c.node_class[k - 1][np.asarray(h.levels[k].parent)]
        )
        key = np.array([f"{p}|{s}" for p, s in zip(parent_cls, sig, strict=True)])
        _, ref = np.unique(key, return_inverse=True)
        # the same partition of the nodes
        pairs = {(int(a), int(b)) for a, b in zip(ref.ravel(), c.node_class[k], strict=True)}
        assert len(pairs) == c.sizes[k] == len(set(ref.ravel()))
        if k:  # parent class of each class, and multiplicities from one representative node
            assert np.array_equal(c.parent(k)[c.node_class[k]], parent_cls)
            rep = np.unique(c.node_class[k - 1], return_index=True)[1]
            for pc, node in enumerate(rep):
                lv = h.levels[k - 1]
                kids = np.arange(lv.child_start[node], lv.child_start[node] + lv.child_count[node])
                got = np.bincount(c.node_class[k][kids], minlength=c.sizes[k])
                want = np.zeros(c.sizes[k], np.int64)
                mine = np.flatnonzero(c.parent(k) == pc)
                want[mine] = c.multiplicity[k][mine]
                assert np.array_equal(got, want)


# ----------------------------------------------------------------------------- summaries
@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=12),
    st.integers(0, 2**32 - 1),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
)
def test_weighted_quantiles_equal_expanded_quantiles(weights, seed, qs):
    gen = np.random.default_rng(seed)
    v = gen.integers(0, 4, size=(len(weights), 3)).astype(float)  # ties included
    w = np.array(weights)
    got = weighted_quantiles(v, w.astype(float), qs, columns=2)
    full = np.repeat(v, w, axis=0)
    for p, g in zip(qs, got, strict=True):
        assert np.array_equal(g, np.quantile(full, p, axis=0, method="inverted_cdf"))


def test_summary_equals_per_node_statistics():
    h = random_hierarchy(np.random.default_rng(8), [(3, 3), (1, 4), (2, 3)])
    s, q, plan = _sex_age(h)
    pred = predict_errors(h, s, plan, [(h.names[0], q["total"])])
    summ = pred.summary(["total", "sex * ageband", "detailed"], quantiles=(0.1, 0.5, 0.9))
    assert list(summ.columns) == [
        "level", "table", "row", "label", "nodes",
        "se_mean", "se_rms", "se_min", "se_q10", "se_q50", "se_q90", "se_max",
    ]  # fmt: skip
    for (lvl, table), g in summ.groupby(["level", "table"], sort=False):
        se = pred.query_standard_errors(lvl, table)
        assert (g.nodes == se.shape[0]).all() and len(g) == se.shape[1]
        if table == "detailed":  # single ages are measured nowhere: not released
            assert g.drop(columns=["level", "table", "row", "label", "nodes"]).isna().all().all()
            continue
        for col, ref in [
            ("se_mean", se.mean(axis=0)),
            ("se_rms", np.sqrt((se**2).mean(axis=0))),
            ("se_min", se.min(axis=0)),
            ("se_max", se.max(axis=0)),
        ] + [
            (f"se_q{p}", np.quantile(se, p / 100, axis=0, method="inverted_cdf"))
            for p in (10, 50, 90)
        ]:
            np.testing.assert_allclose(g[col].to_numpy(), ref, rtol=1e-12, atol=1e-12)
    assert (summ[(summ.level == h.names[0]) & (summ.table == "total")].se_max == 0).all()


# ----------------------------------------------------------------------------- simulation
def replicate(h: Hierarchy, copies: int) -> Hierarchy:
    """``copies`` copies of ``h`` under a new root (level ``all``) that measures nothing, so
    each copy's GLS release is independent of the others' and has ``h``'s error law."""
    names = ["all", *h.names]
    codes: list = [["all"]]
    parents: list = [None]
    for k in range(h.depth):
        n = h.sizes[k]
        copy = np.repeat(np.arange(copies), n)
        codes.append(np.char.zfill(np.arange(copies * n).astype(str), 9))  # copy-major
        if k == 0:
            parents.append(np.zeros(copies, np.int64))
        else:
            parents.append(copy * h.sizes[k - 1] + np.tile(np.asarray(h.levels[k].parent), copies))
    return Hierarchy.from_parents(names, codes, parents)


def _groups_check(pred, h, big, releases, tables, tol=0.03):
    """Per level × table: predicted RMS SE against the RMS error of the simulated releases
    (pooled over copies, nodes and rows); returns the ratios (invariant rows excluded)."""
    ratios = {}
    for k, lvl in enumerate(h.names):
        for t in tables:
            var = pred.query_variances(lvl, t)  # (n_nodes, rows) of one copy
            ok = np.isfinite(var).all(axis=0) & (var.max(axis=0) > 0)
            err2 = np.zeros(var.shape)
            n_rel = 0
            for rel, copies in releases:
                est = rel.query_estimates(k + 1, t).reshape(copies, *var.shape)
                err2 += (est**2).sum(axis=0)  # the truth is 0: the estimate is the error
                n_rel += copies
            held = ~ok & np.isfinite(var).all(axis=0)
            assert np.all(err2[:, held] <= 1e-12 * n_rel), (lvl, t)  # invariants: no error
            if ok.any():
                ratios[(lvl, t)] = float(np.sqrt(err2[:, ok].mean() / n_rel / var[:, ok].mean()))
    return ratios


def _simulate(h, s, plan, inv_plan, copies, seed):
    big = replicate(h, copies)
    counts = [np.zeros((n, *s.shape)) for n in big.sizes]
    shift = [(big.names[h.names.index(lvl) + 1], q, law) for lvl, q, law in plan]
    meas = measure_products(
        counts, shift, KeyedRNG.reproducible(seed, warn=False), level_names=big.names
    )
    invs = [
        ProductInvariant(
            big.names[h.names.index(lvl) + 1],
            q,
            np.zeros((big.sizes[h.names.index(lvl) + 1], q.n_rows)),
        )
        for lvl, q in inv_plan
    ]
    return big, structured_gls(big, s, meas, invs)


def test_predicted_se_match_simulated_releases_fast():
    """16,000 simulated releases of a small tree (one structured GLS over 16,000 independent
    copies): for every level × table, the RMS error is within 3% of the predicted RMS SE
    (≥ 16,000 values per group: 3% is ≥ 5.3 SE of the estimate, α ≈ 1e-7), and a 30% wrong
    noise scale is rejected for every group."""
    h = random_hierarchy(np.random.default_rng(2), [(3, 3), (1, 3)])
    s, q, plan = _sex_age(h)
    inv_plan = [(h.names[0], q["total"])]
    pred = predict_errors(h, s, plan, inv_plan)
    big, rel = _simulate(h, s, plan, inv_plan, 16_000, seed=5)
    tables = ["total", "sex * ageband", "age65", "sex"]
    # the copies' covariances are the one tree's (the root 'all' measures nothing)
    for k in range(h.depth):
        v = rel.query_variances(k + 1, "sex * ageband")[: h.sizes[k]]
        rel_close(v, pred.query_variances(k, "sex * ageband"))
    ratios = _groups_check(pred, h, big, [(rel, 16_000)], tables)
    assert len(ratios) == h.depth * len(tables) - 1  # all but the root's invariant total
    bad = {g: r for g, r in ratios.items() if abs(r - 1) > 0.03}
    assert not bad, bad
    wrong = {g: r * 1.3 for g, r in ratios.items()}  # predicted SEs 30% too small
    assert all(abs(r - 1) > 0.03 for r in wrong.values())


@pytest.mark.slow
def test_predicted_se_match_simulated_releases_pl94():
    """pl94 production strategy and allocation on a small synthetic state, nation and
    state totals invariant: 16,000 simulated releases (8 batches of 2,000 copies), every
    level × table within 3% of the prediction, and a 30% wrong scale rejected."""
    h = synthetic_state(seed=3, blocks=6).hierarchy
    s = Schema.load("pl94")
    plan = allocation_plan(s, levels=h.names)
    total = ProductQuery.parse(s, "total")
    inv_plan = [("nation", total), ("state", total)]
    pred = predict_errors(h, s, plan, inv_plan)
    releases = []
    for b in range(8):
        big, rel = _simulate(h, s, plan, inv_plan, 2_000, seed=100 + b)
        releases.append((rel, 2_000))
    ratios = _groups_check(pred, h, big, releases, list(s.strategy))
    bad = {g: r for g, r in ratios.items() if abs(r - 1) > 0.03}
    assert not bad, bad
    assert all(abs(1.3 * r - 1) > 0.03 for r in ratios.values())


# ----------------------------------------------------------------------------- allocation
def test_pl94_allocation_is_the_production_one_and_plans_spend_rho():
    s = Schema.load("pl94")
    a = s.allocation
    assert a.rho == Fraction(293764, 114921)
    assert list(a.levels) == ["nation", "state", "county", "tract", "block_group", "block"]
    assert a.levels["block_group"] == Fraction(1256, 4099)
    assert a.queries["tract"][0] == Fraction(1567, 4102) and a.queries["nation"][0] == 0
    plan = allocation_plan(s)
    assert len(plan) == 6 * 11 - 1
    pred = predict_errors(synthetic_state(seed=1, blocks=40).hierarchy, s, plan)
    # σ² is rounded up to a rational: the plan spends at most ρ, within 0.1%
    assert float(a.rho) * 0.999 < pred.privacy.rho <= float(a.rho)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rho": "x"}, "allocation.rho"),
        ({"rho": -1}, "negative"),
        ({"levels": {"a": "1/2", "b": "1/3"}}, "sum to 5/6"),
        ({"queries": {"a": ["1"], "c": ["1"]}}, "differ from"),
        ({"queries": {"a": ["1", "0"], "b": ["1"]}}, "one share per strategy query"),
        ({"queries": {"a": ["1/2"], "b": ["1"]}}, "sum to 1/2"),
        ({"extra": 1}, "unknown key 'allocation.extra'"),
    ],
)
def test_allocation_errors_name_the_key(change, message):
    spec = {"rho": "1/2", "levels": {"a": "1/2", "b": "1/2"}, "queries": {"a": ["1"], "b": ["1"]}}
    with pytest.raises(SpecError, match=message):
        Allocation.from_dict({**spec, **change}, 1, "s.toml")


def test_refusals():
    h = random_hierarchy(np.random.default_rng(1), [(2, 2), (2, 2)])
    s, q, plan = _sex_age(h)
    with pytest.raises(SpecError, match="planned twice"):
        predict_errors(h, s, [*plan, plan[0]])
    with pytest.raises(SpecError, match="unknown level"):
        predict_errors(h, s, [("county", q["total"], Gaussian(1.0))])
    with pytest.raises(SpecError, match="no measurement"):
        predict_errors(h, s, [])
    with pytest.raises(SpecError, match="has no \\[allocation\\]"):
        allocation_plan(s)
    # identical siblings sharing a direction measured only above them
    flat = [(h.names[0], q["sex * ageband"], Gaussian(1.0)), (h.names[2], q["sex"], Gaussian(1.0))]
    with pytest.raises(SpecError, match="not identifiable at level"):
        predict_errors(h, s, flat)
