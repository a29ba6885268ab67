"""Top-down streaming rounding of pl94 schema histograms, partition by partition.

A synthetic state (:func:`~censusdp.hierarchy.synthetic.synthetic_state`, ``--blocks``
blocks: nation → state → county → tract → block group → block) with the ``pl94`` person
histogram (:func:`~censusdp.hierarchy.synthetic.pl94_histogram`, 2,016 cells) plus Gaussian
noise (σ = ``--sigma`` per block cell, centred within each partition so that partition,
state and nation totals are integers, as under a state-total invariant), made consistent by
summing the blocks up: GLS-like real cell tensors at every level, never held for more than
one partition at a time.

Partitions are cut at ``--cut`` (``county``: one county each, as the streaming GLS
partitions; ``tract``: runs of whole tracts of at most ``--partition-blocks`` blocks, so that
no partition grows with the state — the synthetic counties are heavy-tailed, the largest of
160,000 blocks holds a fifth of them).

Stages:

* ``top`` — the nation … cut-level tensors (one pass over the partitions, keeping only each
  cut node's sum), rounded by :func:`round_structured_top` with the nation and state totals
  invariant;
* ``partitions`` — per partition: its tensors below the cut regenerated and rounded by
  :func:`round_structured_partition`; the checks (every cell ⌊x⌋ or ⌈x⌉, children = parent
  cell by cell) run outside the timed rounding.

Reports wall and CPU seconds of the rounding alone (and of generating the estimates), CPU
milliseconds per block, the peak resident memory of the process (``VmHWM``) and the largest
partition's block tensor, so runs at two sizes show whether memory grows with the number of
blocks; and, per level, the RMS movement of the nodes' *totals* by the rounding (rounded
total − real total, persons), the defect the controlled rounding fixes (each cell's own
rounding error is at most one person whatever the scheme), and the SHA-256 of every rounded
table (the top's levels, then each partition's, int64 in order): a kernel tuned without
changing the law leaves it as it was. Prints one JSON object.

Measured (``--blocks 16000``, shared 2-core machine): rounding CPU 14.3 s and peak RSS
1,682 MB with issue 33's flow kernel (each cycle walked from the cut node), 5.8 s and
1,387 MB with the leaf matrices swept by 4-cycles first, the walk on the ~5% of arcs left
(compact) and the network's arrays filled in place (issue 36); the totals' RMS movements
stay 0.55–0.59 / 0.49–0.50 / 0.41 persons (tract / block group / block). Then (issue 36, the
same digest ``627424af…``, the commit before and after alternated, load 11–17): 7.97 / 6.11
→ 6.13 / 4.70 CPU s and 1,427 → 1,196 MB with one conditional-shares kernel (caps once, only
rising columns water-filled again), the totals' bounds row by row without (n, K)
temporaries and a branch-light matrix sweep. Then (the same digest; partitions alone, one
thread, best of 3, load 5–6): 287 → 200 CPU µs per block, system time 79 → 8–12, with each
thread's network arrays and conditional values kept from partition to partition (fresh
level-sized arrays were zeroed and unmapped every time) and the walk reading an arc's
direction from the half-edge it came by. What is left is the cycle cancelling itself
(walk 68, 4-cycle sweep 63: its order fixes the integers; the walk's cycles average 85
arcs), then the conditional shares 12, building the network 9, uniforms 7, compaction 10.

Usage: ``python benchmarks/structured_rounding.py [--blocks N] [--cut county|tract]
[--partition-blocks B] [--sigma S] [--seed S] [--no-spreads]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import warnings

import numpy as np

from censusdp.estimation.gls.tree import Forest
from censusdp.estimation.integer.controlled import (
    round_structured_partition,
    round_structured_top,
)
from censusdp.hierarchy.synthetic import PL94_SHAPE, pl94_histogram, synthetic_state
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

LEVELS = {"county": 2, "tract": 3}  # nation 0, state 1


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def partitions(h, cut: int, budget: int) -> list[tuple[int, int]]:
    """Runs of cut-level nodes: one county each, or whole tracts up to ``budget`` blocks."""
    n = h.levels[cut].size
    if cut == LEVELS["county"]:
        return [(c, c + 1) for c in range(n)]
    blocks = np.bincount(h.ancestor_index(-1, cut), minlength=n)
    runs, a, size = [], 0, 0
    for t in range(n):
        if t > a and size + blocks[t] > budget:
            runs.append((a, t))
            a, size = t, 0
        size += blocks[t]
    runs.append((a, n))
    return runs


def ranges_of(h, cut: int, run: tuple[int, int]) -> list[tuple[int, int]]:
    """Node ranges of a run of cut-level nodes' subtrees, cut level to blocks."""
    ranges = [run]
    for k in range(cut, h.depth - 1):
        lo = h.descendant_range(k, ranges[-1][0], k + 1)[0]
        hi = h.descendant_range(k, ranges[-1][1] - 1, k + 1)[1]
        ranges.append((lo, hi))
    return ranges


