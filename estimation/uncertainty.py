"""Standard errors, normal intervals and coverage for linear (GLS) releases.

A GLS estimate is linear in the noise, so its error covariance is exact; with Gaussian noise
the error is exactly normal and ``estimate ± z_{1−α/2} · se`` covers at the nominal rate. For
other noise laws (Laplace, discrete) the interval is the normal approximation, accurate when
many measurements contribute to a value. Rounding adds the variance p(1 − p) ≤ 1/4 of a value
with fractional part p (conditionally on the real-valued estimate; it is unbiased, so the
variances add).

References
----------
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022 — the projected noise law is public,
so the covariance of every released number is exact (§4).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from censusdp.errors import SpecError
from censusdp.estimation.release import Release
from censusdp.estimation.rounding import rounding_variance

__all__ = ["standard_errors", "intervals", "coverage", "rounding_variance"]


def _z(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise SpecError(f"alpha must be in (0, 1), got {alpha}")
    return float(norm.ppf(1.0 - alpha / 2.0))


def standard_errors(
    release: Release, level: str | int, *, include_rounding: bool = False
) -> np.ndarray:
    """Exact standard errors at one level, (n_nodes, n_cells).

    With ``include_rounding`` the rounding variance p(1 − p) of the (real-valued) estimates is
    added (use it on a real-valued release that you will round).

    Raises
    ------
    SpecError
        When the release has no variances (e.g. TopDown-style output).
    """
    k = release.hierarchy.level_index(level)
    if release.variances is None:
        raise SpecError(
            f"the {release.estimator!r} release has no variances; standard errors are "
            "defined for GLS (exact) and averaged MCMC (Monte Carlo) output"
        )
    var = release.variances[k]
    if include_rounding:
        var = var + rounding_variance(release.estimates[k])
    return np.sqrt(var)


def intervals(
    release: Release, level: str | int, alpha: float = 0.1, *, include_rounding: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Normal ``1 − alpha`` intervals ``estimate ∓ z · se`` at one level.

    Returns
    -------
    lower, upper : numpy.ndarray
        (n_nodes, n_cells) each.
    """
    se = standard_errors(release, level, include_rounding=include_rounding)
    est = release.level(level).astype(float)
    half = _z(alpha) * se
    return est - half, est + half


def coverage(
    estimates: np.ndarray, truths: np.ndarray, ses: np.ndarray, alpha: float = 0.1
) -> float:
    """Share of ``|estimate − truth| ≤ z_{1−α/2} · se`` (entries with se = 0 must be exact)."""
    est, tru, se = (np.asarray(a, dtype=float) for a in (estimates, truths, ses))
    if not (est.shape == tru.shape == se.shape):
        raise SpecError("estimates, truths and ses must have the same shape")
    if est.size == 0:
        raise SpecError("coverage of an empty set is undefined")
    hit = np.abs(est - tru) <= _z(alpha) * se + 1e-9 * (1.0 + np.abs(tru))
    return float(hit.mean())
