"""Continuous laws: KS at α = 1e-6 on 100,000 draws, with power against 0.7× and 1.3× scales;
normalised log-densities; calibration classmethods."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from censusdp.mechanisms.laws import Gaussian, Laplace

ALPHA = 1e-6
N = 100_000


@pytest.mark.parametrize(
    ("law", "dist"),
    [
        (Laplace(10.0), lambda s: stats.laplace(scale=s)),
        (Laplace(0.3), lambda s: stats.laplace(scale=s)),
        (Gaussian(10.0), lambda s: stats.norm(scale=s)),
        (Gaussian(2.5), lambda s: stats.norm(scale=s)),
    ],
)
def test_ks_fit_and_power(rng, law, dist):
    scale = law.scale if isinstance(law, Laplace) else law.sigma
    x = law.sample(rng.generator(f"cont/{law!r}"), N)
    assert x.dtype == np.float64 and x.shape == (N,)
    assert stats.kstest(x, dist(scale).cdf).pvalue > ALPHA
    for factor in (0.7, 1.3):
        assert stats.kstest(x, dist(scale * factor).cdf).pvalue < ALPHA


@pytest.mark.parametrize("law", [Laplace(2.0), Gaussian(1.7)])
def test_log_density_normalised_and_variance(law):
    total, _ = integrate.quad(lambda t: math.exp(law.log_density(np.array(t))), -np.inf, np.inf)
    assert total == pytest.approx(1.0, abs=1e-9)
    second, _ = integrate.quad(
        lambda t: t * t * math.exp(law.log_density(np.array(t))), -np.inf, np.inf
    )
    assert law.variance == pytest.approx(second, rel=1e-8)


def test_calibration_classmethods():
    assert Laplace.from_epsilon(0.5, 2.0).privacy(2.0) == pytest.approx(0.5)
    assert Laplace.from_epsilon_delta(0.5, 1e-6, 2.0).scale == 4.0
    g = Gaussian.from_rho(0.25, 3.0)
    assert g.privacy(3.0) == pytest.approx(0.25)
    c = (1 + math.sqrt(1 + math.log(1e6))) / 0.5
    classical = Gaussian.from_epsilon_delta(0.5, 1e-6, 2.0, method="classical")
    assert classical.sigma == pytest.approx(2.0 * c)
    analytic = Gaussian.from_epsilon_delta(0.5, 1e-6, 2.0, method="analytic")
    assert analytic.sigma < 2.0 * c
    assert Gaussian.from_epsilon_delta(0.5, 1e-6, 2.0).sigma == analytic.sigma  # the default
    with pytest.raises(ValueError):
        Laplace(-1.0)
    with pytest.raises(ValueError):
        Gaussian(float("inf"))