def estimates(pop, h, cut: int, run, seed: int, sigma: float) -> tuple[Forest, list, list]:
    """A partition's real tensors, cut level first (flat cells), its forest and ranges."""
    ranges = ranges_of(h, cut, run)
    lo, hi = ranges[-1]
    K = int(np.prod(PL94_SHAPE))
    block, cell, count = pl94_histogram(pop, seed, lo, hi)
    x = np.random.default_rng([seed, 7, run[0]]).standard_normal((hi - lo, K))
    x -= x.mean()  # the partition's noise sums to zero: its total stays an integer
    x *= sigma
    np.add.at(x, (block - lo, cell), count.astype(np.float64))
    f = Forest.of(h, cut, ranges)
    return f, f.aggregate(x), ranges


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=160_000)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cut", choices=sorted(LEVELS), default="county")
    ap.add_argument("--partition-blocks", type=int, default=4096)
    ap.add_argument("--no-spreads", action="store_true", help="skip the variance spreads")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    spreads = not args.no_spreads
    schema = Schema.load("pl94")
    t = synthetic_state(args.seed, blocks=args.blocks)
    h, pop = t.hierarchy, t.leaf_counts[:, 0]
    cut = LEVELS[args.cut]
    runs = partitions(h, cut, args.partition_blocks)
    K = schema.n_cells
    rng = KeyedRNG.reproducible(args.seed, warn=False)

    gen_wall = gen_cpu = 0.0
    w0, c0 = time.perf_counter(), time.process_time()
    cut_est = np.empty((h.levels[cut].size, K))
    for run in runs:
        cut_est[slice(*run)] = estimates(pop, h, cut, run, args.seed, args.sigma)[1][0]
    gen_wall += time.perf_counter() - w0
    gen_cpu += time.process_time() - c0
    top_est = [cut_est]
    for k in range(cut, 0, -1):
        top_est.insert(0, h.aggregate_up(k, top_est[0]))
    total = ProductQuery.parse(schema, "total")
    truth = np.array([[int(pop.sum())]])
    invs = [ProductInvariant(0, total, truth), ProductInvariant(1, total, truth)]

    # once untimed: loads (or compiles) the numba kernels, a one-off per process
    round_structured_top(
        h, schema, [e.reshape(-1, *schema.shape) for e in top_est], rng, invariants=invs,
        spreads=spreads,
    )  # fmt: skip
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
    # per level: sum of squared movements of node totals, and node count
    moved = np.zeros((h.depth, 2))
    digest = hashlib.sha256()
    for c in top.counts:
        digest.update(np.ascontiguousarray(c, np.int64).tobytes())
    for k in range(cut + 1):
        d = top.counts[k].reshape(-1, K).sum(axis=1) - top_est[k].reshape(-1, K).sum(axis=1)
        moved[k] += (float(d @ d), d.size)

    part_wall = part_cpu = 0.0
    largest = 0
    checked = 0
    for run in runs:
        w0, c0 = time.perf_counter(), time.process_time()
        f, est, ranges = estimates(pop, h, cut, run, args.seed, args.sigma)
        gen_wall += time.perf_counter() - w0
        gen_cpu += time.process_time() - c0
        largest = max(largest, est[-1].nbytes)
        w0, c0 = time.perf_counter(), time.process_time()
        out = round_structured_partition(
            f,
            [r[0] for r in ranges],
            h.sizes[cut:],
            schema,
            top.counts[cut][slice(*run)],
            None if top.spread is None else top.spread[cut][slice(*run)],
            [e.reshape(-1, *schema.shape) for e in est[1:]],
            rng,
        )
        part_wall += time.perf_counter() - w0
        part_cpu += time.process_time() - c0
        ints = [top.counts[cut][slice(*run)].reshape(-1, K)] + [
            o.reshape(-1, K) for o in out.counts
        ]
        for o in out.counts:
            digest.update(np.ascontiguousarray(o, np.int64).tobytes())
        for j in range(1, f.depth):
            for r in range(0, est[j].shape[0], 4096):  # checked in slices: no level-sized copy
                d = ints[j][r : r + 4096] - est[j][r : r + 4096]
                assert np.all((d > -1.0) & (d < 1.0))
            assert np.array_equal(f.sum_children(j - 1, ints[j]), ints[j - 1])
            checked += ints[j].size
            d = ints[j].sum(axis=1) - est[j].sum(axis=1)
            moved[cut + j] += (float(d @ d), d.size)
        del f, est, out, ints

    print(
        json.dumps(
            {
                "blocks": int(h.leaves.size),
                "geounits": int(sum(h.sizes)),
                "cells": K,
                "cut": args.cut,
                "partitions": len(runs),
                "persons": int(pop.sum()),
                "sigma": args.sigma,
                "spreads": spreads,
                "rounding_wall_s": round(top_wall + part_wall, 3),
                "rounding_cpu_s": round(top_cpu + part_cpu, 3),
                "rounding_cpu_ms_per_block": round(1e3 * (top_cpu + part_cpu) / h.leaves.size, 3),
                "total_rms_movement": {
                    name: round(float(np.sqrt(moved[k, 0] / max(moved[k, 1], 1))), 3)
                    for k, name in enumerate(h.names)
                },
                "top_wall_s": round(top_wall, 3),
                "partitions_wall_s": round(part_wall, 3),
                "generate_wall_s": round(gen_wall, 3),
                "generate_cpu_s": round(gen_cpu, 3),
                "largest_partition_block_tensor_mb": round(largest / 2**20, 1),
                "peak_rss_mb": round(vm_hwm_mb(), 1),
                "cells_checked": int(checked),
                "invariants_exact": True,
                "digest_of_integer_tables": digest.hexdigest(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
