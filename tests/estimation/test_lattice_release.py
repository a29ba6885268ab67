"""Lattice mechanisms on the shared MCMC engine: invariants, exact-enumeration check of the
L-lag TV bound, the release policy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from censusdp.errors import ConvergenceError
from censusdp.estimation.conditioning.diagnostics import meeting_times
from censusdp.estimation.conditioning.mcmc import DoubleGeometricStep, MetropolisHastings
from censusdp.estimation.integer.lattice_release import (
    CertifyOptions,
    GroupPairMoves,
    certify,
    lattice_engine,
    release_lattice_noise,
    tune_scale,
)
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeGaussian,
    LatticeLaplace,
    sample_group_laplace_l1,
    table_margins_incidence,
)


def _dg_pmf(k: np.ndarray, a: float) -> np.ndarray:
    return (1 - a) / (1 + a) * a ** np.abs(k)


def _exact_kernel(lat: IntegerLattice, law, a: float, box: int):
    """States in the box and the transition matrix of the engine's random-scan kernel."""
    r = 2 * box + 2
    grid = np.stack(np.meshgrid(*[np.arange(-r, r + 1)] * lat.n_directions), -1)
    pts = lat.point(grid.reshape(-1, lat.n_directions))
    pts = pts[np.all(np.abs(pts) <= box, axis=1)]
    index = {tuple(p): i for i, p in enumerate(pts)}
    logp = law.log_target(pts)
    n, k = len(pts), lat.n_directions
    P = np.zeros((n, n))
    steps = np.arange(-2 * box - 1, 2 * box + 2)
    steps = steps[steps != 0]
    q = _dg_pmf(steps, a)
    for s, p in enumerate(pts):
        for d in range(k):
            for u, qu in zip(steps, q, strict=True):
                t = index.get(tuple(p + u * lat.basis[:, d]))
                if t is not None:
                    P[s, t] += qu / k * min(1.0, math.exp(logp[t] - logp[s]))
        P[s, s] += 1.0 - P[s].sum()
    pi = np.exp(logp - logp.max())
    return pts, P, pi / pi.sum()


def test_engine_keeps_margins_exactly():
    a = table_margins_incidence(4, 4)
    lat = IntegerLattice.from_incidence(a)
    for mode in ("single", "all"):
        eng = lattice_engine(lat, LatticeLaplace(0.3, "l2"), 0.8, mode=mode)
        draws = eng.run(eng.init(np.zeros((50, 16), np.int64)), 300, np.random.default_rng(3))
        assert draws.dtype == np.int64
        assert np.all(draws @ a.T == 0)
        assert np.abs(draws).max() > 0


def test_group_pair_moves_keep_group_totals():
    lat = GroupSumLattice(np.array([0, 0, 0, 1, 1, 2, 2, 2, 2]))
    eng = MetropolisHastings(
        lattice_engine(lat, LatticeLaplace(0.3), 0.7).target,
        GroupPairMoves(lat, DoubleGeometricStep(0.7)),
    )
    draws = eng.run(eng.init(np.zeros((40, 9), np.int64)), 500, np.random.default_rng(4))
    assert np.all(lat.contains(draws.reshape(-1, 9)))
    # mean |noise| near the exact value for the l1 law (sanity, loose)
    assert 0.5 < np.abs(draws[250:]).mean() < 5


def test_coupling_bound_dominates_exact_tv():
    """True d_TV(π_t, π) by matrix powers on a truncated lattice vs the L-lag bound."""
    lat = IntegerLattice.from_incidence(table_margins_incidence(2, 3))
    law, a, box, lag = LatticeLaplace(0.6, "l1"), 0.5, 3, 4
    pts, P, pi = _exact_kernel(lat, law, a, box)
    assert np.allclose(pi @ P, pi)  # the kernel leaves the truncated target invariant
    start = np.zeros(len(pts))
    start[int(np.flatnonzero(np.all(pts == 0, axis=1))[0])] = 1.0
    ts = np.arange(0, 40)
    dist, tv_true = start, []
    for _ in ts:
        tv_true.append(0.5 * np.abs(dist - pi).sum())
        dist = dist @ P
    tv_true = np.array(tv_true)
    eng = lattice_engine(lat, law, a, box=box)
    n = 3000
    z0 = np.zeros((n, lat.dim), np.int64)
    res = meeting_times(eng, z0, z0, lag, np.random.default_rng(5), max_iterations=10_000)
    assert res.all_met
    terms = np.maximum(0, np.ceil((res.meeting_times[:, None] - lag - ts[None, :]) / lag))
    bound, se = terms.mean(0), terms.std(0, ddof=1) / math.sqrt(n)
    assert np.all(bound + 4 * se + 1e-12 >= tv_true)
    assert tv_true[5] > 0.05  # the check is not vacuous: the chain starts far from π


