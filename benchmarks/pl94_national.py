"""The national redistricting (pl94) workload, streamed on one machine: prints one JSON object.

The synthetic U.S. (:func:`~censusdp.hierarchy.synthetic.synthetic_us`: nation → 52 states →
3,221 counties → 85,000 tracts → 242,000 block groups → 8.2 million blocks, heavy-tailed
populations, 330 million persons) with ``--fraction F`` of every level below the states (at
least one county per state), its persons spread over the 2,016 ``pl94`` cells
(:class:`~censusdp.pipelines.products.pl94_stream.SyntheticHistogram`, generated partition by partition,
never whole). The production strategy and allocation of the Bureau's 2020 run (the schema's
``[allocation]``: 11 queries, 2,603 noisy counts per geounit, no total at the nation), exact
discrete Gaussian noise, the nation and state totals invariant, run by the streamed engine
:func:`~censusdp.pipelines.products.pl94_stream.stream_pl94` (cut at the counties, ``--partitions``
leaf-balanced runs of counties) and written partition by partition to a release store
(:class:`~censusdp.pipelines.io.pl94_store.Pl94StoreWriter`: P1–P5 tables per level and node,
covariance blocks per shape class, checksums last).

Where the partitions run (``--scheduler``): ``sync`` (in this process), ``threads``
(``--workers`` threads) or ``dask`` (a fresh ``LocalCluster`` of ``--dask-workers`` worker
processes with one thread each, or the scheduler at ``--address``). Pass 1 and every
partition's upward and downward passes are tasks, sent only the partition's forest, its
leaves' persons and the sub-keys of its own noise and rounding chunks; each partition is
rounded, checked and written to the store *where its piece is computed* (the sink of
:func:`~censusdp.pipelines.products.pl94_stream.stream_pl94`), so only the cut-level messages and the
store files' checksums come back to this process. Partitions run largest first.
``--compare`` runs sync, Dask 1 worker and Dask 2 workers in turn on the same geography and
prints their three digests and the 2-over-1 speedup (wall seconds; meaningful on a machine
with two idle cores only: compare CPU seconds otherwise).

The JSON: blocks, geounits, noisy counts, per run wall and CPU seconds (of this process and
of the workers, ``getrusage`` before and after) and per stage (pass 1 = the exact sums above
the cut, measure inside the partitions = histogram generation + query answers + noise,
structured GLS, rounding, checks + store pieces, summed over the tasks: their threads' CPU
time wherever they ran), the peak resident memory of this process and of every worker
(``VmHWM``), bytes written and the release's content digest (independent of partitioning,
order, scheduler and workers; the digest of the runs quoted below) and release digest (the
SHA-256 of the store's manifest, which binds its privacy statement and every piece: keep it
to read the store back with ``Pl94Store(path, expected_digest=...)``), and the checks: every level's rounded total equals the persons, the
invariants ``==`` (US and every state), every cell ⌊x⌋ or ⌈x⌉, children summing to their
parent cell by cell, the 39 linear identities among the P1–P5 columns (P1_001N = P2_001N, a
total = the sum of its rows, ...) at every node. ``--check-county`` adds the slice check on
the county with the fewest blocks: the streamed structured GLS of its subtree equals the
in-memory one bit for bit, and on its smallest block group the dense tree GLS to ~1e-14.

Timings under load (a shared machine) should be read with their CPU seconds beside them.

Since 2026-11-28 the partitions are rounded as one flow network each (node totals within a
person at every level; :mod:`censusdp.estimation.integer.controlled`): a new law, so new digests,
and more work. ``--fraction 1/64`` on the shared 2-core machine (load 4.5–5): 84.0 CPU s, peak
7.1 GB, rounding 47.2 CPU s, digest ``41ee6188…``; the commit before the change, in the same
session (load 6–8): 68.3 CPU s, 4.7 GB, rounding 16.6 CPU s, digest ``f1e22567…``. The figures
below are of the earlier law and have not been re-measured.

Issue 36 (2026-11-28): the fused exact sampler (:mod:`censusdp.mechanisms.dg_kernel`: AES-NI
words inverted in one compiled pass, answers added in place) and upward states cached between
the passes within ``--cache-mb`` (default 1024, was 0). ``--fraction 1/64``, threads, 2 workers,
on the shared 2-core machine (load 5–12), two runs each of the commit before and after: digest
``41ee6188…`` in all four (unchanged); measure inside the partitions 7.70–7.92 → 4.53–5.32 CPU s
(3 of 8 partitions cached, 5 measured twice, against 8); structured GLS 18.0–21.7 → 12.8–18.5
CPU s; whole run 83.9–88.3 → 79.0–85.9 CPU s (the rounding, 51–56 CPU s, is untouched); peak
6.7–7.9 → 7.5–7.9 GB (the cache holds ≤ 1 GiB; a pl94 upward state is ~17.7 KB per block).
With ``--cache-mb 0`` (the kernel alone) the measurement took 7.43 CPU s; one partition's
measurement (26,113 blocks, 2,710 draws per block) 16.0–21.3 → 12.7–16.6 CPU µs per block
(best runs of alternating pairs; one outlier at 24.3 under load).

Both products and a memory budget (issue 36, 2026-11-28; ``--products`` default both,
``--memory-gb`` default 4). ``--fraction 1/64``, threads, 2 workers, the shared 2-core machine
at load 7–9 (wall seconds say little). Before (unbiased only, 8 partitions largest first, no
budget): 77.4 CPU s, peak 7.3 GB, digest ``2cda55cd…``; by stage (CPU s) rounding 49.6, GLS
17.3, measure 5.2, checks + store 4.3. RSS sampled per stage (``tracemalloc`` and ``/proc``,
one 32,031-block partition at 1/256, sync, cache 0): the upward pass 2.1 GB, the GLS output
2.45 GB, the rounding 2.0 GB, and the non-negative product made whole per partition 5.74 GB —
that product, not the GLS, drove the peak once both were made (8.4 GB at 1/64 before the run
was stopped). Now it is made a few tracts' subtrees at a time
(:data:`~censusdp.pipelines.products.pl94_stream.NONNEGATIVE_LEAVES`), the partitions are sized
by the budget, a large county runs beside a small one, and the driver starts a partition only
while the working sets in flight and the cached states fit
(:class:`~censusdp.pipelines.partition_driver.DriverOptions`): peak 5.7 GB with both products,
239.9 CPU s (the non-negative product 166.8 of them; the unbiased stages as before: rounding
45.3, GLS 13.8, measure 5.3, checks + store of both 7.2), digest ``2cda55cd…`` unchanged, every
check of both products true (``--platform-malloc``: 4.4 GB when stopped in the downward pass),
not yet the issue's 4 GB: the largest 1/64 county alone (26,113 blocks) takes ~2.5 GB from the
GLS output to its store pieces, and the county cut cannot split it (the block level in chunks
of block groups is left).
Re-measured at the end of that session on the idle machine (load 0.5–1.5), after the
rounding's per-thread scratch and the compiled transportation kernel: 154.6 s wall, 216.8 CPU s
(1,692 µs per block: measure 4.2, GLS 13.0, rounding 39.8, non-negative product 152.3 = 1,188
µs per block, checks + store 6.3), peak 7.22 GB (the per-thread rounding scratch stays resident
and the budget's 100 KB per block is below the resident cost), digest ``2cda55cd…``, every check
of both products true, store verified. Linear in blocks the full run is ~13,900 CPU s: the
non-negative product (its transport rounding and ``settle_margins``) is 70% of it.

Measured (2026-11-24, the 2-core machine, quiet; threads, ``--workers 2``, the process keeping
the memory it frees — one malloc arena, no trimming:
:func:`~censusdp.pipelines.execute.keep_freed_memory`):

* ``--fraction 1 --check-county`` (8,200,000 blocks, 8,530,274 geounits, 330,010,973 persons,
  22,204,303,221 noisy counts, 482 partitions, the largest 88,301 blocks): **3,261 s wall**,
  6,121 CPU s, peak **14.4 GB** (the largest partitions' working sets and what the heap keeps),
  2.66 GB written in 5,814 files, digest ``c44f4e0e…`` (the same release, bit for bit, as the
  first full run: 4,437 s, 8,060 CPU s, 10.6 GB), every check true, the store re-verified;
  **under the 3,600 s / 16 GB goal**, 11.6× faster than the Bureau's ~37,700 s on a cluster.
  CPU by stage (summed over the tasks): GLS 2,611 s, rounding 1,920 s, checks and store pieces
  664 s, measurement 820 s, pass 1 46 s, the driver's digest and manifest 50 s. Slice check on
  county 05021: streamed = in-memory structured GLS bit for bit, dense tree GLS on its block
  group to 1.0e-14 (estimates) and 2.6e-14 (variances).
* Cost linear in blocks (wall s / CPU s / CPU ms per block / peak): 1/64 (128,125 blocks, 8
  partitions) 54.7 / 100.1 / 0.78 / 4.9 GB; 1/16 (512,500, 31) 203.5 / 382.0 / 0.75 / 5.9 GB;
  1/4 (2,050,000, 120) 853.5 / 1,591.8 / 0.78 / 12.9 GB; 1 (8,200,000, 482) 3,261 / 6,121 /
  0.75 / 14.4 GB.
* ``--fraction 0.0625 --compare`` (512,500 blocks, 31 partitions, gzip level 1): the same digest
  ``9b1d28e9…`` from sync (367.9 s wall, 367.7 CPU s: 0.72 CPU ms per block), Dask 1 worker
  (328.9 s; 18 driver + 339 worker CPU s) and Dask 2 workers (192.6 s; 15 + 363); **2-over-1
  speedup 1.71**; peaks 3.0 GB (driver), 3.9 GB (the one worker), 3.3 GB each (two workers).
  (Before the memory policy and the lattice tabulation: 437.9, 469.1 and 271.4 s, speedup 1.73.)

Usage: ``python benchmarks/pl94_national.py [--fraction F] [--scheduler sync|threads|dask]
[--workers W] [--dask-workers N] [--address tcp://…] [--compare] [--out DIR]
[--partitions P] [--seed S] [--cache-mb M] [--memory-gb G] [--products unbiased,nonnegative]
[--check-county] [--histograms] [--platform-malloc]``.

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
import sys
import time
from pathlib import Path

import numpy as np

from censusdp.estimation.gls.predict import allocation_plan
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.execute import KEEP_FREED_MEMORY, keep_freed_memory, open_executor
from censusdp.pipelines.io.pl94_store import Pl94Store, Pl94StoreWriter
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.products.pl94_stream import (
    BLOCK_BYTES,
    Pl94StreamOptions,
    ReleaseChecks,
    Sinks,
    SyntheticHistogram,
    county_measurements,
    slice_check,
    stream_pl94,
)
from censusdp.pipelines.structured_stream import DEFAULT_CACHE_BYTES
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_stream import _process, _warm  # noqa: E402

#: The full synthetic U.S. (2020 geography: 85,528 tracts, 242,335 block groups, 8.13 M blocks).
US = dict(states=52, counties=3221, tracts=85_000, block_groups=242_000, blocks=8_200_000,
          population=330_000_000)  # fmt: skip
#: Leaves per partition at most by default (runs of whole counties).
LEAVES_PER_PARTITION = 16_384
#: The products a run can make (``--products``): the unbiased one is always made and stored.
PRODUCTS = ("unbiased", "nonnegative")
#: Memory outside the partitions' working sets (interpreter, libraries, the levels above the
#: cut, the store writer), left out of the partitions' budget.
BASE_BYTES = 600 * 2**20


def partitioning(h, budget: int, workers: int, partitions: int = 0) -> tuple[list, list[int]]:
    """The county runs of a run and their order: ``partitions`` of them, or as many as keep
    ``workers`` partitions' working sets (:data:`BLOCK_BYTES` per block) within the memory
    ``budget`` (and at most :data:`LEAVES_PER_PARTITION` blocks each); ordered largest,
    smallest, second largest, ... so a large partition runs beside a small one."""
    blocks = int(h.sizes[-1])
    leaves = LEAVES_PER_PARTITION
    if budget:
        room = max(budget - BASE_BYTES, BLOCK_BYTES)
        leaves = max(1, min(leaves, room // (workers * BLOCK_BYTES)))
    parts = partition_units(h, h.level_index("county"), partitions or -(-blocks // leaves))
    by_size = np.argsort([-p.leaves for p in parts], kind="stable").tolist()
    order = [by_size[i // 2] if i % 2 == 0 else by_size[-1 - i // 2] for i in range(len(parts))]
    return parts, order


def _peak_mb() -> float:
    """Peak resident memory of this process (MB; its worker threads share it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:8.1f} s, peak {_peak_mb():7.0f} MB] {msg}",
          file=sys.stderr, flush=True)  # fmt: skip


