"""Matrix masking: σ calibration (seed eqs. (11)–(13)), Haar sampling, scaling, OLS identity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from censusdp.errors import DataError, SpecError
from censusdp.mechanisms import masking as mk

ALPHA = 1e-6


# ----------------------------------------------------------------------------- calibration


@pytest.mark.parametrize(
    ("eps", "delta", "p", "n", "nec", "suf", "b"),
    [
        (0.1, 0.01, 1, 100, 23.3, 25.4, 6.9),
        (0.01, 0.001, 5, 10000, 309.0, 325.2, 28.1),
        (0.001, 0.001, 20, 10000, 3090.2, 3252.0, 121.4),
    ],
)
def test_table1_spot_rows(eps, delta, p, n, nec, suf, b):
    assert round(mk.sigma_a_necessary(eps, delta), 1) == nec
    assert round(mk.sigma_a_sufficient(eps, delta), 1) == suf
    assert abs(mk.sigma_b_sufficient(eps, delta, p, n) - b) <= 0.05 + 1e-9


def test_b_root_is_a_root_and_unique():
    eps, delta, p, n = 0.05, 0.01, 3, 50
    s = mk.sigma_b_sufficient(eps, delta, p, n)
    assert abs(float(mk.g_b(s, eps, delta, p, n))) < 1e-8 * eps * s * s
    grid = np.linspace(0.05 * s, 5 * s, 400)
    values = mk.g_b(grid, eps, delta, p, n)
    assert np.all(np.diff(values) > 0)  # increasing: the only root is the largest
    assert np.all(values[grid < s] < 0) and np.all(values[grid > s] > 0)


def test_exact_a_root_has_tail_exactly_delta():
    eps, delta = 0.3, 1e-3
    s = mk.sigma_a_exact(eps, delta)
    # L ~ N(1/(2σ²), 1/σ²) for the worst pair ‖d‖ = 1.
    tail = stats.norm.sf((eps - 1 / (2 * s * s)) * s)
    assert tail == pytest.approx(delta, rel=1e-9)
    assert eps * s * s - mk.normal_upper_quantile(delta) * s - 0.5 == pytest.approx(0, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(1e-3, 1.0), delta=st.floats(1e-8, 0.4))
def test_setting_a_bounds_are_ordered(eps, delta):
    nec = mk.sigma_a_necessary(eps, delta)
    exact = mk.sigma_a_exact(eps, delta)
    suf = mk.sigma_a_sufficient(eps, delta)
    assert nec < exact <= suf * (1 + 1e-12)


@settings(max_examples=20, deadline=None)
@given(eps=st.floats(0.01, 1.0), p=st.integers(1, 6), n=st.integers(20, 400))
def test_setting_b_monotone_in_eps_and_n(eps, p, n):
    s = mk.sigma_b_sufficient(eps, 0.01, p, n)
    assert mk.sigma_b_sufficient(eps * 1.5, 0.01, p, n) < s
    assert mk.sigma_b_sufficient(eps, 0.01, p, 4 * n) <= s * (1 + 1e-9)


def test_calibration_errors_name_the_parameter():
    with pytest.raises(SpecError, match="delta"):
        mk.sigma_a_exact(0.1, 0.7)
    with pytest.raises(SpecError, match="epsilon"):
        mk.sigma_a_sufficient(2.0, 0.01)
    with pytest.raises(SpecError, match="n > p"):
        mk.sigma_b_sufficient(0.1, 0.01, 5, 5)
    with pytest.raises(SpecError, match="setting"):
        mk.calibrate_sigma("D", 0.1, 0.01, 1, 10)


def test_privacy_loss_tail_monte_carlo_with_power(rng):
    """P[L > ε] at the exact σ is δ (within 4 SE); at 0.8σ it is far above δ."""
    eps, delta, p = 0.5, 0.01, 3
    s = mk.sigma_a_exact(eps, delta)
    d = np.zeros(p)
    d[0] = 1.0
    m = 400_000
    e = rng.generator("mc").standard_normal((m, p))
    rate = np.mean(mk.privacy_loss_a(s * e, d, s) > eps)
    se = math.sqrt(delta * (1 - delta) / m)
    assert rate <= delta + 4 * se
    assert abs(rate - delta) < 4 * se
    low = np.mean(mk.privacy_loss_a(0.8 * s * e, d, 0.8 * s) > eps)
    assert low > delta + 10 * se


# ----------------------------------------------------------------------------- Haar sampling


def _unfixed_qr(n: int, g: np.random.Generator) -> np.ndarray:
    return np.linalg.qr(g.standard_normal((n, n)))[0]


def _first_entries(sampler, n: int, reps: int, g: np.random.Generator) -> np.ndarray:
    return np.array([sampler(n, g)[0, 0] for _ in range(reps)])


def test_haar_is_orthogonal(rng):
    m = mk.haar_orthogonal(60, rng.generator("haar"))
    assert np.max(np.abs(m.T @ m - np.eye(60))) < 1e-10


def test_haar_first_column_law_and_power(rng):
    """M[0, 0] of a Haar matrix: M₀₀² ~ Beta(1/2, (n−1)/2) and (M₀₀ + 1)/2 ~
    Beta((n−1)/2, (n−1)/2); QR without the sign correction must fail the signed test."""
    n, reps = 6, 3000
    x = _first_entries(mk.haar_orthogonal, n, reps, rng.generator("haar-law"))
    assert stats.kstest(x**2, stats.beta(0.5, (n - 1) / 2).cdf).pvalue > ALPHA
    signed = stats.beta((n - 1) / 2, (n - 1) / 2).cdf
    assert stats.kstest((x + 1) / 2, signed).pvalue > ALPHA
    bad = _first_entries(_unfixed_qr, n, reps, rng.generator("haar-bad"))
    assert stats.kstest((bad + 1) / 2, signed).pvalue < ALPHA


def test_haar_trace_moments_with_power(rng):
    """E tr M = 0 and E (tr M)² = 1 on O(n) (Diaconis–Shahshahani); unfixed QR is biased."""
    n, reps = 8, 4000
    g = rng.generator("haar-trace")
    t = np.array([np.trace(mk.haar_orthogonal(n, g)) for _ in range(reps)])
    assert abs(t.mean()) < 4 * t.std(ddof=1) / math.sqrt(reps)
    assert abs(np.mean(t**2) - 1) < 4 * np.std(t**2, ddof=1) / math.sqrt(reps)
    gb = rng.generator("haar-trace-bad")
    tb = np.array([np.trace(_unfixed_qr(n, gb)) for _ in range(reps)])
    assert abs(tb.mean()) > 4 * tb.std(ddof=1) / math.sqrt(reps)


def test_stiefel_frame_orthonormal_and_uniform(rng):
    g = rng.generator("frame")
    frames = mk.stiefel_frame(g.standard_normal((3000, 7, 3)))
    gram = np.swapaxes(frames, 1, 2) @ frames
    assert np.max(np.abs(gram - np.eye(3))) < 1e-12
    signed = stats.beta(3.0, 3.0).cdf  # (n − 1)/2 with n = 7
    assert stats.kstest((frames[:, 0, 0] + 1) / 2, signed).pvalue > ALPHA
    assert stats.kstest((frames[:, 4, 2] + 1) / 2, signed).pvalue > ALPHA
    # power: the positive-orthant-biased frame (|G| instead of G) must be rejected
    biased = mk.stiefel_frame(np.abs(g.standard_normal((3000, 7, 3))))
    assert stats.kstest((biased[:, 0, 0] + 1) / 2, signed).pvalue < ALPHA


def test_apply_haar_matches_the_law_of_m_times_z(rng):
    """(M Z)₀₀ = ‖z₀‖ u₁ with u uniform on the sphere, for any fixed Z, rank-deficient too."""
    g = rng.generator("apply")
    z = np.zeros((6, 2))
    z[:, 0] = np.arange(6) / 6.0
    z[:, 1] = 2 * z[:, 0]  # rank 1
    y = mk.apply_haar(np.broadcast_to(z, (3000, 6, 2)), g.standard_normal((3000, 6, 2)))
    assert np.allclose(np.swapaxes(y, 1, 2) @ y, z.T @ z, atol=1e-12)
    u = y[:, 0, 0] / np.linalg.norm(z[:, 0])
    assert stats.kstest((u + 1) / 2, stats.beta(2.5, 2.5).cdf).pvalue > ALPHA


# ----------------------------------------------------------------------------- the release


def test_block_sizes():
    sizes = mk.block_sizes(1003, 100)
    assert sizes.sum() == 1003 and sizes.min() >= 100 and sizes.size == 10
    assert mk.block_sizes(50, None).tolist() == [50]
    with pytest.raises(SpecError, match="block size"):
        mk.block_sizes(50, 1)


def test_ols_identity_setting_b_equals_x_plus_e(rng):
    g = np.random.default_rng(3)
    x = np.column_stack([np.ones(300), g.uniform(-1, 1, (300, 3))]) / 2
    a = mk.mask(x, 0.5, 0.01, rng, setting="A", sigma=12.0, label="ols")
    b = mk.mask(x, 0.5, 0.01, rng, setting="B", sigma=12.0, label="ols")
    blocked = mk.mask(x, 0.5, 0.01, rng, setting="B", sigma=12.0, block=60, label="ols")
    ref = mk.ols(a.values)
    assert np.allclose(mk.ols(b.values), ref, rtol=1e-9, atol=1e-12)
    assert np.allclose(mk.ols(blocked.values), ref, rtol=1e-9, atol=1e-12)
    assert not np.allclose(b.values, a.values)  # the mask really moved the rows
    m = mk.haar_orthogonal(300, rng.generator("explicit"))
    assert np.allclose(mk.ols(m @ a.values), ref, rtol=1e-9, atol=1e-12)


def test_mask_is_reproducible_and_calibrated(rng):
    x = np.random.default_rng(1).uniform(-1, 1, (500, 4))
    r1 = mk.mask(x, 0.1, 0.01, rng, setting="C", block=100)
    r2 = mk.mask(x, 0.1, 0.01, rng, setting="C", block=100)
    assert np.array_equal(r1.values, r2.values)
    assert r1.sigma == mk.sigma_b_sufficient(0.1, 0.01, 4, 100)
    assert r1.block_sizes.tolist() == [100] * 5
    with pytest.raises(SpecError, match="below"):
        mk.mask(x, 0.1, 0.01, rng, setting="A", sigma=1.0)
    with pytest.raises(DataError, match="scale_to_unit"):
        mk.mask(3 * x, 0.1, 0.01, rng)


def test_setting_b_noise_variance(rng):
    """Y = M(X + E) with X = 0: every entry has variance σ² (rotation keeps iid N(0, σ²))."""
    x = np.zeros((2000, 2))
    r = mk.mask(x, 1.0, 0.01, rng, setting="B", block=200)
    v = r.values.ravel()
    assert stats.kstest(v / r.sigma, "norm").pvalue > ALPHA
    assert stats.kstest(v / (1.3 * r.sigma), "norm").pvalue < ALPHA


def test_scale_to_unit():
    raw = np.array([[0.0, 10.0], [5.0, 20.0], [12.0, -3.0]])
    scaled, sc = mk.scale_to_unit(raw, [0.0, 0.0], [10.0, 20.0], neighbours="bounded-difference")
    assert np.all(np.abs(scaled) <= 1) and sc.clipped == 2
    assert np.allclose(sc.inverse(scaled)[1], raw[1])
    s2, sc2 = mk.scale_to_unit(raw, 0.0, [10.0, 20.0])
    assert np.allclose(sc2.scale, sc.scale * 2 * math.sqrt(2))
    corners = np.array([[1.0, 1.0], [-1.0, -1.0]]) / (2 * math.sqrt(2))
    assert np.linalg.norm(corners[0] - corners[1]) == pytest.approx(1.0)
    with pytest.raises(SpecError, match="columns \\[1\\]"):
        mk.scale_to_unit(raw, [0.0, 5.0], [1.0, 5.0])
