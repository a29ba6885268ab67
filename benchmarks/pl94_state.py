"""The 2020 redistricting (pl94) workload on one synthetic state: prints one JSON object.

A synthetic state of ``--blocks`` blocks (nation → state → county → tract → block group →
block, :func:`~censusdp.hierarchy.synthetic.synthetic_state`) whose persons are spread over
the 2,016 cells of the ``pl94`` schema (hhgq × votingage × hispanic × cenrace,
:func:`~censusdp.hierarchy.synthetic.pl94_histogram`, generated partition by partition and
held sparse). The production strategy and allocation of the Bureau's 2020 run (docs/design.md
§ Census histograms): 11 product queries per geounit (no ``total`` at the nation), total ρ = 293764/114921
split over levels and queries, exact discrete Gaussian noise, the nation and state totals
invariant. Stages:

The pipeline is the library's streamed engine,
:func:`~censusdp.pipelines.products.pl94_stream.stream_pl94` (this benchmark only times it):

- ``measure``: the queries' answers and their noise; the levels above the county from the
  exact sums of pass 1, the county and below inside each partition (its histogram generated
  there, its noise drawn at its own nodes' keyed positions), so no level below the county is
  held whole;
- ``structured_gls``: by default streamed,
  :func:`~censusdp.pipelines.structured_stream.structured_stream` with one partition per
  county (``--partitions`` to group them): per partition the upward pass leaves a message at
  its county, the nation and state are solved from the messages, then each partition is
  smoothed (from its upward state cached within ``--cache-mb``, or regenerated) and handed to
  a callback, so the block level's estimates are never held whole; ``--in-memory`` measures
  whole levels (:func:`~censusdp.pipelines.products.pl94_stream.measure_whole`, the same values) and
  runs :func:`~censusdp.estimation.gls.structured.structured_gls` on the whole tree instead.
  Estimates and per-node covariance blocks at every level, the production statement checked
  against the derived one;
- ``standard_errors``: of every row of a few marginal tables (:data:`SE_TABLES`) at every
  node of every level, from the nodes' blocks (streamed: in the per-partition callback,
  summarised there; its time is reported apart from the GLS);
- ``rounding``: the unbiased top-down rounding of :mod:`censusdp.estimation.integer.controlled`
  (every cell ⌊x⌋ or ⌈x⌉, children = parent cell by cell, the invariants ``==``): the levels
  down to the cut when they are solved, then each partition in the callback from its county's
  integers; the JSON says whether every check held (each level's rounded total equals the
  invariant, every cell within ⌊x⌋/⌈x⌉, children summing to their parent cell by cell) and,
  per level, ``rounding_of_node_totals``: the RMS movement of the nodes' totals by the
  rounding (rounded − GLS estimate, persons), the RMS of its standard-error bound (the
  rounding's ``spread``) and the RMS GLS standard error of the total;
- ``dense_county``: :func:`~censusdp.pipelines.products.pl94_stream.slice_check` on the subtree of
  the county with the fewest blocks and its noisy measurements: the streamed structured GLS
  equals the in-memory one bit for bit, and the dense :func:`~censusdp.estimation.tree_gls`
  (2,016-cell histogram, dense query matrices, ``K × K`` per node) beside it: the time ratio
  and the largest difference of their estimates and variances.

``seconds`` is the sum of the counted stages' seconds (the synthetic data are timed apart;
the per-partition stages are summed over the threads that ran them, so with ``W > 1`` it
exceeds the elapsed time: ``wall_seconds`` is the run's, from the synthetic data to the
JSON), ``cpu_seconds`` their CPU time (on a shared machine the difference is waiting);
``integer_digest`` the SHA-256 of the released integer tables (:class:`IntegerDigest`: the
same for any ``W``, partition order, and for ``--in-memory``);
``peak_rss_mb`` the process's peak resident memory (``resource.getrusage``; the streamed
stages interleave in the partitions, so their peaks are one).
Progress goes to stderr. The privacy
statement is derived from the measurements (Σ Δ₂²/(2σ²) with the sensitivities computed from
the queries) and compared with the production total.

``--workers W`` (default: the CPUs) threads run the streamed partitions (histogram, noise,
GLS passes, and the rounding, which runs on the thread that smoothed the partition), largest
first; the output is the same for any W (keyed noise, results taken in order). The process
keeps the heap memory it frees (:func:`~censusdp.pipelines.execute.keep_freed_memory`): each
partition's arrays reuse the last one's pages instead of faulting fresh ones in.

Measured (``--blocks 16000 --workers 1``, 2-core machine shared with other jobs, numba caches
warm, two runs each): the ``rounding`` stage's CPU 12.7–13.4 s with the flow networks walked
cycle by cycle from the cut node (issue 33's kernel), 6.1–6.7 s with each leaf parent's
matrix swept by 4-cycles first and the walk on the arcs left (issue 36); peak RSS 1,836 →
1,462–1,478 MB.

Measured 2026-11-28 (issue 36, 160,000 blocks, ``--workers 2``, the 2-core machine loaded
10–16 deep by other jobs, so elapsed times say little): integer digest ``704fb31d…`` before
and after. Before, the rounding ran in the calling thread, partition after partition: its
65.6 CPU s alone bounded the run (88 s on an idle machine, the session before). Now each
partition is rounded on the worker that smoothed it and the workers' CPU is balanced
(upward 7.6 / 7.1 s, downward 33.9 / 32.1 s; calling thread 8.1 s; process 89.3 CPU s
over the run, 64 user + 27 system), so two idle cores would take ~45–50 s: below 30 s
needs less CPU, chiefly the rounding (53.9 CPU s, 337 µs per block). Peak 6.4 → 9.7 GB:
two partitions' rounding working sets at once, the two largest counties first. At 16,000
blocks: process CPU 8.35 s with two workers (pool threads 1.15 / 1.06 and 2.40 / 2.37 s,
calling thread 1.33 s) against 8.96 s with one.

Re-measured at the end of that session on the idle machine (load 0.5–1.5), after the
rounding's per-thread scratch (``--no-dense``; integer digest ``704fb31d…`` in both): with
``--memory-gb 0`` 42.1 s wall, 74.9 CPU s (measure 6.9, GLS 18.3, SEs 3.8, rounding 42.2), peak
9.6 GB; with the default 4 GB budget 49.3 s wall, 69.8 CPU s (rounding 40.5), peak 5.8 GB — the
budget holds the largest counties apart, so the downward pass's threads ran 37.5 / 16.0 CPU s.

Usage: ``python benchmarks/pl94_state.py [--blocks N] [--seed S] [--no-dense] [--in-memory]
[--partitions P] [--cache-mb M] [--workers W] [--memory-gb G]``.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021). DAS_2020_Redistricting_Production_Code,
    ``configs/production/pl94/person_US.ini`` (strategy
    ``ProductionCandidate20210527US_mult8_add02_dsepJune3``).
Canonne, C., Kamath, G. & Steinke, T. (2020). The Discrete Gaussian for Differential Privacy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from fractions import Fraction

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.structured import StructuredPiece, structured_gls
from censusdp.estimation.integer.controlled import RoundedLevels, round_structured
from censusdp.hierarchy.synthetic import PL94_SHAPE, synthetic_state
from censusdp.mechanisms.product_measure import ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.execute import keep_freed_memory
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.products.pl94_stream import (
    PartitionRelease,
    Pl94StreamOptions,
    ReleaseChecks,
    StandardErrorSummary,
    SyntheticHistogram,
    TopRelease,
    county_measurements,
    exact_histograms,
    measure_whole,
    slice_check,
    stream_pl94,
)
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

#: The 11 queries per geounit, in the order of the production strategy.
QUERIES = Schema.load("pl94").strategy

#: The production allocation, read from the schema (``censusdp/schemas/pl94.toml``).
ALLOCATION = Schema.load("pl94").allocation
RHO = ALLOCATION.rho
F = Fraction
N_CELLS = int(np.prod(PL94_SHAPE))
#: Memory outside the partitions' working sets (interpreter, libraries, levels above the cut),
#: left out of ``--memory-gb``'s budget for them.
BASE_BYTES = 600 * 2**20
#: Tables whose standard errors are computed at every node of every level.
SE_TABLES = ("total", "hhinstlevels", "votingage * hispanic", "votingage * hispanic * cenrace")
#: The dense one-county path holds several (nodes, 2016, 2016) float64 arrays: skip it when
#: the smallest county is larger than this (small ``--blocks`` runs have one big county).
DENSE_MAX_BLOCKS = 64


#: Kept for the benchmarks that import them (topdown_scale, structured_gls).
LEVEL_SHARES = ALLOCATION.levels
#: Query shares per level in the order of :data:`QUERIES` (``None``: not measured).
QUERY_SHARES = {
    lvl: tuple(s if s != 0 else None for s in shares) for lvl, shares in ALLOCATION.queries.items()
}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _stage_peak_mb(reset: bool = True) -> float | None:
    """Peak resident memory since the last reset (Linux ``VmHWM``; ``clear_refs`` 5 resets
    it), so each stage's own peak is seen; None where /proc does not offer it."""
    try:
        with open("/proc/self/status") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
    except (OSError, StopIteration, ValueError):
        return None
    return kb / 1024.0


