"""``topdown-small-area``: the small-area bias of TopDown against unbiased GLS.

One synthetic state with 100 counties whose sizes are lognormal between 10 and 100,000 people,
three cells per county, the state total held invariant. The state's cells and every county's
total and cells are measured with discrete Gaussian noise; 50 runs (``--quick``: 10). For each
estimator the county total error (estimate − truth) is averaged over the runs and regressed by
ordinary least squares on log(true county size).

Expected: TopDown-style shows a negative slope — its non-negativity pushes small counties up
and, with the state total fixed, the large counties down — while GLS, linear in the noise and
therefore unbiased, shows a slope indistinguishable from zero.

References
----------
Abowd et al. (2022), "The 2020 Census Disclosure Avoidance System TopDown Algorithm",
Harvard Data Science Review.
Gao, Gong & Yu (2022), "Subspace Differential Privacy", AAAI, §1 and Fig. 1 (the negative
slope of county error on log population in the Bureau's demonstration runs).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from censusdp.budget import Accounting, PrivacyStatement
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.topdown.flat import topdown
from censusdp.experiments.registry import ExperimentContext, ExperimentInfo, repeat
from censusdp.experiments.reporting import Report, pyplot
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms import Query, invariant, measure
from censusdp.mechanisms.discrete import DiscreteGaussian

#: What this study reproduces, for ``censusdp experiment --list`` and the README.
INFO = ExperimentInfo(
    reproduces="TopDown-style small-area bias against GLS, 100 counties, 50 runs",
    paper="Abowd et al. (2022), The 2020 Census Disclosure Avoidance System TopDown Algorithm",
    data=(),
    full_run="12 s",
)

#: Counties, cells and noise scale of the study.
N_COUNTIES = 100
CELLS = ("under18", "adult", "senior")
SIGMA = 20
RUNS, RUNS_QUICK = 50, 10
SIZE_RANGE = (10, 100_000)
#: Mean and standard deviation of log10(county size) before clipping to SIZE_RANGE.
LOG10_SIZE = (2.5, 1.0)


def synthetic_state(rng: np.random.Generator) -> tuple[Hierarchy, np.ndarray]:
    """One state, ``N_COUNTIES`` counties: log10(size) ~ N(LOG10_SIZE) clipped to SIZE_RANGE."""
    lo, hi = np.log10(SIZE_RANGE[0]), np.log10(SIZE_RANGE[1])
    size = np.rint(10 ** np.clip(rng.normal(*LOG10_SIZE, N_COUNTIES), lo, hi)).astype(np.int64)
    share = rng.dirichlet(np.array([2.0, 5.0, 1.5]), N_COUNTIES)
    leaf = np.stack([rng.multinomial(n, p) for n, p in zip(size, share, strict=True)])
    codes = [f"99{i:03d}" for i in range(N_COUNTIES)]
    h, order = Hierarchy.from_parents(
        ["state", "county"],
        [["99"], codes],
        [None, np.zeros(N_COUNTIES, np.int64)],
        return_order=True,
    )
    return h, leaf[order[1]].astype(np.int64)


def run(ctx: ExperimentContext) -> dict:
    runs = RUNS_QUICK if ctx.quick else RUNS
    h, leaf = synthetic_state(ctx.rng.generator("topdown-small-area/truth"))
    counts = h.aggregate(leaf)
    true_total = counts[1].sum(axis=1)
    cells = list(CELLS)
    law = DiscreteGaussian(SIGMA)
    plan = [(0, Query.detailed(cells), law)] + [
        (1, q, law) for q in (Query.total(cells), Query.detailed(cells))
    ]
    invs = [invariant(counts, 0, Query.total(cells))]
    rho = sum(law.privacy(1.0) for _ in plan)
    privacy = PrivacyStatement(
        Accounting.ZCDP, rho=rho, delta=1e-10, invariants=("state: total",), mechanism=law.name
    )

    def county_error(estimator):
        return lambda meas, _: (
            estimator(h, cells, meas, invs, privacy).totals("county") - true_total
        )

    clock: dict[str, float] = {}
    estimators = {"topdown": county_error(topdown), "gls": county_error(tree_gls)}
    out, _ = repeat(runs, ctx.rng, lambda rr: measure(h.names, counts, plan, rr), estimators, clock)
    errors = {k: np.array(v, np.float64) for k, v in out.items()}
    ctx.timings.update({f"{k}_seconds": clock.get(k, 0.0) for k in ("topdown", "gls")})

    logsize = np.log(np.maximum(true_total, 1))
    metrics: dict = {
        "runs": runs,
        "counties": N_COUNTIES,
        "cells": cells,
        "sigma": SIGMA,
        "rho": rho,
    }
    small = true_total <= np.quantile(true_total, 0.2)
    large = true_total >= np.quantile(true_total, 0.8)
    for name, err in errors.items():
        mean_err = err.mean(axis=0)
        fit = stats.linregress(logsize, mean_err)  # OLS slope, its standard error and p
        metrics[name] = {
            "slope": float(fit.slope),
            "slope_se": float(fit.stderr),
            "slope_p": float(fit.pvalue),
            "mean_abs_error": float(np.abs(err).mean()),
            "mean_error_smallest_fifth": float(mean_err[small].mean()),
            "mean_error_largest_fifth": float(mean_err[large].mean()),
        }
    _figure(ctx, logsize, errors, metrics)
    ctx.write_report(_report(ctx, metrics, true_total, privacy))
    return metrics


def _figure(ctx: ExperimentContext, logsize: np.ndarray, errors: dict, metrics: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    x = logsize / np.log(10)
    grid = np.linspace(x.min(), x.max(), 50)
    for name, colour in (("topdown", "tab:red"), ("gls", "tab:blue")):
        mean_err = errors[name].mean(axis=0)
        m = metrics[name]
        axes[0].scatter(x, mean_err, s=12, alpha=0.7, color=colour, label=name)
        intercept = mean_err.mean() - m["slope"] * logsize.mean()
        axes[0].plot(
            grid,
            intercept + m["slope"] * grid * np.log(10),
            color=colour,
            label=f"{name}: slope {m['slope']:.2f} ± {m['slope_se']:.2f} per unit of ln(size)",
        )
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].set_xlabel("log10(true county size)")
    axes[0].set_ylabel(f"mean county total error over {metrics['runs']} runs")
    axes[0].legend(fontsize=8)
    bins = np.quantile(x, [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    cls = np.clip(np.searchsorted(bins, x, side="right") - 1, 0, 4)
    data, pos, colours = [], [], []
    for j in range(5):
        for i, (name, colour) in enumerate((("topdown", "tab:red"), ("gls", "tab:blue"))):
            data.append(errors[name][:, cls == j].ravel())
            pos.append(j * 3 + i)
            colours.append(colour)
    bp = axes[1].boxplot(data, positions=pos, widths=0.8, showfliers=False, patch_artist=True)
    for patch, colour in zip(bp["boxes"], colours, strict=True):
        patch.set_facecolor(colour)
        patch.set_alpha(0.5)
    axes[1].set_xticks([j * 3 + 0.5 for j in range(5)])
    axes[1].set_xticklabels(
        [f"{10 ** bins[j]:.0f}–{10 ** bins[j + 1]:.0f}" for j in range(5)], fontsize=8
    )
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set_xlabel("true county size (quintiles); red TopDown-style, blue GLS")
    axes[1].set_ylabel("county total error (all runs)")
    fig.suptitle("Small-area bias: TopDown-style vs GLS (one state, total invariant)")
    ctx.savefig(fig, "error_vs_log_size.png")


def _report(
    ctx: ExperimentContext, metrics: dict, true_total: np.ndarray, privacy: PrivacyStatement
) -> Report:
    td, gl = metrics["topdown"], metrics["gls"]
    rows = [
        {
            "estimator": name,
            "slope": m["slope"],
            "s.e.": m["slope_se"],
            "p": m["slope_p"],
            "mean abs error": m["mean_abs_error"],
            "mean error, smallest fifth": m["mean_error_smallest_fifth"],
            "mean error, largest fifth": m["mean_error_largest_fifth"],
        }
        for name, m in (("TopDown-style", td), ("GLS", gl))
    ]
    fmt = {"slope": ".3f", "s.e.": ".3f", "p": ".2g", "mean abs error": ".2f",
           "mean error, smallest fifth": "+.2f", "mean error, largest fifth": "+.2f"}  # fmt: skip
    return (
        Report("topdown-small-area", ctx)
        .text(
            f"One synthetic state, {metrics['counties']} counties (sizes {true_total.min()} to "
            f"{true_total.max()}, total {true_total.sum()}), cells {', '.join(metrics['cells'])}; "
            f"state total invariant; discrete Gaussian noise σ = {metrics['sigma']} on the state "
            f"cells and on every county's total and cells; {metrics['runs']} runs.",
            "OLS of the county total error (averaged over the runs) on log(true size):",
        )
        .table(rows, formats=fmt)
        .text(
            f"TopDown-style: slope {td['slope']:.3f} ({td['slope'] / td['slope_se']:.1f} standard "
            f"errors from zero); GLS: slope {gl['slope']:.3f} "
            f"({gl['slope'] / gl['slope_se']:.1f} standard errors). TopDown's non-negativity "
            "lifts the small counties and, with the state total fixed, lowers the large ones; "
            "GLS is linear in the noise and unbiased."
        )
        .figures({"error_vs_log_size.png": ""})
        .privacy(privacy)
    )
