"""Gibbs moves for Gaussian-type (ℓ₂) targets: constraints kept exactly, the stationary law
against enumeration (discrete Gaussian) and against the exact GLS covariance (Gaussian), and
the end-to-end certificate of a 5-level discrete-Gaussian conditioning problem."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from stattests import covariance_z, z_bound

from censusdp.estimation.conditioning.estimator import (
    ConditioningOptions,
    ConditioningProblem,
    certificate,
    condition,
)
from censusdp.estimation.conditioning.gibbs_moves import GibbsGroupMoves, LineDraws
from censusdp.estimation.conditioning.mcmc import MetropolisHastings, ProductTarget
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import random_hierarchy, synthetic_us
from censusdp.mechanisms.discrete import DiscreteGaussian, DiscreteLaplace
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.rng import KeyedRNG

ALPHA = 1e-6


def test_precisions_of_gaussian_type_laws_only():
    g, dg = Gaussian(2.0), DiscreteGaussian(3)
    assert g.l2_precision == 0.25 and dg.l2_precision == pytest.approx(1 / 9, rel=1e-15)
    assert Laplace(1.0).l2_precision is None and DiscreteLaplace(1).l2_precision is None
    t = ProductTarget([g, dg], np.array([0, 1, -1]))
    np.testing.assert_allclose(t.l2_precisions(), [0.25, 1 / 9, 0.0])
    assert t.l1_rates() is None
    assert ProductTarget([g, Laplace(1.0)], np.array([0, 1])).l2_precisions() is None


def test_group_sweeps_keep_every_group_total():
    groups = np.repeat(np.arange(3), 4)
    target = ProductTarget([DiscreteGaussian(2)], np.zeros(12, np.int64))
    draws = LineDraws(precisions=target.l2_precisions(), integer=True)
    eng = MetropolisHastings(target, GibbsGroupMoves(groups, draws))
    gen = np.random.default_rng(5)
    s0 = gen.integers(-5, 6, (200, 12))
    cs = eng.init(s0)
    eng.run(cs, 50, gen)
    assert cs.states.dtype == np.int64 and (cs.states != s0).any()
    np.testing.assert_array_equal(
        cs.states.reshape(200, 3, 4).sum(axis=2), s0.reshape(200, 3, 4).sum(axis=2)
    )
    assert cs.acceptance_rate.min() == 1.0


def _exact_gls_covariance(h, ms, inv, n_cells):
    """Cov(z | y) of the flat-prior Gaussian posterior on the invariant-respecting leaf
    tables: N (Nᵀ A N)⁻¹ Nᵀ, A = Σ_m M_mᵀ M_m / σ_m², N a basis of the invariants' null
    space (the GLS error covariance)."""
    d = h.leaves.size * n_cells
    unit = np.eye(d).reshape(d, h.leaves.size, n_cells)

    def answers(level, query):
        return np.stack([query.apply(h.aggregate(u)[level]).reshape(-1) for u in unit], axis=1)

    A = sum(answers(m.level, m.query).T @ answers(m.level, m.query) / m.law.variance for m in ms)
    C = np.vstack([answers(v.level, v.query) for v in inv])
    N = sl.null_space(C)
    return N @ np.linalg.solve(N.T @ A @ N, N.T)


def test_continuous_gaussian_gibbs_matches_the_exact_gls_covariance():
    """Independent chains after 200 sweeps: every entry of the sample covariance and every mean
    within the α = 1e-6 (Bonferroni) band of the exact GLS covariance and estimate, and the same
    check rejects a 30 % wrong scale either way. 2,000 chains give that power with room: a
    variance's relative sd is √(2/2000) = 3.2 %, a 0.7² or 1.3² scale is ≥ 13 sd off."""
    gen = np.random.default_rng(6)
    h = random_hierarchy(gen, [(2, 3), (2, 3)])
    x = gen.integers(0, 30, (h.leaves.size, 1))
    lv = h.aggregate(x)
    rng = KeyedRNG.reproducible(6, warn=False)
    plan = [(1, Query.detailed(["n"]), Gaussian(3.0)), (2, Query.detailed(["n"]), Gaussian(2.0))]
    ms = measure(h.names, lv, plan, rng)
    inv = [invariant(lv, 0, Query.total(["n"]))]
    prob = ConditioningProblem(h, 1, ms, inv)
    assert prob.kernel == "gibbs"
    eng = prob.engine
    n = 2_000
    cs = eng.init(prob.initial_states(n, gen))
    eng.run(cs, 200, gen)
    draws = prob.tables(cs.states).reshape(n, -1)
    exact = _exact_gls_covariance(h, ms, inv, 1)
    d = exact.shape[0]
    bound = z_bound(ALPHA, d * (d + 1) // 2 + d)
    assert covariance_z(draws, exact).max() < bound
    for wrong in (0.7, 1.3):  # power: a 30 % wrong scale is rejected
        assert covariance_z(draws, wrong**2 * exact).max() > bound, wrong
    # and its mean is the GLS estimate (the posterior mean under the flat prior)
    from censusdp.estimation.gls.tree import tree_gls

    gls = tree_gls(h, ["n"], ms, inv).estimates[-1].reshape(-1)
    se = np.sqrt(np.diag(exact) / n)
    assert np.all(np.abs(draws.mean(axis=0) - gls) < bound * se)


@pytest.mark.slow
def test_five_level_discrete_gaussian_conditioning_certifies():
    """The problem random-walk Metropolis never certified (1-lag pilot did not meet within
    200,000 iterations): 30 blocks, discrete Gaussian at county/tract/block, state totals
    invariant. Its speed is measured by benchmarks/lattice_mcmc.py, not asserted here."""
    t = synthetic_us(5, states=2, counties=5, tracts=10, blocks=30, population=3000)
    h, cells = t.hierarchy, list(t.cells)
    lv = h.aggregate(t.leaf_counts)
    rng = KeyedRNG.reproducible(11, warn=False)
    law = DiscreteGaussian(5)
    ms = measure(h.names, lv, [(k, Query.detailed(cells), law) for k in (2, 3, 4)], rng)
    inv = [invariant(lv, 1, Query.total(cells))]
    rel = condition(h, cells, ms, inv, None, rng)
    cert = certificate(rel)
    assert cert["kernel"] == "gibbs"
    assert cert["tv_bound"] < 0.01
    assert rel.integer and all(e.dtype == np.int64 for e in rel.estimates)
    np.testing.assert_array_equal(rel.estimates[1], lv[1])  # state totals exact
    np.testing.assert_array_equal(rel.estimates[0], lv[0])
    for k in range(h.depth - 1):  # consistent: every level sums the one below
        np.testing.assert_array_equal(rel.estimates[k], h.aggregate(rel.estimates[-1])[k])
    assert cert["rhat_max"] < 1.1


def test_nonnegative_continuous_gaussian_conditioning_uses_gibbs_and_certifies():
    """Gaussian laws without bounds keep the exact GLS path; under non-negativity they now
    get exact Gibbs line draws (truncated normals) instead of random-walk Metropolis."""
    h = Hierarchy.from_parents(["root", "unit"], [["R"], ["a", "b", "c", "d"]], [None, np.zeros(4)])
    x = np.array([[4], [0], [9], [2]])
    lv = h.aggregate(x)
    rng = KeyedRNG.reproducible(8, warn=False)
    ms = measure(h.names, lv, [(1, Query.detailed(["n"]), Gaussian(1.5))], rng)
    inv = [invariant(lv, 0, Query.total(["n"]))]
    opts = ConditioningOptions(nonnegative=True, start=x, n_coupled_pairs=100)
    rel = condition(h, ["n"], ms, inv, None, rng, opts)
    assert certificate(rel)["kernel"] == "gibbs" and rel.diagnostics["tv_bound"] < 0.01
    assert np.all(rel.estimates[1] >= 0)
    assert abs(rel.estimates[0][0, 0] - lv[0][0, 0]) < 1e-9
