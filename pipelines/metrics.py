"""Error metrics of a release against a truth, by size class, and per-group bias regressions.

:func:`error_metrics` carries the Census Bureau's metric set for its disclosure-avoidance
evaluations (mean absolute error, root mean squared error, mean signed error, mean absolute
percent error, and the count of areas whose error exceeds 10% of their size);
:func:`size_class_metrics` gives it per size class of the areas (0, 1–9, 10–99, 100–999,
1000+ persons, the Bureau's bins).

The bias study of the subspace-DP paper (Gao, Gong & Yu 2022, §1 and §5.1, Fig. 1) regresses,
within each state with more than five counties, the county error (released − true) on
log(true population) by ordinary least squares, and counts the states whose slope is negative
and significantly so (two-sided p < 0.01). A TopDown-style algorithm shows negative slopes
(small areas biased up, large ones down); an unbiased estimator does not, beyond chance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

__all__ = [
    "SIZE_CLASSES",
    "error_metrics",
    "group_regressions",
    "size_class_metrics",
    "slope_summary",
]

#: The Census Bureau's size classes of areas (persons): label → [low, high] inclusive.
SIZE_CLASSES: tuple[tuple[str, float, float], ...] = (
    ("0", 0, 0),
    ("1–9", 1, 9),
    ("10–99", 10, 99),
    ("100–999", 100, 999),
    ("1000+", 1000, np.inf),
)


def error_metrics(
    estimate: np.ndarray, truth: np.ndarray, *, l1_denominator: float | None = None
) -> dict:
    """MAE, RMSE, mean error, normalised L1, MAPE and areas off by more than 10%.

    ``mape`` is the mean over entries with ``truth > 0`` of ``100 |x̃ − x| / x`` (percent);
    ``over_10pct`` counts those entries with ``|x̃ − x| > 0.1 x``. Entries with ``truth = 0``
    have no percent error: they enter neither (``mape`` is NaN when every truth is 0),
    and their errors show in the MAE, RMSE and mean error.

    Parameters
    ----------
    estimate, truth : numpy.ndarray
        Same shape.
    l1_denominator : float, optional
        Denominator of the normalised L1 error ‖x − x̃‖₁ / denominator (default: the number of
        entries, i.e. the MAE). The NYC taxi study of Gao et al. (belief revision, Table 2)
        divides by the total number of nodes of the hierarchy (270).
    """
    est = np.asarray(estimate, dtype=np.float64)
    tru = np.asarray(truth, dtype=np.float64)
    if est.shape != tru.shape:
        raise ValueError(f"estimate shape {est.shape} differs from truth shape {tru.shape}")
    err = est - tru
    n = err.size
    l1 = float(np.abs(err).sum())
    pos = tru > 0
    rel = np.abs(err[pos]) / tru[pos]
    return {
        "n": int(n),
        "mae": l1 / n if n else float("nan"),
        "rmse": float(np.sqrt(np.mean(err**2))) if n else float("nan"),
        "mean_error": float(err.mean()) if n else float("nan"),
        "normalized_l1": l1 / (l1_denominator if l1_denominator else max(n, 1)),
        "mape": float(100.0 * rel.mean()) if rel.size else float("nan"),
        "over_10pct": int(np.count_nonzero(rel > 0.1)),
    }


def size_class_metrics(
    estimate: np.ndarray,
    truth: np.ndarray,
    size: np.ndarray | None = None,
    *,
    classes: Sequence[tuple[str, float, float]] = SIZE_CLASSES,
) -> pd.DataFrame:
    """:func:`error_metrics` of the areas of each size class.

    Parameters
    ----------
    estimate, truth : numpy.ndarray
        One value per area (e.g. its total population), same shape.
    size : numpy.ndarray, optional
        The size that classes each area (default: ``truth``).
    classes : sequence of (label, low, high)
        Inclusive bounds (default :data:`SIZE_CLASSES`).

    Returns
    -------
    pandas.DataFrame
        One row per class, in order (empty classes kept, with ``n`` 0 and NaN metrics):
        ``size_class, n, mae, rmse, mean_error, mape, over_10pct``.
    """
    est = np.asarray(estimate, dtype=np.float64).reshape(-1)
    tru = np.asarray(truth, dtype=np.float64).reshape(-1)
    sz = tru if size is None else np.asarray(size, dtype=np.float64).reshape(-1)
    if not (est.shape == tru.shape == sz.shape):
        raise ValueError(
            f"estimate, truth and size have shapes {est.shape}, {tru.shape}, {sz.shape}; "
            "give one value per area"
        )
    rows = []
    for label, lo, hi in classes:  # a handful of classes
        keep = (sz >= lo) & (sz <= hi)
        m = error_metrics(est[keep], tru[keep])
        rows.append(
            {
                "size_class": label,
                "n": m["n"],
                **{k: m[k] for k in ("mae", "rmse", "mean_error", "mape", "over_10pct")},
            }
        )
    return pd.DataFrame(rows)


def group_regressions(
    error: np.ndarray,
    size: np.ndarray,
    group: Sequence | np.ndarray,
    *,
    min_members: int = 6,
) -> pd.DataFrame:
    """OLS of ``error`` on ``log(size)`` within every group, all groups at once.

    Parameters
    ----------
    error : numpy.ndarray
        Released − true value per unit (e.g. county).
    size : numpy.ndarray
        True size per unit (positive; units of size 0 are dropped: log undefined).
    group : array-like
        Group label per unit (e.g. state FIPS).
    min_members : int
        Groups with fewer members are left out (the paper keeps states with more than five
        counties: ``min_members=6``).

    Returns
    -------
    pandas.DataFrame
        One row per kept group: ``group, n, slope, intercept, se, t, p`` (two-sided p-value
        of the slope, Student t with n − 2 degrees of freedom).

    References
    ----------
    Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022, §5.1 and Figure 1.
    """
    err = np.asarray(error, dtype=np.float64)
    sz = np.asarray(size, dtype=np.float64)
    keep = sz > 0
    codes, labels = pd.factorize(np.asarray(group)[keep], sort=True)
    x = np.log(sz[keep])
    y = err[keep]
    g = codes.astype(np.int64)
    k = len(labels)
    n = np.bincount(g, minlength=k).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = np.bincount(g, x, k) / n
        my = np.bincount(g, y, k) / n
        dx = x - mx[g]
        dy = y - my[g]
        sxx = np.bincount(g, dx * dx, k)
        sxy = np.bincount(g, dx * dy, k)
        slope = sxy / sxx
        intercept = my - slope * mx
        resid = dy - slope[g] * dx
        sse = np.bincount(g, resid * resid, k)
        dof = n - 2
        se = np.sqrt(sse / dof / sxx)
        t = slope / se
        p = 2.0 * stats.t.sf(np.abs(t), dof)
    out = pd.DataFrame(
        {
            "group": labels,
            "n": n.astype(np.int64),
            "slope": slope,
            "intercept": intercept,
            "se": se,
            "t": t,
            "p": p,
        }
    )
    return out[out["n"] >= min_members].reset_index(drop=True)


def slope_summary(regressions: pd.DataFrame, *, alpha: float = 0.01) -> dict:
    """Counts of negative and significantly negative slopes, with the chance expectation.

    The significance key spells alpha without its point: ``significant_negative_001`` for
    alpha = 0.01 (the key of the census-county-bias metrics).

    Under no bias (slope 0), each group's slope is significantly negative with probability
    alpha/2 (two-sided test), so the count is Binomial(groups, alpha/2).
    """
    m = int(len(regressions))
    neg = regressions["slope"] < 0
    sig = neg & (regressions["p"] < alpha)
    q = alpha / 2.0
    return {
        "states": m,
        "negative": int(neg.sum()),
        f"significant_negative_{f'{alpha:g}'.replace('.', '')}": int(sig.sum()),
        "significant_positive": int(((~neg) & (regressions["p"] < alpha)).sum()),
        "chance_expected_significant_negative": m * q,
        "chance_upper_99": int(stats.binom.ppf(0.99, m, q)),
        "mean_slope": float(regressions["slope"].mean()) if m else float("nan"),
    }
