"""Exact error prediction on the 8.2M-block synthetic national hierarchy: prints one JSON object.

The synthetic U.S. of :func:`~censusdp.hierarchy.synthetic.synthetic_us` with a block-group
level (nation → state → county → tract → block group → block; 52 states, 3,221 counties,
85,000 tracts, ``--block-groups`` block groups, ``--blocks`` blocks), the ``pl94`` schema's
production strategy and allocation (``censusdp/schemas/pl94.toml``: 11 queries per
geounit, ρ = 293764/114921, discrete Gaussian noise) and the nation and state totals
invariant. :func:`~censusdp.estimation.gls.predict.predict_errors` gives the exact standard
error of every row of every strategy table at every node from the hierarchy's shape alone
(no counts, no noise); the summary is the per level × table × row one ``censusdp predict``
writes.

Stages (wall and CPU seconds; the synthetic hierarchy is built apart and not counted):
``classes`` (the quotient forest of shape classes), ``passes`` (the covariance passes on
the classes, every block of the marginal basis), ``summary`` (SE quantiles over nodes of all
11 tables at every level, weighted by class sizes). ``peak_rss_mb`` is the process's peak
resident memory (``resource.getrusage``), the hierarchy included. Goal: ≤ 60 s, ≤ 4 GB;
measured on the shared 2-core development machine under load: 30 s wall (16.6 CPU s:
classes 3.8, passes 6.8, summary 6.0) and 1.0 GB, for 567,637 classes standing for 8.5
million nodes.

Usage: ``python benchmarks/predict_national.py [--blocks N] [--block-groups N] [--seed S]``.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from censusdp.estimation.gls.predict import allocation_plan, predict_errors
from censusdp.hierarchy.shape_classes import shape_classes
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Schema

#: Tables and rows whose predicted SEs are printed per level (mean and max over nodes).
SHOWN = {
    "total": "total",
    "hhgq": "Household",
    "votingage * hispanic": "18 years and over × Hispanic or Latino",
    "detailed": None,  # the largest-SE cell
}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8_200_000)
    ap.add_argument("--block-groups", type=int, default=240_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    h = synthetic_us(args.seed, blocks=args.blocks, block_groups=args.block_groups).hierarchy
    build = time.perf_counter() - t0
    print(f"[{build:6.1f} s] hierarchy {dict(zip(h.names, h.sizes, strict=True))}", file=sys.stderr)

    schema = Schema.load("pl94")
    plan = allocation_plan(schema, levels=h.names)
    total = ProductQuery.parse(schema, "total")
    invariants = [("nation", total), ("state", total)]
    stages: dict[str, dict[str, float]] = {}

    def stage(name: str, w0: float, c0: float) -> None:
        stages[name] = {"seconds": time.perf_counter() - w0, "cpu_seconds": _cpu() - c0}
        print(f"[{stages[name]['seconds']:6.1f} s] {name}", file=sys.stderr, flush=True)

    w, c = time.perf_counter(), _cpu()
    classes = shape_classes(h)
    stage("classes", w, c)
    names, sizes = h.names, h.sizes
    del h  # only the classes are needed from here on
    w, c = time.perf_counter(), _cpu()
    pred = predict_errors(classes, schema, plan, invariants)
    stage("passes", w, c)
    w, c = time.perf_counter(), _cpu()
    summary = pred.summary()
    stage("summary", w, c)

    shown: dict[str, dict[str, dict[str, float]]] = {}
    for lvl in names:
        shown[lvl] = {}
        for table, label in SHOWN.items():
            rows = summary[(summary.level == lvl) & (summary.table == table)]
            if label is None:
                row = rows.loc[rows.se_max.idxmax()]
            else:
                row = rows[rows.label == label].iloc[0]
            shown[lvl][f"{table}: {row.label}"] = {
                "se_mean": round(float(row.se_mean), 4),
                "se_max": round(float(row.se_max), 4),
            }
    out = {
        "benchmark": "predict_national",
        "nodes": dict(zip(names, sizes, strict=True)),
        "classes": pred.diagnostics["classes"],
        "rho": str(schema.allocation.rho),
        "privacy": pred.privacy.text(),
        "seconds_hierarchy_not_counted": round(build, 2),
        "stages": {k: {m: round(v, 2) for m, v in s.items()} for k, s in stages.items()},
        "seconds": round(sum(s["seconds"] for s in stages.values()), 2),
        "cpu_seconds": round(sum(s["cpu_seconds"] for s in stages.values()), 2),
        "peak_rss_mb": round(_peak_mb(), 0),
        "summary_rows": int(len(summary)),
        "goal": {"seconds": 60, "peak_rss_mb": 4096},
        "predicted_se": shown,
    }
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return out


if __name__ == "__main__":
    main()
