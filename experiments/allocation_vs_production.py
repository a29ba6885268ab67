"""``allocation-vs-production``: an optimised budget allocation against the 2020 production one.

The ``pl94`` schema, a synthetic state (nation → state → county → tract → block group →
block; :func:`~censusdp.hierarchy.synthetic.synthetic_state`), the nation and state totals
invariant, the 2020 production allocation of ρ = 293764/114921 (docs/design.md § Census histograms). The objective
is the Bureau's stated priorities as a sum of relative variances (mean over nodes and rows of
``Var / size²``): total population of counties and tracts, Hispanic × race at tract and block
group, voting-age population (``adult``) at block group. Sizes are *declared* typical
populations, not read from data: county 100,000; tract 4,000 (the Bureau's optimum tract
size); block group 1,500 (between its 600 and 3,000 thresholds); a Hispanic × race row is
1/126 of its node, the voting-age population 78% (2020: 77.9% of the US population is 18+).

1. :func:`~censusdp.estimation.gls.allocate.optimise_allocation` finds level and query shares at
   the same ρ (each measured query ≥ 1% of its production share), with a certified duality
   gap; both allocations are evaluated exactly (discrete Gaussian plans,
   :func:`~censusdp.estimation.gls.predict.predict_errors`).
2. Simulated releases check the prediction: the structured GLS on simulated discrete
   Gaussian noise over zero counts (its error is linear in the noise and does not depend on
   the counts), the objective's empirical value per release and its 95% interval over
   releases, for both allocations.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review — the production allocation and the stated priorities.
Silvey, Titterington & Torsney (1978); Yu (2010) — the multiplicative design algorithm.
"""

from __future__ import annotations

import numpy as np

from censusdp.estimation.gls.allocate import Objective, Target, optimise_allocation
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.structured import structured_gls
from censusdp.experiments.registry import ExperimentContext, ExperimentInfo, repeat
from censusdp.experiments.reporting import Report, pyplot
from censusdp.hierarchy.synthetic import synthetic_state
from censusdp.mechanisms.product_measure import ProductInvariant, measure_products
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Allocation, Schema

INFO = ExperimentInfo(
    reproduces="An optimised ρ allocation against the 2020 production one on the Bureau's "
    "stated priorities (pl94, synthetic state): predicted and simulated relative variances, "
    "which targets got better or worse",
    paper="",
    data=(),
    full_run="17 min",
)

#: Blocks of the synthetic state and simulated releases per allocation (full, quick).
BLOCKS, BLOCKS_QUICK = 6_000, 1_500
RELEASES, RELEASES_QUICK = 20, 4
#: Declared typical persons per node, and each target's row share of it.
POPULATION = {"county": 100_000, "tract": 4_000, "block_group": 1_500}
TARGETS = (
    ("county", "total", 1.0),
    ("tract", "total", 1.0),
    ("tract", "hispanic * cenrace", 1 / 126),
    ("block_group", "hispanic * cenrace", 1 / 126),
    ("block_group", "adult", 0.78),
)
FLOOR, TOLERANCE = 0.01, 1e-3
GOAL = 0.15


def objective(weights: dict[str, float] | None = None) -> Objective:
    """The Bureau's priorities as a sum of relative variances (weights 1, or ``weights`` by
    target label; targets weighted 0 are left out)."""
    targets = []
    for lvl, q, share in TARGETS:
        t = Target(lvl, q, 1.0, POPULATION[lvl] * share)
        w = 1.0 if weights is None else weights.get(t.label, 0.0)
        if w > 0:
            targets.append(Target(lvl, q, w, t.size))
    return Objective(tuple(targets), "sum")


