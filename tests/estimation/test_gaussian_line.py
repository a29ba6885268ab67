"""Exact conditionals of ℓ₂ (Gaussian-type) product targets along lines: pmf against brute
force, χ²/KS of draws at α = 1e-6 with power against a 30% wider law, degenerate lines as for
Laplace lines, and the maximal coupling's marginals and meeting probability."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate as si
import scipy.stats as st
from stattests import chi2_pvalue

from censusdp.estimation.conditioning.gaussian_line import GaussianLine, tail_bound
from censusdp.estimation.conditioning.gibbs_moves import LineDraws
from censusdp.estimation.conditioning.line_conditional import LaplaceLine, couple_lines, distance

ALPHA = 1e-6


def _rep(v, n):
    return np.repeat(np.asarray(v, dtype=np.float64)[None], n, axis=0)


def _line(a, c, p, lo, hi, n=1, integer=True):
    return GaussianLine.build(
        _rep(a, n), _rep(c, n), _rep(p, n), np.full(n, lo), np.full(n, hi), integer=integer
    )


def _brute_integer(a, c, p, lo, hi, scale=1.0, span=300):
    """Normalised log-masses of δ ∈ [−span, span] (−inf outside the bounds), computed from
    the target itself: Σ_k −½ (p_k/scale²) (a_k + c_k δ)²."""
    xs = np.arange(-span, span + 1, dtype=np.float64)
    f = -0.5 * (np.asarray(p) / scale**2 * (a + c * xs[:, None]) ** 2).sum(axis=1)
    f[(xs < lo) | (xs > hi)] = -np.inf
    m = f.max()
    return xs, f - (m + np.log(np.exp(f - m).sum()))


def _random_line(rng):
    k = int(rng.integers(1, 5))
    a = rng.integers(-12, 13, k).astype(float)
    c = rng.integers(-2, 3, k).astype(float)
    p = rng.uniform(0.05, 1.5, k)
    lo = float(rng.choice([-np.inf, -7.0, -1.0, 2.0]))
    hi = float(rng.choice([np.inf, 0.0, 4.0, 9.0]))
    return a, c, p, lo, hi


def test_integer_pmf_matches_brute_force():
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(300):
        a, c, p, lo, hi = _random_line(rng)
        line = _line(a, c, p, lo, hi)
        if not np.any(c) and (math.isinf(lo) or math.isinf(hi)):
            assert not line.proper[0] and line.sample(rng)[0] == 0.0  # improper: δ = 0
            continue
        if hi < lo:
            assert not line.proper[0] and line.sample(rng)[0] == 0.0
            continue
        xs, ref = _brute_integer(a, c, p, lo, hi)
        got = np.array([line.log_pdf(np.array([x]))[0] for x in xs])
        assert np.array_equal(np.isfinite(got), np.isfinite(ref))
        big = ref > -600  # compare probabilities, relatively, where they are representable
        np.testing.assert_allclose(np.exp(got[big]), np.exp(ref[big]), rtol=1e-10, atol=0)
        # the normaliser of f over the active terms (c_k ≠ 0), as for Laplace lines
        f = -0.5 * (np.where(c != 0, p, 0.0) * (a + c * xs[:, None]) ** 2).sum(axis=1)
        fin = np.isfinite(ref)
        np.testing.assert_allclose(f[fin] - line.log_norm[0], ref[fin], rtol=0, atol=1e-9)
        # the sampling window holds all the mass (to rounding)
        if line.P[0] > 0:
            win = line.window[0][np.isfinite(line.window[0])]
            mass = np.exp([line.log_pdf(np.array([k]))[0] for k in win]).sum()
            assert abs(mass - 1.0) < 1e-12
        checked += 1
    assert checked > 150


def test_window_tail_bound_is_negligible():
    for sigma in (0.3, 1.0, 5.0, 100.0, 1e4):
        assert tail_bound(1.0 / sigma**2) < 1e-17


@pytest.mark.parametrize(
    "a, c, p, lo, hi",
    [
        ([3.0, -4.0, 1.0], [1.0, -1.0, 2.0], [0.1, 0.1, 0.04], -8.0, math.inf),
        ([5.0, 2.0], [1.0, -1.0], [1 / 9, 1 / 9], -math.inf, math.inf),
        ([30.0, -2.0], [1.0, -1.0], [0.2, 0.2], -3.0, 6.0),  # mass at the upper bound
    ],
)
def test_integer_draws_pass_chi2_and_reject_a_wider_law(a, c, p, lo, hi):
    a, c, p = (np.asarray(v) for v in (a, c, p))
    n = 200_000
    draws = _line(a, c, p, lo, hi, n).sample(np.random.default_rng(11))
    assert np.array_equal(draws, np.round(draws))
    assert np.all((draws >= lo) & (draws <= hi))
    xs, ref = _brute_integer(a, c, p, lo, hi)
    assert chi2_pvalue(draws, ref, xs) > ALPHA
    _, wider = _brute_integer(a, c, p, lo, hi, scale=1.3)
    assert chi2_pvalue(draws, wider, xs) < ALPHA  # power: a 30% wider law is rejected


def _truncnorm(a, c, p, lo, hi, scale=1.0):
    """The exact law of the continuous line, from the completed square (scipy truncnorm)."""
    P = (p * c * c).sum() / scale**2
    mu = -(p * a * c).sum() / (p * c * c).sum()
    sd = 1.0 / math.sqrt(P)
    return st.truncnorm((lo - mu) / sd, (hi - mu) / sd, loc=mu, scale=sd)


@pytest.mark.parametrize(
    "a, c, p, lo, hi",
    [
        ([1.5, -0.5], [1.0, -1.0], [0.8, 0.8], -math.inf, math.inf),
        ([2.0, 1.0, -3.0], [1.0, -2.0, 1.0], [0.3, 0.5, 1.0], -0.5, 1.0),
        ([0.0], [1.0], [1.0], 9.0, math.inf),  # 9 σ out in the upper tail
        ([0.0], [1.0], [4.0], -math.inf, -6.0),  # 12 σ out in the lower tail
    ],
)
def test_continuous_draws_pass_ks_and_reject_a_wider_law(a, c, p, lo, hi):
    a, c, p = (np.asarray(v) for v in (a, c, p))
    n = 50_000
    line = _line(a, c, p, lo, hi, n, integer=False)
    draws = line.sample(np.random.default_rng(12))
    assert np.all(np.isfinite(draws)) and np.all((draws >= lo) & (draws <= hi))
    assert st.kstest(draws, _truncnorm(a, c, p, lo, hi).cdf).pvalue > ALPHA
    assert st.kstest(draws, _truncnorm(a, c, p, lo, hi, scale=1.3).cdf).pvalue < ALPHA
    # the density integrates to one and matches the truncated normal's
    pts = _truncnorm(a, c, p, lo, hi).ppf(np.linspace(0.01, 0.99, 7))
    ref = _truncnorm(a, c, p, lo, hi).logpdf(pts)
    got = np.array([line.subset(np.array([0])).log_pdf(np.array([x]))[0] for x in pts])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-8)


def test_continuous_normaliser_matches_quadrature():
    rng = np.random.default_rng(7)
    for _ in range(20):
        a, c = rng.normal(0, 3, 3), rng.choice([-2.0, -1.0, 1.0, 2.0], 3)
        p = rng.uniform(0.2, 1.5, 3)
        lo, hi = rng.choice([-np.inf, -2.0]), rng.choice([np.inf, 3.0])
        line = _line(a, c, p, lo, hi, integer=False)
        mu = -(p * a * c).sum() / (p * c * c).sum()
        left, right = max(lo, -60), min(hi, 60)
        z, _ = si.quad(
            lambda x: math.exp(-0.5 * (p * (a + c * x) ** 2).sum()),  # noqa: B023
            left,
            right,
            points=[min(max(mu, left), right)],
            limit=500,
            epsabs=0.0,
            epsrel=1e-12,
        )
        assert abs(line.log_norm[0] - math.log(z)) < 1e-7


@pytest.mark.parametrize("integer", [True, False])
def test_quantile_draws_are_monotone_in_u(integer):
    line = _line([2.0, -3.0], [1.0, -1.0], [0.4, 0.4], -5.0, math.inf, 2001, integer=integer)
    d = line.sample(u=np.linspace(0, 1, 2001, endpoint=False))
    assert np.all(np.diff(d) >= 0)


@pytest.mark.parametrize("integer", [True, False])
def test_degenerate_lines_behave_as_laplace_lines(integer):
    """P = 0 (flat coordinates or c = 0), one-point and empty ranges: the same properness and
    the same draws as LaplaceLine with zero rates."""
    a = np.array([[1.0, 2.0], [1.0, 2.0], [0.0, 1.5], [3.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    c = np.array([[1.0, -1.0], [0.0, 0.0], [1.0, -1.0], [1.0, -1.0], [1.0, -1.0], [1.0, 1.0]])
    w = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 2.0], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0]])
    lo = np.array([-3.0, -np.inf, 0.0, 2.0, 2.0, -np.inf])
    hi = np.array([4.0, 5.0, 0.0, 1.0, 2.0, np.inf])
    g = GaussianLine.build(a, c, w, lo, hi, integer=integer)
    lap = LaplaceLine.build(a, c, w, lo, hi, integer=integer)
    np.testing.assert_array_equal(g.proper, lap.proper)
    u = np.random.default_rng(3).random(6)
    with np.errstate(all="raise"):
        gd = g.sample(u=u)
    flat = np.array([0, 1, 4, 5])  # zero weights: uniform or improper in both families
    np.testing.assert_array_equal(gd[flat], lap.sample(u=u)[flat])
    np.testing.assert_array_equal(gd[~g.proper], 0.0)
    assert not np.isnan(g.log_norm).any()


def _tv_integer(x_ref, y_ref):
    return 0.5 * np.abs(np.exp(x_ref) - np.exp(y_ref)).sum()


def test_maximal_coupling_keeps_marginals_and_meets_with_probability_one_minus_tv():
    rng = np.random.default_rng(13)
    n = 200_000
    c, p = np.array([1.0, -1.0]), np.array([0.25, 0.25])
    ax, ay = np.array([2.0, -1.0]), np.array([0.0, 0.0])
    x, y = _line(ax, c, p, -np.inf, np.inf, n), _line(ay, c, p, -np.inf, np.inf, n)
    shift = np.full(n, 2.0)  # δy = δx + 2 makes the first coordinates equal
    dx, dy, coupled = couple_lines(x, y, shift, rng, close=np.inf)  # maximal on every line
    xs, ref_x = _brute_integer(ax, c, p, -np.inf, np.inf)
    _, ref_y = _brute_integer(ay, c, p, -np.inf, np.inf)
    assert chi2_pvalue(dx, ref_x, xs) > ALPHA
    assert chi2_pvalue(dy, ref_y, xs) > ALPHA
    np.testing.assert_array_equal(dy[coupled], dx[coupled] + 2.0)
    # P(δy = δx + shift) = 1 − d_TV(law of δx + shift, law of δy)
    _, ref_x_shifted = _brute_integer(ax - c * 2.0, c, p, -np.inf, np.inf)
    overlap = 1.0 - _tv_integer(ref_x_shifted, ref_y)
    assert 0.2 < overlap < 0.95  # informative
    se = math.sqrt(overlap * (1 - overlap) / n)
    assert abs(coupled.mean() - overlap) < 4 * se
    # the default (synchronous unless near-identical) coupling keeps both marginals too
    dx, dy, _ = couple_lines(x, y, shift, rng)
    assert chi2_pvalue(dx, ref_x, xs) > ALPHA
    assert chi2_pvalue(dy, ref_y, xs) > ALPHA


def test_continuous_maximal_coupling_meets_with_probability_one_minus_tv():
    rng = np.random.default_rng(14)
    n = 100_000
    c, p = np.array([1.0, -1.0]), np.array([1.0, 1.0])
    x = _line([0.6, 0.0], c, p, -1.0, np.inf, n, integer=False)
    y = _line([0.0, 0.0], c, p, -1.0, np.inf, n, integer=False)
    shift = np.zeros(n)
    dx, dy, coupled = couple_lines(x, y, shift, rng, close=np.inf)
    lx, ly = (
        _truncnorm(np.array([0.6, 0.0]), c, p, -1.0, np.inf),
        _truncnorm(np.zeros(2), c, p, -1.0, np.inf),
    )
    assert st.kstest(dx, lx.cdf).pvalue > ALPHA and st.kstest(dy, ly.cdf).pvalue > ALPHA
    overlap, _ = si.quad(lambda t: min(lx.pdf(t), ly.pdf(t)), -1.0, 30.0, limit=200)
    se = math.sqrt(overlap * (1 - overlap) / n)
    assert abs(coupled.mean() - overlap) < 4 * se


def test_identical_lines_always_couple_and_distance_is_zero():
    rng = np.random.default_rng(15)
    n = 10_000
    c, p = [1.0, -1.0], [0.3, 0.3]
    x = _line([2.0, -1.0], c, p, -np.inf, np.inf, n)
    y = _line([0.0, 1.0], c, p, -np.inf, np.inf, n)  # the same law up to δ ↦ δ + 2
    shift = np.full(n, 2.0)
    assert np.all(distance(x, y, shift) == 0)
    dx, dy, coupled = couple_lines(x, y, shift, rng)
    assert coupled.all() and np.array_equal(dy, dx + shift)
    with pytest.raises(TypeError):
        distance(x, LaplaceLine.build(_rep([0.0], n), _rep([1.0], n), _rep([1.0], n)), shift)


def test_line_draws_pick_the_family():
    d = LineDraws(precisions=np.array([0.5, 0.5, 0.0]), integer=True)
    line = d.line(np.array([[1, 2, 3]]), np.array([[0, 1]]), np.array([[1, -1]]))
    assert isinstance(line, GaussianLine) and line.P[0] == 1.0
    assert isinstance(
        LineDraws(np.ones(3), integer=True).line(
            np.array([[1, 2, 3]]), np.array([[0, 1]]), np.array([[1, -1]])
        ),
        LaplaceLine,
    )
    with pytest.raises(ValueError):
        LineDraws(np.ones(3), precisions=np.ones(3), integer=True)
    with pytest.raises(ValueError):
        LineDraws(precisions=-np.ones(3), integer=True)
