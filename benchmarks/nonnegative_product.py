"""The non-negative product on one synthetic state: errors by size class and CPU seconds.

A synthetic state of ``--blocks`` blocks (:func:`~censusdp.hierarchy.synthetic.synthetic_state`,
persons over the 2,016 ``pl94`` cells), measured with the Bureau's 2020 production strategy
and allocation (:func:`~censusdp.estimation.gls.predict.allocation_plan`, nation and state
totals invariant), the structured GLS in memory
(:func:`~censusdp.pipelines.products.pl94_stream.measure_whole`,
:func:`~censusdp.estimation.gls.structured.structured_gls`), then the non-negative product
(:func:`~censusdp.estimation.integer.nonnegative.nonnegative_structured`) ``--repetitions`` times
with fresh rounding streams. Prints one JSON object: the product's CPU and wall seconds per
run, the CPU seconds of its transportation projections (summed over the runs), the largest
number of transportation-projection sweeps per level, and for every level
below the state and every size class (0, 1–9, 10–99, 100–999, 1000+ persons, by the true
total) the Census Bureau's metrics of the areas' totals against the truth
(:func:`~censusdp.pipelines.metrics.size_class_metrics`: MAE, RMSE, mean signed error,
MAPE, count off by more than 10%), averaged over the repetitions, beside those of the GLS
totals themselves. Confidential by construction (it compares with the truth): a
benchmark, not a release.

With ``--bias-check R`` it instead measures how well the published bias report
(:mod:`censusdp.pipelines.size_class_report`: re-simulated from the released non-negative
histogram as a pseudo-truth) recovers the bias at the truth, per block size class: the true
bias is the mean signed block error of ``R`` releases from the truth (fresh noise each),
the simulated one that of ``R`` replicates from release 0's non-negative block histogram
(its sizes class the blocks), each with its standard error over the runs; the ratio
simulated / true per class, and the empty blocks of the truth and of that release.

**The compiled transportation kernel** (2026-11-28,
:mod:`~censusdp.estimation.integer.transport_kernel` against the numpy sweeps it replaced,
the same hour, load 1–6 on the 2-core machine; every integer bit-identical): here (4,000
blocks, 2 runs, at most 43 sweeps) the projections took 0.289 → 0.108 CPU s; on
``benchmarks/nmf_national.py --fraction 1/256`` (32,031 blocks, structural zeros at ``−M``, up
to 50,860 sweeps) 15.74 → 1.71 CPU s, the integers stage 49.5 → 35.1 CPU s (counted 104.9 →
90.1), its release byte-identical. The rest of that stage is the HiGHS MILP of the hhgq
bounds (``nmf_integers.nearest_bounded_transport``, about half) and the dependent
rounding's ``settle_margins`` (its group sums' cumsums).

Usage: ``python benchmarks/nonnegative_product.py [--blocks N] [--seed S] [--repetitions R]
[--bias-check R]``.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021). Disclosure Avoidance and the 2020 Census: detailed summary
    metrics (by size bins).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

import censusdp.estimation.integer.nonnegative as nn
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.structured import structured_gls
from censusdp.hierarchy.synthetic import synthetic_state
from censusdp.pipelines.metrics import size_class_metrics
from censusdp.pipelines.products.pl94_stream import (
    SparseHistogram,
    SyntheticHistogram,
    exact_histograms,
    measure_whole,
)
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema


def _totals(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).reshape(x.shape[0], -1).sum(axis=1)


def run(blocks: int, seed: int, repetitions: int) -> dict:
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    schema = Schema.load("pl94")
    source = SyntheticHistogram(state.leaf_counts[:, 0], seed)
    meas, invs = measure_whole(
        h,
        schema,
        source,
        allocation_plan(schema, levels=h.names),
        KeyedRNG.reproducible(seed, warn=False),
    )
    rel = structured_gls(h, schema, meas, invs)
    del meas
    truth = [_totals(t) for t in exact_histograms(h, schema, source, h.depth - 1)]
    sweeps: dict[str, int] = {}
    projection = [0.0]
    project = nn.project_transport

    def counted(*args, **kw):  # the sweeps each level took and the CPU, for the report
        c = time.process_time()
        x, s = project(*args, **kw)
        projection[0] += time.process_time() - c
        level = kw.get("where", "")
        sweeps[level] = max(sweeps.get(level, 0), s)
        return x, s

    nn.project_transport = counted
    frames, cpu, wall = [], [], []
    try:
        for r in range(repetitions):
            rng = KeyedRNG.reproducible(seed + 1000 + r, warn=False).child("nonnegative")
            t0, c0 = time.perf_counter(), time.process_time()
            out = nn.nonnegative_structured(rel, rng, invariants=invs)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
            for k in range(2, h.depth):
                m = size_class_metrics(_totals(out.counts[k]), truth[k])
                frames.append(m.assign(level=h.names[k], product="nonnegative", rep=r))
    finally:
        nn.project_transport = project
    for k in range(2, h.depth):
        m = size_class_metrics(_totals(rel.estimates[k]), truth[k])
        frames.append(m.assign(level=h.names[k], product="gls", rep=0))
    f = pd.concat(frames)
    cols = ["n", "mae", "rmse", "mean_error", "mape", "over_10pct"]
    table = f.groupby(["product", "level", "size_class"], sort=False)[cols].mean().reset_index()
    table = table[table["n"] > 0].round(3)
    return {
        "hierarchy": str(h),
        "persons": int(truth[0][0]),
        "cpu_seconds": [round(c, 3) for c in cpu],
        "wall_seconds": [round(w, 3) for w in wall],
        "projection_cpu_seconds": round(projection[0], 3),
        "max_sweeps": sweeps,
        "size_classes": table.to_dict(orient="records"),
    }


def _block_bias(
    h, schema: Schema, source, plan, seed: int, runs: int
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Mean signed block error by size class of ``runs`` non-negative releases of ``source``
    (fresh measurement noise and rounding each), with its standard error over the runs;
    also the source's block totals and release 0's block histogram (blocks × cells)."""
    truth = _totals(exact_histograms(h, schema, source, h.depth - 1)[-1])
    frames, first = [], None
    for r in range(runs):
        rng = KeyedRNG.reproducible(seed + r, warn=False)
        meas, invs = measure_whole(h, schema, source, plan, rng)
        rel = structured_gls(h, schema, meas, invs)
        del meas
        out = nn.nonnegative_structured(rel, rng.child("nonnegative"), invariants=invs)
        leaf = np.asarray(out.counts[-1]).reshape(h.leaves.size, -1)
        if first is None:
            first = leaf
        m = size_class_metrics(leaf.sum(axis=1), truth)
        frames.append(m.assign(run=r))
    f = pd.concat(frames)
    g = f.groupby("size_class", sort=False)
    table = pd.DataFrame(
        {
            "n": g["n"].first(),
            "bias": g["mean_error"].mean(),
            "bias_se": g["mean_error"].std(ddof=1) / np.sqrt(runs),
        }
    )
    return table, truth, first


