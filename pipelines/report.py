"""Figures and ``report.md`` of a pipeline run's evaluation, written for readers who have not
read the papers.

Every number in the report is computed from the run's own metrics and regressions. The
evaluation compares releases with the confidential truth, so the report carries
:data:`CONFIDENTIAL_LABEL`. Its size does not grow with the data: per-group results are shown
in full only up to :data:`MAX_GROUPS` groups, beyond that as quantiles and by size class (the
full detail stays in ``regressions.parquet``), and every figure has a bounded size.

Figures are drawn as a statistician would publish them: PNG with an SVG beside it; value
axes linear unless the values span more than a decade (:func:`axis_scale`); levels held
exactly by an invariant drawn and labelled "exact", never left blank; errors by size class
as the Census Bureau's detailed summary metrics report them (mean signed error, mean
absolute error, RMSE and mean absolute percent error per total-population size class, one
panel per metric).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from censusdp.budget import Accounting

__all__ = [
    "CONFIDENTIAL_LABEL",
    "EXACT_LABEL",
    "MAX_GROUPS",
    "SIZE_METRICS",
    "axis_scale",
    "markdown_table",
    "plot_errors_by_level",
    "plot_errors_by_size",
    "plot_slopes",
    "slope_table",
    "write_figures",
    "write_report",
]

#: Label of every evaluation folder, report and manifest.
CONFIDENTIAL_LABEL = (
    "CONFIDENTIAL: contains confidential comparisons with the true data; not for publication. "
    "Errors against the truth, with the release, reveal the truth."
)
#: Groups shown one by one in the report and its figures; more are summarised.
MAX_GROUPS = 30


def slope_table(regressions: pd.DataFrame) -> pd.DataFrame:
    """Per group and estimator: mean slope over repetitions with a 95% interval.

    The interval is mean ± t₀.₉₇₅ · sd / √R over the R repetitions (each repetition is an
    independent run of the mechanism); with one repetition it is the OLS interval.
    """
    cols = ["estimator", "group", "n_units", "repetitions", "slope", "low", "high"]
    if regressions.empty:
        return pd.DataFrame(columns=cols)
    g = regressions.groupby(["estimator", "group"], sort=True)
    agg = g.agg(
        n_units=("n", "first"),
        repetitions=("slope", "size"),
        slope=("slope", "mean"),
        sd=("slope", "std"),
        se0=("se", "first"),
    ).reset_index()
    r = agg["repetitions"].to_numpy()
    many = r > 1
    dof = np.where(many, r - 1, np.maximum(agg["n_units"].to_numpy() - 2, 1))
    spread = np.where(many, agg["sd"].to_numpy() / np.sqrt(r), agg["se0"].to_numpy())
    half = stats.t.ppf(0.975, dof) * spread
    agg["n_units"] = agg["n_units"].astype(int)
    agg["repetitions"] = agg["repetitions"].astype(int)
    agg["low"] = agg["slope"] - half
    agg["high"] = agg["slope"] + half
    return agg[cols]


def plot_slopes(ax, table: pd.DataFrame, groups: list, estimators: list) -> None:
    """Per-group mean slopes with their intervals, one dodged series per estimator."""
    width = 0.8 / len(estimators)
    for i, est in enumerate(estimators):
        t = table[table["estimator"] == est].set_index("group").reindex(groups)
        x = np.arange(len(groups)) + (i - (len(estimators) - 1) / 2) * width
        ax.errorbar(
            x,
            t["slope"],
            yerr=[t["slope"] - t["low"], t["high"] - t["slope"]],
            fmt="o",
            capsize=3,
            label=est,
        )


#: The per-size-class metrics drawn, one panel each, as the Census Bureau's detailed summary
#: metrics report them by total-population size class: (column, axis label).
SIZE_METRICS = (
    ("mean_error", "mean signed error (persons)"),
    ("mae", "mean absolute error (persons)"),
    ("rmse", "RMSE (persons)"),
    ("mape", "mean absolute percent error (%)"),
)
#: What an exact (invariant) level is labelled in a figure.
EXACT_LABEL = "exact"


def axis_scale(values) -> str:
    """The value axis a figure of ``values`` uses: ``"log"`` only when the positive finite
    values span more than one decade (largest / smallest > 10) and none is negative, else
    ``"linear"``.

    Close values on a log axis look several-fold apart (57 vs 60 drawn as bars on a log axis
    spanning 57–60); zeros (exact levels) are left out of the span and drawn apart, labelled
    :data:`EXACT_LABEL`.

    Parameters
    ----------
    values : array-like of float

    Returns
    -------
    {"log", "linear"}
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if (v < 0).any():
        return "linear"
    pos = v[v > 0]
    if pos.size < 2:
        return "linear"
    return "log" if pos.max() > 10 * pos.min() else "linear"


