"""Extreme privacy parameters end in a BudgetError that states the supported range.

The probe: ε = 1e-300 and 1e300 (and extreme ρ, σ, δ) ended in OverflowError,
ZeroDivisionError, non-converging root finders or endless loops. Every entry point that
turns a budget into a noise scale (or back) now checks its input and its output against
:data:`EPSILON_RANGE`, :data:`RHO_RANGE` and :data:`SCALE_RANGE`.
"""

from __future__ import annotations

import signal

import pytest

from censusdp import budget as B
from censusdp.errors import BudgetError
from censusdp.mechanisms import calibration as C
from censusdp.mechanisms.discrete import DiscreteGaussian, DiscreteLaplace
from censusdp.mechanisms.laws import Gaussian, Laplace

TINY, HUGE = 1e-300, 1e300
EXTREMES = [TINY, HUGE, 5e-324, 1.7e308]

# name -> callable of one extreme value x (the other parameters ordinary)
ENTRY_POINTS = {
    "classical_gaussian_c(ε)": lambda x: C.classical_gaussian_c(x, 1e-6),
    "classical_gaussian_sigma(ε)": lambda x: C.classical_gaussian_sigma(x, 1e-6),
    "classical_gaussian_epsilon(σ)": lambda x: C.classical_gaussian_epsilon(x, 1e-6),
    "analytic_gaussian_sigma(ε)": lambda x: C.analytic_gaussian_sigma(x, 1e-6),
    "analytic_gaussian_delta(ε)": lambda x: C.analytic_gaussian_delta(x, 1.0),
    "analytic_gaussian_delta(σ)": lambda x: C.analytic_gaussian_delta(1.0, x),
    "analytic_gaussian_epsilon(σ)": lambda x: C.analytic_gaussian_epsilon(x, 1e-6),
    "zcdp_gaussian_sigma(ε)": lambda x: C.zcdp_gaussian_sigma(x, 1e-6),
    "zcdp_gaussian_sigma(ε, tight)": lambda x: C.zcdp_gaussian_sigma(x, 1e-6, tight=True),
    "gaussian_sigma_for(ε)": lambda x: C.gaussian_sigma_for(x, 1e-6),
    "laplace_scale(ε)": lambda x: C.laplace_scale(x),
    "laplace_epsilon(b)": lambda x: C.laplace_epsilon(x),
    "dp_to_zcdp(ε)": lambda x: B.dp_to_zcdp(x, 1e-6),
    "dp_to_zcdp(ε, tight)": lambda x: B.dp_to_zcdp(x, 1e-6, tight=True),
    "zcdp_to_dp(ρ)": lambda x: B.zcdp_to_dp(x, 1e-6),
    "zcdp_to_dp_cks(ρ)": lambda x: B.zcdp_to_dp_cks(x, 1e-6),
    "pure_to_zcdp(ε)": lambda x: B.pure_to_zcdp(x),
    "gaussian_rho(σ)": lambda x: B.gaussian_rho(x),
    "gaussian_sigma(ρ)": lambda x: B.gaussian_sigma(x),
    "ZCDPAccountant(ρ)": lambda x: B.ZCDPAccountant(x, 1e-6),
    "PureAccountant(ε)": lambda x: B.PureAccountant(x),
    "statement_for(pure ε)": lambda x: B.statement_for("pure", x),
    "statement_for(zcdp ρ)": lambda x: B.statement_for("zcdp", x),
    "DiscreteGaussian(σ)": lambda x: DiscreteGaussian(x),
    "DiscreteGaussian.from_sigma2": lambda x: DiscreteGaussian.from_sigma2(x),
    "DiscreteGaussian.from_rho": lambda x: DiscreteGaussian.from_rho(x),
    "DiscreteGaussian.from_epsilon_delta(ε)": lambda x: DiscreteGaussian.from_epsilon_delta(
        x, 1e-6
    ),
    "DiscreteLaplace(t)": lambda x: DiscreteLaplace(x),
    "DiscreteLaplace.from_epsilon": lambda x: DiscreteLaplace.from_epsilon(x),
    "Gaussian.from_rho": lambda x: Gaussian.from_rho(x),
    "Gaussian.from_epsilon_delta(ε)": lambda x: Gaussian.from_epsilon_delta(x, 1e-6),
    "Laplace.from_epsilon": lambda x: Laplace.from_epsilon(x),
}


def _alarm(*_):
    raise TimeoutError("did not return within 5 s")


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("x", EXTREMES)
def test_extreme_parameter_gives_budget_error_with_range(name, x):
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(5)
    try:
        with pytest.raises(BudgetError, match=r"supported range|not \(ε, δ"):
            ENTRY_POINTS[name](x)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("delta", [1e-300, 5e-324, 1 - 1e-16])
@pytest.mark.parametrize("eps", [B.EPSILON_RANGE[0] * 10, 1.0, B.EPSILON_RANGE[1]])
def test_extreme_delta_within_the_epsilon_range_is_handled(eps, delta):
    """Every δ in (0, 1) either calibrates (a finite, in-range σ) or says why not."""
    for f in (C.analytic_gaussian_sigma, C.classical_gaussian_sigma, C.zcdp_gaussian_sigma):
        try:
            sigma = f(eps, delta)
        except BudgetError as e:
            assert "supported range" in str(e)
        else:
            assert B.SCALE_RANGE[0] <= sigma <= B.SCALE_RANGE[1]
    try:
        rho = B.dp_to_zcdp(eps, delta, tight=True)
    except BudgetError as e:
        assert "supported range" in str(e)
    else:
        assert B.zcdp_to_dp_cks(rho, delta) <= eps


def test_range_edges_are_accepted():
    lo, hi = B.EPSILON_RANGE
    assert C.laplace_scale(1.0, 1.0) == 1.0
    assert B.pure_to_zcdp(hi) == hi * hi / 2
    assert DiscreteLaplace(B.SCALE_RANGE[1]).scale == B.SCALE_RANGE[1]
    assert DiscreteGaussian(B.SCALE_RANGE[0] * 10).sigma > 0
    assert B.zcdp_to_dp(0.0, 1e-6) == 0.0
    with pytest.raises(BudgetError, match=r"\[1e-12, 10000\]"):
        B.check_epsilon(hi * 2)