def geography(fraction: float, seed: int, states: int = US["states"]):
    """The synthetic U.S. with ``fraction`` of its counties (at least one per state), tracts,
    block groups, blocks and persons (``states`` of them: fewer for smoke tests)."""
    if not 0 < fraction <= 1:
        raise SystemExit("--fraction must be in (0, 1]")
    n = {k: (states if k == "states" else max(1, round(v * fraction))) for k, v in US.items()}
    n["counties"] = max(n["counties"], n["states"])
    n["tracts"] = max(n["tracts"], n["counties"])
    n["block_groups"] = max(n["block_groups"], n["tracts"])
    n["blocks"] = max(n["blocks"], n["block_groups"])
    return synthetic_us(seed, **n)


def _executor(args: argparse.Namespace, scheduler: str, workers: int):
    """The executor of a run: ``sync``, ``threads`` (``workers`` threads), ``dask`` (a fresh
    ``LocalCluster`` of ``workers`` single-threaded processes, or ``--address``)."""
    if scheduler == "dask":
        ex = open_executor("distributed", address=args.address or None, workers=workers)
    else:
        ex = open_executor(scheduler, workers=workers)
    return ex


def run(args: argparse.Namespace, h, pop: np.ndarray, ex, out_dir: Path) -> dict:
    """One streamed run of the national workload on executor ``ex`` written to
    ``out_dir/store``: its JSON."""
    t_start = time.perf_counter()
    schema = Schema.load("pl94")
    plan = allocation_plan(schema, levels=h.names)
    source = SyntheticHistogram(pop, args.seed)
    rng = KeyedRNG.reproducible(args.seed, warn=False)
    total = ProductQuery.parse(schema, "total")
    budget = int(args.memory_gb * 2**30)
    parts, order = partitioning(h, budget, ex.workers, args.partitions)
    checks = ReleaseChecks(h, tables=True)
    nonnegative = "nonnegative" in args.products
    nn_checks = ReleaseChecks(h, tables=True, nonnegative=True) if nonnegative else None
    store_path = out_dir / "store"
    client = getattr(ex, "client", None)
    if client is not None:
        client.run(_warm)  # imports in the workers, not timed
    before = client.run(_process) if client is not None else {}
    me = _process()

    t0, c0 = time.perf_counter(), time.process_time()
    with Pl94StoreWriter(  # replaces an earlier run's store once this one is complete
        store_path, h, schema, overwrite=True, histograms=args.histograms
    ) as store:
        t_classes, c_classes = time.perf_counter() - t0, time.process_time() - c0
        _log(t_start, f"store opened (shape classes: {t_classes:.1f} s); streaming on {ex.name}")

        def on_top(top) -> None:
            checks.top(top)
            store.top(top)
            if nn_checks is not None:
                nn_checks.top(top)
            _log(t_start, "top solved and rounded")

        res = stream_pl94(
            h, schema, source, plan, rng, on_top=on_top, options=Pl94StreamOptions(
                partitions=parts, executor=ex, order=order,
                cache_bytes=int(args.cache_mb * 2**20), nonnegative=nonnegative,
                memory_bytes=max(budget - BASE_BYTES, 0) if budget else None,
                sink=Sinks((checks.for_partition(), store.piece_sink(),
                            *([nn_checks.for_partition()] if nonnegative else []))),
                sink_payload=lambda p: (None, store.payload(p), *([None] if nonnegative else [])),
            ),
        )  # fmt: skip
        _log(t_start, f"{len(parts)} partitions written")
        t1, c1 = time.perf_counter(), time.process_time()
        for checked, written, *nn in res.sunk:
            checks.add(checked)
            store.add(written)
            if nn:
                nn_checks.add(nn[0])
        queries = [q for _, q, _ in plan] + [total, total]
        summary = store.finish(res, queries, info={"checks": checks.result(res.persons)})
        t_finish, c_finish = time.perf_counter() - t1, time.process_time() - c1
    t_run, c_run = time.perf_counter() - t0, time.process_time() - c0
    mine = _process()
    after = client.run(_process) if client is not None else {}
    _log(t_start, "store written")
    d = res.diagnostics
    m = d["measure_inside_partitions"]
    stages = {
        "pass_1_exact_sums_above_the_cut": (d["seconds_truth"], d["cpu_seconds_truth"]),
        "measure_levels_above_the_cut": (d["seconds_measure_top"], d["cpu_seconds_measure_top"]),
        "measure_inside_partitions (generate + answer + noise; summed over tasks)": (
            d["seconds_measure"], d["cpu_seconds_measure"]),
        "structured_gls (up + top + down; tasks summed)": (d["seconds_gls"], d["cpu_seconds_gls"]),
        "of which the top solve (driver)": (
            d["stream"]["seconds_top"], d["stream"]["cpu_seconds_top"]),
        "rounding_top (driver)": (d["seconds_rounding_top"], d["cpu_seconds_rounding_top"]),
        "rounding_partitions (in the tasks, summed)": (
            d["seconds_rounding"] - d["seconds_rounding_top"],
            d["cpu_seconds_rounding"] - d["cpu_seconds_rounding_top"]),
        "nonnegative_top (driver)": (
            d["seconds_nonnegative_top"], d["cpu_seconds_nonnegative_top"]),
        "nonnegative_partitions (in the tasks, summed)": (
            d["seconds_nonnegative"] - d["seconds_nonnegative_top"],
            d["cpu_seconds_nonnegative"] - d["cpu_seconds_nonnegative_top"]),
        "checks_and_store_top (driver)": (
            d["seconds_callbacks_top"], d["cpu_seconds_callbacks_top"]),
        "checks_and_store_pieces (in the tasks, summed)": (
            d["seconds_callbacks"] - d["seconds_callbacks_top"],
            d["cpu_seconds_callbacks"] - d["cpu_seconds_callbacks_top"]),
        "payloads_sent_to_tasks (driver)": (d["seconds_payloads"], d["cpu_seconds_payloads"]),
        "store_digest_and_manifest (driver)": (t_finish, c_finish),
        "shape_classes (driver)": (t_classes, c_classes),
    }  # fmt: skip
    st = d["stream"]
    workers_cpu = {a: after[a]["cpu"] - before[a]["cpu"] for a in after if a in before}
    per_block = 1e6 / h.sizes[-1]
    out: dict = {
        "products": list(args.products),
        "memory_budget_bytes": budget,
        "partitions_waiting_for_memory": st.get("partitions_waiting_for_memory"),
        "scheduler": ex.name,
        "workers": ex.workers,
        "partitions": len(res.partitions),
        "largest_partition_blocks": max(p.leaves for p in res.partitions),
        "partitions_regenerated": st["partitions_regenerated"],
        "message_bytes": st["message_bytes"],
        "seconds": t_run,
        "cpu_seconds_driver": c_run,
        "cpu_seconds_workers": sum(workers_cpu.values()),
        "cpu_seconds": c_run + sum(workers_cpu.values()),
        "seconds_per_stage": {k: v[0] for k, v in stages.items()},
        "cpu_seconds_per_stage": {k: v[1] for k, v in stages.items()},
        "cpu_us_per_block": (c_run + sum(workers_cpu.values())) * per_block,
        "cpu_us_per_block_per_stage": {k: v[1] * per_block for k, v in stages.items()},
        "stream_seconds (tasks summed)": {k: v for k, v in st.items() if k.startswith("seconds_")},
        "seconds_histogram_generation_inside_partitions (in-process only)": m["seconds_generate"],
        "seconds_noise_inside_partitions (in-process only)": m["seconds_noise"],
        "peak_rss_mb": {
            "driver": mine["peak_mb"],
            "workers": [v["peak_mb"] for v in after.values()],
        },
        "bytes_written": summary["bytes_written"],
        "files_written": summary["files"],
        "digest": summary["digest"],
        "release_digest": summary["release_digest"],
        "store": str(store_path),
        "privacy": {
            "rho": res.privacy.rho,
            "invariants": list(res.privacy.invariants),
            "statement": res.privacy.text().split(". derived from")[0],
        },
        "checks": checks.result(res.persons),
        "checks_nonnegative": None if nn_checks is None else nn_checks.result(res.persons),
        "persons": res.persons,
        "noisy_counts": res.noisy_counts,
    }
    if "note" in d:
        out["note"] = d["note"]
    if not after:
        out["peak_rss_mb"]["workers"] = "threads of the driver"
    if me["peak_mb"] and args.address:
        out["peak_rss_mb"]["note"] = "the workers' peaks are over their lifetime (--address)"
    t0 = time.perf_counter()
    verified = Pl94Store(store_path, summary["release_digest"]).verify() == summary["digest"]
    out["store_verified"] = verified
    out["seconds_store_verify (not counted)"] = time.perf_counter() - t0
    return out


