"""Distributed-scale benchmark: measure + partitioned GLS + variances + rounding on Dask.

Synthetic U.S. geography (:func:`censusdp.hierarchy.synthetic.synthetic_us`: nation / 52
states / 3,221 counties / ~85,000 tracts / 8.2 million blocks, one cell), nation and state
totals invariant, exact discrete Gaussian noise at the county, tract and block levels. The
tree is cut at the state level; the same partitions run on a Dask ``LocalCluster`` with 1 and
with 2 worker processes (1 thread each). Stages: :func:`measure_partitioned` (with
``keep=True``), :func:`partitioned_gls` (estimates and exact variances),
:func:`partitioned_round`.

The measurement and GLS stages chain on the cluster: each partition's measurements and
upward state stay on the worker that computed them (Dask futures; the next task runs where
its input is). What passes between the driver and the workers: the partitions' exact counts
of the levels at or below the cut (inside the measurement tasks), the cut-level messages
(small), the finished GLS arrays of every level (estimates and variances), and for rounding
each partition's real leaf estimates out and its rounded leaves and leftovers back.

Timed, per stage, in the driver: from the first submission of the stage to its result.
The measurement stage ends when every partition's measurements exist on the workers
(``PartitionedMeasurements.wait``); the GLS stage includes gathering and concatenating
its estimates and variances and the invariant check of the release; the rounding stage
includes gathering and assembling the rounded release. Cluster start-up, importing the
task code in the workers and the synthetic data are not timed.

Prints one JSON object: wall seconds per stage and in total for each worker count, the
speedup of 2 workers over 1, the peak resident memory (``VmHWM``) of every worker process
and of the driver, and whether both runs gave the same numbers (they must: keyed noise and
per-node arithmetic). The speedup is only meaningful on an otherwise idle machine with at
least 2 free cores.

Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_=65536`` in every worker; setting it switches off
glibc's dynamic mmap threshold, so every large temporary numpy array becomes a fresh
``mmap`` that is page-faulted in and unmapped again (measured: tasks 1.5–2× slower than the
same code in the driver). The benchmark removes that variable from the workers' environment
(``distributed.nanny.pre-spawn-environ``) and reports it under ``worker_environ``.

Usage: ``python benchmarks/distributed_scale.py [--blocks N] [--partitions P] [--seed S]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
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
    import censusdp.estimation.gls
    import censusdp.estimation.rounding
    import censusdp.mechanisms.discrete  # noqa: F401

    return True


def _digest(arrays: list[np.ndarray]) -> str:
    d = hashlib.sha256()
    for a in arrays:
        d.update(np.ascontiguousarray(a).tobytes())
    return d.hexdigest()[:16]


def _worker_environ() -> dict:
    import dask
    import dask.distributed  # noqa: F401  (loads the distributed config)

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    dask.config.set({"distributed.nanny.pre-spawn-environ": env})
    return env


def run(table, n_partitions: int, workers: int, seed: int) -> dict:
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
    parts = partition_units(h, 1, n_partitions)
    rng = KeyedRNG.reproducible(seed, warn=False)
    with open_executor("distributed", workers=workers) as ex:
        ex.client.run(_warm)
        t0 = time.perf_counter()
        meas = measure_partitioned(h.names, counts, plan, rng, parts, ex, keep=True)
        meas.wait()  # the measurements stay on the workers; wait so the stage can be timed
        t1 = time.perf_counter()
        kept = partitioned_gls(h, cells, meas, invs, privacy, parts, ex, keep=True)
        del meas
        kept.wait()
        t2 = time.perf_counter()
        rounded_kept = partitioned_round(kept, rng, parts, ex, method="cells")
        rounded_kept.wait()
        t3 = time.perf_counter()
        rounded = rounded_kept.gather()
        t4 = time.perf_counter()
        rounded_kept.drop()
        rel = kept.gather()  # not timed: the real-valued release, for the figures below
        kept.drop()
        rss = ex.client.run(_peak_mb)
    err = rel.estimates[-1] - counts[-1]
    return {
        "workers": workers,
        "partitions": len(parts),
        "seconds": t4 - t0,
        "seconds_per_stage": {
            "measure_discrete_gaussian": t1 - t0,
            "gls_with_variances": t2 - t1,
            "unbiased_rounding": t3 - t2,
            "gather_release": t4 - t3,
        },
        "gls_stages": {k: v for k, v in rel.diagnostics.items() if k.startswith("seconds")},
        "peak_rss_mb_per_worker": sorted(round(v, 1) for v in rss.values()),
        "state_totals_exact_after_rounding": bool(
            np.array_equal(rounded.totals("state"), counts[1].sum(1))
        ),
        "block_rmse": float(np.sqrt(np.mean(err**2))),
        "block_mean_reported_variance": float(rel.variances[-1].mean()),
        "digest": _digest(rel.estimates + rel.variances + rounded.estimates + rounded.variances),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8_200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = synthetic_us(args.seed, blocks=args.blocks)
    synth = time.perf_counter() - t0
    env = _worker_environ()
    runs = [run(table, args.partitions, w, args.seed) for w in (1, 2)]
    out = {
        "blocks": int(table.hierarchy.leaves.size),
        "sizes": list(table.hierarchy.sizes),
        "cut": "state",
        "worker_environ": env,
        "seconds_synthetic_data (not counted)": synth,
        "runs": runs,
        "speedup_2_over_1": runs[0]["seconds"] / runs[1]["seconds"],
        "identical_results": runs[0]["digest"] == runs[1]["digest"],
        "driver_peak_rss_mb": _peak_mb(),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