def _simulate(h, schema: Schema, allocation: Allocation, obj: Objective, rng, releases: int):
    """Per release, each target's empirical relative variance (mean over nodes and rows of
    error² / size²): the GLS on simulated noise over zero counts."""
    plan = allocation_plan(schema, allocation, levels=h.names)
    counts = [np.zeros((n, *schema.shape), np.int64) for n in h.sizes]
    total = ProductQuery.parse(schema, "total")
    inv = [
        ProductInvariant(lvl, total, np.zeros((h.sizes[k], 1), np.int64))
        for k, lvl in enumerate(h.names[:2])
    ]

    def relative_variances(meas, _):
        rel = structured_gls(h, schema, meas, inv)  # the truth is 0: estimates are errors
        return [
            float(np.mean(rel.query_estimates(t.level, t.query) ** 2)) / t.size**2
            for t in obj.targets
        ]

    def draw(rr):
        return measure_products(counts, plan, rr, level_names=h.names)

    out, _ = repeat(releases, rng, draw, {"gls": relative_variances}, stream="release/{}")
    return np.array(out["gls"], np.float64).reshape(releases, len(obj.targets))


def _compare(res, sims: dict, releases: int, strategy: tuple[str, ...]) -> dict:
    """Predicted and simulated objective of production and optimised, and per target."""
    obj = res.objective
    weights = np.array([t.weight for t in obj.targets])
    emp = {}
    for name, s in sims.items():
        per_release = s @ weights
        emp[name] = {
            "objective": float(per_release.mean()),
            "ci95": float(1.96 * per_release.std(ddof=1) / np.sqrt(releases)),
            "targets": s.mean(axis=0),
            "targets_se": s.std(axis=0, ddof=1) / np.sqrt(releases),
        }
    rp, ro = emp["production"], emp["optimised"]
    ratio = ro["objective"] / rp["objective"]
    # the ratio's interval: delta method over independent releases
    ratio_ci = (
        1.96
        * ratio
        * np.hypot(ro["ci95"] / 1.96 / ro["objective"], rp["ci95"] / 1.96 / rp["objective"])
    )
    targets = []
    for j, t in enumerate(obj.targets):
        b, a = float(res.targets_before[j]), float(res.targets_after[j])
        targets.append(
            {
                "target": t.label,
                "weight": t.weight,
                "size": t.size,
                "predicted_production": b,
                "predicted_optimised": a,
                "change": None if b == 0 else a / b - 1,
                "simulated_production": float(rp["targets"][j]),
                "simulated_production_se": float(rp["targets_se"][j]),
                "simulated_optimised": float(ro["targets"][j]),
                "simulated_optimised_se": float(ro["targets_se"][j]),
                "verdict": "held exactly" if b == 0 and a == 0
                else ("better" if a < b else "worse" if a > b else "same"),
            }
        )  # fmt: skip
    return {
        "predicted_production": res.before,
        "predicted_optimised": res.after,
        "predicted_improvement": res.improvement,
        "simulated_production": rp["objective"],
        "simulated_production_ci95": rp["ci95"],
        "simulated_optimised": ro["objective"],
        "simulated_optimised_ci95": ro["ci95"],
        "simulated_improvement": 1 - ratio,
        "simulated_improvement_ci95": float(ratio_ci),
        "goal_met": bool(res.improvement >= GOAL and 1 - ratio - ratio_ci >= GOAL),
        "certified": res.certified,
        "duality_gap": res.gap,
        "lower_bound": res.bound,
        "iterations": res.iterations,
        "predictions": res.evaluations,
        "optimise_seconds": res.seconds,
        "targets": targets,
        "levels_optimised": {k: float(v) for k, v in res.allocation.levels.items()},
        "largest_shares": sorted(
            (
                (float(r / res.allocation.rho), lvl, q)
                for lvl, q, r in res.allocation.query_rhos(strategy)
            ),
            reverse=True,
        )[:6],
    }