def test_release_policy_records_and_certifies(rng):
    a = table_margins_incidence(3, 3)
    lat = IntegerLattice.from_incidence(a)
    law = LatticeLaplace(0.5, "l1")
    x = np.arange(9, dtype=np.int64) + 5
    rel = release_lattice_noise(
        lat, law, rng, data=x, n_draws=400, invariants=("rows", "columns"), rhat_sweeps=4000
    )
    c = rel.convergence
    assert c.tv_bound < 0.01 and c.n_coupled >= 200
    assert c.rhat_max < 1.01 and c.rhat_chains >= 4
    assert np.all(rel.released @ a.T == a @ x)
    assert rel.released.dtype == np.int64
    se = rel.noise.std(0, ddof=1) / math.sqrt(400)
    assert np.all(np.abs(rel.noise.mean(0)) < 4 * se)
    text = rel.privacy.text()
    assert "total variation" in text and "share the invariants" in text
    assert rel.diagnostics["tv_bound"] == c.tv_bound


def test_release_policy_refuses_without_convergence(rng):
    lat = IntegerLattice.from_incidence(table_margins_incidence(3, 3))
    short = CertifyOptions(a=0.2, max_iterations=30)
    with pytest.raises(ConvergenceError, match="more iterations|max_iterations"):
        certify(lat, LatticeLaplace(0.05, "l1"), rng, short)
    with pytest.raises(ValueError):
        certify(lat, LatticeLaplace(0.5), rng, CertifyOptions(n_coupled=50))
    # the same options one by one, as before CertifyOptions (accepted for one release)
    with pytest.raises(ValueError, match="at least 200 coupled"):
        certify(lat, LatticeLaplace(0.5), rng, n_coupled=50)
    with pytest.raises(TypeError, match="'n_pairs'; its options are the fields of CertifyOptions"):
        certify(lat, LatticeLaplace(0.5), rng, n_pairs=300)


def test_tuning_rule_lands_in_band(rng):
    lat = IntegerLattice.from_incidence(table_margins_incidence(3, 3))
    for law in (LatticeLaplace(0.1, "l1"), LatticeGaussian(3.0)):
        a, rate = tune_scale(lat, law, rng.generator("tune"))
        assert 0 < a < 1 and 0.2 <= rate <= 0.5


def test_gibbs_release_on_group_lattice_matches_the_exact_sampler(rng):
    """Default mode for the l1 law on state totals: Gibbs matching sweeps, certified; the
    released draws agree with the exact rejection sampler (KS on ‖z‖₁, α = 1e-6) and the test
    has power: exact draws at another ε are rejected."""
    lat = GroupSumLattice(np.array([0] * 6 + [1] * 9))
    law = LatticeLaplace(0.4, "l1")
    x = np.arange(15, dtype=np.int64) * 7 + 3
    rel = release_lattice_noise(lat, law, rng, data=x, n_draws=1500, invariants=("groups",))
    c = rel.convergence
    assert c.mode == "gibbs" and math.isnan(c.a) and c.acceptance == 1.0
    assert c.tv_bound < 0.01 and c.rhat_max < 1.01 and c.n_coupled >= 200
    assert np.all(lat.contains(rel.noise))
    assert np.all(rel.released[:, :6].sum(1) == x[:6].sum())
    assert np.all(rel.released[:, 6:].sum(1) == x[6:].sum())
    assert "total variation" in rel.privacy.text()
    norm = np.abs(rel.noise).sum(axis=1)
    exact = sample_group_laplace_l1(lat, 0.4, rng.generator("exact"), 1500)
    assert stats.ks_2samp(norm, np.abs(exact).sum(axis=1)).pvalue > 1e-6
    wrong = sample_group_laplace_l1(lat, 0.3, rng.generator("wrong"), 1500)
    assert stats.ks_2samp(norm, np.abs(wrong).sum(axis=1)).pvalue < 1e-6


def test_metropolis_engine_rejects_a_gibbs_certificates_nan_a():
    lat = IntegerLattice.from_incidence(table_margins_incidence(3, 3))
    with pytest.raises(ValueError, match="mode=report.mode"):
        lattice_engine(lat, LatticeLaplace(0.5, "l1"), float("nan"))
    eng = lattice_engine(lat, LatticeLaplace(0.5, "l1"), float("nan"), mode="gibbs")
    draws = eng.run(eng.init(np.zeros((20, 9), np.int64)), 50, np.random.default_rng(6))
    assert np.all(lat.contains(draws.reshape(-1, 9)))
