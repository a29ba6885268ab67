"""Top-down streaming rounding of pl94 schema histograms, partition by county.

A synthetic state (:func:`~censusdp.hierarchy.synthetic.synthetic_state`, ``--blocks``
blocks: nation → state → county → tract → block group → block) with the ``pl94`` person
histogram (:func:`~censusdp.hierarchy.synthetic.pl94_histogram`, 2,016 cells) plus Gaussian
noise (σ = ``--sigma`` per block cell, centred within each county so that county, state and
nation totals are integers, as under a state-total invariant), made consistent by summing
the blocks up: GLS-like real cell tensors at every level, never held for more than one
county at a time.

Stages:

* ``top`` — the nation, state and county tensors (one pass over the counties, keeping only
  each county's sum), rounded by :func:`round_structured_top` with the nation and state
  totals invariant;
* ``partitions`` — per county: its tract, block-group and block tensors regenerated and
  rounded by :func:`round_structured_partition`; the checks (every cell ⌊x⌋ or ⌈x⌉, children
  = parent cell by cell) run outside the timed rounding.

Reports wall and CPU seconds of the rounding alone (and of generating the estimates), the
peak resident memory of the process (``VmHWM``) and the largest county's block tensor, so a
run at two sizes shows memory not growing with the number of blocks. Prints one JSON object.

Usage: ``python benchmarks/structured_rounding.py [--blocks N] [--sigma S] [--seed S]
[--no-spreads]``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

from censusdp.estimation.gls import Forest
from censusdp.estimation.structured_rounding import (
    round_structured_partition,
    round_structured_top,
)
from censusdp.hierarchy.synthetic import PL94_SHAPE, pl94_histogram, synthetic_state
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

COUNTY = 2  # nation 0, state 1, county 2


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def county_ranges(h, c: int) -> list[tuple[int, int]]:
    """Node ranges of county ``c``'s subtree, county level to blocks."""
    ranges = [(c, c + 1)]
    for k in range(COUNTY, h.depth - 1):
        lo = h.descendant_range(k, ranges[-1][0], k + 1)[0]
        hi = h.descendant_range(k, ranges[-1][1] - 1, k + 1)[1]
        ranges.append((lo, hi))
    return ranges


def county_estimates(pop, h, c: int, seed: int, sigma: float) -> tuple[Forest, list]:
    """County ``c``'s real tensors, county level first (flat cells), and its forest."""
    ranges = county_ranges(h, c)
    lo, hi = ranges[-1]
    K = int(np.prod(PL94_SHAPE))
    block, cell, count = pl94_histogram(pop, seed, lo, hi)
    x = np.random.default_rng([seed, 7, c]).standard_normal((hi - lo, K))
    x -= x.mean()  # the county's noise sums to zero: county totals stay integers
    x *= sigma
    np.add.at(x, (block - lo, cell), count.astype(np.float64))
    f = Forest.of(h, COUNTY, ranges)
    return f, f.aggregate(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=160_000)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-spreads", action="store_true", help="skip the variance spreads")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    spreads = not args.no_spreads
    schema = Schema.load("pl94")
    t = synthetic_state(args.seed, blocks=args.blocks)
    h, pop = t.hierarchy, t.leaf_counts[:, 0]
    n_counties = h.levels[COUNTY].size
    K = schema.n_cells
    rng = KeyedRNG.reproducible(args.seed, warn=False)

    gen_wall = gen_cpu = 0.0
    w0, c0 = time.perf_counter(), time.process_time()
    county = np.empty((n_counties, K))
    for c in range(n_counties):
        county[c] = county_estimates(pop, h, c, args.seed, args.sigma)[1][0][0]
    gen_wall += time.perf_counter() - w0
    gen_cpu += time.process_time() - c0
    state = county.sum(axis=0, keepdims=True)  # one state
    top_est = [state, state, county]
    total = ProductQuery.parse(schema, "total")
    truth = np.array([[int(pop.sum())]])
    invs = [ProductInvariant(0, total, truth), ProductInvariant(1, total, truth)]

    w0, c0 = time.perf_counter(), time.process_time()
    top = round_structured_top(
        h,
        schema,
        [e.reshape(-1, *schema.shape) for e in top_est],
        rng,
        invariants=invs,
        spreads=spreads,
    )
    top_wall, top_cpu = time.perf_counter() - w0, time.process_time() - c0
    assert int(top.counts[0].sum()) == int(pop.sum()) == int(top.counts[1].sum())

    part_wall = part_cpu = 0.0
    largest = 0
    checked = 0
    for c in range(n_counties):
        w0, c0 = time.perf_counter(), time.process_time()
        f, est = county_estimates(pop, h, c, args.seed, args.sigma)
        gen_wall += time.perf_counter() - w0
        gen_cpu += time.process_time() - c0
        largest = max(largest, est[-1].nbytes)
        ranges = county_ranges(h, c)
        w0, c0 = time.perf_counter(), time.process_time()
        out = round_structured_partition(
            f,
            [r[0] for r in ranges],
            h.sizes[COUNTY:],
            schema,
            top.counts[COUNTY][c : c + 1],
            None if top.spread is None else top.spread[COUNTY][c : c + 1],
            [e.reshape(-1, *schema.shape) for e in est[1:]],
            rng,
        )
        part_wall += time.perf_counter() - w0
        part_cpu += time.process_time() - c0
        ints = [top.counts[COUNTY][c : c + 1].reshape(1, K)] + [
            o.reshape(-1, K) for o in out.counts
        ]
        for j in range(1, f.depth):
            for r in range(0, est[j].shape[0], 4096):  # checked in slices: no level-sized copy
                d = ints[j][r : r + 4096] - est[j][r : r + 4096]
                assert np.all((d > -1.0) & (d < 1.0))
            assert np.array_equal(f.sum_children(j - 1, ints[j]), ints[j - 1])
            checked += ints[j].size
        del f, est, out, ints

    print(
        json.dumps(
            {
                "blocks": int(h.leaves.size),
                "geounits": int(sum(h.sizes)),
                "cells": K,
                "counties": int(n_counties),
                "persons": int(pop.sum()),
                "sigma": args.sigma,
                "spreads": spreads,
                "rounding_wall_s": round(top_wall + part_wall, 3),
                "rounding_cpu_s": round(top_cpu + part_cpu, 3),
                "top_wall_s": round(top_wall, 3),
                "partitions_wall_s": round(part_wall, 3),
                "generate_wall_s": round(gen_wall, 3),
                "generate_cpu_s": round(gen_cpu, 3),
                "largest_county_block_tensor_mb": round(largest / 2**20, 1),
                "peak_rss_mb": round(vm_hwm_mb(), 1),
                "cells_checked": int(checked),
                "invariants_exact": True,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
