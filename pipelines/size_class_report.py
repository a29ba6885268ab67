"""Both products' errors by size class, and the non-negative product's bias by simulation.

A release ships two products from one run (:mod:`censusdp.estimation.integer.nonnegative`): the
unbiased one (GLS, unbiased rounding, standard errors) and the non-negative one (consistent
non-negative integers, biased). Users need to know how large that bias is for areas of
their size. The Census Bureau reports its disclosure-avoidance errors per geographic level
and size class (0, 1–9, 10–99, 100–999, 1000+ persons) with one metric set — mean absolute
error, root mean squared error, mean signed error, mean absolute percent error and the count
of areas off by more than 10% (:func:`~censusdp.pipelines.metrics.size_class_metrics`).

**Publishable: the bias by simulation from the released estimates.** The released
non-negative block histogram is taken as a pseudo-truth; the measurements are drawn again
``R`` times from it with the same strategy and budget, both products are made again each
time, and their errors against the pseudo-truth are averaged per (level, size class). The
mean signed error of the non-negative product is its estimated bias, given with the
standard error of that average over the ``R`` replicates. It uses released data only (and
fresh noise), so it may be published beside the release. It estimates the bias at a truth
like the release, not at the confidential truth: a parametric bootstrap (Efron &
Tibshirani 1993, §6), whose own error grows with the bias it measures. The released
histogram is not a smoothed truth: the non-negative projection sets small areas to zero,
so the release has *more* empty areas than the truth and fewer small ones, and the bias at
such a pseudo-truth differs from the bias at the truth in either direction. On a synthetic
state of 4,000 blocks (2020 allocation; ``benchmarks/nonnegative_product.py --bias-check 8``:
bias at the truth over 8 releases, simulation over 8 replicates from one release) the block
bias was +6.74, +3.46, −6.27, −13.21 persons in the size classes 0, 1–9, 10–99, 100–999 and
the simulation gave +6.23, +3.69, −8.51, −12.10 — every sign right, 0.92–1.36 times the size
(0.99–1.42 on a second state; the release: 2,092 empty blocks against the truth's 1,267).
The report says so.

**Confidential: errors against the truth** (:func:`evaluate_size_classes`), written only on
request and labelled :data:`~censusdp.pipelines.report.CONFIDENTIAL_LABEL`: together with
the release they reveal the truth.

:func:`write_size_class_report` writes ``size_classes.csv``, ``size_classes.md`` and one
figure, ``size_classes.png`` (mean signed error by size class, both products, every
level), and with an evaluation ``evaluation/size_classes.csv`` and
``evaluation/size_classes.md``.

References
----------
Efron, B. & Tibshirani, R. J. (1993). An Introduction to the Bootstrap. Chapman & Hall.
U.S. Census Bureau (2021). Disclosure Avoidance and the 2020 Census: detailed summary
    metrics (mean absolute error, mean numeric error, mean absolute percent error and the
    count of geographies with a percent difference over 10%, by size bins).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.errors import DataError
from censusdp.hierarchy import Hierarchy
from censusdp.pipelines.metrics import SIZE_CLASSES, size_class_metrics
from censusdp.pipelines.report import CONFIDENTIAL_LABEL, markdown_table
from censusdp.spreadsheet import write_csv

__all__ = [
    "PRODUCTS",
    "Replicate",
    "area_totals",
    "evaluate_size_classes",
    "simulate_size_classes",
    "write_size_class_report",
]

#: The two products, in report order.
PRODUCTS = ("unbiased", "nonnegative")
#: One simulated replicate ``r``: product → level → every area's total.
Replicate = Callable[[int], Mapping[str, Mapping[str, np.ndarray]]]
_METRICS = ("mae", "rmse", "mean_error", "mape", "over_10pct")


def area_totals(
    hierarchy: Hierarchy,
    block: np.ndarray,
    count: np.ndarray,
    levels: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Persons per area of each level from sparse leaf entries (``block`` = leaf index),
    summed up the hierarchy exactly (int64)."""
    n = hierarchy.leaves.size
    leaf = np.zeros(n, np.int64)
    np.add.at(leaf, np.asarray(block, np.int64), np.asarray(count, np.int64))
    sums = hierarchy.aggregate(leaf[:, None])
    names = hierarchy.names if levels is None else levels
    return {lv: sums[hierarchy.level_index(lv)][:, 0] for lv in names}