def _save(fig, out: Path, stem: str) -> str:
    """Save ``stem``.png and, beside it, ``stem``.svg (text kept as text); the PNG's name."""
    import matplotlib.pyplot as plt

    fig.savefig(out / f"{stem}.png", dpi=110, bbox_inches="tight")
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": stem}):
        fig.savefig(out / f"{stem}.svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return f"{stem}.png"


def plot_errors_by_level(ax, mean: pd.DataFrame) -> str:
    """Grouped bars of the error per level (rows) and estimator (columns), each bar labelled
    with its value; a level whose error is exactly 0 (held by an invariant) is drawn as a
    marker on the baseline labelled :data:`EXACT_LABEL` rather than left blank. The value
    axis follows :func:`axis_scale`; returns the scale used."""
    import matplotlib.pyplot as plt

    levels, ests = list(mean.index), list(mean.columns)
    values = mean.to_numpy(dtype=np.float64)
    scale = axis_scale(values)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(len(ests), 1)
    x = np.arange(len(levels))
    pos = values[np.isfinite(values) & (values > 0)]
    # on a log axis the baseline of an exact level is half the smallest error shown
    base = float(pos.min() / 2) if scale == "log" and pos.size else 0.0
    for i, est in enumerate(ests):
        color = colors[i % len(colors)]
        xi = x + (i - (len(ests) - 1) / 2) * width
        v = values[:, i]
        shown = np.isfinite(v) & (v > 0)
        bars = ax.bar(xi[shown], v[shown], width, label=est, color=color)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
        exact = np.isfinite(v) & (v == 0)
        ax.plot(xi[exact], np.full(int(exact.sum()), base), "_", color=color, ms=12, mew=2)
        for xe in xi[exact]:
            ax.annotate(
                EXACT_LABEL,
                (xe, base),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=90,
            )
    ax.set_yscale(scale)
    if scale == "linear":
        ax.set_ylim(bottom=0)
    ax.set_xticks(x, levels)
    return scale


def plot_errors_by_size(axes, sizes: pd.DataFrame, metrics) -> None:
    """One panel per metric (:data:`SIZE_METRICS`), the size classes in their order along x,
    one series of points per estimator; signed errors get a zero line. Each panel's value
    axis follows :func:`axis_scale`."""
    classes = list(dict.fromkeys(sizes["size_class"].astype(str)))
    x = np.arange(len(classes))
    ests = list(dict.fromkeys(sizes["estimator"]))
    for ax, (col, label) in zip(axes, metrics, strict=True):
        for j, est in enumerate(ests):
            sub = sizes[sizes["estimator"] == est]
            g = sub.set_index(sub["size_class"].astype(str))
            v = g[col].reindex(classes).to_numpy(dtype=np.float64)
            off = (j - (len(ests) - 1) / 2) * 0.1
            ax.plot(x + off, v, "o", label=est)
        scale = axis_scale(sizes[col])
        ax.set_yscale(scale)
        if col == "mean_error":
            ax.axhline(0, color="black", lw=0.8)
        elif scale == "linear":
            ax.set_ylim(bottom=0)
        ax.set_xticks(x, classes, rotation=30)
        ax.set_xlabel("true leaf total (size class)")
        ax.set_title(label, fontsize=9)


def write_figures(
    out: Path,
    metrics: pd.DataFrame,
    regressions: pd.DataFrame,
    manifest: dict,
    *,
    sizes: pd.DataFrame | None = None,
) -> list[str]:
    """Bounded figures, each as PNG with an SVG beside it: ``bias_slopes`` (per-group slopes
    with intervals up to :data:`MAX_GROUPS` groups, else their distribution per estimator),
    ``errors_by_level`` (:func:`plot_errors_by_level`: exact levels drawn and labelled) and,
    with ``sizes``, ``errors_by_size`` (:func:`plot_errors_by_size`: one panel per metric by
    size class). Value axes are linear unless the values span more than a decade
    (:func:`axis_scale`). Returns the PNG names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    table = slope_table(regressions)
    if not table.empty:
        groups = sorted(table["group"].unique())
        ests = list(dict.fromkeys(table["estimator"]))
        if len(groups) <= MAX_GROUPS:
            fig, ax = plt.subplots(figsize=(min(max(6, 0.4 * len(groups) * len(ests) + 2), 14), 4))
            plot_slopes(ax, table, groups, ests)
            ax.set_xticks(np.arange(len(groups)), groups, rotation=90 if len(groups) > 12 else 0)
            ax.set_title("Small-area bias per group (mean over repetitions, 95% interval)")
            ax.legend()
        else:
            fig, ax = plt.subplots(figsize=(min(2 + 1.5 * len(ests), 14), 4))
            data = [table.loc[table["estimator"] == e, "slope"].dropna().to_numpy() for e in ests]
            ax.boxplot(data, showfliers=False)
            ax.set_xticks(np.arange(1, len(ests) + 1), ests)
            ax.set_title(f"Small-area bias: distribution of the {len(groups):,} group slopes")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel("slope of leaf-total error on log(true size)")
        names.append(_save(fig, out, "bias_slopes"))
    if not metrics.empty:
        mean = metrics.groupby(["level", "estimator"], sort=False)["total_rmse"].mean().unstack()
        mean = mean.reindex(manifest["data"]["levels"])
        fig, ax = plt.subplots(figsize=(6, 4))
        scale = plot_errors_by_level(ax, mean)
        ax.set_ylabel(
            "RMSE of node totals (mean over repetitions)"
            + (", log scale" if scale == "log" else "")
        )
        ax.set_title("Error per level (a level held by an invariant is marked as exact)")
        ax.legend()
        names.append(_save(fig, out, "errors_by_level"))
    if sizes is not None and not sizes.empty:
        panels = [(c, lab) for c, lab in SIZE_METRICS if c in sizes.columns]
        fig, axes = plt.subplots(
            1, len(panels), figsize=(min(3.2 * len(panels), 14), 3.6), squeeze=False
        )
        plot_errors_by_size(axes[0], sizes, panels)
        axes[0][0].legend()
        fig.suptitle("Errors of leaf totals by size class (repetition 0)", fontsize=10)
        fig.tight_layout()
        names.append(_save(fig, out, "errors_by_size"))
    return names


def _total(privacy: dict) -> str:
    key = "epsilon" if privacy["accounting"] == Accounting.PURE else "rho"
    return f"{key.replace('epsilon', 'ε').replace('rho', 'ρ')} = {privacy[key]:g}"


def _few(names: list[str], k: int = 12) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k:,} more" if len(names) > k else "")


def markdown_table(df: pd.DataFrame, floatfmt: str | Mapping[str, str] = ".3g") -> str:
    """A GitHub-flavoured markdown table of ``df``: floats formatted with ``floatfmt``, or per
    column with a mapping ``{column: format}`` (columns it omits: ``".3g"``; a format given
    for a column applies to its integers too, e.g. ``","`` or ``"+d"``)."""
    cols = list(df.columns)
    fmts = floatfmt if isinstance(floatfmt, Mapping) else {}
    default = ".3g" if isinstance(floatfmt, Mapping) else floatfmt
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = []
        for col, v in zip(cols, row, strict=True):
            fmt = fmts.get(col)
            if isinstance(v, bool | np.bool_):
                cells.append(str(v))
            elif fmt is not None and isinstance(v, int | float | np.integer | np.floating):
                cells.append(format(v, fmt))
            elif isinstance(v, float | np.floating):
                cells.append(format(v, default))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(
    out: Path,
    metrics: pd.DataFrame,
    regressions: pd.DataFrame,
    manifest: dict,
    figures: list[str],
    *,
    title: str | None = None,
    sizes: pd.DataFrame | None = None,
) -> Path:
    """Write ``report.md``: what ran, the privacy statements, errors per level and the bias
    study, under :data:`CONFIDENTIAL_LABEL`; its length does not grow with the data."""
    lines = [f"# {title or 'censusdp run'}: evaluation", "", f"**{CONFIDENTIAL_LABEL}**", ""]
    lines += [
        "The release itself (estimates, standard errors, privacy statement) is in `../release/`; "
        "this folder compares it with the truth.",
        "",
    ]
    lines += _what_was_run(manifest)
    lines += _errors_per_level(metrics)
    if not regressions.empty:
        lines += _small_area_bias(regressions)
    if sizes is not None and not sizes.empty:
        lines += [
            "## Errors by size class",
            "",
            "Leaf-total errors of repetition 0 grouped by the true leaf total. A mean signed "
            "error that falls as size grows is small-area bias.",
            "",
            markdown_table(sizes),
            "",
        ]
    for fig in figures:
        svg = fig.removesuffix(".png") + ".svg"
        lines += [f"![{fig}]({fig})", "", f"(vector: [{svg}]({svg}))", ""]
    t = manifest["timings_seconds"]
    lines += ["## Timings", "", ", ".join(f"{k}: {v:.2f} s" for k, v in t.items()), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _what_was_run(manifest: dict) -> list[str]:
    """The report's sections on what ran (data, budget, estimators, repetitions, the
    measurements) and the release's privacy statements."""
    data = manifest["data"]
    spec = manifest["spec"]
    reps = manifest["repetitions"]
    lines = [
        "## What was run",
        "",
        f"- Data: `{data['source']}`; levels {' → '.join(data['levels'])} with "
        f"{', '.join(f'{n:,}' for n in data['nodes'])} nodes; cells: {_few(data['cells'])}.",
        f"- Budget: {spec['privacy']['accounting']} accounting, total {_total(spec['privacy'])}; "
        f"noise: {spec['mechanism']['noise']}.",
        f"- Estimators: {', '.join(spec['estimators']['run'])}; integer step: {spec['estimators']['integer']}.",
        f"- {reps} independent repetition(s); scheduler `{manifest['scheduler']}` with "
        f"{manifest['partitions']} partition(s) cut at level `{manifest['cut_level']}` "
        "(the output does not depend on either).",
        f"- Reproducible (seeded) mode: {'yes — not for a real release' if manifest['reproducible_mode'] else 'no (fresh secure key)'}.",
        "",
        "Measurements (each calibrated from its query's computed sensitivity):",
        "",
        markdown_table(
            pd.DataFrame(manifest["measurements"])[["level", "query", "budget", "law", "variance"]]
        ),
        "",
        "## Privacy",
        "",
    ]
    for est, st in manifest["privacy"].items():
        lines.append(f"- **{est}**: {st['text']}")
    lines += [
        "",
        "These statements are of the release. The comparisons below use the confidential truth "
        "and carry no privacy guarantee.",
    ]
    return lines