def _cpu() -> float:
    """CPU seconds of this process (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def strategy(schema: Schema) -> list:
    """(level, query, law) of the production strategy (:func:`allocation_plan`)."""
    return allocation_plan(schema)


def measure_state(h, populations: np.ndarray, seed: int, plan, rng: KeyedRNG, workers: int = 1):
    """Noisy answers of ``plan`` at every node of the synthetic state, whole levels (the
    engine's :func:`~censusdp.pipelines.products.pl94_stream.measure_whole`, the values a streamed
    run draws), the exact histograms of the levels above the blocks (root first) and
    ``{"draws": n}``, for the benchmarks that compare estimators on them."""
    schema = Schema.load("pl94")
    source = SyntheticHistogram(populations, seed)
    meas, _ = measure_whole(h, schema, source, plan, rng)
    values = {(m.level, m.query.name): m.values for m in meas}
    tensors = exact_histograms(h, schema, source, h.depth - 2, workers)
    return values, tensors, {"draws": sum(v.size for v in values.values())}


def measurements(h, plan, values: dict, ranges: dict | None = None) -> list[ProductMeasurement]:
    """The plan's measurements, optionally restricted to node ranges ``{level: (lo, hi)}``
    (levels absent from ``ranges`` are left out)."""
    out = []
    for lvl, q, law in plan:
        if ranges is None:
            out.append(ProductMeasurement(lvl, q, values[(lvl, q.name)], law))
        elif lvl in ranges:
            lo, hi = ranges[lvl]
            out.append(ProductMeasurement(lvl, q, values[(lvl, q.name)][lo:hi], law))
    return out


def _log(t_start: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t_start:8.1f} s, peak {_peak_mb():7.0f} MB] {msg}",
          file=sys.stderr, flush=True)  # fmt: skip


def run(
    blocks: int,
    seed: int,
    dense: bool,
    streaming: bool = True,
    partitions: int = 0,
    cache_mb: float = 4096.0,
    workers: int = 1,
    memory_gb: float = 4.0,
) -> dict:
    t_start = time.perf_counter()
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    persons = int(state.leaf_counts.sum())
    schema = Schema.load("pl94")
    plan = allocation_plan(schema, levels=h.names)
    rho = sum(law.privacy(q.l2_sensitivity) for _, q, law in plan)
    total = ProductQuery.parse(schema, "total")
    source = SyntheticHistogram(state.leaf_counts[:, 0], seed)
    rng = KeyedRNG.reproducible(seed, warn=False)
    claimed = PrivacyStatement("zcdp", rho=float(RHO), mechanism="discrete_gaussian")
    t_data = time.perf_counter() - t_start
    _log(t_start, f"synthetic state {h}")
    print(f"privacy (derived from the measurements): rho = {rho:.6f}", file=sys.stderr)

    ses = StandardErrorSummary(schema, SE_TABLES)
    checks = ReleaseChecks(h)
    moved = TotalMovement(schema)
    digest = IntegerDigest()
    cut = h.level_index("county")
    parts = partition_units(h, cut, partitions or h.sizes[cut])
    # largest, smallest, second largest, ...: a large county smoothed beside a small one
    by_size = np.argsort([-p.leaves for p in parts], kind="stable").tolist()
    order = [by_size[i // 2] if i % 2 == 0 else by_size[-1 - i // 2] for i in range(len(parts))]
    budget = int(memory_gb * 2**30) - BASE_BYTES if memory_gb else None
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    if streaming:

        def on_top(top: TopRelease) -> None:
            ses.add(top.piece)
            checks.top(top)
            moved.add(top.piece, top.counts, top.rounded.spread)
            digest.add(top.piece.first, top.piece.ranges, top.counts)

        def on_partition(out: PartitionRelease) -> None:
            ses.add(out.piece)
            checks.partition(out)
            moved.add(out.piece, out.counts, getattr(out, "total_var", None))
            digest.add(out.piece.first, out.piece.ranges, out.counts)

        res = stream_pl94(
            h, schema, source, plan, rng, on_top=on_top, on_partition=on_partition,
            options=Pl94StreamOptions(partitions=parts, workers=workers, order=order,
                                      cache_bytes=int(cache_mb * 2**20), privacy=claimed,
                                      memory_bytes=budget),
        )  # fmt: skip
        d = res.diagnostics
        privacy, diagnostics = res.privacy, d["stream"]
        m = d["measure_inside_partitions"]
        measure_s = d["seconds_truth"] + d["seconds_measure_top"] + d["seconds_measure"]
        measure_s -= m["seconds_generate"]
        measure_c = d["cpu_seconds_truth"] + d["cpu_seconds_measure_top"]
        measure_c += d["cpu_seconds_measure"]
        stages = {
            "measure (apply queries + noise)": (measure_s, measure_c),
            "structured_gls": (d["seconds_gls"], d["cpu_seconds_gls"]),
            "standard_errors": (ses.clock["standard_errors"], ses.clock["cpu_standard_errors"]),
            "rounding": (d["seconds_rounding"], d["cpu_seconds_rounding"]),
        }
        t_data += m["seconds_generate"] + d["seconds_truth"]
        draws, noise_s = d["draws"], m["seconds_noise"]
        state_total = float(res.top.piece.query_estimates("state", total)[0, 0])
        path = (f"streamed ({len(res.partitions)} partitions of counties, upward states "
                f"cached within {cache_mb:g} MB)")  # fmt: skip
    else:
        meas, invs = measure_whole(h, schema, source, plan, rng)
        t1, c1 = time.perf_counter(), time.process_time()
        rel = structured_gls(h, schema, meas, invs, privacy=claimed)
        del meas
        t2, c2 = time.perf_counter(), time.process_time()
        ses.add(_whole(rel))
        t3, c3 = time.perf_counter(), time.process_time()
        rounded = round_structured(rel, rng.child("rounding"), invariants=invs, spreads=False)
        t4, c4 = time.perf_counter(), time.process_time()
        checks.top(TopRelease(_whole(rel), RoundedLevels(rounded.counts, None), tuple(invs)))
        digest.add(0, [(0, n) for n in h.sizes[: cut + 1]], rounded.counts[: cut + 1])
        for p in parts:  # the streamed run's pieces, for the same digest
            low = zip(rounded.counts[cut + 1 :], p.ranges[1:], strict=True)
            digest.add(cut + 1, p.ranges[1:], [c[lo:hi] for c, (lo, hi) in low])
        privacy, diagnostics = rel.privacy, rel.diagnostics
        stages = {
            "measure (apply queries + noise)": (t1 - t0, c1 - c0),
            "structured_gls": (t2 - t1, c2 - c1),
            "standard_errors": (t3 - t2, c3 - c2),
            "rounding": (t4 - t3, c4 - c3),
        }
        draws = sum(h.sizes[h.level_index(lvl)] * q.n_rows for lvl, q, _ in plan)
        noise_s = float("nan")
        state_total = float(rel.query_estimates("state", total)[0, 0])
        path = "in memory"
        del rel, rounded
    _log(t_start, "estimated, rounded and summarised")
    t_run, c_run, m_run = (
        time.perf_counter() - t0,
        time.process_time() - c0,
        time.thread_time() - m0,
    )
    out = {
        "blocks": int(h.sizes[-1]),
        "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
        "persons": persons,
        "cells": N_CELLS,
        "queries_per_geounit": len(QUERIES),
        "noisy_counts_per_geounit": sum(ProductQuery.parse(schema, t).n_rows for t in QUERIES),
        "path": path,
        "seconds": sum(v[0] for v in stages.values()),
        "cpu_seconds": sum(v[1] for v in stages.values()),
        "seconds_elapsed (stages and consumers, synthetic data included)": t_run,
        "cpu_seconds_process (the same span)": c_run,
        "cpu_seconds_calling_thread (the same span)": m_run,
        "seconds_per_stage": {k: v[0] for k, v in stages.items()},
        "cpu_seconds_per_stage": {k: v[1] for k, v in stages.items()},
        "structured_stream": {
            k: v for k, v in diagnostics.items()
            if k.startswith(("seconds_", "partitions", "cache", "largest", "message", "worker"))
        } if streaming else {},
        "seconds_synthetic_data (not counted)": t_data,
        "noise_draws": int(draws),
        "seconds_noise (summed over threads)": noise_s,
        "noise_draws_per_second": draws / noise_s if noise_s == noise_s else None,
        "privacy": {
            "accounting": "zcdp",
            "rho_derived": rho,
            "rho_production": float(RHO),
            "invariants": ["nation: total", "state: total"],
            "release_statement_rho": privacy.rho,
            "release_statement_invariants": list(privacy.invariants),
            "release_statement": privacy.text(),
        },
        "state_total_invariant_residual": abs(state_total - persons),
        "gls_diagnostics": {k: v for k, v in diagnostics.items() if k != "blocks"},
        "standard_errors": ses.result(h.names),
        "rounding": checks.result(persons),
        "rounding_of_node_totals": moved.result(h.names),
        "integer_digest": digest.result(),
        "seconds_rounding_checks (not counted)": checks.clock["checks"],
    }  # fmt: skip
    k = h.level_index("county")
    sizes = [int(np.diff(h.descendant_range(k, c, h.depth - 1))[0]) for c in range(h.sizes[k])]
    c = int(np.argmin(sizes))
    if not dense:
        out["dense_county"] = "skipped: --no-dense"
    elif sizes[c] > DENSE_MAX_BLOCKS:
        out["dense_county"] = (
            f"skipped: the smallest county has {sizes[c]} blocks (> {DENSE_MAX_BLOCKS}); "
            "the dense path holds several (nodes, 2016, 2016) float64 arrays"
        )
    else:
        _log(t_start, "dense and structured GLS on the smallest county")
        sub, smeas = county_measurements(h, schema, source, plan, rng, c)
        out["dense_county"] = {"county": str(h[k].codes[c]), **slice_check(sub, schema, smeas)}
    out["wall_seconds"] = time.perf_counter() - t_start
    out["peak_rss_mb"] = _peak_mb()
    return out


class IntegerDigest:
    """SHA-256 of the released integer cell tensors (int64 bytes, C order) of each piece —
    the levels down to the cut whole, each partition's levels below it — taken in node order
    whatever order the pieces come in: the same for any order and number of workers (for
    one partitioning), and for the in-memory path sliced alike, so any change of the
    rounding's output shows. ``result()``: the first 16 hex digits."""

    def __init__(self) -> None:
        self.pieces: dict[tuple[int, int], str] = {}

    def add(self, first: int, ranges, counts) -> None:
        for j, ((lo, _), c) in enumerate(zip(ranges, counts, strict=True)):
            data = np.ascontiguousarray(c, np.int64).data
            self.pieces[(first + j, lo)] = hashlib.sha256(data).hexdigest()

    def result(self) -> str:
        joined = "".join(self.pieces[k] for k in sorted(self.pieces))
        return hashlib.sha256(joined.encode()).hexdigest()[:16]


