"""Statistical test helpers shared by the test modules (``pythonpath`` in pyproject.toml puts
this directory on ``sys.path``: ``from stattests import chi2_pvalue``)."""

from __future__ import annotations

import numpy as np
import scipy.stats as st

__all__ = ["chi2_pvalue", "covariance_z", "z_bound"]


def chi2_pvalue(draws: np.ndarray, log_pmf: np.ndarray, xs: np.ndarray) -> float:
    """Pearson chi-square p-value of integer ``draws`` against the pmf ``exp(log_pmf)`` on the
    support points ``xs``: points expected fewer than 5 times are pooled with the mass outside
    ``xs`` into one bin."""
    expected = np.exp(log_pmf) * draws.size
    values, counts_all = np.unique(draws, return_counts=True)
    lookup = dict(zip(values.tolist(), counts_all.tolist(), strict=True))
    counts = np.array([lookup.get(float(x), 0) for x in xs])
    keep = expected >= 5
    obs = np.append(counts[keep], draws.size - counts[keep].sum())
    exp = np.append(expected[keep], draws.size - expected[keep].sum())
    ok = exp > 0
    return float(st.chisquare(obs[ok], exp[ok] * obs[ok].sum() / exp[ok].sum()).pvalue)


def z_bound(alpha: float, n_tests: int) -> float:
    """Two-sided normal critical value for ``n_tests`` simultaneous tests at family level
    ``alpha`` (Bonferroni)."""
    return float(st.norm.isf(alpha / (2 * max(n_tests, 1))))


def covariance_z(draws: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """z-scores of the sample covariance of ``draws`` (rows independent) against ``cov``, entry by
    entry: under a normal law Var(S_ij) = (Σ_ii Σ_jj + Σ_ij²) / (n − 1) (Anderson 2003, §3.3).
    Entries whose reference variance is zero get 0 when matched exactly and ∞ otherwise."""
    n = draws.shape[0]
    diff = np.cov(draws, rowvar=False) - cov
    d = np.diag(cov)
    sd = np.sqrt((np.outer(d, d) + cov**2) / (n - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(diff) / sd
    return np.where(sd > 0, z, np.where(np.abs(diff) < 1e-9, 0.0, np.inf))
