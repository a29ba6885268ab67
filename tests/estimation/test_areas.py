"""Off-spine areas (sums of leaves): exact SEs against the dense KKT covariance, predicted
against released, coverage of 90% intervals over simulated releases."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from censusdp.errors import SpecError
from censusdp.estimation import general_gls
from censusdp.estimation.gls.areas import area_release, structured_area_covariance
from censusdp.estimation.gls.predict import predict_errors
from censusdp.estimation.gls.sparse import hierarchy_to_sparse
from censusdp.estimation.gls.structured import structured_gls
from censusdp.estimation.gls.tree import NodeVarianceMeasurement
from censusdp.hierarchy.equivalency import equivalency_from_arrays
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_measure import ProductInvariant, ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant, Measurement
from censusdp.schema import Schema

_spec = importlib.util.spec_from_file_location(
    "_structured_gls_tests", Path(__file__).with_name("test_structured_gls.py")
)
_sgls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sgls)  # random cases of the structured GLS
cases, rel_close = _sgls.cases, _sgls.rel_close


# ----------------------------------------------------------------------------- reference
def dense_problem(h, schema, meas, invs):
    """The dense sparse-KKT problem on the identified subspace ``W`` (orthonormal basis
    ``V``, as the structured reference does): ``(Ar, y, v, Cr, c, V)`` with the rows and
    invariants in ``W`` coordinates; None when it is singular (not identifiable)."""
    K = schema.n_cells
    gram = np.zeros((K, K))
    for x in [*meas, *invs]:
        d = x.query.dense().astype(float)
        gram += d.T @ d
    ev, vec = np.linalg.eigh(gram)
    V = vec[:, ev > 1e-10 * ev.max()]
    names = h.names
    dmeas = [
        NodeVarianceMeasurement(
            names.index(m.level), m.query.to_query(), m.values, m.law, m.node_variance
        )  # fmt: skip
        if m.node_variance is not None
        else Measurement(names.index(m.level), m.query.to_query(), m.values, m.law)
        for m in meas
    ]
    dinvs = [Invariant(names.index(i.level), i.query.to_query(), i.values) for i in invs]
    A, y, v, C, c = hierarchy_to_sparse(h, dmeas, dinvs, n_cells=K)
    R = sp.kron(sp.eye(h.leaves.size), sp.csr_matrix(V)).tocsr()
    Ar, Cr = (A @ R).tocsr(), (C @ R).tocsr()
    F = (Ar.T @ sp.diags(1.0 / v) @ Ar).toarray()
    if Cr.shape[0]:
        N = scipy.linalg.null_space(Cr.toarray(), rcond=1e-10)
        F = N.T @ F @ N
    if F.size and np.linalg.eigvalsh(F).min() <= 1e-9 * max(1.0, np.abs(F).max()):
        return None
    return Ar, y, v, Cr, c, V


def dense_area_covariance(h, schema, meas, invs, leaf, area, n_areas):
    """The area sums' covariances from the full leaves × leaves GLS covariance of the dense
    sparse-KKT problem (:func:`dense_problem`); None when it is not identifiable."""
    prob = dense_problem(h, schema, meas, invs)
    if prob is None:
        return None
    Ar, y, v, Cr, c, V = prob
    K = schema.n_cells
    _, cov = general_gls(Ar, y, v, Cr if Cr.shape[0] else None, c if Cr.shape[0] else None)
    E = sp.csr_matrix((np.ones(leaf.size), (area, leaf)), shape=(n_areas, h.leaves.size))
    G = sp.kron(E, sp.csr_matrix(V)).tocsr()
    full = G @ (G @ cov).T
    return np.stack([full[a * K : (a + 1) * K, a * K : (a + 1) * K] for a in range(n_areas)])


@st.composite
def area_cases(draw, max_cells: int = 12, max_leaves: int = 8):
    h, schema, meas, invs, extra = draw(cases(max_cells=max_cells, max_leaves=max_leaves))
    n = h.leaves.size
    n_areas = draw(st.integers(1, max(1, n)))
    assign = draw(st.lists(st.integers(-1, n_areas - 1), min_size=n, max_size=n))
    assign = np.asarray(assign)
    assign[draw(st.integers(0, n - 1))] = 0  # area 0 has a leaf
    used = np.unique(assign[assign >= 0])
    leaf = np.flatnonzero(assign >= 0)
    area = np.searchsorted(used, assign[leaf])  # areas with no leaf are not listed
    return h, schema, meas, invs, extra, leaf, area, used.size


def _equivalency(h, leaf, area, n_areas):
    codes = np.asarray(h.leaves.codes, dtype=object)
    names = np.array([f"P{a:03d}" for a in range(n_areas)], dtype=object)
    return equivalency_from_arrays(h, codes[leaf], names[area], name="place")


def check_area_case(h, schema, meas, invs, extra, leaf, area, n_areas) -> str:
    """The released areas' covariances, and their query variances, equal the dense ones
    (1e-9); predicted ones too when every level has one scale. Returns what was compared."""
    ref = dense_area_covariance(h, schema, meas, invs, leaf, area, n_areas)
    if ref is None:
        with pytest.raises(SpecError, match="not identifiable"):
            structured_gls(h, schema, meas, invs, acknowledge_exact_release=True)
        return "refused"
    eq = _equivalency(h, leaf, area, n_areas)
    rel = structured_gls(h, schema, meas, invs, acknowledge_exact_release=True)
    got = area_release(rel, eq)
    # the equivalency sorts areas by code: P000 < P001 < ... keeps the index
    for a in range(n_areas):
        rel_close(got.node_covariance("place", a).dense_cells(), ref[a])
    ok = got.identified_rows(extra)
    qd = extra.dense().astype(float)
    ref_var = np.einsum("ij,njk,ik->ni", qd, ref, qd)
    rel_close(got.query_variances("place", extra)[:, ok], ref_var[:, ok])
    leaves = rel.estimates[-1].reshape(h.leaves.size, -1)
    sums = np.stack([leaves[leaf[area == a]].sum(axis=0) for a in range(n_areas)])
    rel_close(got.level("place").reshape(n_areas, -1), sums)
    if any(m.node_variance is not None for m in meas):
        return "released"
    pred = predict_errors(
        h, schema, [(m.level, m.query, m.law) for m in meas],
        [(i.level, i.query) for i in invs], areas=eq,
    )  # fmt: skip
    for a in range(n_areas):
        rel_close(pred.areas.node_covariance("place", a).dense_cells(), ref[a])
    return "predicted"


def _run_cases(n: int, seed_offset: bool) -> dict:
    seen = {"released": 0, "predicted": 0, "refused": 0}

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=not seed_offset,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(area_cases())
    def run(case):
        seen[check_area_case(*case)] += 1

    run()
    return seen


def test_area_covariances_equal_dense_reference():
    """Hypothesis cases (random schemas ≤ 12 cells, marginal workloads with per-level and
    per-node budgets, invariants at random levels, trees of depth 2–4 with fan-out 1–3, random
    block → area maps with unassigned leaves): every area's covariance equals the dense KKT
    covariance summed over its leaves, to 1e-9, released (and predicted when every level has
    one noise scale)."""
    seen = _run_cases(30, seed_offset=False)
    assert seen["predicted"] >= 5 and seen["released"] >= 10, seen


@pytest.mark.slow
def test_area_covariances_equal_dense_reference_many():
    """The same on 300 random (not derandomized) cases."""
    seen = _run_cases(300, seed_offset=True)
    assert seen["predicted"] >= 60 and seen["released"] >= 100, seen


def test_bordered_families_equal_dense_reference():
    """An only child whose combination of cells is measured above it only (flat directions
    at the child, the bordered family inverse) and invariants at the middle level."""
    s = Schema.load("sex_age5")
    gen = np.random.default_rng(3)
    h = random_hierarchy(gen, [(2, 2), (2, 3), (1, 1)])
    counts = h.aggregate(gen.integers(0, 9, size=(h.leaves.size, *s.shape)))
    det, tot = ProductQuery.parse(s, "detailed"), ProductQuery.parse(s, "total")
    meas = []
    for k, q in [(0, det), (1, det), (2, det), (3, tot)]:
        truth = q.apply(counts[k]).astype(float)
        meas.append(ProductMeasurement(h.names[k], q, truth + gen.normal(size=truth.shape),
                                       Gaussian(1.0 + k / 2)))  # fmt: skip
    invs = [ProductInvariant(h.names[1], tot, tot.apply(counts[1]))]
    leaf = np.arange(h.leaves.size)[::2]
    area = np.arange(leaf.size) % 3
    assert check_area_case(h, s, meas, invs, det, leaf, area, 3) == "predicted"


# ----------------------------------------------------------------------------- coverage
_pspec = importlib.util.spec_from_file_location(
    "_predict_tests", Path(__file__).with_name("test_predict.py")
)
_pred = importlib.util.module_from_spec(_pspec)
_pspec.loader.exec_module(_pred)  # replicate(h, copies): independent copies under one root


def _coverage(h, leaf, area, n_areas, copies, seed, z=1.6448536269514722):
    """``copies`` simulated releases (one structured GLS over independent copies of ``h``,
    Gaussian noise, zero counts: the estimate is the error) of every place's cells; returns
    per (place, row) the number of 90% intervals ±z·SE that cover the truth, the SEs of one
    copy, and the prediction's."""
    s, q, plan = _pred._sex_age(h)
    inv_plan = [(h.names[0], q["total"])]
    big, rel = _pred._simulate(h, s, plan, inv_plan, copies, seed)
    n = h.leaves.size
    copy = np.repeat(np.arange(copies), leaf.size)
    big_leaf = copy * n + np.tile(leaf, copies)  # replicate() numbers leaves copy-major
    codes = np.asarray(big.leaves.codes, dtype=object)
    names = np.array([f"C{c:05d}P{a:02d}" for c in range(copies) for a in range(n_areas)],
                     dtype=object)  # fmt: skip
    eq = equivalency_from_arrays(big, codes[big_leaf], names[copy * n_areas + np.tile(area, copies)],
                                 name="place")  # fmt: skip
    places = area_release(rel, eq)
    table = q["sex * ageband"]
    est = places.query_estimates("place", table).reshape(copies, n_areas, table.n_rows)
    se = places.query_standard_errors("place", table).reshape(copies, n_areas, table.n_rows)
    pred = predict_errors(h, s, plan, inv_plan, areas=_equivalency(h, leaf, area, n_areas))
    return (np.abs(est) <= z * se).sum(axis=0), se, pred.areas.query_standard_errors("place", table)