class TotalMovement:
    """Per level: the RMS of the rounding's movement of the nodes' totals (rounded total −
    GLS estimate of the total, persons), the RMS of its standard-error bound (the
    rounding's ``spread``, when given) and of the GLS standard error of the total."""

    def __init__(self, schema: Schema) -> None:
        self.total = ProductQuery.parse(schema, "total")
        self.acc: dict = {}

    def add(self, piece, counts, spread) -> None:
        for j, lvl in enumerate(piece.names):
            c = np.asarray(counts[j]).reshape(len(counts[j]), -1).sum(axis=1)
            d = c - piece.query_estimates(lvl, self.total)[:, 0]
            gls = piece.query_standard_errors(lvl, self.total)[:, 0]
            a = self.acc.setdefault(lvl, np.zeros(4))
            a += (float(d @ d), d.size, float(np.nansum(gls * gls)), 0.0)
            if spread is not None:
                a[3] += float(np.sum(spread[j]))

    def result(self, names) -> dict:
        out = {}
        for lvl in names:
            if lvl not in self.acc:
                continue
            sq, n, g, b = self.acc[lvl]
            out[lvl] = {
                "rms_movement": float(np.sqrt(sq / n)),
                "rms_bound": float(np.sqrt(b / n)),
                "rms_gls_se": float(np.sqrt(g / n)),
            }
        return out


