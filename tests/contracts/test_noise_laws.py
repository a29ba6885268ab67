"""Contracts every noise law that :mod:`censusdp.mechanisms` exports must keep.

Run over :data:`LAWS`, the noise-law registry (a new law is tested the moment it registers),
each at three scales:

* the sampler draws from the law its ``log_density`` describes: Pearson χ² at α = 1e-6 on
  100,000 draws (integers: one bin per value; continuous: bins of a tenth of a standard
  deviation with exact bin masses by quadrature), and the same draws reject the law with a
  30% larger or smaller scale at α = 1e-6 (power);
* ``log_density`` is normalised and ``variance`` is its second moment; the sample variance
  agrees with it (z-test at α = 1e-6) and rejects the 30%-wrong scale;
* the ℓ₁/ℓ₂ capabilities the MCMC samplers rely on (``l1_rate``, ``l2_precision``) match
  ``log_density``;
* calibration round trip: the law calibrated to a budget (ε or ρ by its ``accounting``) on a
  query of sensitivity Δ reports that budget back from ``privacy(Δ)`` — never more — and so
  does the spec layer's ``make_law``; privacy scales as Δ (pure) or Δ² (zCDP);
* integer laws draw int64 integers, continuous ones float64.

The statistical tests are Fisher's (goodness of fit) and Pearson's (1900); variances of the
sample variance follow Cramér (1946, §27.4).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from scipy import integrate, stats
from stattests import chi2_pvalue

import censusdp.mechanisms as mechanisms
from censusdp.mechanisms import NoiseLaw, Query
from censusdp.mechanisms.registry import NOISE_LAWS
from censusdp.pipelines.plan import make_law

ALPHA = 1e-6
N = 100_000
#: |z| beyond this rejects at two-sided α
Z_CRIT = float(stats.norm.isf(ALPHA / 2))


#: Every registered noise law (:data:`~censusdp.mechanisms.registry.NOISE_LAWS`): a law is
#: tested the moment it registers.
LAWS: tuple[type[NoiseLaw], ...] = tuple(NOISE_LAWS.get(n).law for n in NOISE_LAWS.names())


def test_every_exported_law_is_registered():
    exported = {
        obj
        for name in mechanisms.__all__
        if isinstance(obj := getattr(mechanisms, name), type)
        and issubclass(obj, NoiseLaw)
        and not inspect.isabstract(obj)
    }
    assert exported <= set(LAWS)


#: Standard scales (Laplace b, Gaussian σ, discrete t or σ) each law is tested at.
SCALES = (0.8, 3.0, 10.0)


def budget_for(cls: type[NoiseLaw], scale: float, sens: float = 1.0) -> float:
    """The budget (ε or ρ by accounting) whose calibrated law has this scale."""
    if cls.accounting == "pure":
        return sens / scale
    if cls.accounting == "zcdp":
        return sens**2 / (2.0 * scale**2)
    raise AssertionError(f"{cls.__name__}: unknown accounting {cls.accounting!r}")


def calibrated(cls: type[NoiseLaw], budget: float, sens: float = 1.0) -> NoiseLaw:
    """The law of ``cls`` spending ``budget`` on a query of sensitivity ``sens``."""
    if cls.accounting == "pure":
        return cls.from_epsilon(budget, sens)
    return cls.from_rho(budget, sens)


def law_at(cls: type[NoiseLaw], scale: float) -> NoiseLaw:
    return calibrated(cls, budget_for(cls, scale))


def _density(law: NoiseLaw, t: float) -> float:
    return math.exp(float(law.log_density(np.array([t]))[0]))


def bin_probabilities(law: NoiseLaw, edges: np.ndarray) -> np.ndarray:
    """Masses of (−∞, e₀), [e₀, e₁), …, [e_m, ∞) under a continuous law, by quadrature."""
    inner = [
        integrate.quad(lambda t: _density(law, t), a, b)[0]
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    ]
    lo = integrate.quad(lambda t: _density(law, t), -np.inf, edges[0])[0]
    hi = integrate.quad(lambda t: _density(law, t), edges[-1], np.inf)[0]
    return np.array([lo, *inner, hi])


def fit_pvalue(draws: np.ndarray, law: NoiseLaw, grid_std: float) -> float:
    """χ² p-value of ``draws`` against ``law``; continuous bins are ``grid_std``/10 wide."""
    if law.is_integer:
        radius = math.ceil(12 * grid_std) + 2
        xs = np.arange(-radius, radius + 1)
        return chi2_pvalue(draws, law.log_density(xs), xs)
    edges = grid_std * np.linspace(-6.0, 6.0, 121)
    probs = bin_probabilities(law, edges)
    bins = np.searchsorted(edges, draws, side="right")  # 0: below e₀, len(edges): above
    with np.errstate(divide="ignore"):
        return chi2_pvalue(bins, np.log(probs), np.arange(probs.size))


def second_moment(law: NoiseLaw) -> tuple[float, float]:
    """(total mass, second moment) of ``law`` from its log-density alone."""
    if law.is_integer:
        radius = math.ceil(60 * law.std) + 20
        k = np.arange(-radius, radius + 1)
        pm = np.exp(law.log_density(k))
        return float(pm.sum()), float((k.astype(float) ** 2 * pm).sum())
    mass = integrate.quad(lambda t: _density(law, t), -np.inf, np.inf, epsabs=1e-13)[0]
    m2 = integrate.quad(lambda t: t * t * _density(law, t), -np.inf, np.inf, epsrel=1e-11)[0]
    return mass, m2


def test_the_package_exports_every_known_law():
    names = {cls.name for cls in LAWS}
    assert {"laplace", "gaussian", "discrete_laplace", "discrete_gaussian"} <= names
    assert len(names) == len(LAWS), "two exported laws share a name"


@pytest.mark.parametrize("cls", LAWS, ids=lambda c: c.name)
@pytest.mark.parametrize("scale", SCALES)
def test_sampler_matches_the_law_and_rejects_a_30_percent_wrong_scale(cls, scale, rng):
    law = law_at(cls, scale)
    draws = law.sample(rng.generator(f"contract/{cls.name}/{scale}"), N)
    assert draws.shape == (N,)
    assert draws.dtype == (np.int64 if cls.is_integer else np.float64)
    p = fit_pvalue(draws, law, law.std)
    assert p > ALPHA, f"{law!r}: the draws do not follow log_density (p = {p:.3g})"
    for factor in (0.7, 1.3):
        wrong = law_at(cls, scale * factor)
        p_bad = fit_pvalue(draws, wrong, law.std)
        assert p_bad < ALPHA, f"{law!r}: no power against {wrong!r} (p = {p_bad:.3g})"


@pytest.mark.parametrize("cls", LAWS, ids=lambda c: c.name)
@pytest.mark.parametrize("scale", SCALES)
def test_log_density_is_normalised_and_variance_is_its_second_moment(cls, scale):
    law = law_at(cls, scale)
    mass, m2 = second_moment(law)
    assert mass == pytest.approx(1.0, abs=1e-9)
    assert law.variance == pytest.approx(m2, rel=1e-8)
    assert law.std == pytest.approx(math.sqrt(m2), rel=1e-8)


@pytest.mark.parametrize("cls", LAWS, ids=lambda c: c.name)
@pytest.mark.parametrize("scale", SCALES)
def test_sample_variance_agrees_and_rejects_a_30_percent_wrong_scale(cls, scale, rng):
    law = law_at(cls, scale)
    x = law.sample(rng.generator(f"contract-var/{cls.name}/{scale}"), N).astype(np.float64)
    s2 = x.var()
    # Var(s²) ≈ (μ₄ − σ⁴)/n, estimated from the draws
    se = math.sqrt((np.mean((x - x.mean()) ** 4) - s2**2) / N)
    assert abs(s2 - law.variance) < Z_CRIT * se, (law, s2, law.variance, se)
    for factor in (0.7, 1.3):
        wrong = law_at(cls, scale * factor)
        assert abs(s2 - wrong.variance) > Z_CRIT * se, (law, wrong)


@pytest.mark.parametrize("cls", LAWS, ids=lambda c: c.name)
def test_line_capabilities_match_the_log_density(cls):
    law = law_at(cls, 3.0)
    x = np.arange(-40, 41).astype(np.float64) if cls.is_integer else np.linspace(-40, 40, 97)
    rel = law.log_density(x) - law.log_density(np.zeros(1))
    if law.l1_rate is not None:
        np.testing.assert_allclose(rel, -law.l1_rate * np.abs(x), rtol=1e-12, atol=1e-12)
    if law.l2_precision is not None:
        np.testing.assert_allclose(rel, -0.5 * law.l2_precision * x * x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", LAWS, ids=lambda c: c.name)
@pytest.mark.parametrize("sens", [1, 2, 3])
@pytest.mark.parametrize("scale", SCALES)
def test_calibration_round_trip_spends_the_budget_and_never_more(cls, sens, scale):
    budget = budget_for(cls, scale, sens)
    law = calibrated(cls, budget, sens)
    assert isinstance(law, cls)
    spent = law.privacy(sens)
    assert spent <= budget * (1 + 1e-12), f"{law!r} spends {spent} > {budget}"
    assert spent == pytest.approx(budget, rel=2e-3)
    power = 1 if cls.accounting == "pure" else 2
    assert law.privacy(2 * sens) == pytest.approx(2**power * spent, rel=1e-12)
    # the spec layer: the law of the same name calibrated on a query of sensitivity sens
    query = Query("scaled", np.full((1, 1), sens, dtype=np.int64), ("scaled",))
    assert query.sensitivity(power) == sens
    assert NOISE_LAWS.get(cls.name).accounting == cls.accounting
    spec_law = make_law(cls.name, budget, query)
    assert type(spec_law) is cls
    assert spec_law.privacy(sens) == spent
    assert spec_law.variance == law.variance