def test_place_intervals_cover_at_the_nominal_rate():
    """2,000 simulated releases of a 26-block tree with 7 places that cut across its tracts
    (some blocks in no place): the released SEs are the same in every copy and equal the
    prediction; 90% intervals cover 89–91% of the time over all places and cells, each
    (place, cell)'s 2,000 coverages pass a two-sided binomial test at α = 1e-6 (Bonferroni
    over the cells), and SEs 30% too small or too large would fail it. (Seed 21: 90.13% over
    the 56 place cells, per cell 88.2–92.0%.)"""
    from scipy.stats import binomtest, norm

    gen = np.random.default_rng(11)
    h = random_hierarchy(gen, [(2, 3), (2, 4), (3, 6)])
    n = h.leaves.size
    assign = gen.integers(-1, 7, size=n)  # -1: in no place; places cross tract boundaries
    leaf = np.flatnonzero(assign >= 0)
    area = assign[leaf]
    copies = 2_000
    covered, se, predicted = _coverage(h, leaf, area, 7, copies, seed=21)
    np.testing.assert_allclose(se, np.broadcast_to(se[0], se.shape), rtol=1e-12)
    np.testing.assert_allclose(se[0], predicted, rtol=1e-9)
    rate = covered.sum() / (copies * covered.size)
    assert 0.89 <= rate <= 0.91, rate
    alpha = 1e-6 / covered.size
    p = [binomtest(int(k), copies, 0.9).pvalue for k in covered.ravel()]
    assert min(p) > alpha, (min(p), rate)
    z = norm.ppf(0.95)
    for factor in (0.7, 1.3):  # the coverage a 30% wrong SE would give, at the same α
        wrong = 2 * norm.cdf(z * factor) - 1
        k = int(round(wrong * copies))
        assert binomtest(k, copies, 0.9).pvalue < alpha, factor