def _whole(rel) -> StructuredPiece:
    """A whole release as the piece of every level (what the consumers take)."""
    return StructuredPiece(
        names=tuple(rel.hierarchy.names), first=0,
        ranges=tuple((0, n) for n in rel.hierarchy.sizes), schema=rel.schema,
        basis=rel.basis, estimates=rel.estimates, covariances=rel.covariances,
        identified=rel.identified, _rows=rel._rows,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=160_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-dense", action="store_true", help="skip the dense one-county path")
    ap.add_argument(
        "--in-memory",
        action="store_true",
        help="the in-memory structured GLS instead of the streamed one",
    )
    ap.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="streamed partitions of counties (default: one per county)",
    )
    ap.add_argument(
        "--cache-mb",
        type=float,
        default=4096.0,
        help="memory for cached upward states (0: recompute every partition's)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="threads for the noise draws and the streamed partitions (default: the CPUs; "
        "the output does not depend on it)",
    )
    ap.add_argument(
        "--memory-gb", type=float, default=4.0,
        help="memory budget of the partitions' working sets and cached states (0: none)",
    )  # fmt: skip
    args = ap.parse_args()
    keep_freed_memory()  # the heap keeps what the partitions free: no page faults on reuse
    out = run(
        args.blocks,
        args.seed,
        not args.no_dense,
        not args.in_memory,
        args.partitions,
        args.cache_mb,
        args.workers,
        args.memory_gb,
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