def _errors_per_level(metrics: pd.DataFrame) -> list[str]:
    """The section of errors per level and estimator, averaged over repetitions."""
    lines = [
        "",
        "## Errors per level",
        "",
        "Mean over repetitions of the errors of node totals (MAE, RMSE, mean signed error) and of "
        "single cells (MAE). A mean signed error far from zero is bias.",
        "",
    ]
    agg = (
        metrics.groupby(["level", "estimator"], sort=False)[
            ["total_mae", "total_rmse", "total_mean_error", "cell_mae"]
        ]
        .mean()
        .reset_index()
    )
    return lines + [markdown_table(agg), ""]


def _small_area_bias(regressions: pd.DataFrame) -> list[str]:
    """The small-area bias section: per estimator the groups with a negative and a
    significantly negative slope (with the number chance gives), then every group's slope,
    or their quantiles beyond :data:`MAX_GROUPS` groups."""
    lines = [
        "## Small-area bias",
        "",
        "Within each group (the level above the leaves), the leaf-total error (released − true) is "
        "regressed on log(true size) by ordinary least squares. A negative slope means small areas "
        "come out too large and large areas too small — the bias that non-negativity and fixed "
        "parent totals give the TopDown-style baseline. For an unbiased estimator the slopes scatter "
        "around zero: at level 0.01 about 0.5% of groups show a significant negative slope by chance.",
        "",
    ]
    summary = []
    for (est, rep), g in regressions.groupby(["estimator", "repetition"], sort=False):
        summary.append(
            {
                "estimator": est,
                "repetition": rep,
                "groups": len(g),
                "negative": int((g["slope"] < 0).sum()),
                "significant_negative_001": int(((g["slope"] < 0) & (g["p"] < 0.01)).sum()),
            }
        )
    s = pd.DataFrame(summary).groupby("estimator", sort=False).mean(numeric_only=True).reset_index()
    s["chance_expected_significant_negative"] = s["groups"] * 0.005
    slopes = slope_table(regressions)
    n_groups = slopes["group"].nunique()
    lines += ["Per repetition, averaged:", "", markdown_table(s.drop(columns="repetition")), ""]
    if n_groups <= MAX_GROUPS:
        return lines + [
            "Slope per group (mean over repetitions, 95% interval):",
            "",
            markdown_table(slopes),
            "",
        ]
    q = (
        slopes.groupby("estimator", sort=False)["slope"]
        .quantile([0.05, 0.25, 0.5, 0.75, 0.95])
        .unstack()
    )
    q.columns = [f"q{int(c * 100):02d}" for c in q.columns]
    q.insert(0, "groups", slopes.groupby("estimator", sort=False).size())
    q.insert(
        1,
        "interval_below_0",
        (slopes["high"] < 0).groupby(slopes["estimator"], sort=False).sum(),
    )
    return lines + [
        f"Slopes of the {n_groups:,} groups (mean over repetitions), as quantiles; every "
        "group's slope and interval is in `regressions.parquet`:",
        "",
        markdown_table(q.reset_index()),
        "",
    ]
