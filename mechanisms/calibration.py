"""Noise calibration: the functions that tie ε, δ, ρ, σ and b together.

* Laplace: b = Δ₁/ε and back.
* Classical (ε, δ) Gaussian, as used in the subspace-DP seeds: c(ε, δ) = (1 + √(1 + ln(1/δ)))/ε
  and σ = c·Δ₂ (Gao, Gong & Yu 2022, Lemma 13).
* Analytic Gaussian mechanism: the smallest σ that is exactly (ε, δ)-DP (Balle & Wang 2018,
  Theorem 8 and Algorithm 1), with scipy's normal CDF and Brent root finding.
* zCDP: σ = Δ₂/√(2ρ) and ρ from (ε, δ) by :func:`censusdp.budget.dp_to_zcdp`.

The seeds' constant c(ε, δ) is *not* a valid (ε, δ) calibration for every (ε, δ): the exact
privacy profile (Balle & Wang, Thm. 8) shows σ = c(0.5, 10⁻¹²)·Δ₂ is only
(0.5, 1.6·10⁻¹²)-DP. It is kept, as the explicit option ``"classical"``, because the seeds use it (and
reproductions of their figures need it); ``"analytic"``, exact by construction, is the default
of every function that calibrates a Gaussian to (ε, δ). Any σ is ρ-zCDP with
ρ = Δ₂²/(2σ²), which is what the accountants compose.

Every function that returns a noise scale rounds in the privacy-safe direction: the scale it
returns never spends more than the stated budget (checked after root finding, and nudged up
by one ulp at a time when needed).

References
----------
Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", 2014, Thm. 3.6 (Laplace)
and Thm. A.1 (classical Gaussian).
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022, Lemma 13 (c(ε, δ)).
Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy: Analytical
Calibration and Optimal Denoising", ICML 2018, Theorem 8 (exact δ(ε) of a Gaussian) and
Algorithm 1 (analytic Gaussian mechanism).
Bun & Steinke (2016), Prop. 1.3 and 1.6; Canonne, Kamath & Steinke (2020), Cor. 13.
"""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.special import log_ndtr

from censusdp.budget import (
    EPSILON_RANGE,
    Accounting,
    check_delta,
    check_epsilon,
    check_positive,
    check_scale,
    dp_to_zcdp,
    gaussian_rho,
    gaussian_sigma,
)
from censusdp.errors import BudgetError

__all__ = [
    "GAUSSIAN_CALIBRATIONS",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "classical_gaussian_c",
    "classical_gaussian_epsilon",
    "classical_gaussian_sigma",
    "gaussian_rho",
    "gaussian_sigma",
    "gaussian_sigma_for",
    "laplace_epsilon",
    "laplace_scale",
    "zcdp_gaussian_sigma",
]

#: Names accepted by :func:`gaussian_sigma_for`. The zCDP calibration is named after its
#: accountant (σ from the largest ρ whose conversion gives (ε, δ)), so its name is the
#: accountant's; ``"zcdp_cks"`` is the same through the tight conversion.
GAUSSIAN_CALIBRATIONS = ("classical", "analytic", Accounting.ZCDP.value, "zcdp_cks")


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """b = Δ₁/ε (Dwork & Roth 2014, Thm. 3.6)."""
    b = check_positive("sensitivity", sensitivity) / check_epsilon(epsilon)
    return check_scale(b, "the resulting Laplace scale")


def laplace_epsilon(scale: float, sensitivity: float = 1.0) -> float:
    """ε = Δ₁/b."""
    eps = check_positive("sensitivity", sensitivity) / check_scale(scale, "scale")
    return check_epsilon(eps, "the resulting epsilon")


def classical_gaussian_c(epsilon: float, delta: float) -> float:
    """c(ε, δ) = (1 + √(1 + ln(1/δ)))/ε, the seeds' Gaussian multiplier.

    References
    ----------
    Gao, Gong & Yu (2022), Lemma 13.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    return (1.0 + math.sqrt(1.0 + -math.log(delta))) / epsilon


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """σ = c(ε, δ)·Δ₂ (Gao, Gong & Yu 2022, Lemma 13)."""
    sigma = classical_gaussian_c(epsilon, delta) * check_positive("sensitivity", sensitivity)
    return check_scale(sigma, "the resulting sigma")


def classical_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The ε of :func:`classical_gaussian_sigma` at a given σ: ε = (1 + √(1 + ln(1/δ)))·Δ₂/σ."""
    sigma = check_scale(sigma, "sigma")
    sensitivity = check_positive("sensitivity", sensitivity)
    eps = (1.0 + math.sqrt(1.0 + -math.log(check_delta(delta)))) * sensitivity / sigma
    return check_epsilon(eps, "the resulting epsilon")


def analytic_gaussian_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """The exact δ at which N(0, σ²) noise on a query of ℓ₂ sensitivity Δ is (ε, δ)-DP.

    δ(ε) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), evaluated in log space.

    References
    ----------
    Balle & Wang (2018), Theorem 8.
    """
    epsilon = float(epsilon)
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise BudgetError(f"epsilon must be a non-negative finite number, got {epsilon!r}")
    if epsilon > 0:
        epsilon = check_epsilon(epsilon)
    sigma = check_scale(sigma, "sigma")
    sensitivity = check_positive("sensitivity", sensitivity)
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return _gap(float(log_ndtr(a - b)), epsilon + float(log_ndtr(-a - b)))


def _gap(log_a: float, log_b: float) -> float:
    """``e^{log_a} − e^{log_b}`` when positive, else 0, without cancellation (NaN stays NaN)."""
    return 0.0 if log_b >= log_a else math.exp(log_a) * -math.expm1(log_b - log_a)


