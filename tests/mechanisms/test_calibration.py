"""Calibration: the seeds' c(ε, δ), the analytic Gaussian (Balle & Wang 2018), zCDP
conversions and round trips (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import zcdp_to_dp, zcdp_to_dp_cks
from censusdp.errors import BudgetError
from censusdp.mechanisms.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    classical_gaussian_c,
    classical_gaussian_epsilon,
    classical_gaussian_sigma,
    gaussian_rho,
    gaussian_sigma,
    gaussian_sigma_for,
    laplace_epsilon,
    laplace_scale,
    zcdp_gaussian_sigma,
)

eps_st = st.floats(0.01, 5.0)
delta_st = st.floats(1e-12, 0.1)
sens_st = st.floats(0.1, 50.0)


def test_classical_c_matches_seed_formula():
    assert classical_gaussian_c(0.5, 1e-5) == pytest.approx(
        (1 + math.sqrt(1 + math.log(1e5))) / 0.5, rel=1e-15
    )
    assert classical_gaussian_sigma(0.5, 1e-5, 3.0) == pytest.approx(
        3.0 * classical_gaussian_c(0.5, 1e-5)
    )


def test_analytic_gaussian_known_value_and_tightness():
    # Balle & Wang (2018): ε = 1, δ = 1e-5, Δ = 1 needs σ ≈ 3.73 (classical c gives 4.54)
    sigma = analytic_gaussian_sigma(1.0, 1e-5)
    assert sigma == pytest.approx(3.73, abs=0.01)
    assert analytic_gaussian_delta(1.0, sigma) <= 1e-5
    assert analytic_gaussian_delta(1.0, sigma * (1 - 1e-6)) > 1e-5
    # the large-δ branch of Algorithm 1 (δ ≥ δ₀)
    sigma = analytic_gaussian_sigma(0.05, 0.4)
    assert analytic_gaussian_delta(0.05, sigma) <= 0.4
    assert analytic_gaussian_delta(0.05, sigma * (1 - 1e-6)) > 0.4


@settings(max_examples=60, deadline=None)
@given(eps_st, delta_st, sens_st)
def test_analytic_round_trip_and_never_worse_than_classical(eps, delta, sens):
    sigma = analytic_gaussian_sigma(eps, delta, sens)
    assert analytic_gaussian_delta(eps, sigma, sens) <= delta
    back = analytic_gaussian_epsilon(sigma, delta, sens)
    assert back <= eps * (1 + 1e-9)
    assert back == pytest.approx(eps, rel=1e-6)


def test_seed_constant_is_not_a_valid_calibration_everywhere():
    # c(ε, δ) of the seeds (Lemma 13) is looser than the exact minimum for moderate δ ...
    assert analytic_gaussian_sigma(0.5, 1e-6) < classical_gaussian_sigma(0.5, 1e-6)
    assert analytic_gaussian_delta(0.5, classical_gaussian_sigma(0.5, 1e-6)) <= 1e-6
    # ... but falls short for small δ: at (ε, δ) = (0.5, 1e-12) it is only (0.5, 1.6e-12)-DP
    sigma = classical_gaussian_sigma(0.5, 1e-12)
    assert analytic_gaussian_delta(0.5, sigma) > 1e-12
    assert sigma < analytic_gaussian_sigma(0.5, 1e-12)


@settings(max_examples=60, deadline=None)
@given(eps_st, delta_st, sens_st)
def test_classical_round_trip(eps, delta, sens):
    sigma = classical_gaussian_sigma(eps, delta, sens)
    assert classical_gaussian_epsilon(sigma, delta, sens) == pytest.approx(eps, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-4, 10.0), sens_st)
def test_sigma_rho_round_trip(rho, sens):
    assert gaussian_rho(gaussian_sigma(rho, sens), sens) == pytest.approx(rho, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(eps_st, delta_st, sens_st)
def test_zcdp_sigma_spends_at_most_epsilon(eps, delta, sens):
    for tight, conv in ((False, zcdp_to_dp), (True, zcdp_to_dp_cks)):
        sigma = zcdp_gaussian_sigma(eps, delta, sens, tight=tight)
        assert conv(gaussian_rho(sigma, sens), delta) <= eps * (1 + 1e-12)
    assert zcdp_gaussian_sigma(eps, delta, sens, tight=True) <= zcdp_gaussian_sigma(
        eps, delta, sens
    ) * (1 + 1e-12)


def test_laplace_and_dispatch():
    assert laplace_epsilon(laplace_scale(0.3, 2.0), 2.0) == pytest.approx(0.3)
    for m in ("classical", "analytic", "zcdp", "zcdp_cks"):
        assert gaussian_sigma_for(0.5, 1e-6, 1.0, m) > 0
    with pytest.raises(BudgetError):
        gaussian_sigma_for(0.5, 1e-6, 1.0, "bogus")
    with pytest.raises(BudgetError):
        classical_gaussian_c(0.5, 1.5)
    with pytest.raises(BudgetError):
        laplace_scale(-1.0)


def test_analytic_is_the_default_and_classical_an_explicit_option():
    """Every (ε, δ) Gaussian calibration defaults to the analytic Gaussian (exact δ); the
    seeds' classical c(ε, δ) is kept as an explicit option for reproducing the papers."""
    import numpy as np

    from censusdp.mechanisms.laws import Gaussian
    from censusdp.mechanisms.subspace import projected_gaussian
    from censusdp.rng import KeyedRNG

    eps, delta, sens = 3.0, 1e-12, 2.0
    analytic = analytic_gaussian_sigma(eps, delta, sens)
    assert gaussian_sigma_for(eps, delta, sens) == analytic
    assert Gaussian.from_epsilon_delta(eps, delta, sens).sigma == analytic
    assert analytic_gaussian_delta(eps, analytic, sens) <= delta
    classical = gaussian_sigma_for(eps, delta, sens, "classical")
    assert classical == classical_gaussian_sigma(eps, delta, sens)
    # the classical multiplier does not deliver δ at large ε (the reason for the default)
    assert analytic_gaussian_delta(eps, classical, sens) > delta
    rng = KeyedRNG.reproducible(0, warn=False)
    h = np.arange(6, dtype=float)
    A = np.eye(6) * sens
    rel = projected_gaussian(A, h, np.ones((1, 6)), eps, delta, rng)
    assert rel.noise_scale == analytic
    seed_rel = projected_gaussian(A, h, np.ones((1, 6)), eps, delta, rng, calibration="classical")
    assert seed_rel.noise_scale == classical