def test_an_area_that_is_a_node_has_its_standard_errors():
    """An area made of all the blocks of one tract has the tract's covariance, one made of a
    single block the block's (released and predicted, 1e-9)."""
    gen = np.random.default_rng(5)
    h = random_hierarchy(gen, [(2, 3), (2, 4), (2, 5)])
    s, q, plan = _pred._sex_age(h)
    inv_plan = [(h.names[0], q["total"])]
    tract = h.ancestor_index(h.names[-1], h.names[1])
    node = int(tract[-1])
    leaf = np.concatenate([np.flatnonzero(tract == node), [0]])
    area = np.concatenate([np.zeros(leaf.size - 1, np.int64), [1]])
    eq = _equivalency(h, leaf, area, 2)
    pred = predict_errors(h, s, plan, inv_plan, areas=eq)
    big, rel = _pred._simulate(h, s, plan, inv_plan, 1, seed=1)
    big_eq = equivalency_from_arrays(
        big, np.asarray(big.leaves.codes, dtype=object)[leaf], ["P000"] * (leaf.size - 1) + ["P001"]
    )
    released = area_release(rel, big_eq)
    for got in (pred.areas.node_covariance(0, 0), released.node_covariance(0, 0)):
        rel_close(got.dense_cells(), pred.node_covariance(1, node).dense_cells())
    for got in (pred.areas.node_covariance(0, 1), released.node_covariance(0, 1)):
        rel_close(got.dense_cells(), pred.node_covariance(h.depth - 1, 0).dense_cells())


