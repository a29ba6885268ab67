"""Statistical test helpers shared by the test modules (``pythonpath`` in pyproject.toml puts
this directory on ``sys.path``: ``from stattests import chi2_pvalue``)."""

from __future__ import annotations

import numpy as np
import scipy.stats as st

__all__ = ["chi2_pvalue"]


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
