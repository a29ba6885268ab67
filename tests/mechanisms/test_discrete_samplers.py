"""Exact discrete samplers: χ² goodness of fit at α = 1e-6 (with power against 0.7× and
1.3× scales), the Bernoulli(exp(−γ)) primitive, the plain-Python reference, the int64
overflow paths, rational rounding and the law objects."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from censusdp.mechanisms.discrete import (
    MAX_DENOMINATOR,
    DiscreteGaussian,
    DiscreteLaplace,
    bernoulli_exp,
    bernoulli_exp_reference,
    discrete_gaussian_reference,
    discrete_laplace_reference,
    geometric_exp1,
    rational_up,
    sample_discrete_gaussian,
)

ALPHA = 1e-6
N = 100_000


def dg_pmf(sigma2: float, support: np.ndarray) -> np.ndarray:
    """Exact discrete Gaussian pmf on ``support`` (normaliser by a wide truncated sum)."""
    half = int(math.ceil(40 * math.sqrt(sigma2))) + 10
    k = np.arange(-half, half + 1, dtype=np.float64)
    z = np.exp(-(k * k) / (2 * sigma2)).sum()
    s = support.astype(np.float64)
    return np.exp(-(s * s) / (2 * sigma2)) / z


def dl_pmf(scale: float, support: np.ndarray) -> np.ndarray:
    a = 1.0 / scale
    return math.tanh(a / 2) * np.exp(-a * np.abs(support.astype(np.float64)))


def chi2_pvalue(draws: np.ndarray, pmf, radius: int) -> float:
    """χ² test of integer draws against ``pmf``: every integer with expected count ≥ 5 is a
    bin, the two tails are pooled into one bin each (their probabilities by complement)."""
    n = draws.size
    support = np.arange(-radius, radius + 1)
    p = pmf(support)
    ok = np.flatnonzero(p * n >= 5)
    lo, hi = support[ok[0]], support[ok[-1]]
    centre = np.arange(lo, hi + 1)
    pc = pmf(centre)
    tail_lo = tail_hi = (1.0 - pc.sum()) / 2.0  # symmetric laws
    counts = np.array([np.sum(draws == k) for k in centre])
    obs = np.concatenate([[np.sum(draws < lo)], counts, [np.sum(draws > hi)]])
    exp = n * np.concatenate([[tail_lo], pc, [tail_hi]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(stats.chi2.sf(stat, keep.sum() - 1))


@pytest.mark.parametrize("sigma", [10, Fraction(7, 2), 0.8, 2.5])
def test_discrete_gaussian_chi2_and_power(rng, sigma):
    law = DiscreteGaussian(sigma)
    s2 = float(law.sigma2)
    draws = law.sample(rng.generator(f"dg/{sigma}"), N)
    assert draws.dtype == np.int64 and draws.shape == (N,)
    radius = int(10 * math.sqrt(s2)) + 2
    p_ok = chi2_pvalue(draws, lambda k: dg_pmf(s2, k), radius)
    assert p_ok > ALPHA, p_ok
    for factor in (0.7, 1.3):
        p_bad = chi2_pvalue(draws, lambda k, f=factor: dg_pmf(s2 * f * f, k), radius)
        assert p_bad < ALPHA, (factor, p_bad)


def test_discrete_gaussian_log_mass_is_exact_pmf_on_ten_sigma(rng):
    law = DiscreteGaussian(10)
    k = np.arange(-100, 101)
    np.testing.assert_allclose(np.exp(law.log_density(k)), dg_pmf(100.0, k), rtol=1e-13)
    assert abs(np.exp(law.log_density(np.arange(-400, 401))).sum() - 1.0) < 1e-13
    assert law.variance <= 100.0 and law.variance == pytest.approx(100.0, rel=1e-12)
    small = DiscreteGaussian(Fraction(1, 2))
    kk = np.arange(-30, 31)
    var = float((kk**2 * np.exp(small.log_density(kk))).sum())
    assert small.variance == pytest.approx(var, rel=1e-13)
    assert small.variance < 0.25


@pytest.mark.parametrize("scale", [10, Fraction(7, 3), 1, 0.75])
def test_discrete_laplace_chi2_and_power(rng, scale):
    law = DiscreteLaplace(scale)
    t = law.scale
    draws = law.sample(rng.generator(f"dl/{scale}"), N)
    assert draws.dtype == np.int64
    radius = int(40 * t) + 40
    assert chi2_pvalue(draws, lambda k: dl_pmf(t, k), radius) > ALPHA
    for factor in (0.7, 1.3):
        assert chi2_pvalue(draws, lambda k, f=factor: dl_pmf(t * f, k), radius) < ALPHA


def test_discrete_laplace_log_mass_and_variance():
    law = DiscreteLaplace(Fraction(7, 3))
    k = np.arange(-400, 401)
    pm = np.exp(law.log_density(k))
    assert abs(pm.sum() - 1.0) < 1e-13
    assert law.variance == pytest.approx(float((k**2 * pm).sum()), rel=1e-12)
    np.testing.assert_allclose(pm, dl_pmf(7 / 3, k), rtol=1e-13)


@pytest.mark.parametrize(
    "gamma",
    [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(7), Fraction(29, 4)],
)
def test_bernoulli_exp_matches_exp_minus_gamma(rng, gamma):
    n = 200_000
    num = np.full(n, gamma.numerator, dtype=np.int64)
    hits = int(bernoulli_exp(rng.generator(f"be/{gamma}"), num, gamma.denominator).sum())
    p = math.exp(-float(gamma))
    assert stats.binomtest(hits, n, p).pvalue > ALPHA
    if gamma > 0:  # power: a 30% error in γ is detected
        assert stats.binomtest(hits, n, math.exp(-1.3 * float(gamma))).pvalue < ALPHA


def test_bernoulli_exp_mixed_array_and_huge_denominator(rng):
    gen = rng.generator("be/mixed")
    gammas = np.array([0, 1, 2, 3], dtype=np.int64)
    num = np.tile(gammas, 50_000)
    out = bernoulli_exp(gen, num, 2)  # γ = 0, 1/2, 1, 3/2
    for g in gammas:
        hits = int(out[num == g].sum())
        assert stats.binomtest(hits, 50_000, math.exp(-g / 2)).pvalue > ALPHA
    den = (1 << 62) + 11  # den·k overflows int64: the split Bernoulli path
    num = np.full(100_000, den // 2, dtype=np.int64)
    hits = int(bernoulli_exp(gen, num, den).sum())
    assert stats.binomtest(hits, 100_000, math.exp(-(den // 2) / den)).pvalue > ALPHA


def test_geometric_exp1_law(rng):
    g = geometric_exp1(rng.generator("geo"), N)
    q = math.exp(-1.0)
    radius = 60
    support = np.arange(0, radius)
    p = (1 - q) * q**support
    ok = p * N >= 5
    obs = np.array([np.sum(g == k) for k in support[ok]] + [np.sum(g >= support[ok][-1] + 1)])
    exp = N * np.concatenate([p[ok], [1 - p[ok].sum()]])
    stat = ((obs - exp) ** 2 / exp).sum()
    assert stats.chi2.sf(stat, obs.size - 1) > ALPHA


def test_plain_python_reference_samplers_agree(rng):
    gen = rng.generator("reference")
    assert sum(bernoulli_exp_reference(gen, Fraction(3, 2)) for _ in range(20_000)) == (
        pytest.approx(20_000 * math.exp(-1.5), abs=5.3 * math.sqrt(20_000 * 0.25))
    )
    draws = np.array([discrete_gaussian_reference(gen, Fraction(9, 4)) for _ in range(4000)])
    assert chi2_pvalue(draws, lambda k: dg_pmf(2.25, k), 30) > ALPHA
    draws = np.array([discrete_laplace_reference(gen, Fraction(3, 2)) for _ in range(4000)])
    assert chi2_pvalue(draws, lambda k: dl_pmf(1.5, k), 60) > ALPHA


def test_large_parameter_paths(rng):
    # σ ≈ 1400 with denominator 1024: 2pqt² < 2⁶³ but (|Y|tq − p)² overflows → object path
    s2 = Fraction(1400**2 * 1024 + 1, 1024)
    draws = sample_discrete_gaussian(rng.generator("dg/object"), 60_000, s2)
    radius = 10 * 1400
    assert chi2_pvalue(draws, lambda k: dg_pmf(float(s2), k), radius) > ALPHA
    assert chi2_pvalue(draws, lambda k: dg_pmf(float(s2) * 1.69, k), radius) < ALPHA
    # σ = 50000: 2pqt² ≥ 2⁶³ → Python-integer acceptance, still exact
    big = DiscreteGaussian(50_000).sample(rng.generator("dg/python"), 400)
    z = big.mean() / (50_000 / math.sqrt(400))
    assert abs(z) < 5.3
    assert 0.6 < big.var() / 50_000**2 < 1.5


def test_rational_rounding_is_upward_and_bounded():
    for v in (10.3, 0.1, 3.14159, 123456.789, 2.5):
        f = rational_up(v)
        assert f >= Fraction(v)
        assert f.denominator <= MAX_DENOMINATOR
        assert float(f) - v <= max(v * 2**-19, 2**-10)
    assert rational_up(Fraction(7, 3)) == Fraction(7, 3)
    assert rational_up(12) == 12
    with pytest.raises(ValueError):
        rational_up(-1.0)
    with pytest.raises(ValueError):
        rational_up(float("nan"))


def test_calibration_classmethods_never_overspend():
    for eps in (0.1, 0.37, 2.0):
        law = DiscreteLaplace.from_epsilon(eps, 2)
        assert law.privacy(2) <= eps and law.privacy(2) == pytest.approx(eps, rel=1e-3)
    for rho in (0.01, 0.5, 3.3):
        law = DiscreteGaussian.from_rho(rho, 3)
        assert law.privacy(3) <= rho and law.privacy(3) == pytest.approx(rho, rel=1e-3)
    law = DiscreteGaussian.from_epsilon_delta(1.0, 1e-6)
    from censusdp.budget import zcdp_to_dp_cks

    assert zcdp_to_dp_cks(law.privacy(1), 1e-6) <= 1.0
    assert DiscreteGaussian(Fraction(3, 2)).sigma2 == Fraction(9, 4)
    assert DiscreteGaussian(10.3).sigma2 >= Fraction(10.3) ** 2
    with pytest.raises(ValueError):
        DiscreteGaussian(0)


def test_same_stream_same_draws(rng):
    a = DiscreteGaussian(10).sample(rng.generator("same"), 1000)
    b = DiscreteGaussian(10).sample(rng.generator("same"), 1000)
    assert np.array_equal(a, b)
    assert DiscreteGaussian(3).sample(rng.generator("empty"), 0).shape == (0,)