# ----------------------------------------------------------------------------- streamed
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(area_cases(), st.integers(0, 3), st.integers(1, 4))
def test_streamed_area_covariances_equal_whole_tree(case, cut, n_parts):
    """Partition by partition (:func:`area_partition` at a random cut, then :func:`area_top`)
    the area covariances equal the whole-tree sweep's (1e-9), per-node budgets included."""
    from censusdp.estimation.gls.areas import area_partition, area_top
    from censusdp.estimation.gls.structured import structured_setup
    from censusdp.pipelines.partition import partition_units

    h, schema, meas, invs, _, leaf, area, n_areas = case
    cut = min(cut, h.depth - 1)
    try:
        setup = structured_setup(h, schema, meas, invs, acknowledge_exact_release=True)
        whole = structured_area_covariance(setup, _equivalency(h, leaf, area, n_areas))
    except SpecError:
        return  # not identifiable: refused alike (the dense test covers the refusal)
    eq = _equivalency(h, leaf, area, n_areas)
    parts = partition_units(h, cut, n_parts)
    partials = [area_partition(setup, eq, cut, p.ranges) for p in parts]
    streamed = area_top(setup, eq, cut, partials)
    for mask, blk in whole.blocks.items():
        rel_close(streamed.blocks[mask], blk)


# ----------------------------------------------------------------------------- plain tables
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(2, 4), st.booleans())
def test_tree_gls_area_covariances_equal_dense_reference(seed, K, depth, hold_total):
    """The tree GLS of plain tables (one to three cells, detailed or total per level, node
    variances at random, the root total held or not): area covariances equal the dense
    KKT's (1e-9)."""
    from censusdp.estimation.gls.areas import tree_area_covariance
    from censusdp.mechanisms.queries import Query

    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(1, 3)] * (depth - 1))
    cells = [f"c{i}" for i in range(K)]
    counts = h.aggregate(gen.integers(0, 20, size=(h.leaves.size, K)))
    meas = []
    for k in range(depth):
        for q in (
            [Query.detailed(cells)] if k == depth - 1 else [Query.total(cells)][: gen.integers(2)]
        ):
            truth = counts[k] @ np.asarray(q.matrix, float).T
            vals = truth + gen.normal(size=truth.shape)
            if gen.random() < 0.3:
                meas.append(NodeVarianceMeasurement(k, q, vals, Gaussian(1.0),
                                                    gen.uniform(0.5, 2.0, h.sizes[k])))  # fmt: skip
            else:
                meas.append(Measurement(k, q, vals, Gaussian(float(gen.uniform(0.5, 2.0)))))
    tot = Query.total(cells)
    invs = [Invariant(0, tot, counts[0] @ np.asarray(tot.matrix, float).T)] if hold_total else []
    n = h.leaves.size
    assign = gen.integers(-1, 3, size=n)
    assign[0] = 0
    leaf = np.flatnonzero(assign >= 0)
    used = np.unique(assign[leaf])
    area = np.searchsorted(used, assign[leaf])
    eq = _equivalency(h, leaf, area, used.size)
    got = tree_area_covariance(h, cells, meas, invs, eq)
    A, y, v, C, c = hierarchy_to_sparse(h, meas, invs, n_cells=K)
    _, cov = general_gls(A, y, v, C if C.shape[0] else None, c if C.shape[0] else None)
    E = sp.kron(sp.csr_matrix((np.ones(leaf.size), (area, leaf)), shape=(used.size, n)), sp.eye(K))
    full = (E @ (E @ cov).T).T
    ref = np.stack([full[a * K : (a + 1) * K, a * K : (a + 1) * K] for a in range(used.size)])
    rel_close(got, ref)


