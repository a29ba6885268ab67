"""National-scale projection (GLS) benchmark: prints one JSON object.

Synthetic U.S. geography (nation / 52 states / 3,221 counties / ~85,000 tracts / 8.2 million
blocks, one cell), nation and state totals invariant, exact discrete Gaussian noise at the
county, tract and block levels; then the tree GLS estimate with exact variances and unbiased
integer rounding. ``seconds`` is the time of noise + GLS + variances + rounding (the synthetic
data are not counted); ``peak_rss_mb`` is the process's peak resident memory.

With ``../shared/data/county_sex_age5_2010.csv`` present it also times the 3,221 counties ×
36 cells (sex × age) problem: total and detailed queries at every level, state totals
invariant.

Usage: ``python benchmarks/national_scale.py [--blocks N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.estimation import round_bipartite, round_release, tree_gls
from censusdp.hierarchy import Table
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.paths import shared_data_file
from censusdp.rng import KeyedRNG


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def national(blocks: int, seed: int) -> dict:
    t0 = time.perf_counter()
    table = synthetic_us(seed, blocks=blocks)
    h, cells = table.hierarchy, table.cells
    counts = table.all_levels()
    t1 = time.perf_counter()
    rng = KeyedRNG.reproducible(seed, warn=False)
    q = Query.total(cells)
    law = DiscreteGaussian(10)
    meas = measure(h.names, counts, [(k, q, law) for k in (2, 3, 4)], rng)
    invs = [invariant(counts, 0, q), invariant(counts, 1, q)]
    t2 = time.perf_counter()
    privacy = PrivacyStatement(
        "zcdp",
        rho=3 * law.privacy(1.0),
        invariants=("nation: total", "state: total"),
        mechanism="discrete_gaussian",
    )
    rel = tree_gls(h, cells, meas, invs, privacy)
    t3 = time.perf_counter()
    rounded = round_release(rel, rng, method="cells")
    t4 = time.perf_counter()
    exact_states = bool(np.array_equal(rounded.totals("state"), counts[1].sum(1)))
    err = rel.estimates[-1] - counts[-1]
    return {
        "blocks": int(h.leaves.size),
        "sizes": list(h.sizes),
        "seconds": t4 - t1,
        "seconds_per_stage": {
            "synthetic_data (not counted)": t1 - t0,
            "discrete_gaussian_noise": t2 - t1,
            "gls_with_variances": t3 - t2,
            "unbiased_rounding": t4 - t3,
        },
        "gls_path": rel.diagnostics["path"],
        "state_totals_exact_after_rounding": exact_states,
        "block_rmse": float(np.sqrt(np.mean(err**2))),
        "block_mean_reported_variance": float(rel.variances[-1].mean()),
        "noise_variance": law.variance,
        "max_consistency_residual": rel.diagnostics["max_consistency_residual"],
    }


def real_counties(seed: int) -> dict | None:
    path = shared_data_file("county_sex_age5_2010.csv")
    if path is None:
        return None
    import pandas as pd

    df = pd.read_csv(path, dtype={"fips": str})
    df = df[df["version"] == "sf2010"]
    table = Table.from_frame(df, [("state", "fips", 2), ("county", "fips")], "[MF]_*")
    h, cells, counts = table.hierarchy, table.cells, table.all_levels()
    rng = KeyedRNG.reproducible(seed, warn=False)
    law = DiscreteGaussian(4)
    plan = [(k, q, law) for k in range(3) for q in (Query.total(cells), Query.detailed(cells))]
    t0 = time.perf_counter()
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 1, Query.total(cells))]
    privacy = PrivacyStatement("zcdp", rho=6 * law.privacy(1.0), invariants=("state: total",))
    t1 = time.perf_counter()
    rel = tree_gls(h, cells, meas, invs, privacy)
    t2 = time.perf_counter()
    rounded = round_release(rel, rng, method="totals")
    t3 = time.perf_counter()
    bip = round_bipartite(h, rel.estimates[-1], rng)
    t4 = time.perf_counter()
    return {
        "counties": int(h.leaves.size),
        "cells": len(cells),
        "seconds_noise": t1 - t0,
        "seconds_gls_with_variances": t2 - t1,
        "seconds_rounding_totals": t3 - t2,
        "seconds_rounding_bipartite": t4 - t3,
        "state_totals_exact_after_rounding": bool(
            np.array_equal(rounded.totals("state"), counts[1].sum(1))
            and np.array_equal(bip[1].sum(1), counts[1].sum(1))
        ),
        "gls_path": rel.diagnostics["path"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8_200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = national(args.blocks, args.seed)
    out["real_county_sex_age"] = real_counties(args.seed)
    out["peak_rss_mb"] = _peak_mb()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