def bias_check(blocks: int, seed: int, runs: int) -> dict:
    """The simulated bias report against the bias at the truth, per block size class."""
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    schema = Schema.load("pl94")
    source = SyntheticHistogram(state.leaf_counts[:, 0], seed)
    plan = allocation_plan(schema, levels=h.names)
    true, truth, first = _block_bias(h, schema, source, plan, seed + 100, runs)
    block, cell = np.nonzero(first)
    pseudo = SparseHistogram(block, cell, first[block, cell])
    sim, released, _ = _block_bias(h, schema, pseudo, plan, seed + 5000, runs)
    rows = []
    for c in true.index:
        t, s = true.loc[c], sim.loc[c]
        if t["n"] == 0 and s["n"] == 0:
            continue
        rows.append(
            {
                "size_class": c,
                "blocks_truth": int(t["n"]),
                "blocks_release": int(s["n"]),
                "true_bias": round(float(t["bias"]), 3),
                "true_bias_se": round(float(t["bias_se"]), 3),
                "simulated_bias": round(float(s["bias"]), 3),
                "simulated_bias_se": round(float(s["bias_se"]), 3),
                "ratio_simulated_to_true": round(float(s["bias"] / t["bias"]), 2),
            }
        )
    return {
        "hierarchy": str(h),
        "persons": int(truth.sum()),
        "runs": runs,
        "empty_blocks_truth": int((truth == 0).sum()),
        "empty_blocks_release": int((released == 0).sum()),
        "by_size_class": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--bias-check", type=int, default=0, metavar="R")
    a = ap.parse_args()
    if a.bias_check:
        print(json.dumps(bias_check(a.blocks, a.seed, a.bias_check), indent=1))
    else:
        print(json.dumps(run(a.blocks, a.seed, a.repetitions), indent=1))


if __name__ == "__main__":
    main()