def check_county(h, pop: np.ndarray, seed: int) -> dict:
    """The slice check on the county with the fewest blocks (and the dense GLS on its
    smallest block group)."""
    schema = Schema.load("pl94")
    plan = allocation_plan(schema, levels=h.names)
    source = SyntheticHistogram(pop, seed)
    rng = KeyedRNG.reproducible(seed, warn=False)
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
    return check


def benchmark(args: argparse.Namespace) -> dict:
    """The geography once, then one run (``--scheduler``) or, with ``--compare``, sync,
    Dask 1 worker and Dask 2 workers in turn: their digests and the 2-over-1 speedup."""
    t_start = time.perf_counter()
    c_start = time.process_time()
    table = geography(args.fraction, args.seed)
    h = table.hierarchy
    pop = table.leaf_counts[:, 0]
    del table
    t_geo, c_geo = time.perf_counter() - t_start, time.process_time() - c_start
    _log(t_start, f"synthetic geography {h}")
    out_dir = Path(args.out)
    out: dict = {
        "fraction": args.fraction,
        "blocks": int(h.sizes[-1]),
        "geounits": int(sum(h.sizes)),
        "nodes_per_level": dict(zip(h.names, map(int, h.sizes), strict=True)),
        "seconds_synthetic_geography (not counted)": t_geo,
        "cpu_seconds_synthetic_geography (not counted)": c_geo,
        "load_average_before": list(os.getloadavg()),
        "malloc": (
            {"policy": "platform"}
            if args.platform_malloc
            else {
                "policy": "keep freed memory",
                "settings": KEEP_FREED_MEMORY,
                "driver": keep_freed_memory(),
            }
        ),  # fmt: skip
    }
    if args.compare:
        runs = {"sync": ("sync", 1), "dask-1": ("dask", 1), "dask-2": ("dask", 2)}
    else:
        runs = {args.scheduler: (args.scheduler, args.dask_workers if args.scheduler == "dask"
                                 else args.workers)}  # fmt: skip
    out["runs"] = {}
    for name, (scheduler, workers) in runs.items():
        with _executor(args, scheduler, workers) as ex:
            r = run(args, h, pop, ex, out_dir / name if args.compare else out_dir)
        out["runs"][name] = r
        _log(t_start, f"{name}: {r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} CPU s, "
                      f"digest {r['digest'][:12]}")  # fmt: skip
    first = next(iter(out["runs"].values()))
    out["digests"] = {k: r["digest"] for k, r in out["runs"].items()}
    out["identical_digests"] = len(set(out["digests"].values())) == 1
    out["digest"] = first["digest"]
    out["persons"] = first["persons"]
    out["noisy_counts"] = first["noisy_counts"]
    if "dask-1" in out["runs"] and "dask-2" in out["runs"]:
        out["speedup_2_over_1"] = (
            out["runs"]["dask-1"]["seconds"] / out["runs"]["dask-2"]["seconds"]
        )
    out["ratio_to_the_bureau_37700_s"] = (
        37_700 / first["seconds"] if args.fraction == 1 and not args.compare else None
    )
    out["load_average_after"] = list(os.getloadavg())
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(out, indent=2) + "\n")  # before the check
    if args.check_county:
        _log(t_start, "slice check on the smallest county")
        out["check_county"] = check_county(h, pop, args.seed)
    out["wall_seconds_total"] = time.perf_counter() - t_start
    return out


