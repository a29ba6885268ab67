"""The main job (``censusdp demo``): GLS vs TopDown-style on the embedded
midwest table, at two budgets, with the small-area bias study of Gao, Gong & Yu.

The spec ``midwest_demo.toml`` (region → state → county, five race cells, state totals held
exact, exact discrete Gaussian noise; GLS and TopDown-style) is run at each budget of
:data:`BUDGETS` with its repetitions; every run writes its own folder (``rho_<budget>/``:
``release/`` and the confidential ``evaluation/``) and this experiment adds a combined
``report.md``, ``bias_slopes.png`` and ``metrics.json``.

Conditioning discrete Gaussian noise is a certified Gibbs MCMC run per release: on this table
one release took more than 160 s of CPU (measured; GLS and TopDown-style together take about
17 s of CPU for all 40 releases), so the main job leaves it out
(:data:`CONDITIONING_REPETITIONS` = 0). Set it above 0 to add conditioning on the first
repetitions of each budget (the same measurements as the other estimators' first
repetitions: every repetition's noise is keyed by its index), written to
``rho_<budget>_conditioning/``; the laplace-conditioning experiment studies the sampler.

References
----------
Gao, Gong & Yu (2022), "Subspace Differential Privacy", AAAI, §1 and §5.1 (the per-state
regression of county error on log population that reveals TopDown's small-area bias).
ggplot2's ``midwest`` table (2000 U.S. census county demographics), packaged as
``censusdp/data/midwest.csv`` (:meth:`censusdp.hierarchy.table.Table.from_midwest`).

The module is light at import: pandas, numpy and the pipeline are imported when the demo
runs (``censusdp demo``, :mod:`censusdp.app.commands.demo`, runs it as an experiment).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from censusdp.experiments.registry import ExperimentContext, ExperimentInfo

if TYPE_CHECKING:
    import pandas as pd

    from censusdp.experiments.reporting import Report

log = logging.getLogger(__name__)

__all__ = ["BUDGETS", "CONDITIONING_REPETITIONS", "SPEC", "print_summary", "run"]

#: What this study reproduces, for ``censusdp experiment --list`` and the README.
INFO = ExperimentInfo(
    reproduces="the main job: GLS vs TopDown-style (discrete Gaussian noise) on the embedded midwest counties, bias slopes per state at two budgets",
    paper="Gao, Gong & Yu (2022), Subspace Differential Privacy, §5.1 (the per-state regression)",
    data=(),
    full_run="21–22 s",
)

SPEC = Path(__file__).with_name("midwest_demo.toml")
#: Total ρ (zCDP) of the two runs: a tight and a looser budget.
BUDGETS = (0.001, 0.01)
#: Repetitions of the conditioning estimator (MCMC) per budget, at most 1 with ``--quick``;
#: 0 leaves it out (see the module note for the measured cost).
CONDITIONING_REPETITIONS = 0


def _summary(regressions: pd.DataFrame, metrics: pd.DataFrame) -> dict:
    from censusdp.pipelines.report import slope_table

    out = {}
    for est, g in regressions.groupby("estimator", sort=False):
        flags = g.assign(negative=g["slope"] < 0, sig=(g["slope"] < 0) & (g["p"] < 0.01))
        per_rep = flags.groupby("repetition")[["negative", "sig"]].sum()
        table = slope_table(g)
        leaf = metrics[
            (metrics["estimator"] == est) & (metrics["level"] == metrics["level"].iloc[-1])
        ]
        out[est] = {
            "groups": int(g["group"].nunique()),
            "repetitions": int(g["repetition"].nunique()),
            "mean_negative_per_run": float(per_rep["negative"].mean()),
            "mean_significant_negative_001_per_run": float(per_rep["sig"].mean()),
            "chance_expected_significant_negative": 0.005 * int(g["group"].nunique()),
            "groups_with_negative_mean_slope_interval": int((table["high"] < 0).sum()),
            "groups_with_positive_mean_slope_interval": int((table["low"] > 0).sum()),
            "mean_slope": float(g["slope"].mean()),
            "county_total_mae": float(leaf["total_mae"].mean()),
            "county_total_rmse": float(leaf["total_rmse"].mean()),
            "county_mean_error": float(leaf["total_mean_error"].mean()),
        }
    return out


#: The columns of each budget's summary table in the report.
_SUMMARY_COLUMNS = [
    "estimator",
    "repetitions",
    "county_total_mae",
    "county_mean_error",
    "mean_slope",
    "mean_negative_per_run",
    "mean_significant_negative_001_per_run",
    "groups_with_negative_mean_slope_interval",
]


def run(ctx: ExperimentContext) -> dict:
    """Run the demo spec at every budget; combine the reports."""
    import pandas as pd

    from censusdp.pipelines.report import slope_table
    from censusdp.pipelines.runner import run_spec, with_budget
    from censusdp.pipelines.specs import load_spec
    from censusdp.progress import show_progress

    spec = load_spec(SPEC)
    reps = 4 if ctx.quick else spec.run.repetitions
    cond_reps = min(reps, CONDITIONING_REPETITIONS, 1 if ctx.quick else reps)
    fast = tuple(e for e in spec.estimators.run if e != "conditioning")
    slow = ("conditioning",) if cond_reps else ()
    metrics: dict = {
        "repetitions": reps,
        "conditioning_repetitions": cond_reps if slow else 0,
        "budgets": {},
    }
    tables = []
    for rho in BUDGETS:
        runs = []
        for suffix, estimators, n in (("", fast, reps), ("_conditioning", slow, cond_reps)):
            if not estimators:
                continue
            log.info("ρ = %g%s: %s, %d repetition(s)", rho, suffix, ", ".join(estimators), n)
            s = with_budget(spec, rho)
            s = dataclasses.replace(
                s,
                run=dataclasses.replace(s.run, repetitions=n),
                estimators=dataclasses.replace(s.estimators, run=estimators),
            )
            res = run_spec(
                s,
                out=ctx.out / f"rho_{rho:g}{suffix}",
                rng=ctx.rng.child(f"rho={rho!r}"),  # the same measurements in both runs
                progress=show_progress(False),  # the command line's bar (-q: none)
                title=f"Midwest demo at ρ = {rho:g}" + (" (conditioning)" if suffix else ""),
            )
            ctx.timings[f"rho_{rho:g}{suffix}"] = res.manifest["timings_seconds"]["total"]
            runs.append(res)
        regressions = pd.concat([r.regressions for r in runs], ignore_index=True)
        summ = _summary(regressions, pd.concat([r.metrics for r in runs], ignore_index=True))
        metrics["budgets"][f"rho_{rho:g}"] = summ
        t = slope_table(regressions)
        t["budget"] = f"ρ = {rho:g}"
        tables.append(t)
    table = pd.concat(tables, ignore_index=True)
    log.info("writing the combined report (report.md, bias_slopes.png)")
    _figure(ctx, table)
    ctx.write_report(_report(ctx, metrics, table, reps, cond_reps, bool(slow)))
    return metrics


def _figure(ctx: ExperimentContext, table: pd.DataFrame) -> None:
    import numpy as np

    from censusdp.experiments.reporting import pyplot
    from censusdp.pipelines.report import plot_slopes

    plt = pyplot()
    states = sorted(table["group"].unique())
    ests = list(dict.fromkeys(table["estimator"]))
    fig, axes = plt.subplots(1, len(BUDGETS), figsize=(5 * len(BUDGETS), 4), sharey=False)
    for ax, (budget, tb) in zip(
        np.atleast_1d(axes), table.groupby("budget", sort=False), strict=True
    ):
        plot_slopes(ax, tb, states, ests)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(states)), states)
        ax.set_title(budget)
        ax.set_ylabel("slope of county error on log(population)")
    np.atleast_1d(axes)[0].legend()
    fig.suptitle("Per-state bias slope (mean over repetitions, 95% interval)")
    ctx.savefig(fig, "bias_slopes.png")


def _report(
    ctx: ExperimentContext,
    metrics: dict,
    table: pd.DataFrame,
    reps: int,
    cond_reps: int,
    slow: bool,
) -> Report:
    from censusdp.experiments.reporting import Report

    rep = (
        Report(
            "midwest-demo",
            ctx,
            title="Midwest demo: an unbiased estimator beside a TopDown-style baseline",
        )
        .text(
            "ggplot2's `midwest` table (2000 U.S. census; 437 counties of Illinois, Indiana, Michigan, Ohio and "
            "Wisconsin, population by race: white, black, American Indian, Asian, other) is "
            "treated as confidential. Every level's histogram is measured with exact discrete "
            "Gaussian noise (zCDP; integer sampling, so no floating-point attack applies), the "
            "five state totals are released exactly (invariants), and the estimators below turn "
            "the same noisy measurements into consistent, integer county tables:"
        )
        .bullets(
            [
                "**gls** — the projection estimator (generalised least squares over the "
                "hierarchy): unbiased, with an exact standard error for every number, then "
                "unbiased integer rounding;",
                "**topdown** — the U.S. Census Bureau's TopDown-style optimisation with "
                "non-negativity and the parent totals as constraints;",
                (
                    "**conditioning** — a draw from the noise law conditioned on consistency and "
                    "the invariants, also unbiased; for discrete Gaussian noise a certified Gibbs "
                    "MCMC run (released once its L-lag coupling bound on the total-variation "
                    f"distance is below 0.01), much slower than the others, so on the first "
                    f"{cond_reps} of the {reps} repetitions only (same measurements)."
                    if slow
                    else "conditioning (the noise law conditioned on the constraints) is left "
                    "out of the main job: for discrete Gaussian noise it is a certified Gibbs "
                    "MCMC run taking minutes per release (see "
                    "`censusdp.experiments.midwest_demo`)."
                ),
            ]
        )
        .text(
            "The question is the one of the subspace-DP paper (Gao, Gong & Yu 2022, Fig. 1): "
            "within each state, regress the county-total error on log(true county population). "
            "A negative slope means small counties come out too large and large ones too small."
        )
    )
    for rho in BUDGETS:
        summ = metrics["budgets"][f"rho_{rho:g}"]
        rows = [
            {"estimator": e, **{k: v for k, v in d.items() if k != "groups"}}
            for e, d in summ.items()
        ]
        rep.section(
            f"ρ = {rho:g} ({reps} repetitions; details in `rho_{rho:g}/evaluation/report.md`"
            + (f" and `rho_{rho:g}_conditioning/evaluation/report.md`)" if slow else ")")
        ).table(rows, _SUMMARY_COLUMNS)
    return (
        rep.section("Per-state slopes")
        .figures({"bias_slopes.png": "per-state bias slopes"})
        .table(table, ["budget", "estimator", "group", "n_units", "slope", "low", "high"])
        .text(
            "An interval entirely below zero is a state where the estimator is biased against "
            "large counties and in favour of small ones. The unbiased estimators' intervals "
            "cover zero except by chance; their price is that single county cells can be "
            "negative before rounding and have wider spread than TopDown-style's in the "
            "smallest cells, while TopDown-style trades that spread for systematic error."
        )
        .privacy(
            "with the state totals released exactly, the guarantee is induced subspace "
            "differential privacy (Gao, Gong & Yu 2022, Def. 6): differential privacy among "
            "databases that share the invariants, never plain ε-DP. The run reports state the "
            "budget of each estimator (all are post-processing of the same measurements). The "
            "noise is drawn by exact integer samplers (discrete Gaussian), not in floating "
            "point, so the floating-point attacks on textbook samplers (Mironov 2012) do not "
            "apply. Seeded runs are for reproduction only."
        )
    )


def print_summary(metrics: dict) -> None:
    """The short table ``censusdp demo`` prints: errors and bias per estimator and budget."""
    print(
        f"{'budget':<12}{'estimator':<14}{'county MAE':>12}{'mean slope':>12}{'neg/run':>9}{'sig<0/run':>11}"
    )
    for budget, per in metrics["budgets"].items():
        for est, d in per.items():
            print(
                f"{budget:<12}{est:<14}{d['county_total_mae']:>12.2f}{d['mean_slope']:>12.3f}"
                f"{d['mean_negative_per_run']:>9.2f}{d['mean_significant_negative_001_per_run']:>11.2f}"
            )
