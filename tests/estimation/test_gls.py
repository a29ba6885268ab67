"""Tree GLS (two-pass belief propagation) against the sparse KKT reference and its properties."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stattests import z_bound

from censusdp.errors import DataError, SpecError
from censusdp.estimation import NodeVarianceMeasurement, general_gls, tree_gls
from censusdp.estimation.gls.sparse import hierarchy_to_sparse, level_aggregator
from censusdp.hierarchy import Hierarchy, Table
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.privacy import derive_statement
from censusdp.mechanisms.queries import Invariant, Measurement, Query, guard_exact_release


def cell_names(k: int) -> list[str]:
    return [f"c{i}" for i in range(k)]


def queries(cells: list[str]) -> dict[str, Query]:
    q = {"detailed": Query.detailed(cells), "total": Query.total(cells)}
    if len(cells) > 2:
        half = len(cells) // 2
        q["halves"] = Query.marginal("halves", cells, {"a": cells[:half], "b": cells[half:]})
    return q


def noisy(level: int, query: Query, exact: np.ndarray, sigma: float, gen) -> Measurement:
    truth = query.apply(exact)
    return Measurement(level, query, truth + gen.normal(0.0, sigma, truth.shape), Gaussian(sigma))


def exact_invariant(level: int, query: Query, counts: list[np.ndarray]) -> Invariant:
    return Invariant(level, query, query.apply(counts[level]).astype(float))


def acknowledged(h, meas, invs):
    """The derived statement, acknowledging random invariants that may determine every
    measured value (these tests check the arithmetic, not the privacy guard)."""
    return guard_exact_release(
        h.names,
        [(m.level, m.query) for m in meas],
        [(i.level, i.query) for i in invs],
        derive_statement(h.names, meas, invs),
        acknowledge=True,
    )


def reference(h, K, meas, invs, geometry="weighted"):
    """Per-level estimates and per-node covariances from the sparse KKT solver."""
    A, y, v, C, c = hierarchy_to_sparse(h, meas, invs, n_cells=K)
    x, cov = general_gls(A, y, v, C, c, geometry)
    est, covs = [], []
    for k in range(h.depth):
        G = sp.kron(level_aggregator(h, k), sp.eye(K)).tocsr()
        est.append((G @ x).reshape(-1, K))
        full = G @ (G @ cov).T
        n = h.levels[k].size
        covs.append(np.stack([full[i * K : (i + 1) * K, i * K : (i + 1) * K] for i in range(n)]))
    return est, covs


def assert_matches(rel, est, covs, atol=1e-8):
    for k, (e, c) in enumerate(zip(est, covs, strict=True)):
        scale = 1.0 + np.abs(e).max()
        np.testing.assert_allclose(rel.estimates[k], e, atol=atol * scale, err_msg=f"level {k}")
        vscale = 1.0 + np.abs(c).max()
        np.testing.assert_allclose(
            rel.variances[k], np.diagonal(c, axis1=1, axis2=2), atol=atol * vscale
        )
        if rel.covariances is not None:
            np.testing.assert_allclose(rel.covariances[k], c, atol=atol * vscale)


@st.composite
def problems(draw):
    depth = draw(st.integers(2, 5))
    K = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    gen = np.random.default_rng(seed)
    hi = {2: 6, 3: 4, 4: 3, 5: 3}[depth]
    fan = [(1, int(gen.integers(1, hi + 1))) for _ in range(depth - 1)]
    h = random_hierarchy(gen, fan)
    cells = cell_names(K)
    q = queries(cells)
    x = gen.integers(0, 50, size=(h.leaves.size, K))
    counts = h.aggregate(x)
    meas = [noisy(depth - 1, q["detailed"], counts[-1], float(gen.uniform(0.5, 4)), gen)]
    for k in range(depth):
        for name in q:
            if gen.random() < 0.35:
                meas.append(noisy(k, q[name], counts[k], float(gen.uniform(0.5, 4)), gen))
    invs = []
    for k in range(depth):
        for name in q:
            if gen.random() < 0.25:
                invs.append(exact_invariant(k, q[name], counts))
    return h, cells, meas, invs


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(problems())
def test_tree_gls_equals_sparse_reference(problem):
    h, cells, meas, invs = problem
    rel = tree_gls(h, cells, meas, invs, acknowledged(h, meas, invs), covariance=True)
    est, covs = reference(h, len(cells), meas, invs)
    assert_matches(rel, est, covs)
    for k in range(h.depth - 1):  # consistency at every level
        np.testing.assert_allclose(
            h.aggregate_up(k + 1, rel.estimates[k + 1]), rel.estimates[k], atol=1e-9 * 1e3
        )
    for inv in invs:
        np.testing.assert_allclose(
            inv.query.apply(rel.estimates[inv.level]), inv.values, atol=1e-9 * 1e3
        )


def _flat_case(fan, K, plan, invplan, seed=3):
    gen = np.random.default_rng(seed)
    names = [f"L{d}" for d in range(len(fan) + 1)]
    codes, parents, n = [["r"]], [None], 1
    for d, counts in enumerate(fan, start=1):
        par = np.repeat(np.arange(n), counts(n))
        codes.append([f"{d}-{i}" for i in range(par.size)])
        parents.append(par)
        n = par.size
    h = Hierarchy.from_parents(names, codes, parents)
    cells = cell_names(K)
    q = queries(cells)
    q["first"] = Query.marginal("first", cells, {"a": cells[:1]})
    counts = h.aggregate(gen.integers(0, 30, size=(h.leaves.size, K)))
    meas = [noisy(k, q[name], counts[k], s, gen) for k, name, s in plan]
    invs = [exact_invariant(k, q[name], counts) for k, name in invplan]
    return h, cells, meas, invs


ONE = lambda n: np.ones(n, dtype=int)  # noqa: E731


@pytest.mark.parametrize(
    ("fan", "K", "plan", "invplan"),
    [
        # leaves measured by their total only; the parent's detailed query identifies them
        (
            [lambda n: [4], ONE],
            3,
            [(2, "total", 1.0), (1, "detailed", 2.0), (0, "total", 1.5)],
            [(0, "total")],
        ),
        # the parent's invariant marginal identifies leaves measured by their total
        ([lambda n: [3], ONE], 2, [(2, "total", 1.0), (0, "detailed", 2.0)], [(1, "first")]),
        # an undetermined direction passes through an unmeasured level to the root
        ([lambda n: [1], ONE], 2, [(2, "total", 1.0), (0, "detailed", 2.0)], []),
        # siblings: leaves measured on one cell and in total, parents detailed
        (
            [lambda n: [2], ONE],
            3,
            [(2, "first", 1.0), (2, "total", 0.7), (1, "detailed", 2.0)],
            [(0, "total")],
        ),
    ],
)
def test_underdetermined_leaves_resolved_by_ancestors(fan, K, plan, invplan):
    h, cells, meas, invs = _flat_case(fan, K, plan, invplan)
    rel = tree_gls(h, cells, meas, invs, None, covariance=True)
    assert_matches(rel, *reference(h, K, meas, invs))


@pytest.mark.parametrize(
    ("fan", "K", "plan", "level"),
    [
        ([lambda n: [2], lambda n: [2, 1]], 3, [(2, "total", 1.0), (1, "detailed", 2.0)], "L2"),
        ([lambda n: [2], ONE], 3, [(2, "total", 1.0), (0, "detailed", 2.0)], "L1"),
        ([lambda n: [2], ONE], 2, [(2, "total", 1.0), (1, "total", 2.0)], "L0"),
        ([lambda n: [3], lambda n: [2, 1, 1]], 1, [(1, "total", 1.0)], "L2"),
    ],
)
def test_not_identifiable_names_level(fan, K, plan, level):
    h, cells, meas, invs = _flat_case(fan, K, plan, [])
    with pytest.raises(SpecError, match=f"level '{level}'"):
        tree_gls(h, cells, meas, invs, None)


def test_one_cell_unmeasured_only_children_take_their_parent_value():
    # K = 1: an unmeasured leaf that is its parent's only child (a flat leaf, bordered parent)
    h, cells, meas, _ = _flat_case([lambda n: [3], ONE], 1, [(1, "total", 1.0)], [])
    rel = tree_gls(h, cells, meas, [], None)
    assert_matches(rel, *reference(h, 1, meas, []))
    # to rounding (the kernel's gain on a flat only child is 1 up to an ulp)
    np.testing.assert_allclose(rel.estimates[2], rel.estimates[1], rtol=1e-14, atol=0)


def test_noiseless_consistent_measurements_come_back_unchanged():
    gen = np.random.default_rng(5)
    h = random_hierarchy(gen, [(2, 4), (1, 5), (1, 3)])
    for K in (1, 4):
        cells = cell_names(K)
        q = queries(cells)
        counts = h.aggregate(gen.integers(0, 100, size=(h.leaves.size, K)))
        meas = [
            Measurement(k, q[n], q[n].apply(counts[k]).astype(float), Gaussian(s))
            for k, n, s in [(3, "detailed", 2.0), (2, "total", 1.0), (1, "detailed", 3.0)]
        ]
        invs = [exact_invariant(0, q["total"], counts), exact_invariant(1, q["total"], counts)]
        rel = tree_gls(h, cells, meas, invs, None)
        for k in range(h.depth):
            np.testing.assert_allclose(rel.estimates[k], counts[k], atol=1e-9)


def test_node_variances_and_euclidean_geometry_match_reference():
    gen = np.random.default_rng(9)
    h = random_hierarchy(gen, [(2, 3), (1, 4)])
    cells = cell_names(3)
    q = queries(cells)
    counts = h.aggregate(gen.integers(0, 40, size=(h.leaves.size, 3)))
    n_leaves = h.leaves.size
    node_var = gen.uniform(0.5, 5.0, n_leaves)
    leaf = noisy(2, q["detailed"], counts[2], 1.0, gen)
    meas = [
        NodeVarianceMeasurement(2, leaf.query, leaf.values, leaf.law, node_variance=node_var),
        noisy(1, q["total"], counts[1], 2.0, gen),
    ]
    invs = [exact_invariant(0, q["total"], counts)]
    rel = tree_gls(h, cells, meas, invs, None, covariance=True)
    assert_matches(rel, *reference(h, 3, meas, invs))
    # Euclidean: unit weights; exact variances only when every scale is equal
    rel_e = tree_gls(h, cells, meas, invs, None, geometry="euclidean")
    est, _ = reference(h, 3, meas, invs, geometry="euclidean")
    for a, b in zip(rel_e.estimates, est, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-8 * (1 + np.abs(b).max()))
    assert rel_e.variances is None and rel_e.privacy.geometry == "euclidean"
    equal = [
        noisy(2, q["detailed"], counts[2], 2.0, gen),
        noisy(1, q["total"], counts[1], 2.0, gen),
    ]
    rel_eq = tree_gls(h, cells, equal, invs, None, geometry="euclidean", covariance=True)
    assert_matches(rel_eq, *reference(h, 3, equal, invs, geometry="euclidean"))


def test_contradictory_invariants_raise():
    gen = np.random.default_rng(2)
    h = random_hierarchy(gen, [(3, 3), (2, 2)])
    cells = cell_names(2)
    q = queries(cells)
    counts = h.aggregate(gen.integers(0, 9, size=(h.leaves.size, 2)))
    meas = [noisy(2, q["detailed"], counts[2], 1.0, gen)]
    bad = Invariant(0, q["total"], q["total"].apply(counts[0]) + 1.0)
    with pytest.raises(DataError, match="contradict"):
        tree_gls(h, cells, meas, [bad, exact_invariant(1, q["total"], counts)], None)


def test_shape_errors_name_the_level():
    gen = np.random.default_rng(2)
    h = random_hierarchy(gen, [(3, 3)])
    cells = cell_names(2)
    m = Measurement(1, Query.detailed(cells), np.zeros((2, 2)), Gaussian(1.0))
    with pytest.raises(SpecError, match="level 'L1'"):
        tree_gls(h, cells, [m], [], None)


def test_unbiased_exact_variance_and_coverage_over_noise_draws():
    """500 Gaussian draws: |mean error| < 4 SE, every cell's error variance within the α = 1e-6
    band of the reported variance (a band that rejects a 30 % wrong scale: shown), pooled
    variances within 5 %, 90 % coverage. Per cell the variance ratio has sd √(2/500) = 6.3 %,
    so the Bonferroni band (z ≈ 6) is ±0.38 and a 0.7² or 1.3² scale lies ≥ 0.41 away."""
    from censusdp.estimation import coverage

    gen = np.random.default_rng(11)
    h = random_hierarchy(gen, [(3, 3), (2, 3), (1, 3)])
    cells = cell_names(3)
    q = queries(cells)
    counts = h.aggregate(gen.integers(0, 60, size=(h.leaves.size, 3)))
    invs = [exact_invariant(0, q["total"], counts), exact_invariant(1, q["total"], counts)]
    plan = [(3, "detailed", 2.0), (2, "total", 1.0), (2, "detailed", 3.0), (1, "halves", 1.5)]
    R = 500
    errs = [np.empty((R,) + c.shape) for c in counts]
    var = None
    hits, n_cells = [], 0
    for r in range(R):
        meas = [noisy(k, q[n], counts[k], s, gen) for k, n, s in plan]
        rel = tree_gls(h, cells, meas, invs, None)
        var = rel.variances
        for k in range(h.depth):
            errs[k][r] = rel.estimates[k] - counts[k]
        est = np.concatenate([e.ravel() for e in rel.estimates[1:]])
        tru = np.concatenate([c.ravel() for c in counts[1:]])
        se = np.sqrt(np.concatenate([v.ravel() for v in var[1:]]))
        live = se > 0
        hits.append(coverage(est[live], tru[live], se[live], 0.1))
        n_cells += int(live.sum())
    bound = z_bound(1e-6, sum(int((v > 1e-12).sum()) for v in var))
    for k in range(h.depth):
        mean = errs[k].mean(axis=0)
        sd = errs[k].std(axis=0, ddof=1)
        live = var[k] > 1e-12
        assert np.all(np.abs(mean[live]) < 4 * sd[live] / np.sqrt(R)), f"biased at level {k}"
        ratio = errs[k].var(axis=0, ddof=1)[live] / var[k][live]
        print(f"level {k}: variance ratio per cell {ratio.min():.3f}-{ratio.max():.3f}")
        assert abs(ratio.mean() - 1) < 0.05  # pooled over cells
        for scale in (1.0, 0.7, 1.3):  # the right variance passes, a 30 % wrong scale fails
            z = np.abs(ratio / scale**2 - 1) / np.sqrt(2 / (R - 1))
            assert (z.max() < bound) == (scale == 1.0), (k, scale, z.max())
        assert np.all(np.abs(errs[k][:, ~live]) < 1e-8)
    cov = float(np.mean(hits))
    print(f"coverage {cov:.4f} over {n_cells} cell-draws")
    assert n_cells >= 10_000
    assert 0.89 <= cov <= 0.91, cov


def test_euclidean_projection_is_conditioning_for_spherical_gaussian():
    """Gao, Gong & Yu (2022), Thm. 22: Π_N e has the law of e given C e = 0."""
    gen = np.random.default_rng(4)
    n, sigma = 6, 2.0
    C = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0.0]])
    x = gen.integers(0, 20, n).astype(float)
    _, cov = general_gls(sp.eye(n), x, sigma**2, C, C @ x, "euclidean", covariance="full")
    # the estimate is affine in y: recover the map from n + 1 solves, apply it to all draws
    base, _ = general_gls(
        sp.eye(n), np.zeros(n), sigma**2, C, C @ x, "euclidean", covariance="none"
    )
    L = np.column_stack(
        [
            general_gls(
                sp.eye(n), np.eye(n)[i], sigma**2, C, C @ x, "euclidean", covariance="none"
            )[0]
            - base
            for i in range(n)
        ]
    )
    R = 20_000
    y = x + gen.normal(0, sigma, (R, n))
    errs = base + y @ L.T - x
    cond = sigma**2 * (np.eye(n) - C.T @ np.linalg.solve(C @ C.T, C))
    np.testing.assert_allclose(cov, cond, atol=1e-12)
    emp = np.cov(errs.T)
    # entrywise: the sample covariance has sd ≈ σ² √(2/R) ≈ 0.07 here
    assert np.abs(emp - cond).max() < 5 * sigma**2 * np.sqrt(2 / R)
    # and the conditional law sampled directly agrees: e − Σ Cᵀ (C Σ Cᵀ)⁻¹ C e
    e = gen.normal(0, sigma, (R, n))
    direct = e - (e @ C.T) @ np.linalg.solve(C @ C.T, C)
    assert np.abs(np.cov(direct.T) - emp).max() < 7 * sigma**2 * np.sqrt(2 / R)


@pytest.mark.shared
def test_real_counties_by_sex_and_age_keep_state_totals(shared_file, rng):
    """3,221 counties × 36 cells (2010 SF1): total and detailed queries at every level, state
    totals invariant; the rounded release keeps every state total exactly."""
    import pandas as pd

    from censusdp.estimation import round_release
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import measure

    df = pd.read_csv(shared_file("county_sex_age5_2010.csv"), dtype={"fips": str})
    df = df[df["version"] == "sf2010"]
    table = Table.from_frame(df, [("state", "fips", 2), ("county", "fips")], "[MF]_*")
    h, cells, counts = table.hierarchy, table.cells, table.all_levels()
    law = DiscreteGaussian(4)
    plan = [(k, q, law) for k in range(3) for q in (Query.total(cells), Query.detailed(cells))]
    meas = measure(h.names, counts, plan, rng)
    invs = [exact_invariant(1, Query.total(cells), counts)]
    rel = tree_gls(h, cells, meas, invs, None)
    np.testing.assert_allclose(rel.totals("state"), counts[1].sum(1), atol=1e-6)
    assert rel.totals("nation")[0] == pytest.approx(counts[0].sum(), rel=1e-12)
    rounded = round_release(rel, rng, method="totals")
    assert np.array_equal(rounded.totals("state"), counts[1].sum(1))
    assert (
        rounded.totals("nation")[0]
        == counts[0].sum()
        == 308_745_538 + counts[1][h["state"].codes == "72"].sum()
    )


# ----------------------------------------------------------------------------- total/detailed shapes
def _passes(h, cells, meas, invs, geometry="weighted"):
    """The split passes at cut 0 without a privacy statement (problems with invariants only
    have none to derive): the estimates, variances and covariances of :func:`tree_gls`."""
    from censusdp.estimation.gls.tree import (
        gls_downward,
        gls_finish,
        gls_plan,
        gls_top,
        gls_upward,
        whole_forest,
    )

    plan, m, i = gls_plan(h, cells, meas, invs, geometry)
    state = gls_upward(plan, whole_forest(h), m, i)
    zhat, Phat = gls_top(plan, h, 0, m, i, [state.message()])
    zhat, Phat = gls_downward(plan, state, zhat[-1], Phat[-1])
    est, var, cov = gls_finish(plan, zhat, Phat, True)

    class Rel:  # the fields assert_matches reads
        estimates, variances, covariances = est, var, cov

    return Rel


def _td_queries(cells: list[str]) -> dict[str, Query]:
    """Queries whose Gram matrix is αI + β11ᵀ, and invariants fixing the total or the node."""
    K = len(cells)
    stacked = np.vstack([np.eye(K, dtype=np.int64), np.ones((1, K), np.int64)])
    return {
        "detailed": Query.detailed(cells),
        "total": Query.total(cells),
        "total3": Query("total3", np.full((1, K), 3, np.int64), ("t",)),
        "two_totals": Query("two_totals", np.ones((2, K), np.int64), ("t1", "t2")),
        "stacked": Query("stacked", stacked, (*cells, "total")),
    }


@st.composite
def total_detailed_problems(draw):
    depth = draw(st.integers(2, 4))
    K = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    gen = np.random.default_rng(seed)
    hi = {2: 6, 3: 4, 4: 3}[depth]
    h = random_hierarchy(gen, [(1, int(gen.integers(1, hi + 1))) for _ in range(depth - 1)])
    cells = cell_names(K)
    q = _td_queries(cells)
    counts = h.aggregate(gen.integers(0, 50, size=(h.leaves.size, K)))
    leaf = draw(st.sampled_from(["detailed", "total", "none", "stacked"]))
    meas = []
    if leaf != "none":
        meas.append(noisy(depth - 1, q[leaf], counts[-1], float(gen.uniform(0.5, 4)), gen))
        if draw(st.booleans()):  # per-node variances
            m = meas[-1]
            nv = gen.uniform(0.5, 5.0, h.leaves.size)
            meas[-1] = NodeVarianceMeasurement(m.level, m.query, m.values, m.law, node_variance=nv)
    for k in range(depth - 1):
        for name in ("detailed", "total", "total3", "stacked"):
            if gen.random() < 0.3:
                meas.append(noisy(k, q[name], counts[k], float(gen.uniform(0.5, 4)), gen))
    invs = []
    for k in range(depth):
        for name in ("total", "detailed", "total3", "two_totals", "stacked"):
            if gen.random() < 0.12:
                invs.append(exact_invariant(k, q[name], counts))
    geometry = draw(st.sampled_from(["weighted", "weighted", "euclidean"]))
    return h, cells, meas, invs, geometry


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(total_detailed_problems())
def test_total_detailed_problems_equal_reference(problem):
    """Total/detailed/stacked queries and total/full invariants (the shapes the removed
    total/deviation path special-cased) through the one kernel against the sparse KKT
    reference, including flat (under-determined) nodes, redundant invariants
    (pseudo-inverse), node variances and the Euclidean geometry."""
    h, cells, meas, invs, geometry = problem
    K = len(cells)
    try:
        rel = _passes(h, cells, meas, invs, geometry)
    except SpecError as exc:  # not identifiable: the reference's KKT system is singular
        assert "not identifiable at level" in str(exc)
        A, _, _, C, _ = hierarchy_to_sparse(h, meas, invs, n_cells=K)
        stacked = sp.vstack([A, C]).toarray()
        assert np.linalg.matrix_rank(stacked) < stacked.shape[1]
        return
    est, covs = reference(h, K, meas, invs, geometry)
    if rel.variances is None:  # Euclidean with unequal scales: the estimate only
        for a, b in zip(rel.estimates, est, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-8 * (1 + np.abs(b).max()))
        return
    assert_matches(rel, est, covs)
    for inv in invs:
        np.testing.assert_allclose(
            inv.query.apply(rel.estimates[inv.level]), inv.values, atol=1e-9 * 1e3
        )


def test_total_detailed_contradictions_raise():
    gen = np.random.default_rng(2)
    h = random_hierarchy(gen, [(3, 3), (2, 2)])
    cells = cell_names(3)
    q = _td_queries(cells)
    counts = h.aggregate(gen.integers(0, 9, size=(h.leaves.size, 3)))
    meas = [noisy(2, q["detailed"], counts[2], 1.0, gen)]
    # a root total that is not the sum of the (invariant) state totals
    bad = Invariant(0, q["total"], q["total"].apply(counts[0]) + 1.0)
    with pytest.raises(DataError, match="contradict"):
        tree_gls(h, cells, meas, [bad, exact_invariant(1, q["total"], counts)], None)
    # a detailed invariant whose total disagrees with the total invariant of the same level
    bad_t = Invariant(1, q["total"], q["total"].apply(counts[1]) + 2.0)
    with pytest.raises(DataError, match="contradict"):
        tree_gls(h, cells, meas, [bad_t, exact_invariant(1, q["detailed"], counts)], None)