def _products(text: str) -> tuple[str, ...]:
    """``--products``: a comma-separated subset of :data:`PRODUCTS` naming unbiased."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in PRODUCTS]
    if bad or "unbiased" not in names:
        raise argparse.ArgumentTypeError(
            f"--products {text!r}: give unbiased and optionally nonnegative, comma-separated"
            + (f" (unknown: {', '.join(bad)})" if bad else "")
        )
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument(
        "--scheduler", choices=("sync", "threads", "dask"), default="threads",
        help="where the partitions run (threads: --workers threads of this process)",
    )  # fmt: skip
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--dask-workers", type=int, default=2,
        help="worker processes of the LocalCluster (one thread each)",
    )  # fmt: skip
    ap.add_argument("--address", default="", help="join a Dask scheduler (tls:// or tcp://)")
    ap.add_argument(
        "--compare", action="store_true",
        help="run sync, Dask 1 worker and Dask 2 workers in turn (digests, speedup)",
    )  # fmt: skip
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
        default=DEFAULT_CACHE_BYTES / 2**20,
        help="memory for upward states kept between the passes (default 1024; 0: regenerate)",
    )
    ap.add_argument(
        "--products", type=_products, default=PRODUCTS,
        help="comma-separated: unbiased (always made and stored), nonnegative (made and "
        "checked beside it on the workers); default both",
    )  # fmt: skip
    ap.add_argument(
        "--memory-gb", type=float, default=4.0,
        help="memory budget: partitions sized and run so their working sets and the cache "
        "fit (default 4; 0: none, --partitions runs at once)",
    )  # fmt: skip
    ap.add_argument("--check-county", action="store_true")
    ap.add_argument(
        "--histograms",
        action="store_true",
        help="also store the rounded histograms (sparse; large)",
    )
    ap.add_argument(
        "--platform-malloc",
        action="store_true",
        help="leave this process's malloc policy alone (default: keep freed memory)",
    )
    args = ap.parse_args()
    print(json.dumps(benchmark(args), indent=2))


if __name__ == "__main__":
    main()