def run(ctx: ExperimentContext) -> dict:
    blocks = BLOCKS_QUICK if ctx.quick else BLOCKS
    releases = RELEASES_QUICK if ctx.quick else RELEASES
    schema = Schema.load("pl94")
    h = synthetic_state(1, blocks=blocks).hierarchy
    total = ProductQuery.parse(schema, "total")
    invariants = [("nation", total), ("state", total)]

    # 1. relative: the declared sizes, weights 1 (the smallest cells dominate);
    # 2. balanced: each target weighted by 1 / its production relative variance, so the
    #    objective is the mean ratio to production (targets held exactly are left out)
    with ctx.timed("optimise", cpu=True):
        results = {"relative": optimise_allocation(
            h, schema, objective(), invariants, floor=FLOOR, tolerance=TOLERANCE)}  # fmt: skip
        first = results["relative"]
        balance = {
            t.label: 1.0 / v
            for t, v in zip(first.objective.targets, first.targets_before, strict=True)
            if v > 0
        }
        results["balanced"] = optimise_allocation(
            h, schema, objective(balance), invariants, floor=FLOOR, tolerance=TOLERANCE
        )

    with ctx.timed("simulate", cpu=True):
        every = objective()  # all targets: simulate once, weight per objective afterwards
        labels = [t.label for t in every.targets]
        sim = {
            "production": _simulate(
                h, schema, schema.allocation, every, ctx.rng.child("p"), releases
            )
        }
        for name, res in results.items():
            sim[name] = _simulate(h, schema, res.allocation, every, ctx.rng.child(name), releases)

    metrics: dict = {
        "blocks": blocks,
        "nodes": dict(zip(h.names, (int(n) for n in h.sizes), strict=True)),
        "rho": str(schema.allocation.rho),
        "releases": releases,
        "floor": FLOOR,
        "levels_production": {k: float(v) for k, v in schema.allocation.levels.items()},
    }
    for name, res in results.items():
        cols = [labels.index(t.label) for t in res.objective.targets]
        sims = {"production": sim["production"][:, cols], "optimised": sim[name][:, cols]}
        metrics[name] = _compare(res, sims, releases, schema.strategy)
    metrics["goal_met"] = all(metrics[n]["goal_met"] for n in results)
    _figure(ctx, metrics)
    ctx.write_report(_report(ctx, metrics))
    return metrics