def analytic_gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float = 1.0, *, tol: float = 1e-12
) -> float:
    """The smallest σ such that the Gaussian mechanism is (ε, δ)-DP (analytic calibration).

    Algorithm 1 of Balle & Wang (2018): with δ₀ = Φ(0) − e^ε Φ(−√(2ε)),

    * if δ ≥ δ₀, v* = sup{v ≥ 0 : B⁺(v) ≤ δ}, B⁺(v) = Φ(√(εv)) − e^ε Φ(−√(ε(v+2))),
      α = √(1 + v*/2) − √(v*/2);
    * else u* = inf{u ≥ 0 : B⁻(u) ≤ δ}, B⁻(u) = Φ(−√(εu)) − e^ε Φ(−√(ε(u+2))),
      α = √(1 + u*/2) + √(u*/2);

    and σ = α·Δ/√(2ε). The root is found by Brent's method and the result is then checked
    against the exact δ(ε) of :func:`analytic_gaussian_delta` and increased by ulps until it
    does not exceed δ.

    References
    ----------
    Balle & Wang (2018), Algorithm 1 and Theorem 8.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)

    def bound(v: float, sign: float) -> float:  # B⁺(v) for sign +1, B⁻(v) for −1
        return _gap(
            float(log_ndtr(sign * math.sqrt(epsilon * v))),
            epsilon + float(log_ndtr(-math.sqrt(epsilon * (v + 2.0)))),
        )

    # B⁺ increases in v, B⁻ decreases in u: double the bracket until it crosses δ
    sign = 1.0 if delta >= bound(0.0, 1.0) else -1.0
    hi = 1.0
    while (bound(hi, sign) <= delta) == (sign > 0):
        hi *= 2.0
    v = brentq(lambda x: bound(x, sign) - delta, 0.0, hi, xtol=tol, rtol=1e-15, maxiter=1000)
    alpha = math.sqrt(1.0 + v / 2.0) - sign * math.sqrt(v / 2.0)
    sigma = check_scale(alpha * sensitivity / math.sqrt(2.0 * epsilon), "the resulting sigma")
    step = 0
    while analytic_gaussian_delta(epsilon, sigma, sensitivity) > delta:
        # one ulp first, then geometrically larger steps (an inaccurate root costs a few
        # dozen evaluations, never billions)
        sigma = check_scale(sigma * (1.0 + 2.0**-52 * 2.0**step), "the resulting sigma")
        step += 1
    return sigma


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest ε with N(0, σ²) noise (ε, δ)-DP (Balle & Wang 2018, Thm. 8, inverted).

    δ(ε) decreases in ε; the root is found by Brent's method and rounded up (the returned ε
    satisfies δ(ε) ≤ δ).
    """
    sigma = check_scale(sigma, "sigma")
    delta = check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    if analytic_gaussian_delta(0.0, sigma, sensitivity) <= delta:
        return 0.0
    hi = 1.0
    while analytic_gaussian_delta(hi, sigma, sensitivity) > delta:
        if hi >= EPSILON_RANGE[1]:
            raise BudgetError(
                f"σ = {sigma:g} at ℓ₂ sensitivity {sensitivity:g} is not (ε, δ = {delta:g})-DP "
                f"for any ε up to {EPSILON_RANGE[1]:g}: the noise is too small for this δ"
            )
        hi = min(2.0 * hi, EPSILON_RANGE[1])
    eps = brentq(
        lambda e: analytic_gaussian_delta(e, sigma, sensitivity) - delta,
        0.0,
        hi,
        xtol=1e-14,
        rtol=1e-15,
    )
    step = 0
    while analytic_gaussian_delta(eps, sigma, sensitivity) > delta:
        eps = check_epsilon(eps * (1.0 + 2.0**-52 * 2.0**step), "the resulting epsilon")
        step += 1
    return eps


def zcdp_gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float = 1.0, *, tight: bool = False
) -> float:
    """σ = Δ₂/√(2ρ) with ρ the largest zCDP budget that converts to (ε, δ).

    ``tight`` uses the Canonne–Kamath–Steinke conversion (:func:`censusdp.budget.zcdp_to_dp_cks`).
    """
    return gaussian_sigma(dp_to_zcdp(epsilon, delta, tight=tight), sensitivity)


def gaussian_sigma_for(
    epsilon: float, delta: float, sensitivity: float = 1.0, method: str = "analytic"
) -> float:
    """The Gaussian σ for (ε, δ)-DP by the named calibration.

    Parameters
    ----------
    method : {"analytic", "classical", "zcdp", "zcdp_cks"}
        The analytic Gaussian (the default: the smallest σ that is exactly (ε, δ)-DP, for
        every ε > 0 and δ ∈ (0, 1)); the seeds' c(ε, δ)·Δ₂, kept for reproducing the papers
        (it does not deliver the stated δ for small δ or large ε: see the module notes); σ
        from the largest ρ whose simple (Bun–Steinke) or tight (CKS) conversion gives (ε, δ).

    Raises
    ------
    BudgetError
        Unknown method.
    """
    if method == "classical":
        return classical_gaussian_sigma(epsilon, delta, sensitivity)
    if method == "analytic":
        return analytic_gaussian_sigma(epsilon, delta, sensitivity)
    if method in (Accounting.ZCDP, "zcdp_cks"):
        return zcdp_gaussian_sigma(epsilon, delta, sensitivity, tight=method == "zcdp_cks")
    raise BudgetError(
        f"unknown Gaussian calibration {method!r}; choose one of {GAUSSIAN_CALIBRATIONS}"
    )