# ----------------------------------------------------------------------------- options
def _sweep_problem():
    """One block's upward pass on a small tree (sex × age5, three levels) and two areas."""
    from censusdp.estimation.gls.areas import area_pairs, covariance_levels
    from censusdp.estimation.gls.kernel import general_up, root_start
    from censusdp.estimation.gls.structured import structured_setup
    from censusdp.hierarchy.forest import whole_forest
    from censusdp.mechanisms.product_measure import measure_products
    from censusdp.rng import KeyedRNG

    gen = np.random.default_rng(3)
    h = random_hierarchy(gen, [(2, 3), (2, 3), (1, 3)])
    schema = Schema.load("sex_age5")
    leaves = gen.poisson(4.0, (h.sizes[-1], schema.n_cells))
    counts = [c.reshape(-1, *schema.shape) for c in h.aggregate(leaves)]
    qs = [ProductQuery.parse(schema, t) for t in ("total", "sex", "detailed")]
    plan = [(lv, q, Gaussian(1.0)) for lv in h.names for q in qs]
    rng = KeyedRNG.reproducible(3, warn=False)
    meas = measure_products(dict(zip(h.names, counts, strict=True)), plan, rng)
    setup = structured_setup(h, schema, meas, [], acknowledge_exact_release=True)
    mask = max(setup.basis.subsets, key=setup.k)
    kS = setup.k(mask)
    forest = whole_forest(h)
    ups = general_up(forest, covariance_levels(setup, mask, 0, forest.sizes), kS, None)
    leaf = np.arange(h.sizes[-1])
    area = leaf % 2
    P0 = root_start(ups, kS, h.names[0])[1]
    return (forest, ups, kS, leaf, area, 2, P0), area_pairs(forest, leaf, area, 2)


def test_sweep_options_and_the_old_keywords_give_the_same_sweep():
    """``area_sweep``'s settings as ``SweepOptions`` or one by one as before (accepted for one
    release): the same arrays to the bit; a keyword over the options wins; an unknown one is
    refused naming the options' fields."""
    from censusdp.estimation.gls.areas import SweepOptions, area_sweep

    args, pairs = _sweep_problem()
    whole = area_sweep(*args, options=SweepOptions(pairs=pairs))
    assert whole.shape == (2, args[2], args[2]) and np.all(np.isfinite(whole))
    assert np.array_equal(area_sweep(*args, pairs=pairs), whole)
    assert np.array_equal(area_sweep(*args), whole)  # pairs are only shared, not changed
    acc, (node, ar, M) = area_sweep(*args, options=SweepOptions(to_root=False, pairs=pairs))
    old_acc, (old_node, old_ar, old_M) = area_sweep(*args, to_root=False, pairs=pairs)
    over = area_sweep(*args, options=SweepOptions(pairs=pairs), to_root=False)
    for got in (old_acc, over[0]):
        assert np.array_equal(got, acc)
    assert np.array_equal(old_node, node) and np.array_equal(old_ar, ar)
    assert np.array_equal(old_M, M)
    assert not np.array_equal(acc, whole)  # the partial sweep is not the whole one
    with pytest.raises(TypeError, match=r"'to_rot'.*SweepOptions: rows, up_forest"):
        area_sweep(*args, to_rot=False)


def test_streamed_areas_keep_each_single_node_partitions_own_variance():
    """One node per partition with variances per node: each partition's cut message is
    "shared" (one matrix for its one node) but the matrices differ, so the union must keep
    both. The area {first leaf} has Var = v₁v₂/(v₁ + v₂) under the held total (a hypothesis
    case found the streamed sweep using v₁ for both, giving v₁/2)."""
    from censusdp.estimation.gls.areas import area_partition, area_top
    from censusdp.estimation.gls.structured import structured_setup
    from censusdp.pipelines.partition import partition_units
    from censusdp.schema import Schema

    s = Schema.flat(["c"])
    h = random_hierarchy(np.random.default_rng(0), [(2, 2)])
    q = ProductQuery.parse(s, "detailed")
    v = np.array([1.08194705, 1.03305527])
    meas = [ProductMeasurement(h.names[1], q, np.array([[18.4], [15.4]]), Gaussian(1), v)]
    invs = [ProductInvariant(h.names[0], q, np.array([[34]]))]
    setup = structured_setup(h, s, meas, invs, acknowledge_exact_release=True)
    eq = _equivalency(h, np.array([0]), np.array([0]), 1)
    parts = partition_units(h, 1, 2)
    streamed = area_top(setup, eq, 1, [area_partition(setup, eq, 1, p.ranges) for p in parts])
    whole = structured_area_covariance(setup, eq)
    expected = v[0] * v[1] / (v[0] + v[1])
    for mask, blk in whole.blocks.items():
        assert np.isclose(float(blk.ravel()[0]), expected, rtol=1e-12)
        assert np.isclose(float(streamed.blocks[mask].ravel()[0]), expected, rtol=1e-12)