def _figure(ctx: ExperimentContext, metrics: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for ax, name in zip(axes[:2], ("relative", "balanced"), strict=True):
        m = metrics[name]
        shown = [t for t in m["targets"] if t["predicted_production"] > 0]
        x = np.arange(len(shown))
        for i, (who, colour) in enumerate((("production", "tab:grey"), ("optimised", "tab:blue"))):
            pred = [t[f"predicted_{who}"] for t in shown]
            sim = [t[f"simulated_{who}"] for t in shown]
            se = [1.96 * t[f"simulated_{who}_se"] for t in shown]
            ax.bar(x + (i - 0.5) * 0.38, pred, 0.38, color=colour, label=f"{who} (predicted)")
            ax.errorbar(x + (i - 0.5) * 0.38, sim, yerr=se, fmt="o", color="k", ms=3,
                        label="simulated, 95% CI" if i else None)  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([t["target"] for t in shown], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("relative variance (Var / size²)")
        ax.legend(fontsize=7)
        ax.set_title(
            f"{name} objective: {-100 * m['predicted_improvement']:+.1f}% predicted, "
            f"{-100 * m['simulated_improvement']:+.1f}% simulated",
            fontsize=9,
        )
    names = list(metrics["levels_production"])
    y = np.arange(len(names))
    bars = [("production", metrics["levels_production"], "tab:grey")] + [
        (n, metrics[n]["levels_optimised"], c)
        for n, c in (("relative", "tab:blue"), ("balanced", "tab:orange"))
    ]
    for i, (label, shares, colour) in enumerate(bars):
        axes[2].barh(y + (i - 1) * 0.27, [shares[n] for n in names], 0.27, color=colour,
                     label=label)  # fmt: skip
    axes[2].set_yticks(y)
    axes[2].set_yticklabels(names)
    axes[2].invert_yaxis()
    axes[2].set_xlabel("share of ρ")
    axes[2].legend(fontsize=8)
    axes[2].set_title("Level shares", fontsize=9)
    fig.suptitle(f"Optimised vs 2020 production allocation at the same ρ = {metrics['rho']}")
    ctx.savefig(fig, "allocation_vs_production.png")


def _section(report: Report, name: str, m: dict, what: str) -> None:
    rows = [
        {
            "target": t["target"],
            "weight": t["weight"],
            "size": t["size"],
            "production (pred.)": t["predicted_production"],
            "optimised (pred.)": t["predicted_optimised"],
            "change": "—" if t["change"] is None else f"{100 * t['change']:+.1f}%",
            "production (sim.)": f"{t['simulated_production']:.4g} ± "
            f"{1.96 * t['simulated_production_se']:.2g}",
            "optimised (sim.)": f"{t['simulated_optimised']:.4g} ± "
            f"{1.96 * t['simulated_optimised_se']:.2g}",
            "verdict": t["verdict"],
        }
        for t in m["targets"]
    ]
    goal = "met" if m["goal_met"] else "NOT met"
    certificate = (
        f"certified relative duality gap {m['duality_gap']:.2g}"
        if m["certified"]
        else f"NOT certified: gap {m['duality_gap']:.2g}"
    )
    report.section(f"Objective `{name}`: {what}").bullets(
        [
            f"predicted: production {m['predicted_production']:.5g} → optimised "
            f"{m['predicted_optimised']:.5g} ({-100 * m['predicted_improvement']:+.1f}%)",
            f"simulated (95% CI over releases): production {m['simulated_production']:.5g} ± "
            f"{m['simulated_production_ci95']:.2g} → optimised {m['simulated_optimised']:.5g} ± "
            f"{m['simulated_optimised_ci95']:.2g} ({-100 * m['simulated_improvement']:+.1f}% ± "
            f"{100 * m['simulated_improvement_ci95']:.1f}%)",
            f"goal (≥ {100 * GOAL:.0f}% below production, predicted and simulated): {goal}",
            f"solver: {m['iterations']} iterations, {m['predictions']} predictions, "
            f"{m['optimise_seconds']:.0f} s; {certificate}, lower bound on the optimum "
            f"{m['lower_bound']:.5g} (continuous Gaussian model)",
            "largest (level, query) shares of ρ: "
            + "; ".join(f"{lvl} {q} {s:.3f}" for s, lvl, q in m["largest_shares"]),
        ]
    ).table(rows, formats={c: ".4g" for c in ("weight", "size", "production (pred.)",
                                               "optimised (pred.)")})  # fmt: skip


def _report(ctx: ExperimentContext, metrics: dict) -> Report:
    m = metrics
    shares = [
        {
            "level": lvl,
            "production": m["levels_production"][lvl],
            "relative": m["relative"]["levels_optimised"][lvl],
            "balanced": m["balanced"]["levels_optimised"][lvl],
        }
        for lvl in m["levels_production"]
    ]
    report = Report("allocation-vs-production", ctx).text(
        f"pl94 schema; synthetic state of {m['blocks']} blocks ({m['nodes']}); nation and "
        f"state totals invariant; ρ = {m['rho']} (zCDP) for every allocation; "
        f"{m['releases']} simulated releases per allocation (structured GLS on discrete "
        "Gaussian noise over zero counts). Targets (the Bureau's stated priorities): total "
        "population of counties and tracts, Hispanic × race at tract and block group, "
        "voting-age population at block group; relative variance = mean over nodes and rows "
        "of Var / size², sizes declared: county 100,000, tract 4,000, block group 1,500 "
        "persons; a Hispanic × race row 1/126 of them, voting age 78%. Every measured query "
        f"keeps ≥ {m['floor']:g} × its production share (so every table stays identified).",
        "The solver's certificate is for the continuous Gaussian model (σ² = Δ²/2ρ); the "
        "predicted values below are exact for the discrete Gaussian plans, whose variance is "
        "below σ² when σ < 1, so an optimised value can sit below the model's bound.",
    )
    _section(report, "relative", m["relative"], "sum of relative variances, weights 1")
    _section(
        report,
        "balanced",
        m["balanced"],
        "each target weighted by 1 / its production relative variance (the mean ratio "
        "to production; targets held exactly left out)",
    )
    return (
        report.section("Level shares of ρ")
        .table(shares, formats=".4f")
        .figures({"allocation_vs_production.png": "predicted and simulated objectives, shares"})
    )
