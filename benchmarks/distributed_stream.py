"""The streamed pl94 structured GLS on one synthetic state: sync vs Dask 1 and 2 workers.

The state, its 2,016-cell person histogram, the production strategy and allocation and the
noisy measurements are those of ``benchmarks/pl94_state.py`` (imported, not copied): nation →
state → county → tract → block group → block, 11 product queries per geounit, exact discrete
Gaussian noise, the nation and state totals invariant. The tree is cut at the county level,
one partition per county (``--partitions`` groups them), and
:func:`~censusdp.pipelines.structured_stream.structured_stream` runs on three executors:

- ``sync``: :class:`~censusdp.pipelines.execute.SyncExecutor`, every pass in this process;
- ``dask-1`` and ``dask-2``: a fresh ``LocalCluster`` of 1 and of 2 worker processes (one
  thread each). Each task is sent its partition's slices of the measurements; its upward
  state stays on its worker (cached within ``--cache-mb`` per run), only the cut-level
  messages come to this process, and the downward task hands the partition's piece to a
  sink *on the worker* that returns its SHA-256 (estimates and covariance blocks), so no
  block-level estimate crosses the network. Partitions are submitted largest first (by
  blocks), at most ``2 ×`` the workers ahead of the one being consumed.

``--topdown`` runs TopDown-style instead
(:func:`~censusdp.estimation.topdown.schema.topdown_schema`, the Bureau's production
orderings and the ``nurse_nva_0`` structural zero of ``benchmarks/topdown_scale.py``) on the
same measurements and executors: each level's parents are solved as tasks (runs of parents
of equal numbers of children, 4 per worker, the largest first) and the digest is that of
the integer estimates of every level.

The release's digest is the SHA-256 over the top levels' piece and every partition's sink
digest in partition order: the same for every executor and worker count (bit-identical
output). Per run: wall seconds, CPU seconds of this process and of the workers (summed;
``getrusage`` of each process, before and after), the peak resident memory of this process
and of each worker (``VmHWM``), the stream's per-stage seconds (summed over tasks). Cluster
start-up and a warm-up task importing the code in each worker are not timed. The speedup is
``dask-1`` wall over ``dask-2`` wall: meaningful only on a machine with 2 idle cores (on a
shared one, compare the CPU seconds).

Measured (2026-11-24, the 2-core machine shared with five other jobs, load average 19–22:
wall times are mostly waiting; compare CPU seconds), seed 0, 30,000 blocks (9 counties in 7
partitions, 0.8 M persons), upward states cached, the final code: the same digest from all
three runs (and from every earlier version of this branch); sync 24.9 s wall, 7.6 CPU s
(peak 1.9 GB, the measurements held whole); Dask 1 worker 40.1 s wall, 11.7 CPU s (2.2
driver + 9.5 worker; worker peak 1.6 GB); Dask 2 workers 51.4 s wall, 14.8 CPU s (2.8 +
12.0; worker peaks 1.25 and 1.17 GB); 151 kB of messages came up. Speedup 2 over 1: 0.78
under that load (0.88–0.91 in three earlier runs at loads 9–25): no meaning there; the
partitions' blocks allow at most 1.95 (largest first on two workers). To be re-measured on
a quiet machine.

``--topdown``, 12,000 blocks (3 counties, 79 tracts, 236 block groups; load 19–21): the
same digest of every level from all three runs, the block total equal to the state's;
sync 479 s wall, 78 CPU s; Dask 1 worker 677 s wall, 106 CPU s (21 driver + 85 worker);
Dask 2 workers 619 s wall, 122 CPU s (25 + 98), worker peaks 0.47 GB each. The tract level
(3 parents, 238 s of the sync run) bounds what two workers can gain here.

Usage: ``python benchmarks/distributed_stream.py [--blocks N] [--seed S] [--partitions P]
[--cache-mb M] [--runs sync,dask-1,dask-2] [--topdown]``.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (geographic partitioning of the work).
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pl94_state import PL94_SHAPE, measure_state, measurements, strategy  # noqa: E402
from topdown_scale import NURSE_NVA_0  # noqa: E402

from censusdp.estimation.gls.structured import StructuredPiece  # noqa: E402
from censusdp.estimation.topdown.schema import (  # noqa: E402
    TopDownOptions,
    structural_zero_mask,
    topdown_schema,
)
from censusdp.hierarchy.synthetic import synthetic_state  # noqa: E402
from censusdp.mechanisms.product_measure import (  # noqa: E402
    ProductInvariant,
    ProductMeasurement,
)
from censusdp.mechanisms.product_query import ProductQuery  # noqa: E402
from censusdp.pipelines.execute import SyncExecutor, open_executor  # noqa: E402
from censusdp.pipelines.partition import Partition, partition_units  # noqa: E402
from censusdp.pipelines.structured_stream import (  # noqa: E402
    StreamOptions,
    given_values,
    structured_stream,
)
from censusdp.rng import KeyedRNG  # noqa: E402
from censusdp.schema import Schema  # noqa: E402


def piece_digest(piece: StructuredPiece) -> str:
    """SHA-256 of a piece's estimates and covariance blocks (levels, then blocks by mask)."""
    h = hashlib.sha256()
    for k, est in enumerate(piece.estimates):
        h.update(np.ascontiguousarray(est).tobytes())
        if piece.covariances is not None:
            cov = piece.covariances[k].blocks
            for mask in sorted(cov):
                h.update(np.ascontiguousarray(cov[mask]).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class DigestSink:
    """The worker-side sink: a partition's piece → its digest (all that comes back)."""

    def __call__(self, piece: StructuredPiece, part: Partition, payload: object) -> str:
        return piece_digest(piece)


def _process() -> dict:
    """CPU seconds (user + system) and peak resident MB (``VmHWM``) of this process."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    peak = r.ru_maxrss / 1024.0
    try:
        with open("/proc/self/status") as f:
            peak = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024.0
    except (OSError, StopIteration):
        pass
    return {"cpu": r.ru_utime + r.ru_stime, "peak_mb": peak}


def _warm() -> bool:  # import the task code in a worker before timing
    import censusdp.estimation.gls.structured
    import censusdp.estimation.topdown.sparse
    import censusdp.pipelines.structured_stream  # noqa: F401

    return True


def problem(blocks: int, seed: int):
    """The state's hierarchy, schema, measurements (values whole), invariants."""
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    schema = Schema.load("pl94")
    plan = strategy(schema)
    rng = KeyedRNG.reproducible(seed, warn=False)
    values, tensors, _ = measure_state(h, state.leaf_counts[:, 0], seed, plan, rng)
    total = ProductQuery.parse(schema, "total")
    invs = [ProductInvariant(lvl, total, total.apply(tensors[k].reshape(-1, *PL94_SHAPE)))
            for k, lvl in enumerate(h.names[:2])]  # fmt: skip
    return h, schema, measurements(h, plan, values), invs, int(state.leaf_counts.sum())


def _timed(ex, fn) -> tuple[object, dict]:
    """``fn()`` on executor ``ex``: its value, and wall seconds, CPU seconds of this process
    and of the workers, peak resident memory of each."""
    client = getattr(ex, "client", None)
    before = client.run(_process) if client else {}
    me = _process()
    t0 = time.perf_counter()
    value = fn()
    wall = time.perf_counter() - t0
    mine = _process()
    after = client.run(_process) if client else {}
    workers_cpu = sum(after[a]["cpu"] - before[a]["cpu"] for a in after if a in before)
    return value, {
        "executor": ex.name,
        "workers": ex.workers,
        "seconds": wall,
        "cpu_seconds_driver": mine["cpu"] - me["cpu"],
        "cpu_seconds_workers": workers_cpu,
        "cpu_seconds": mine["cpu"] - me["cpu"] + workers_cpu,
        "peak_rss_mb_driver": mine["peak_mb"],
        "peak_rss_mb_workers": [v["peak_mb"] for v in after.values()],
    }


def topdown_run(ex, h, schema, meas, invs, parts, cache_bytes: int) -> dict:
    """One timed TopDown-style run on executor ``ex``: digest of every level, seconds."""
    zeros = structural_zero_mask(schema, NURSE_NVA_0)
    rel, out = _timed(ex, lambda: topdown_schema(
        h, schema, meas, invs, TopDownOptions(structural_zeros=zeros, executor=ex),
    ))  # fmt: skip
    d = hashlib.sha256()
    for est in rel.estimates:
        d.update(np.ascontiguousarray(est).tobytes())
    out["digest"] = d.hexdigest()
    out["seconds_per_level"] = {k: v["seconds"] for k, v in rel.diagnostics["levels"].items()}
    out["parents_solved_per_level"] = {
        k: v["parents_solved"] for k, v in rel.diagnostics["levels"].items()
    }
    out["solver_cpu_seconds"] = rel.diagnostics["cpu_seconds"]
    out["block_total_equals_state_total"] = bool(
        int(rel.estimates[-1].sum()) == int(invs[1].values[0, 0])
    )
    return out


def one_run(ex, h, schema, meas, invs, parts, cache_bytes: int) -> dict:
    """One timed streamed run on executor ``ex``: its digest, seconds and memory."""
    cut = parts[0].cut
    heads = [
        m if h.level_index(m.level) < cut
        else ProductMeasurement(m.level, m.query, np.empty((0, m.query.n_rows)), m.law)
        for m in meas
    ]  # fmt: skip
    res, out = _timed(ex, lambda: structured_stream(
        h, schema, heads, given_values(meas, h, cut), parts, invs, options=StreamOptions(
            executor=ex, sink=DigestSink(), cache_bytes=cache_bytes,
            order=np.argsort([-p.leaves for p in parts], kind="stable"),
        ),
    ))  # fmt: skip
    d = hashlib.sha256(piece_digest(res.top).encode())
    for s in res.sunk:
        d.update(s.encode())
    diag = res.diagnostics
    return out | {
        "digest": d.hexdigest(),
        "partitions_cached": diag["partitions_cached"],
        "message_bytes": diag["message_bytes"],
        "stream_seconds": {k: v for k, v in diag.items() if k.startswith("seconds_")},
        "state_total_residual": float(
            abs(res.top.query_estimates("state", "total")[0, 0] - invs[1].values[0, 0])
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--partitions", type=int, default=0, help="default: one per county")
    ap.add_argument("--cache-mb", type=float, default=2048.0, help="upward states cached")
    ap.add_argument("--runs", default="sync,dask-1,dask-2")
    ap.add_argument("--topdown", action="store_true", help="TopDown-style instead of the GLS")
    args = ap.parse_args()
    run = topdown_run if args.topdown else one_run
    t0 = time.perf_counter()
    h, schema, meas, invs, persons = problem(args.blocks, args.seed)
    cut = h.level_index("county")
    parts = partition_units(h, cut, args.partitions or h.sizes[cut])
    t_data = time.perf_counter() - t0
    print(f"[{t_data:.0f} s] {h}, {len(parts)} partitions", file=sys.stderr, flush=True)
    cache = int(args.cache_mb * 2**20)
    runs = {}
    for name in args.runs.split(","):
        if name == "sync":
            runs[name] = run(SyncExecutor(), h, schema, meas, invs, parts, cache)
        else:
            w = int(name.split("-")[1])
            with open_executor("distributed", workers=w) as ex:
                ex.client.run(_warm)
                runs[name] = run(ex, h, schema, meas, invs, parts, cache)
        r = runs[name]
        print(f"[{time.perf_counter() - t0:.0f} s] {name}: {r['seconds']:.1f} s wall, "
              f"{r['cpu_seconds']:.1f} CPU s", file=sys.stderr, flush=True)  # fmt: skip
    digests = {r["digest"] for r in runs.values()}
    out = {
        "blocks": int(h.sizes[-1]),
        "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
        "persons": persons,
        "cells": int(np.prod(PL94_SHAPE)),
        "estimator": "topdown_schema" if args.topdown else "structured_stream",
        "cut": h.names[cut],
        "partitions": len(parts),
        "cache_mb": args.cache_mb,
        "seconds_data_and_measurement (not counted)": t_data,
        "runs": runs,
        "identical_digests": len(digests) == 1,
        "load_average": list(os.getloadavg()),
    }
    if "dask-1" in runs and "dask-2" in runs:
        out["speedup_2_over_1"] = runs["dask-1"]["seconds"] / runs["dask-2"]["seconds"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
