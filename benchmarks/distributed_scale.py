"""Distributed-scale benchmark: measure + partitioned GLS + variances + rounding on Dask.

Synthetic U.S. geography (:func:`censusdp.hierarchy.synthetic.synthetic_us`: nation / 52
states / 3,221 counties / ~85,000 tracts / 8.2 million blocks, one cell), nation and state
totals invariant, exact discrete Gaussian noise at the county, tract and block levels. The
tree is cut at the state level; the same partitions run on a Dask ``LocalCluster`` with 1 and
with 2 worker processes (1 thread each). Stages: :func:`measure_partitioned` (with
``keep=True``), :func:`partitioned_gls` (estimates and exact variances, ``keep=True``),
:func:`partitioned_round` of the kept release, and :func:`write_release` of the integer
release (counts and variances of every level): each partition's levels below the state are
written by the worker that computed them, the nation and state levels and the manifest by
the driver, into a temporary directory (``--out``) renamed into place when complete.

The stages chain on the cluster: each partition's measurements, upward state and release
piece stay on the worker that computed them (Dask futures; the next task runs where its
input is). What passes between the driver and the workers: the partitions' exact counts of
the levels at or below the cut (inside the measurement tasks) and the cut-level messages and
leftover fractions (small).

The other ending, gathering the whole integer release into the driver
(:meth:`PartitionedRelease.gather`, 133 MB at 8.2M blocks, received and copied by the driver
alone), is timed on its own after the write and reported beside it: ``seconds_if_gathered``
and ``speedup_2_over_1_if_gathered`` count it in place of the write. The store read back
(not timed) must equal the gathered release bit for bit (``store_reads_back_as_gathered``).

Timed, per stage, in the driver: from the first submission of the stage until its results
exist (``wait``); the write until the store is renamed into place. Cluster start-up,
importing the task code in the workers and the synthetic data are not timed. The worker
counts take ``--repeats`` turns: in each, a fresh 1-worker cluster and then a fresh 2-worker
cluster run the pipeline once to warm their memory (not counted, as the later repetitions of
a spec run warm) and once timed. Turns interleave the two in time, so a drift in the
machine's speed falls on both alike, and only one cluster is up at a time (an idle second
cluster's scheduler would take CPU from the one measured). The figures are the medians over
turns; every turn is listed, with its speedup.

Prints one JSON object: wall seconds per stage and in total for each worker count, the
speedup of 2 workers over 1 (ratio of the median totals) with and without the gather in
place of the write, the largest peak resident memory (``VmHWM``) of a worker process and
that of the driver, and whether every run gave the same numbers (they must: keyed noise and
per-node arithmetic). The speedup is only meaningful on an otherwise idle machine with at
least 2 free cores.

Memory policy (reported under ``malloc``): every process keeps the memory it frees for
reuse instead of returning it to the kernel — the executor's workers by default
(:data:`~censusdp.pipelines.execute.KEEP_FREED_MEMORY`; Dask's nanny would set
``MALLOC_TRIM_THRESHOLD_=65536``, which returns every freed block at once), the driver through
``mallopt``. On the 2-core CI VM, touching memory the process does not hold yet costs about
20 µs per 4 KiB page (measured: a fresh 12.8 MB numpy array 5–18 ms, a reused one 2 ms); a
rounding task spent as much time in the kernel as computing. Same work, same numbers; only
where freed memory goes. ``--platform-malloc`` runs without the policy.

Usage: ``python benchmarks/distributed_scale.py [--blocks N] [--partitions P] [--repeats R]
[--seed S] [--out DIR] [--platform-malloc]`` (the last leaves the memory policy alone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant
from censusdp.pipelines.execute import KEEP_FREED_MEMORY, keep_freed_memory, open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.io.release_store import read_release, write_release
from censusdp.pipelines.measure import measure_partitioned
from censusdp.pipelines.partition import partition_units
from censusdp.rng import KeyedRNG


def _peak_mb() -> float:
    """Peak resident memory of this process in MB: ``VmHWM`` of ``/proc/self/status``.

    Not ``getrusage``'s ``ru_maxrss``: Linux carries that over ``execve``, so a worker
    process forked from the driver (and then exec'ed) reports the driver's peak at the fork
    (the synthetic data) instead of its own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _warm() -> bool:  # import the task code in a worker before timing
    import censusdp.estimation.gls.tree
    import censusdp.estimation.integer.laminar
    import censusdp.mechanisms.discrete  # noqa: F401

    return True


def _digest(arrays: list[np.ndarray]) -> str:
    d = hashlib.sha256()
    for a in arrays:
        d.update(np.ascontiguousarray(a).tobytes())
    return d.hexdigest()[:16]


def _memory_policy() -> dict:
    """The executor's workers keep freed memory (:data:`KEEP_FREED_MEMORY`); so does this
    process (:func:`keep_freed_memory`, glibc only)."""
    driver = keep_freed_memory()
    return {"policy": "keep freed memory", "settings": KEEP_FREED_MEMORY, "driver": driver}


def _pipeline(table, parts, ex, seed: int, store: Path) -> tuple[dict, list[np.ndarray], object]:
    """One timed run: stage seconds, the arrays to compare, and the real-valued release.

    The integer release is written to ``store`` (removed afterwards).
    """
    h, cells = table.hierarchy, table.cells
    counts = table.all_levels()
    q = Query.total(cells)
    law = DiscreteGaussian(10)
    plan = [(k, q, law) for k in (2, 3, 4)]
    invs = [invariant(counts, 0, q), invariant(counts, 1, q)]
    privacy = PrivacyStatement(
        "zcdp",
        rho=3 * law.privacy(1.0),
        invariants=("nation: total", "state: total"),
        mechanism="discrete_gaussian",
    )
    rng = KeyedRNG.reproducible(seed, warn=False)
    t0 = time.perf_counter()
    meas = measure_partitioned(h.names, counts, plan, rng, parts, ex, keep=True)
    meas.wait()
    t1 = time.perf_counter()
    kept = partitioned_gls(h, cells, meas, invs, privacy, parts, ex, keep=True)
    del meas
    kept.wait()
    t2 = time.perf_counter()
    rounded_kept = partitioned_round(kept, rng, parts, ex, method="cells")
    rounded_kept.wait()
    t3 = time.perf_counter()
    write_release(rounded_kept, store)
    t4 = time.perf_counter()
    rounded = rounded_kept.gather()  # the other ending, timed on its own
    t5 = time.perf_counter()
    rounded_kept.drop()
    stored = read_release(store, h)  # not timed: what the workers wrote, to compare
    shutil.rmtree(store)
    rel = kept.gather()  # not timed: the real-valued release, for the figures below
    kept.drop()
    stages = {
        "measure_discrete_gaussian": t1 - t0,
        "gls_with_variances": t2 - t1,
        "unbiased_rounding": t3 - t2,
        "write_integer_release": t4 - t3,
        "total": t4 - t0,
        "gather_integer_release": t5 - t4,
        "total_if_gathered": t3 - t0 + t5 - t4,
    }
    exact = bool(np.array_equal(rounded.totals("state"), counts[1].sum(1)))
    same = _digest(stored.estimates + stored.variances) == _digest(
        rounded.estimates + rounded.variances
    )
    arrays = rel.estimates + rel.variances + rounded.estimates + rounded.variances
    return {"stages": stages, "state_totals_exact": exact, "store_as_gathered": same}, arrays, rel


def _summary(workers: int, parts: list, reps: list, digests: set, rss: dict, rel, table) -> dict:
    stages = {k: statistics.median(r["stages"][k] for r in reps) for k in reps[0]["stages"]}
    err = rel.estimates[-1] - table.all_levels()[-1]
    return {
        "workers": workers,
        "partitions": len(parts),
        "seconds": stages.pop("total"),
        "seconds_if_gathered": stages.pop("total_if_gathered"),
        "seconds_per_stage": stages,
        "seconds_each_repeat": [round(r["stages"]["total"], 3) for r in reps],
        "seconds_if_gathered_each_repeat": [
            round(r["stages"]["total_if_gathered"], 3) for r in reps
        ],
        "gls_stages": {k: v for k, v in rel.diagnostics.items() if k.startswith("seconds")},
        "peak_rss_mb_largest_worker": round(max(rss.values()), 1),
        "state_totals_exact_after_rounding": all(r["state_totals_exact"] for r in reps),
        "store_reads_back_as_gathered": all(r["store_as_gathered"] for r in reps),
        "block_rmse": float(np.sqrt(np.mean(err**2))),
        "block_mean_reported_variance": float(rel.variances[-1].mean()),
        "digest": digests.pop() if len(digests) == 1 else sorted(digests),
    }


def run(table, n_partitions: int, seed: int, repeats: int, keep: bool, out: Path) -> list[dict]:
    """``repeats`` turns; in each, a fresh 1-worker cluster then a fresh 2-worker cluster run
    the pipeline once untimed (to warm their memory) and once timed. Turns interleave the
    worker counts in time, so a drift in the machine's speed falls on both alike, and only
    one cluster is up at a time."""
    parts = partition_units(table.hierarchy, 1, n_partitions)
    counts = (1, 2)
    reps: dict[int, list] = {w: [] for w in counts}
    digests: dict[int, set] = {w: set() for w in counts}
    rss: dict[int, dict] = {w: {} for w in counts}
    last: dict = {}
    for _ in range(repeats):
        for w in counts:
            with open_executor("distributed", workers=w, keep_memory=keep) as ex:
                ex.client.run(_warm)
                _pipeline(table, parts, ex, seed, out / "release")  # warm-up, not counted
                res, arrays, last[w] = _pipeline(table, parts, ex, seed, out / "release")
                digests[w].add(_digest(arrays))
                reps[w].append(res)
                del arrays
                for addr, mb in ex.client.run(_peak_mb).items():
                    rss[w][f"{len(rss[w])}:{addr}"] = mb
    return [_summary(w, parts, reps[w], digests[w], rss[w], last[w], table) for w in counts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8_200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the release store (default: a new temporary directory)",
    )
    ap.add_argument(
        "--platform-malloc",
        action="store_true",
        help="leave every process's memory policy as the platform and Dask set it",
    )
    args = ap.parse_args()
    malloc = {"policy": "platform"} if args.platform_malloc else _memory_policy()
    t0 = time.perf_counter()
    table = synthetic_us(args.seed, blocks=args.blocks)
    synth = time.perf_counter() - t0
    keep = not args.platform_malloc
    with tempfile.TemporaryDirectory(dir=args.out) as out:
        runs = run(table, args.partitions, args.seed, args.repeats, keep, Path(out))

    def pairs(key: str) -> list[float]:
        return [round(a / b, 3) for a, b in zip(runs[0][key], runs[1][key], strict=True)]

    out = {
        "blocks": int(table.hierarchy.leaves.size),
        "sizes": list(table.hierarchy.sizes),
        "cut": "state",
        "repeats": args.repeats,
        "malloc": malloc,
        "seconds_synthetic_data (not counted)": synth,
        "runs": runs,
        "speedup_2_over_1": runs[0]["seconds"] / runs[1]["seconds"],
        "speedup_each_repeat": pairs("seconds_each_repeat"),
        "speedup_2_over_1_if_gathered": runs[0]["seconds_if_gathered"]
        / runs[1]["seconds_if_gathered"],
        "speedup_if_gathered_each_repeat": pairs("seconds_if_gathered_each_repeat"),
        "identical_results": isinstance(runs[0]["digest"], str)
        and runs[0]["digest"] == runs[1]["digest"],
        "driver_peak_rss_mb": _peak_mb(),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
