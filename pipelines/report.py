"""Figures and ``report.md`` of a pipeline run, written for readers who have not read the papers.

Every number in the report is computed from the run's own metrics and regressions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["markdown_table", "plot_slopes", "slope_table", "write_figures", "write_report"]


def slope_table(regressions: pd.DataFrame) -> pd.DataFrame:
    """Per group and estimator: mean slope over repetitions with a 95% interval.

    The interval is mean ± t₀.₉₇₅ · sd / √R over the R repetitions (each repetition is an
    independent run of the mechanism); with one repetition it is the OLS interval.
    """
    rows = []
    for (est, group), g in regressions.groupby(["estimator", "group"], sort=True):
        r = len(g)
        mean = float(g["slope"].mean())
        if r > 1:
            half = float(stats.t.ppf(0.975, r - 1) * g["slope"].std(ddof=1) / np.sqrt(r))
        else:
            half = float(stats.t.ppf(0.975, max(int(g["n"].iloc[0]) - 2, 1)) * g["se"].iloc[0])
        rows.append(
            {
                "estimator": est,
                "group": group,
                "n_units": int(g["n"].iloc[0]),
                "repetitions": r,
                "slope": mean,
                "low": mean - half,
                "high": mean + half,
            }
        )
    return pd.DataFrame(rows)


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


def write_figures(
    out: Path, metrics: pd.DataFrame, regressions: pd.DataFrame, manifest: dict
) -> list[str]:
    """``bias_slopes.png`` (per-group slopes with intervals) and ``errors_by_level.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    table = slope_table(regressions)
    if not table.empty:
        groups = sorted(table["group"].unique())
        ests = list(dict.fromkeys(table["estimator"]))
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(groups) * len(ests) + 2), 4))
        plot_slopes(ax, table, groups, ests)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(groups)), groups, rotation=90 if len(groups) > 12 else 0)
        ax.set_ylabel("slope of leaf-total error on log(true size)")
        ax.set_title("Small-area bias per group (mean over repetitions, 95% interval)")
        ax.legend()
        fig.savefig(out / "bias_slopes.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        names.append("bias_slopes.png")
    if not metrics.empty:
        mean = metrics.groupby(["level", "estimator"], sort=False)["total_rmse"].mean().unstack()
        mean = mean.reindex(manifest["data"]["levels"])
        fig, ax = plt.subplots(figsize=(6, 4))
        mean.plot.bar(ax=ax, logy=True)
        ax.set_ylabel("RMSE of node totals (mean over repetitions)")
        ax.set_title("Error per level")
        fig.savefig(out / "errors_by_level.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        names.append("errors_by_level.png")
    return names


def _total(privacy: dict) -> str:
    key = "epsilon" if privacy["accounting"] == "pure" else "rho"
    return f"{key.replace('epsilon', 'ε').replace('rho', 'ρ')} = {privacy[key]:g}"


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """A GitHub-flavoured markdown table of ``df`` (floats formatted with ``floatfmt``)."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = [format(v, floatfmt) if isinstance(v, float | np.floating) else str(v) for v in row]
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
) -> Path:
    """Write ``report.md``: what ran, the privacy statements, errors per level and the bias study."""
    data = manifest["data"]
    spec = manifest["spec"]
    reps = manifest["repetitions"]
    lines = [f"# {title or 'censusdp run'}", ""]
    lines += [
        "## What was run",
        "",
        f"- Data: `{data['source']}`; levels {' → '.join(data['levels'])} with "
        f"{', '.join(f'{n:,}' for n in data['nodes'])} nodes; cells: {', '.join(data['cells'])}.",
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
    lines += [markdown_table(agg), ""]
    if not regressions.empty:
        lines += [
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
        s = (
            pd.DataFrame(summary)
            .groupby("estimator", sort=False)
            .mean(numeric_only=True)
            .reset_index()
        )
        s["chance_expected_significant_negative"] = s["groups"] * 0.005
        lines += [
            "Per repetition, averaged:",
            "",
            markdown_table(s.drop(columns="repetition")),
            "",
            "Slope per group (mean over repetitions, 95% interval):",
            "",
            markdown_table(slope_table(regressions)),
            "",
        ]
    for fig in figures:
        lines += [f"![{fig}]({fig})", ""]
    t = manifest["timings_seconds"]
    lines += ["## Timings", "", ", ".join(f"{k}: {v:.2f} s" for k, v in t.items()), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
