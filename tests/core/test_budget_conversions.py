"""Conversions between pure DP, zCDP and (ε, δ)-DP (censusdp.budget)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from censusdp.budget import (
    dp_to_zcdp,
    gaussian_rho,
    gaussian_sigma,
    pure_to_zcdp,
    zcdp_to_dp,
    zcdp_to_dp_cks,
)
from censusdp.errors import BudgetError

rhos = st.floats(1e-8, 1e3)
deltas = st.floats(1e-15, 0.5)
epsilons = st.floats(1e-4, 1e3)


def _steinke_reference(rho: float, delta: float) -> float:
    """Bisection of Steinke's cdp2adp reference code (the authors' own implementation)."""

    def cdp_delta(eps: float) -> float:
        amin, amax = 1.01, (eps + 1) / (2 * rho) + 2
        for _ in range(1000):
            alpha = (amin + amax) / 2
            if (2 * alpha - 1) * rho - eps + math.log1p(-1.0 / alpha) < 0:
                amin = alpha
            else:
                amax = alpha
        log_d = (alpha - 1) * (alpha * rho - eps) + alpha * math.log1p(-1 / alpha)
        return min(math.exp(log_d) / (alpha - 1.0), 1.0)

    lo, hi = 0.0, rho + 2 * math.sqrt(rho * math.log(1 / delta))
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdp_delta(mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def test_closed_forms():
    assert zcdp_to_dp(1.0, math.exp(-4.0)) == pytest.approx(5.0, rel=1e-15)
    assert zcdp_to_dp(0.0, 1e-5) == 0.0
    assert dp_to_zcdp(5.0, math.exp(-4.0)) == pytest.approx(1.0, rel=1e-14)
    assert pure_to_zcdp(2.0) == 2.0
    assert pure_to_zcdp(0.5) == 0.125
    assert gaussian_rho(1.0) == 0.5
    assert gaussian_rho(2.0, sensitivity=2.0) == 0.5
    assert gaussian_sigma(0.5) == 1.0
    assert gaussian_sigma(2.0, sensitivity=4.0) == 2.0


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.5, 1.0, 10.0, 2.63])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 0.01])
def test_cks_matches_the_authors_reference(rho, delta):
    assert zcdp_to_dp_cks(rho, delta) == pytest.approx(_steinke_reference(rho, delta), rel=1e-9)


@pytest.mark.parametrize("rho, delta", [(0.1, 1e-6), (1.0, 1e-10), (5.0, 0.05)])
def test_cks_is_the_minimum_over_alpha(rho, delta):
    def eps(log_x: float) -> float:  # Cor. 13 solved for ε, α = 1 + exp(log_x)
        a = 1 + math.exp(log_x)
        return a * rho + (math.log(1 / delta) - math.log(a)) / (a - 1) + math.log1p(-1 / a)

    best = minimize_scalar(eps, bounds=(-20, 20), method="bounded", options={"xatol": 1e-12})
    assert zcdp_to_dp_cks(rho, delta) == pytest.approx(best.fun, rel=1e-9)
    # the value is attained, i.e. not below the bound at any α
    assert zcdp_to_dp_cks(rho, delta) <= eps(best.x) + 1e-12


def test_cks_is_zero_for_tiny_rho():
    # (0, δ)-DP is implied when δ dominates: ε(α) < 0 for large α
    assert zcdp_to_dp_cks(1e-6, 0.1) == 0.0
    assert zcdp_to_dp_cks(0.0, 1e-5) == 0.0


@settings(max_examples=200, deadline=None)
@given(rho=rhos, delta=deltas)
def test_cks_never_exceeds_the_simple_bound(rho, delta):
    assert 0.0 <= zcdp_to_dp_cks(rho, delta) <= zcdp_to_dp(rho, delta)


@settings(max_examples=100, deadline=None)
@given(rho=rhos, factor=st.floats(1.001, 10.0), delta=deltas, shrink=st.floats(0.01, 0.999))
def test_conversions_are_monotone(rho, factor, delta, shrink):
    for convert in (zcdp_to_dp, zcdp_to_dp_cks):
        assert convert(rho, delta) <= convert(rho * factor, delta)
        assert convert(rho, delta * shrink) >= convert(rho, delta)


@settings(max_examples=100, deadline=None)
@given(eps=epsilons, delta=deltas, tight=st.booleans())
def test_eps_to_rho_to_eps_round_trip(eps, delta, tight):
    convert = zcdp_to_dp_cks if tight else zcdp_to_dp
    rho = dp_to_zcdp(eps, delta, tight=tight)
    back = convert(rho, delta)
    assert back <= eps  # privacy-safe direction
    assert back == pytest.approx(eps, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(eps=epsilons, delta=deltas)
def test_tight_inverse_gives_more_rho(eps, delta):
    assert dp_to_zcdp(eps, delta, tight=True) >= dp_to_zcdp(eps, delta)


@settings(max_examples=200, deadline=None)
@given(sigma=st.floats(1e-3, 1e4), sens=st.floats(0.1, 100.0))
def test_sigma_rho_sigma_round_trip(sigma, sens):
    assert gaussian_sigma(gaussian_rho(sigma, sens), sens) == pytest.approx(sigma, rel=1e-12)


@pytest.mark.parametrize(
    "call",
    [
        lambda: zcdp_to_dp(-1.0, 1e-5),
        lambda: zcdp_to_dp(1.0, 0.0),
        lambda: zcdp_to_dp_cks(1.0, 1.0),
        lambda: zcdp_to_dp_cks(math.inf, 1e-5),
        lambda: dp_to_zcdp(0.0, 1e-5),
        lambda: dp_to_zcdp(1.0, -1e-5),
        lambda: pure_to_zcdp(-1.0),
        lambda: gaussian_rho(0.0),
        lambda: gaussian_sigma(1.0, sensitivity=math.nan),
    ],
)
def test_invalid_arguments_raise_budget_error(call):
    with pytest.raises(BudgetError):
        call()