def _frame(
    values: Mapping[str, Mapping[str, np.ndarray]],
    reference: Mapping[str, np.ndarray],
    size: Mapping[str, np.ndarray],
) -> pd.DataFrame:
    frames = []
    for product, levels in values.items():
        for level, ref in reference.items():
            if level not in levels:
                raise DataError(
                    f"size-class report: product {product!r} has no totals for level {level!r}"
                )
            m = size_class_metrics(levels[level], ref, size[level])
            m.insert(0, "level", level)
            m.insert(0, "product", product)
            frames.append(m)
    return pd.concat(frames, ignore_index=True)


def simulate_size_classes(
    pseudo_truth: Mapping[str, np.ndarray],
    replicate: Replicate,
    repetitions: int,
    *,
    size: Mapping[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Both products' errors by size class, averaged over simulated releases.

    Parameters
    ----------
    pseudo_truth : mapping of level → array
        Every area's total in the released non-negative product (the pseudo-truth; it also
        sets the size classes).
    replicate : callable
        ``replicate(r)`` measures the pseudo-truth again with the release's strategy and
        fresh noise (stream ``r``) and returns both products' area totals,
        ``{product: {level: totals}}``.
    repetitions : int
        Number of replicates ``R`` (≥ 2, for the standard error of the bias).
    size : mapping of level → array, optional
        What classes the areas (default: ``pseudo_truth``), e.g. an area's housing units
        when the values are its occupied units.

    Returns
    -------
    pandas.DataFrame
        ``product, level, size_class, n`` then the replicate means of ``mae, rmse,
        mean_error, mape, over_10pct``, and ``bias_se``: the standard error of the mean
        signed error over the replicates (sd / √R). ``mean_error`` is the estimated bias.
    """
    if repetitions < 2:
        raise DataError("size-class simulation: give at least 2 replicates (for the bias SE)")
    runs = []
    for r in range(repetitions):  # each replicate is a whole release
        f = _frame(replicate(r), pseudo_truth, pseudo_truth if size is None else size)
        f["replicate"] = r
        runs.append(f)
    all_runs = pd.concat(runs, ignore_index=True)
    keys = ["product", "level", "size_class"]
    g = all_runs.groupby(keys, sort=False)
    out = g[["n", *_METRICS]].mean()
    out["n"] = g["n"].first()
    out["bias_se"] = g["mean_error"].std(ddof=1) / np.sqrt(repetitions)
    return out.reset_index()


def evaluate_size_classes(
    truth: Mapping[str, np.ndarray],
    released: Mapping[str, Mapping[str, np.ndarray]],
    *,
    size: Mapping[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Both products' errors by size class against the confidential truth (CONFIDENTIAL);
    areas classed by ``size`` (default: ``truth``).

    Returns ``product, level, size_class, n, mae, rmse, mean_error, mape, over_10pct``.
    """
    return _frame(released, truth, truth if size is None else size)


def _figure(df: pd.DataFrame, path: Path, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(dict.fromkeys(df["level"]))
    labels = [c[0] for c in SIZE_CLASSES]
    fig, axes = plt.subplots(1, len(levels), figsize=(4 * len(levels), 3.4), squeeze=False)
    for ax, level in zip(axes[0], levels, strict=True):
        for product in PRODUCTS:
            d = df[(df["level"] == level) & (df["product"] == product) & (df["n"] > 0)]
            x = [labels.index(c) for c in d["size_class"]]
            ax.errorbar(
                x, d["mean_error"], yerr=2 * d["bias_se"], marker="o", capsize=3, label=product
            )
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(labels)), labels, rotation=30)
        ax.set_title(level)
        ax.set_xlabel(f"size class ({unit})")
    axes[0][0].set_ylabel(f"mean signed error ({unit})")
    axes[0][0].legend()
    fig.suptitle("Simulated mean signed error (bias) by size class, ±2 SE")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_size_class_report(
    out: Path,
    simulated: pd.DataFrame,
    *,
    repetitions: int,
    evaluation: pd.DataFrame | None = None,
    unit: str = "persons",
    what: str = "block histogram",
    privacy: str | None = None,
) -> list[Path]:
    """Write the report into the (temporary) output directory ``out``.

    Writes ``size_classes.csv``, ``size_classes.md`` and ``size_classes.png`` (publishable:
    simulated from the released estimates) and, when ``evaluation`` is given,
    ``evaluation/size_classes.csv`` and ``evaluation/size_classes.md`` labelled
    confidential. ``unit`` names what is counted and sizes the areas (``"persons"``,
    ``"housing units"``), ``what`` the released non-negative table taken as the truth,
    ``privacy`` the report's privacy wording (the release's
    :meth:`~censusdp.budget.Product.wording` of it, so it says what privacy.md says).
    Returns the paths written.
    """
    out = Path(out)
    written = [out / "size_classes.csv", out / "size_classes.md", out / "size_classes.png"]
    write_csv(simulated, written[0], index=False)
    cols = ["level", "size_class", "n", "mean_error", "bias_se", *_METRICS[:2], *_METRICS[3:]]
    lines = [
        "# Errors by size class",
        "",
        f"Simulated from the released estimates ({repetitions} replicates): the released "
        f"non-negative {what} is taken as the truth, measured again with the same strategy "
        "and budget and fresh noise, and both products are made again; errors are against "
        f"that pseudo-truth, areas classed by their size in {unit}. It uses released data "
        "only. "
        "Size classes without areas are left out (they are in `size_classes.csv`). "
        "`mean_error` of the non-negative product is its estimated **bias**; `bias_se` is "
        "the standard error of that average. MAPE and `over_10pct` (areas off by more than "
        "10%) leave out areas of size 0. The simulation takes the release as the truth, "
        "and the release has more empty areas and fewer small ones than the truth (the "
        "non-negative projection sets small areas to zero): the simulated bias can be "
        "smaller or larger than the bias at the truth — read its sign and order of "
        "magnitude, not its size to better than a factor of about 2.",
        "",
        *([] if privacy is None else [f"Privacy: {privacy}.", ""]),
    ]
    for product in PRODUCTS:
        d = simulated[(simulated["product"] == product) & (simulated["n"] > 0)]
        if d.empty:
            continue
        title = (
            "Non-negative product (biased; no standard errors)"
            if product == "nonnegative"
            else "Unbiased product (GLS, unbiased rounding; with standard errors)"
        )
        lines += [f"## {title}", "", markdown_table(d[cols]), ""]
    lines += ["![mean signed error by size class](size_classes.png)", ""]
    written[1].write_text("\n".join(lines), encoding="utf-8")
    _figure(simulated, written[2], unit)
    if evaluation is not None:
        ev = out / "evaluation"
        ev.mkdir(exist_ok=True)
        paths = [ev / "size_classes.csv", ev / "size_classes.md"]
        write_csv(evaluation, paths[0], index=False)
        ecols = ["product", "level", "size_class", "n", *_METRICS]
        text = [
            "# Errors by size class against the confidential truth",
            "",
            f"**{CONFIDENTIAL_LABEL}**",
            "",
            markdown_table(evaluation.loc[evaluation["n"] > 0, ecols]),
            "",
        ]
        paths[1].write_text("\n".join(text), encoding="utf-8")
        written += paths
    return written
