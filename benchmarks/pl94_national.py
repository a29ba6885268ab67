"""The national redistricting (pl94) workload, streamed on one machine: prints one JSON object.

The synthetic U.S. (:func:`~censusdp.hierarchy.synthetic.synthetic_us`: nation → 52 states →
3,221 counties → 85,000 tracts → 242,000 block groups → 8.2 million blocks, heavy-tailed
populations, 330 million persons) with ``--fraction F`` of every level below the states (at
least one county per state), its persons spread over the 2,016 ``pl94`` cells
(:class:`~censusdp.pipelines.pl94_stream.SyntheticHistogram`, generated partition by partition,
never whole). The production strategy and allocation of the Bureau's 2020 run (the schema's
``[allocation]``: 11 queries, 2,603 noisy counts per geounit, no total at the nation), exact
discrete Gaussian noise, the nation and state totals invariant, run by the streamed engine
:func:`~censusdp.pipelines.pl94_stream.stream_pl94` (cut at the counties, ``--partitions``
leaf-balanced runs of counties) and written partition by partition to a release store
(:class:`~censusdp.pipelines.pl94_store.Pl94StoreWriter`: P1–P5 tables per level and node,
covariance blocks per shape class, checksums last).

The JSON: blocks, geounits, noisy counts (and draws made: the downward pass regenerates each
partition's noise), wall and CPU seconds per stage (synthetic geography, pass 1 = the exact
sums above the cut, measure inside the partitions = histogram generation + query answers +
noise, structured GLS, rounding, store + checks), the peak resident memory of the process
(threads only: every process is this one), bytes written and the release's digest (partition-
and worker-independent), and the checks: every level's rounded total equals the persons, the
invariants ``==`` (US and every state), every cell ⌊x⌋ or ⌈x⌉, children summing to their
parent cell by cell, the 39 linear identities among the P1–P5 columns (P1_001N = P2_001N, a
total = the sum of its rows, ...) at every node. ``--check-county`` adds the slice check on
the county with the fewest blocks: the streamed structured GLS of its subtree equals the
in-memory one bit for bit, and on its smallest block group the dense tree GLS to ~1e-14.

Timings under load (a shared machine) should be read with their CPU seconds beside them.

Usage: ``python benchmarks/pl94_national.py [--fraction F] [--workers W] [--out DIR]
[--partitions P] [--seed S] [--cache-mb M] [--check-county] [--histograms]``.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (10 h 29 min on the Bureau's cluster).
U.S. Census Bureau (2021). DAS_2020_Redistricting_Production_Code.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from censusdp.estimation.predict import allocation_plan
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.pl94_store import Pl94Store, Pl94StoreWriter
from censusdp.pipelines.pl94_stream import (
    ReleaseChecks,
    SyntheticHistogram,
    county_measurements,
    slice_check,
    stream_pl94,
)
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

#: The full synthetic U.S. (2020 geography: 85,528 tracts, 242,335 block groups, 8.13 M blocks).
US = dict(states=52, counties=3221, tracts=85_000, block_groups=242_000, blocks=8_200_000,
          population=330_000_000)  # fmt: skip
#: Leaves per partition by default (runs of whole counties).
LEAVES_PER_PARTITION = 16_384


def _peak_mb() -> float:
    """Peak resident memory of this process (MB; its worker threads share it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:8.1f} s, peak {_peak_mb():7.0f} MB] {msg}",
          file=sys.stderr, flush=True)  # fmt: skip


def geography(fraction: float, seed: int):
    """The synthetic U.S. with ``fraction`` of its counties (at least one per state), tracts,
    block groups, blocks and persons."""
    if not 0 < fraction <= 1:
        raise SystemExit("--fraction must be in (0, 1]")
    n = {k: (v if k == "states" else max(1, round(v * fraction))) for k, v in US.items()}
    n["counties"] = max(n["counties"], n["states"])
    n["tracts"] = max(n["tracts"], n["counties"])
    n["block_groups"] = max(n["block_groups"], n["tracts"])
    n["blocks"] = max(n["blocks"], n["block_groups"])
    return synthetic_us(seed, **n)


