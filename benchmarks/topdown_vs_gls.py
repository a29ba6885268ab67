"""Seconds of the TopDown-style baseline and of tree GLS on the 2010 county table.

nation → state (first two characters of the FIPS code) → county; 36 sex × age cells; state
totals invariant (the nation total is implied); total and detailed queries measured with
Gaussian noise at every level (discrete Gaussian when ``censusdp.mechanisms.discrete`` is
available). Without ``../shared/data/county_sex_age5_2010.csv`` a synthetic hierarchy of the
same size (52 states, 3,221 counties, 36 cells) is used.

Prints one JSON object: the best of ``--repeat`` runs of each estimator (every TopDown run
cold, with an empty problem cache), all run times, their ratio and the TopDown per-level
timings. Run ``python benchmarks/topdown_vs_gls.py [--seed N] [--rho R] [--repeat K]``.

References
----------
Abowd et al. (2022), "The 2020 Census Disclosure Avoidance System TopDown Algorithm",
Harvard Data Science Review.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import numpy as np
import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.estimation.topdown.flat import topdown
from censusdp.estimation.topdown.sparse import clear_pattern_cache
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms import Gaussian, Query, invariant, measure
from censusdp.paths import shared_data_file
from censusdp.rng import KeyedRNG

N_STATES, N_COUNTIES, N_CELLS = 52, 3221, 36


def county_table() -> tuple[Hierarchy, list[str], np.ndarray, str]:
    """The real sf2010 table, or a synthetic table of the same size."""
    path = shared_data_file("county_sex_age5_2010.csv")
    if path is not None:
        df = pd.read_csv(path, dtype={"fips": str, "gisjoin": str, "version": str})
        df = df[df["version"] == "sf2010"].reset_index(drop=True)
        cells = [c for c in df.columns if c not in ("gisjoin", "fips", "version")]
        states = sorted(df["fips"].str[:2].unique())
        parent = pd.Index(states).get_indexer(df["fips"].str[:2])
        h, order = Hierarchy.from_parents(
            ["nation", "state", "county"],
            [["US"], states, df["fips"].to_numpy()],
            [None, np.zeros(len(states), np.int64), parent],
            return_order=True,
        )
        leaf = df[cells].to_numpy(np.int64)[order[2]]
        return h, cells, leaf, "county_sex_age5_2010.csv (sf2010)"
    rng = np.random.default_rng(2010)
    state_of = np.concatenate(
        [np.arange(N_STATES), rng.integers(0, N_STATES, N_COUNTIES - N_STATES)]
    )
    states = [f"{i:02d}" for i in range(N_STATES)]
    codes = [f"{s:02d}{i:03d}" for i, s in enumerate(state_of)]
    h, order = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], states, codes],
        [None, np.zeros(N_STATES, np.int64), state_of],
        return_order=True,
    )
    size = np.exp(rng.normal(10.2, 1.5, N_COUNTIES))
    cells = [f"c{j:02d}" for j in range(N_CELLS)]
    leaf = rng.poisson(size[:, None] * rng.dirichlet(np.ones(N_CELLS), N_COUNTIES))
    return h, cells, leaf[order[2]].astype(np.int64), "synthetic (52 states, 3,221 counties)"


def noise_law(sigma: float):
    try:
        from censusdp.mechanisms.discrete import DiscreteGaussian

        return DiscreteGaussian(sigma)
    except ImportError:
        return Gaussian(sigma)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rho", type=float, default=1.0, help="total zCDP budget")
    ap.add_argument("--repeat", type=int, default=3, help="runs per estimator (best is kept)")
    args = ap.parse_args()

    h, cells, leaf, source = county_table()
    counts = h.aggregate(leaf)
    queries = (Query.total(cells), Query.detailed(cells))
    rho_q = args.rho / (h.depth * len(queries))  # equal shares; sensitivity 1 per query
    law = noise_law(1.0 / math.sqrt(2.0 * rho_q))
    plan = [(k, q, law) for k in range(h.depth) for q in queries]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(args.seed, warn=False))
    invs = [invariant(counts, 1, Query.total(cells))]
    privacy = PrivacyStatement(
        "zcdp", rho=args.rho, invariants=("nation: total", "state: total"), mechanism=law.name
    )

    try:
        from censusdp.estimation.gls.tree import tree_gls
    except ImportError as exc:  # the GLS module is not there yet
        tree_gls, gls_error = None, f"censusdp.estimation.gls.tree unavailable: {exc}"
    else:
        gls_error = None

    # Best of ``--repeat`` interleaved runs of each (the machine may be shared); every TopDown
    # run starts from an empty problem cache, i.e. pays cvxpy's compilation as a one-off
    # release does.
    td_times, gls_times = [], []
    rel = None
    for _ in range(args.repeat):
        clear_pattern_cache()
        t0 = time.perf_counter()
        td = topdown(h, cells, meas, invs, privacy)
        td_times.append(time.perf_counter() - t0)
        if tree_gls is not None:
            t0 = time.perf_counter()
            rel = tree_gls(h, cells, meas, invs, privacy)
            gls_times.append(time.perf_counter() - t0)
    td_s = min(td_times)
    gls_s = min(gls_times) if gls_times else None

    out = {
        "data": source,
        "levels": dict(zip(h.names, h.sizes, strict=True)),
        "cells": len(cells),
        "noise": repr(law),
        "repeat": args.repeat,
        "topdown_seconds": td_s,
        "gls_seconds": gls_s,
        "topdown_seconds_all": td_times,
        "gls_seconds_all": gls_times,
        "ratio_topdown_over_gls": (td_s / gls_s) if gls_s else None,
        "topdown_levels": {
            name: {
                key: d[key]
                for key in ("parents_solved", "trivial_single_child", "seconds", "milp_fallbacks")
            }
            for name, d in td.diagnostics["levels"].items()
        },
        "topdown_county_mae": float(np.abs(td.level("county") - counts[2]).mean()),
        "gls_county_mae": (
            float(np.abs(rel.level("county") - counts[2]).mean()) if rel is not None else None
        ),
        "gls_kernel": (
            f"{rel.diagnostics['path']}/{rel.diagnostics.get('kernel', '?')}"
            if rel is not None
            else None
        ),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if gls_error:
        out["gls_error"] = gls_error
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
