"""Exact conditionals of ℓ₁ product targets along lines: normaliser and density against
brute force, χ² of draws at α = 1e-6 with power, couplings keep both marginals."""

from __future__ import annotations

import math

import numpy as np
import scipy.integrate as si
import scipy.stats as st
from hypothesis import given, settings
from hypothesis import strategies as hs
from stattests import chi2_pvalue

from censusdp.estimation.conditioning.line_conditional import LaplaceLine, couple_lines, distance

ALPHA = 1e-6


def _brute_integer(a, c, beta, lo, hi, span=400):
    """Log-masses of δ ∈ [−span, span] (−inf outside the bounds), normalised."""
    xs = np.arange(-span, span + 1, dtype=np.float64)
    f = -(beta * np.abs(a + c * xs[:, None])).sum(axis=1)
    f[(xs < lo) | (xs > hi)] = -np.inf
    return xs, f - (np.log(np.exp(f - f.max()).sum()) + f.max())


def _line(a, c, beta, lo, hi, n=1, integer=True):
    rep = lambda v: np.repeat(np.asarray(v, dtype=np.float64)[None], n, axis=0)  # noqa: E731
    return LaplaceLine.build(
        rep(a), rep(c), rep(beta), np.full(n, lo), np.full(n, hi), integer=integer
    )


@settings(max_examples=60, deadline=None)
@given(
    a=hs.lists(hs.integers(-8, 8), min_size=1, max_size=5),
    data=hs.data(),
)
def test_integer_log_pdf_matches_brute_force(a, data):
    k = len(a)
    c = data.draw(hs.lists(hs.integers(-2, 2), min_size=k, max_size=k))
    beta = data.draw(hs.lists(hs.floats(0.2, 2.0), min_size=k, max_size=k))
    lo = data.draw(hs.sampled_from([-math.inf, -6.0, -1.0]))
    hi = data.draw(hs.sampled_from([math.inf, 0.0, 5.0]))
    if not any(c) and (math.isinf(lo) or math.isinf(hi)):
        return  # improper: nothing to compare
    a, c, beta = (np.asarray(v, dtype=np.float64) for v in (a, c, beta))
    line = _line(a, c, beta, lo, hi)
    xs, ref = _brute_integer(a, c, beta, lo, hi)
    window = np.abs(xs) <= 20
    got = np.array([line.log_pdf(np.array([x]))[0] for x in xs[window]])
    finite = np.isfinite(ref[window])
    assert np.array_equal(np.isfinite(got), finite)
    assert np.allclose(got[finite], ref[window][finite], atol=1e-9)


def test_continuous_normaliser_matches_quadrature():
    rng = np.random.default_rng(7)
    for _ in range(20):
        a, c = rng.normal(0, 3, 3), rng.choice([-2.0, -1.0, 1.0, 2.0], 3)
        beta = rng.uniform(0.2, 1.5, 3)
        lo, hi = rng.choice([-np.inf, -2.0]), rng.choice([np.inf, 3.0])
        line = _line(a, c, beta, lo, hi, integer=False)
        brk = np.clip(-a / c, max(lo, -300), min(hi, 300))
        z, _ = si.quad(
            lambda x: math.exp(-(beta * np.abs(a + c * x)).sum()),  # noqa: B023
            max(lo, -300),
            min(hi, 300),
            points=sorted(set(brk)),
            limit=500,
        )
        assert abs(line.log_norm[0] - math.log(z)) < 1e-7


def test_integer_draws_pass_chi2_and_reject_a_wrong_scale():
    a, c, beta = np.array([3.0, -4.0, 1.0]), np.array([1.0, -1.0, 2.0]), np.array([0.3, 0.3, 0.5])
    n = 100_000
    draws = _line(a, c, beta, -8.0, math.inf, n).sample(np.random.default_rng(11))
    assert np.array_equal(draws, np.round(draws))
    xs, ref = _brute_integer(a, c, beta, -8.0, math.inf)
    assert chi2_pvalue(draws, ref, xs) > ALPHA
    _, wrong = _brute_integer(a, c, 1.3 * beta, -8.0, math.inf)
    assert chi2_pvalue(draws, wrong, xs) < ALPHA  # power: 30% wrong rates are rejected


def test_continuous_draws_pass_ks_and_reject_a_wrong_scale():
    a, c, beta = np.array([1.5, -0.5]), np.array([1.0, -1.0]), np.array([0.8, 0.8])
    n = 50_000
    draws = _line(a, c, beta, -math.inf, math.inf, n, integer=False).sample(
        np.random.default_rng(12)
    )

    def cdf(b):
        grid = np.linspace(-60, 60, 240_001)
        dens = np.exp(-(b * np.abs(a + c * grid[:, None])).sum(axis=1))
        cum = np.cumsum(dens)
        return lambda x: np.interp(x, grid, cum / cum[-1])

    assert st.kstest(draws, cdf(beta)).pvalue > ALPHA
    assert st.kstest(draws, cdf(0.7 * beta)).pvalue < ALPHA


def test_quantile_draws_are_monotone_in_u():
    line = _line([2.0, -3.0], [1.0, -1.0], [0.4, 0.4], -5.0, math.inf, 2001)
    u = np.linspace(0, 1, 2001, endpoint=False)
    d = line.sample(u=u)
    assert np.all(np.diff(d) >= 0)


def test_coupling_keeps_both_marginals_and_identical_lines_agree():
    rng = np.random.default_rng(13)
    n = 100_000
    c, beta = [1.0, -1.0], [0.5, 0.5]
    x = _line([2.0, -1.0], c, beta, -math.inf, math.inf, n)
    y = _line([0.0, 0.0], c, beta, -math.inf, math.inf, n)
    shift = np.full(n, 2.0)
    dx, dy, _ = couple_lines(x, y, shift, rng)
    xs, ref_x = _brute_integer(np.array([2.0, -1.0]), np.array(c), np.array(beta), -np.inf, np.inf)
    _, ref_y = _brute_integer(np.zeros(2), np.array(c), np.array(beta), -np.inf, np.inf)
    assert chi2_pvalue(dx, ref_x, xs) > ALPHA
    assert chi2_pvalue(dy, ref_y, xs) > ALPHA
    # lines identical up to the shift: distance 0, and the draws always coincide
    y2 = _line([0.0, 1.0], c, beta, -math.inf, math.inf, n)
    assert np.all(distance(x, y2, shift) == 0)
    dx, dy, coupled = couple_lines(x, y2, shift, rng)
    assert coupled.all() and np.array_equal(dy, dx + shift)


def test_a_one_point_continuous_line_keeps_delta_zero():
    """lo == hi: no density along the line; the draw is δ = 0 and nothing is NaN."""
    line = _line([0.0, 1.5], [1.0, -1.0], [1.0, 2.0], 0.0, 0.0, n=3, integer=False)
    with np.errstate(all="raise"):
        draws = line.sample(np.random.default_rng(0))
    assert not line.proper.any()
    np.testing.assert_array_equal(draws, 0.0)
    assert np.isnan(line.log_norm).sum() == 0