def run(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    c_start = time.process_time()
    table = geography(args.fraction, args.seed)
    h = table.hierarchy
    pop = table.leaf_counts[:, 0]
    del table
    t_geo, c_geo = time.perf_counter() - t_start, time.process_time() - c_start
    _log(t_start, f"synthetic geography {h}")

    schema = Schema.load("pl94")
    plan = allocation_plan(schema, levels=h.names)
    source = SyntheticHistogram(pop, args.seed)
    rng = KeyedRNG.reproducible(args.seed, warn=False)
    total = ProductQuery.parse(schema, "total")
    n_parts = args.partitions or max(1, round(h.sizes[-1] / LEAVES_PER_PARTITION))
    checks = ReleaseChecks(h, tables=True)
    out_dir = Path(args.out)
    store_path = out_dir / "store"
    if store_path.exists():
        shutil.rmtree(store_path)

    t0, c0 = time.perf_counter(), time.process_time()
    with Pl94StoreWriter(store_path, h, schema, histograms=args.histograms) as store:
        t_classes, c_classes = time.perf_counter() - t0, time.process_time() - c0
        _log(t_start, f"store opened (shape classes: {t_classes:.1f} s); streaming")
        done = [0]

        def on_top(top) -> None:
            checks.top(top)
            store.top(top)
            _log(t_start, "top solved and rounded")

        def on_partition(out) -> None:
            checks.partition(out)
            store.partition(out)
            done[0] += 1
            if done[0] % max(1, n_parts // 10) == 0:
                _log(t_start, f"{done[0]}/{n_parts} partitions written")

        res = stream_pl94(
            h, schema, source, plan, rng, partitions=n_parts, workers=args.workers,
            cache_bytes=int(args.cache_mb * 2**20), on_top=on_top, on_partition=on_partition,
        )  # fmt: skip
        queries = [q for _, q, _ in plan] + [total, total]
        t1, c1 = time.perf_counter(), time.process_time()
        summary = store.finish(res, queries, info={"checks": checks.result(res.persons)})
        t_finish, c_finish = time.perf_counter() - t1, time.process_time() - c1
    t_run, c_run = time.perf_counter() - t0, time.process_time() - c0
    _log(t_start, "store written")
    d = res.diagnostics
    m = d["measure_inside_partitions"]
    stages = {
        "pass_1_exact_sums_above_the_cut": (d["seconds_truth"], d["cpu_seconds_truth"]),
        "measure_levels_above_the_cut": (d["seconds_measure_top"], d["cpu_seconds_measure_top"]),
        "measure_inside_partitions (generate + answer + noise; summed over threads)": (
            d["seconds_measure"], d["cpu_seconds_measure"]),
        "structured_gls": (d["seconds_gls"], d["cpu_seconds_gls"]),
        "rounding": (d["seconds_rounding"], d["cpu_seconds_rounding"]),
        "store_and_checks (callbacks)": (d["seconds_callbacks"], d["cpu_seconds_callbacks"]),
        "store_digest_and_manifest": (t_finish, c_finish),
        "shape_classes": (t_classes, c_classes),
    }  # fmt: skip
    out: dict = {
        "fraction": args.fraction,
        "blocks": int(h.sizes[-1]),
        "geounits": int(sum(h.sizes)),
        "nodes_per_level": dict(zip(h.names, map(int, h.sizes), strict=True)),
        "persons": res.persons,
        "partitions": len(res.partitions),
        "largest_partition_blocks": max(p.leaves for p in res.partitions),
        "workers": args.workers,
        "noisy_counts": res.noisy_counts,
        "noise_draws_made (regenerations included)": d["draws"],
        "seconds_synthetic_geography (not counted)": t_geo,
        "cpu_seconds_synthetic_geography (not counted)": c_geo,
        "seconds": t_run,
        "cpu_seconds": c_run,
        "seconds_per_stage": {k: v[0] for k, v in stages.items()},
        "cpu_seconds_per_stage": {k: v[1] for k, v in stages.items()},
        "seconds_histogram_generation_inside_partitions (summed over threads)": m[
            "seconds_generate"
        ],
        "seconds_noise_inside_partitions (summed over threads)": m["seconds_noise"],
        "partitions_regenerated": d["stream"]["partitions_regenerated"],
        "peak_rss_mb": {"this process (every worker is a thread of it)": _peak_mb()},
        "bytes_written": summary["bytes_written"],
        "files_written": summary["files"],
        "digest": summary["digest"],
        "store": str(store_path),
        "privacy": {
            "rho": res.privacy.rho,
            "invariants": list(res.privacy.invariants),
            "statement": res.privacy.text().split(". derived from")[0],
        },
        "checks": checks.result(res.persons),
        "ratio_to_the_bureau_37700_s": None,
    }
    if args.fraction == 1:
        out["ratio_to_the_bureau_37700_s"] = 37_700 / t_run
    t0 = time.perf_counter()
    out["store_verified"] = Pl94Store(store_path).verify() == summary["digest"]
    out["seconds_store_verify (not counted)"] = time.perf_counter() - t0
    (out_dir / "result.json").write_text(json.dumps(out, indent=2) + "\n")  # before the check
    if args.check_county:
        _log(t_start, "slice check on the smallest county")
        k = h.level_index("county")
        lo_hi = np.array([h.descendant_range(k, c, h.depth - 1) for c in range(h.sizes[k])])
        c = int(np.argmin(lo_hi[:, 1] - lo_hi[:, 0]))
        sub, smeas = county_measurements(h, schema, source, plan, rng, c)
        check = {"county": str(h[k].codes[c]), **slice_check(sub, schema, smeas, dense=False)}
        # the dense GLS holds (nodes, 2016, 2016) float64: on the county's smallest block group
        kb = h.level_index("block_group")
        lo, hi = h.descendant_range(k, c, kb)
        sizes = [np.diff(h.descendant_range(kb, b, h.depth - 1))[0] for b in range(lo, hi)]
        b = lo + int(np.argmin(sizes))
        bsub, bmeas = county_measurements(h, schema, source, plan, rng, b, level="block_group")
        check["dense_on_block_group"] = {
            "block_group": str(h[kb].codes[b]),
            **slice_check(bsub, schema, bmeas, dense=True),
        }
        out["check_county"] = check
    out["wall_seconds_total"] = time.perf_counter() - t_start
    out["peak_rss_mb"]["this process (every worker is a thread of it)"] = _peak_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="results/pl94_national")
    ap.add_argument(
        "--partitions",
        type=int,
        default=0,
        help=f"runs of counties (default: one per {LEAVES_PER_PARTITION} blocks)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cache-mb",
        type=float,
        default=0.0,
        help="memory for upward states kept between the passes (0: regenerate)",
    )
    ap.add_argument("--check-county", action="store_true")
    ap.add_argument(
        "--histograms",
        action="store_true",
        help="also store the rounded histograms (sparse; large)",
    )
    args = ap.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
