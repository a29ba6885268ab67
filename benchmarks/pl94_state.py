"""The 2020 redistricting (pl94) workload on one synthetic state: prints one JSON object.

A synthetic state of ``--blocks`` blocks (nation → state → county → tract → block group →
block, :func:`~censusdp.hierarchy.synthetic.synthetic_state`) whose persons are spread over
the 2,016 cells of the ``pl94`` schema (hhgq × votingage × hispanic × cenrace,
:func:`~censusdp.hierarchy.synthetic.pl94_histogram`, generated partition by partition and
held sparse). The production strategy and allocation of the Bureau's 2020 run (``DESIGN.md``
§10): 11 product queries per geounit (no ``total`` at the nation), total ρ = 293764/114921
split over levels and queries, exact discrete Gaussian noise, the nation and state totals
invariant. Stages:

- ``measure``: the queries' answers and their noise, level by level; the block level one
  keyed chunk of blocks at a time from the sparse histogram (a dense chunk, never the whole
  block tensor);
- ``structured_gls``: by default streamed,
  :func:`~censusdp.pipelines.structured_stream.structured_stream` with one partition per
  county (``--partitions`` to group them): per partition the upward pass leaves a message at
  its county, the nation and state are solved from the messages, then each partition is
  smoothed (from its upward state cached within ``--cache-mb``, or recomputed) and handed to
  a callback, so the block level's estimates are never held whole; ``--in-memory`` runs
  :func:`~censusdp.estimation.structured_gls.structured_gls` on the whole tree instead.
  Estimates and per-node covariance blocks at every level, the production statement checked
  against the derived one;
- ``standard_errors``: of every row of a few marginal tables (:data:`SE_TABLES`) at every
  node of every level, from the nodes' blocks (streamed: in the per-partition callback,
  summarised there; its time is reported apart from the GLS);
- ``rounding``: the unbiased top-down rounding of :mod:`censusdp.estimation.structured_rounding`
  (every cell ⌊x⌋ or ⌈x⌉, children = parent cell by cell, the invariants ``==``): the levels
  down to the cut when they are solved, then each partition in the callback from its county's
  integers; the JSON says whether every check held (each level's rounded total equals the
  invariant, every cell within ⌊x⌋/⌈x⌉, children summing to their parent cell by cell);
- ``dense_county``: the existing dense :func:`~censusdp.estimation.tree_gls` (2,016-cell
  histogram, dense query matrices, ``K × K`` per node) on the subtree of the county with the
  fewest blocks, on the same noisy measurements, beside the structured GLS of the same
  subtree: the time ratio and the largest difference of their estimates and variances.

``seconds`` is the wall time of the counted stages (the synthetic data are timed apart),
``cpu_seconds`` their CPU time (on a shared machine the difference is waiting);
``peak_rss_mb`` the process's peak resident memory (``resource.getrusage``) and
``peak_rss_mb_per_stage`` each stage's own peak (Linux ``VmHWM``, reset between stages).
Progress goes to stderr. The privacy
statement is derived from the measurements (Σ Δ₂²/(2σ²) with the sensitivities computed from
the queries) and compared with the production total.

``--workers W`` (default: the CPUs) threads draw the block level's noise and run the streamed
partitions' passes; the output is the same for any W (keyed noise, results taken in order).

Usage: ``python benchmarks/pl94_state.py [--blocks N] [--seed S] [--no-dense] [--in-memory]
[--partitions P] [--cache-mb M] [--workers W]``.

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
import json
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
from scipy import sparse

from censusdp.budget import PrivacyStatement
from censusdp.estimation import tree_gls
from censusdp.estimation.gls import Forest
from censusdp.estimation.predict import allocation_plan
from censusdp.estimation.structured_gls import StructuredPiece, StructuredRelease, structured_gls
from censusdp.estimation.structured_rounding import (
    round_structured,
    round_structured_partition,
    round_structured_top,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import PL94_SHAPE, pl94_partitions, synthetic_state
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_measure import ProductInvariant, ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery, axis_product
from censusdp.mechanisms.queries import Measurement, Query, measure_range
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.structured_stream import given_values, structured_stream
from censusdp.rng import CHUNK, KeyedRNG
from censusdp.schema import Schema

#: The 11 queries per geounit, in the order of the production strategy.
QUERIES = Schema.load("pl94").strategy

#: The production allocation, read from the schema (``censusdp/schemas/pl94.toml``).
ALLOCATION = Schema.load("pl94").allocation
RHO = ALLOCATION.rho
F = Fraction
LEVEL_SHARES = ALLOCATION.levels
#: Query shares per level in the order of :data:`QUERIES` (``None``: not measured).
QUERY_SHARES = {
    lvl: tuple(s if s != 0 else None for s in shares) for lvl, shares in ALLOCATION.queries.items()
}
N_CELLS = int(np.prod(PL94_SHAPE))
#: Tables whose standard errors are computed at every node of every level.
SE_TABLES = ("total", "hhinstlevels", "votingage * hispanic", "votingage * hispanic * cenrace")
#: The dense one-county path holds several (nodes, 2016, 2016) float64 arrays: skip it when
#: the smallest county is larger than this (small ``--blocks`` runs have one big county).
DENSE_MAX_BLOCKS = 64


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


def _log(t_start: float, msg: str) -> None:
    peak = _stage_peak_mb(reset=False)
    print(f"[{time.perf_counter() - t_start:8.1f} s, stage peak {peak or 0:7.0f} MB] {msg}",
          file=sys.stderr, flush=True)  # fmt: skip


def _cpu() -> float:
    """CPU seconds of this process (user + system): wall time minus the waits of a shared
    machine, summed over threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def strategy(schema: Schema) -> list[tuple[str, ProductQuery, DiscreteGaussian]]:
    """(level, query, law) of the production strategy: σ² = Δ₂²/(2 ρ · level share · query
    share), Δ₂ computed from the query (1 for every query here)."""
    return allocation_plan(schema)


def _dense_chunk(block: np.ndarray, cell: np.ndarray, count: np.ndarray, lo: int, hi: int):
    x = np.zeros((hi - lo, N_CELLS), np.int64)
    x[block - lo, cell] = count
    return x.reshape(hi - lo, *PL94_SHAPE)


def measure_state(
    h: Hierarchy,
    populations: np.ndarray,
    seed: int,
    plan: list[tuple[str, ProductQuery, DiscreteGaussian]],
    rng: KeyedRNG,
    workers: int = 1,
) -> tuple[dict, list[np.ndarray], dict]:
    """Noisy answers of ``plan`` at every node, the block level one keyed chunk at a time
    (its queries' noise drawn by ``workers`` threads: keyed streams, so the same values).

    Returns the noisy values ``{(level, query name): array}``, the exact tensors of the
    levels above the blocks (root first) and timings. The block histogram is generated
    partition by partition (one :data:`~censusdp.rng.CHUNK` of blocks, the noise streams'
    chunk, so each chunk's noise is drawn once) and never held whole; its block-group sums
    are accumulated on the way.
    """
    names, D = h.names, h.depth
    n_blocks = h.sizes[-1]
    bg_of = h.ancestor_index(D - 1, D - 2)
    n_bg = h.sizes[D - 2]
    bg_sum = np.zeros(n_bg * N_CELLS, np.int64)
    block_plan = [(q, law) for lvl, q, law in plan if lvl == names[-1]]
    values: dict = {
        (names[-1], q.name): np.empty((n_blocks, q.n_rows), np.int32) for q, _ in block_plan
    }
    t = dict(generate=0.0, generate_cpu=0.0, apply=0.0, noise=0.0, draws=0)
    bounds = [*range(0, n_blocks, CHUNK), n_blocks]
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    for i, block, cell, count in pl94_partitions(populations, seed, bounds):
        t0, c0 = time.perf_counter(), _cpu()
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        bg_sum += np.bincount(bg_of[block] * N_CELLS + cell, count, n_bg * N_CELLS).astype(np.int64)
        x = _dense_chunk(block, cell, count, lo, hi)
        t1 = time.perf_counter()
        t["generate"] += t1 - t0
        t["generate_cpu"] += _cpu() - c0
        t1 = time.perf_counter()
        answers = apply_queries([q for q, _ in block_plan], x)
        t["apply"] += time.perf_counter() - t1
        del x
        t2 = time.perf_counter()

        def draw(q: ProductQuery, law: DiscreteGaussian, lo=lo, hi=hi, answers=answers) -> int:
            truth = answers[q.name]
            noisy = measure_range(truth, names[-1], n_blocks, lo, q, law, rng)
            if np.abs(noisy).max(initial=0) >= 2**31:
                raise OverflowError("a noisy block count does not fit int32")
            values[(names[-1], q.name)][lo:hi] = noisy
            return truth.size

        t["draws"] += sum(pool.map(lambda ql: draw(*ql), block_plan))
        t["noise"] += time.perf_counter() - t2
        del answers
    pool.shutdown()

    t0, c0 = time.perf_counter(), _cpu()
    tensors = [bg_sum.reshape(n_bg, N_CELLS)]
    for k in range(D - 2, 0, -1):
        tensors.append(h.aggregate_up(k, tensors[-1]))
    tensors = tensors[::-1]
    t["generate"] += time.perf_counter() - t0
    t["generate_cpu"] += _cpu() - c0
    for k in range(D - 1):
        level_plan = [(q, law) for lvl, q, law in plan if lvl == names[k]]
        t1 = time.perf_counter()
        answers = apply_queries([q for q, _ in level_plan], tensors[k].reshape(-1, *PL94_SHAPE))
        t["apply"] += time.perf_counter() - t1
        for q, law in level_plan:
            t2 = time.perf_counter()
            truth = answers.pop(q.name)
            values[(names[k], q.name)] = measure_range(truth, names[k], h.sizes[k], 0, q, law, rng)
            t["noise"] += time.perf_counter() - t2
            t["draws"] += truth.size
    return values, tensors, t


def apply_queries(queries: list[ProductQuery], x: np.ndarray) -> dict[str, np.ndarray]:
    """Exact answers of every query on a batch of count tensors, ``{name: (n, n_rows)}``.

    The same integers as ``q.apply(x)`` for each query, but each marginal is summed from the
    smallest one already computed (the lattice of marginals: ``votingage * cenrace`` from
    ``votingage * hispanic * cenrace``, not from the 2,016 cells), then its recodes applied:
    about one pass over the histogram instead of one per query.
    """
    summed: dict[frozenset, np.ndarray] = {frozenset(): x}
    out = {}
    order = sorted(queries, key=lambda q: sum(f.is_all for f in q.factors))
    for q in order:
        drop = frozenset(ax for ax, f in enumerate(q.factors) if f.is_all)
        src = min((S for S in summed if S <= drop), key=lambda S: summed[S].size)
        y = summed[src]
        for ax in sorted(drop - src):
            y = y.sum(axis=ax + 1, keepdims=True)
        summed[drop] = y
        for ax, f in enumerate(q.factors):
            if not (f.is_detailed or f.is_all):
                y = axis_product(y, ax + 1, f.matrix.astype(y.dtype, copy=False))
        out[q.name] = y.reshape(y.shape[0], -1)
    return out


def measurements(
    h: Hierarchy,
    plan: list[tuple[str, ProductQuery, DiscreteGaussian]],
    values: dict,
    ranges: dict | None = None,
) -> list[ProductMeasurement]:
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


def smallest_county(
    h: Hierarchy, plan: list[tuple[str, ProductQuery, DiscreteGaussian]], values: dict
) -> tuple[Hierarchy, str, list[ProductMeasurement]] | str:
    """The subtree of the county with the fewest blocks and copies of its measurements (no
    invariant inside it), or why it is skipped."""
    k = h.level_index("county")
    sizes = [int(np.diff(h.descendant_range(k, c, h.depth - 1))[0]) for c in range(h.sizes[k])]
    c = int(np.argmin(sizes))
    if sizes[c] > DENSE_MAX_BLOCKS:
        return (f"skipped: the smallest county has {sizes[c]} blocks (> {DENSE_MAX_BLOCKS}); "
                "the dense path holds several (nodes, 2016, 2016) float64 arrays")  # fmt: skip
    sub = h.subtree(k, c)
    ranges = {lvl: h.descendant_range(k, c, lvl) for lvl in sub.names}
    smeas = [
        ProductMeasurement(m.level, m.query, m.values.copy(), m.law)
        for m in measurements(h, plan, values, ranges)
    ]
    return sub, str(h[k].codes[c]), smeas


def dense_county(sub: Hierarchy, code: str, schema: Schema, smeas: list) -> dict:
    """The dense tree GLS (``K × K`` per node) and the structured GLS on one county's
    subtree and measurements: times, ratio and the largest differences."""
    dense_q = {m.query.name: Query(m.query.name, m.query.dense(), m.query.labels) for m in smeas}
    meas = [
        Measurement(sub.names.index(m.level), dense_q[m.query.name],
                    np.asarray(m.values, np.int64), m.law)
        for m in smeas
    ]  # fmt: skip
    rho = sum(m.law.privacy(m.query.l2_sensitivity) for m in smeas)
    privacy = PrivacyStatement("zcdp", rho=rho, mechanism="discrete_gaussian")
    t0 = time.perf_counter()
    rel = tree_gls(sub, schema.cells, meas, [], privacy)
    t1 = time.perf_counter()
    srel = structured_gls(sub, schema, smeas)
    t2 = time.perf_counter()
    svar = [srel.query_variances(j, "detailed") for j in range(sub.depth)]
    scale = max(float(np.abs(e).max()) for e in rel.estimates)
    return {
        "county": code,
        "nodes_per_level": dict(zip(sub.names, sub.sizes, strict=True)),
        "seconds_dense_tree_gls": t1 - t0,
        "seconds_structured_gls": t2 - t1,
        "ratio_dense_over_structured": (t1 - t0) / (t2 - t1),
        "dense_gls_path": rel.diagnostics.get("path"),
        "max_estimate_difference_relative": max(
            float(np.abs(a - b.reshape(a.shape)).max())
            for a, b in zip(rel.estimates, srel.estimates, strict=True)
        )
        / scale,
        "max_variance_difference_relative": max(
            float(np.abs(a - b).max() / np.abs(a).max())
            for a, b in zip(rel.variances, svar, strict=True)
        ),
    }


class StandardErrors:
    """Per level and table of :data:`SE_TABLES`: the mean and largest SE over its rows and
    nodes, accumulated piece by piece (a streamed run's partitions, or a whole release)."""

    def __init__(self, schema: Schema) -> None:
        self.queries = [ProductQuery.parse(schema, t) for t in SE_TABLES]
        self.acc: dict = {}
        self.seconds = self.cpu_seconds = 0.0

    def add(self, est: StructuredPiece | StructuredRelease, levels) -> None:
        t0, c0 = time.perf_counter(), _cpu()
        for lvl in levels:
            for q in self.queries:
                se = est.query_standard_errors(lvl, q)
                ok = ~np.isnan(se)
                a = self.acc.setdefault((lvl, q.name), [0.0, 0, -np.inf])
                a[0] += float(se[ok].sum())
                a[1] += int(ok.sum())
                a[2] = max(a[2], float(se[ok].max(initial=-np.inf)))
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += _cpu() - c0

    def result(self, names) -> dict:
        out: dict = {}
        for lvl in names:
            out[lvl] = {}
            for q in self.queries:
                total, count, top = self.acc[(lvl, q.name)]
                out[lvl][q.name] = {"mean": total / count if count else float("nan"), "max": top}
        return out


class Rounding:
    """The unbiased top-down rounding of the estimate
    (:mod:`censusdp.estimation.structured_rounding`): the levels down to the cut once, then
    each partition from its cut nodes' integers; keeps only what the checks need (each
    level's rounded total, and whether every cell is ⌊x⌋ or ⌈x⌉ and every level sums to the
    one above it cell by cell)."""

    def __init__(self, h: Hierarchy, schema: Schema, invariants, rng: KeyedRNG) -> None:
        self.h, self.schema, self.invariants, self.rng = h, schema, invariants, rng
        self.top = None
        self.totals = np.zeros(h.depth, np.int64)
        # and-ed over every piece checked (each piece's checks can set them False)
        self.floor_ceil = self.consistent = True
        self.seconds = self.cpu_seconds = self.check_seconds = 0.0

    def _check(self, counts, estimates, parent_counts) -> None:
        t0 = time.perf_counter()
        for c, x in zip(counts, estimates, strict=True):
            d = c - np.asarray(x, dtype=float)
            self.floor_ceil &= bool(np.all((d > -1 - 1e-6) & (d < 1 + 1e-6)))
        for parent, (child, par_of) in parent_counts:
            n_par, n_child = parent.shape[0], child.shape[0]
            up = sparse.csr_matrix(
                (np.ones(n_child, np.int64), (par_of, np.arange(n_child))), (n_par, n_child)
            )
            sums = up @ child.reshape(n_child, -1)
            self.consistent &= bool(np.array_equal(sums, parent.reshape(n_par, -1)))
        self.check_seconds += time.perf_counter() - t0

    def round_top(self, top: StructuredPiece) -> None:
        t0, c0 = time.perf_counter(), _cpu()
        self.top = round_structured_top(
            self.h, self.schema, list(top.estimates), self.rng,
            invariants=self.invariants, spreads=False,
        )  # fmt: skip
        for k, c in enumerate(self.top.counts):
            self.totals[k] += int(c.sum())
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += _cpu() - c0

    def round_partition(self, piece: StructuredPiece, part) -> None:
        t0, c0 = time.perf_counter(), _cpu()
        cut = part.cut
        f = Forest.of(self.h, cut, part.ranges)
        cut_counts = self.top.counts[cut][slice(*part.units)]
        out = round_structured_partition(
            f, [r[0] for r in part.ranges], self.h.sizes[cut:], self.schema, cut_counts,
            None, list(piece.estimates), self.rng, negative=self.top.negative,
        )  # fmt: skip
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += _cpu() - c0
        levels = [cut_counts, *out.counts]
        pairs = []
        for j in range(1, len(levels)):
            lo = part.ranges[j - 1][0]
            par_of = self.h.levels[cut + j].parent[slice(*part.ranges[j])] - lo
            pairs.append((levels[j - 1], (levels[j], par_of)))
        self._check(out.counts, piece.estimates, pairs)
        for j, c in enumerate(out.counts, start=cut + 1):
            self.totals[j] += int(c.sum())

    def result(self, persons: int) -> dict:
        return {
            "rounded_total_per_level": dict(zip(self.h.names, self.totals.tolist(), strict=True)),
            "every_level_total_equals_the_invariant": bool(np.all(self.totals == persons)),
            "every_cell_floor_or_ceil": self.floor_ceil,
            "children_sum_to_parent_cell_by_cell": self.consistent,
        }


def standard_errors(rel: StructuredRelease, schema: Schema) -> dict:
    """Per level and table: the mean and largest SE over its rows and nodes."""
    se = StandardErrors(schema)
    se.add(rel, rel.hierarchy.names)
    return se.result(rel.hierarchy.names)


def run(
    blocks: int,
    seed: int,
    dense: bool,
    streaming: bool = True,
    partitions: int = 0,
    cache_mb: float = 4096.0,
    workers: int = 1,
) -> dict:
    t_start = time.perf_counter()
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    schema = Schema.load("pl94")
    plan = strategy(schema)
    rho = sum(law.privacy(q.l2_sensitivity) for _, q, law in plan)
    total = ProductQuery.parse(schema, "total")
    t_data = time.perf_counter() - t_start

    _log(t_start, f"synthetic state {h}; measuring")
    rng = KeyedRNG.reproducible(seed, warn=False)
    peaks = {"synthetic_state": _stage_peak_mb()}
    t0, c0 = time.perf_counter(), _cpu()
    values, tensors, tm = measure_state(h, state.leaf_counts[:, 0], seed, plan, rng, workers)
    t_measure = time.perf_counter() - t0 - tm["generate"]
    t_data += tm["generate"]
    peaks["measure (with the histogram's partitions)"] = _stage_peak_mb()
    _log(t_start, "measured; structured GLS")
    print(f"privacy (derived from the measurements): rho = {rho:.6f}", file=sys.stderr)

    cpu_measure = _cpu() - c0 - tm["generate_cpu"]
    county = smallest_county(h, plan, values) if dense else "skipped: --no-dense"
    t0, c0 = time.perf_counter(), _cpu()
    meas = measurements(h, plan, values)
    invs = [ProductInvariant(lvl, total, total.apply(tensors[k].reshape(-1, *PL94_SHAPE)))
            for k, lvl in enumerate(h.names[:2])]  # fmt: skip
    claimed = PrivacyStatement("zcdp", rho=float(RHO), mechanism="discrete_gaussian")
    ses = StandardErrors(schema)
    rounding = Rounding(h, schema, invs, rng.child("rounding"))
    stream_diag: dict = {}
    if streaming:
        cut = h.level_index("county")
        parts = partition_units(h, cut, partitions or h.sizes[cut])
        heads = [
            m if h.level_index(m.level) < cut
            else ProductMeasurement(m.level, m.query, np.empty((0, m.query.n_rows)), m.law)
            for m in meas
        ]  # fmt: skip

        def on_partition(piece: StructuredPiece) -> None:
            ses.add(piece, piece.names)
            rounding.round_partition(piece, parts[piece.partition])

        res = structured_stream(
            h, schema, heads, given_values(meas, h, cut), parts, invs, on_partition,
            on_top=rounding.round_top, privacy=claimed, cache_bytes=int(cache_mb * 2**20),
            workers=workers,
        )  # fmt: skip
        del meas, values
        rel = res.top
        privacy, diagnostics = res.privacy, res.diagnostics
        stream_diag = {
            k: v
            for k, v in diagnostics.items()
            if k.startswith(("seconds_", "partitions", "cache", "largest", "message"))
        }
        callbacks = ses.seconds + rounding.seconds + rounding.check_seconds
        t_gls = time.perf_counter() - t0 - callbacks
        cpu_gls = _cpu() - c0 - ses.cpu_seconds - rounding.cpu_seconds - rounding.check_seconds
        peaks["structured_gls streamed (with standard errors per partition)"] = _stage_peak_mb()
        t0, c0 = time.perf_counter(), _cpu()
        ses.add(rel, rel.names)
    else:
        rel = structured_gls(h, schema, meas, invs, privacy=claimed)
        privacy, diagnostics = rel.privacy, rel.diagnostics
        del meas, values
        t_gls, cpu_gls = time.perf_counter() - t0, _cpu() - c0
        peaks["structured_gls"] = _stage_peak_mb()
        _log(t_start, "structured GLS done; standard errors")
        t0, c0 = time.perf_counter(), _cpu()
        ses.add(rel, h.names)
        peaks["standard_errors"] = _stage_peak_mb()
        _log(t_start, "rounding")
        t0, c0 = time.perf_counter(), _cpu()
        rounded = round_structured(rel, rounding.rng, invariants=invs, spreads=False)
        rounding.seconds, rounding.cpu_seconds = time.perf_counter() - t0, _cpu() - c0
        rounding.totals[:] = [int(c.sum()) for c in rounded.counts]
        pairs = [
            (rounded.counts[k - 1], (rounded.counts[k], h.levels[k].parent))
            for k in range(1, h.depth)
        ]
        rounding._check(rounded.counts, rel.estimates, pairs)
        del rounded, pairs
        peaks["rounding"] = _stage_peak_mb()
    t_se = ses.seconds
    cpu_se = ses.cpu_seconds
    se_table = ses.result(h.names)
    _log(t_start, "structured GLS and standard errors done")
    state_total = rel.query_estimates("state", total)[0, 0]
    stages = {
        "measure (apply queries + noise)": t_measure,
        "structured_gls": t_gls,
        "standard_errors": t_se,
        "rounding": rounding.seconds,
    }
    counted = t_measure + t_gls + t_se + rounding.seconds
    cpu_counted = cpu_measure + cpu_gls + cpu_se + rounding.cpu_seconds
    out = {
        "blocks": int(h.sizes[-1]),
        "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
        "persons": int(state.leaf_counts.sum()),
        "cells": N_CELLS,
        "queries_per_geounit": len(QUERIES),
        "noisy_counts_per_geounit": sum(ProductQuery.parse(schema, t).n_rows for t in QUERIES),
        "path": (
            f"streamed ({stream_diag.get('partitions', 0)} partitions of counties, upward "
            f"states cached within {cache_mb:g} MB)"
            if streaming
            else "in memory"
        ),
        "seconds": counted,
        "cpu_seconds": cpu_counted,
        "seconds_per_stage": stages,
        "cpu_seconds_per_stage": {
            "measure (apply queries + noise)": cpu_measure,
            "structured_gls": cpu_gls,
            "standard_errors": cpu_se,
            "rounding": rounding.cpu_seconds,
        },
        "structured_stream": stream_diag,
        "seconds_synthetic_data (not counted)": t_data,
        "seconds_apply_queries": tm["apply"],
        "seconds_noise": tm["noise"],
        "noise_draws": int(tm["draws"]),
        "noise_draws_per_second": tm["draws"] / tm["noise"],
        "privacy": {
            "accounting": "zcdp",
            "rho_derived": rho,
            "rho_production": float(RHO),
            "invariants": ["nation: total", "state: total"],
            "release_statement_rho": privacy.rho,
            "release_statement_invariants": list(privacy.invariants),
            "release_statement": privacy.text(),
        },
        "state_total_invariant_residual": float(abs(state_total - state.leaf_counts.sum())),
        "gls_diagnostics": {k: v for k, v in diagnostics.items() if k != "blocks"},
        "standard_errors": se_table,
        "rounding": rounding.result(int(state.leaf_counts.sum())),
        "seconds_rounding_checks (not counted)": rounding.check_seconds,
    }
    if not isinstance(county, str):
        _log(t_start, "dense and structured GLS on the smallest county")
    out["dense_county"] = (
        county if isinstance(county, str) else dense_county(*county[:2], schema, county[2])
    )
    if not isinstance(county, str):
        peaks["dense_county"] = _stage_peak_mb(reset=False)
    out["wall_seconds"] = time.perf_counter() - t_start
    # clear_refs also resets getrusage's ru_maxrss: the process peak is the stages' largest
    out["peak_rss_mb"] = max(_peak_mb(), *(v for v in peaks.values() if v is not None))
    out["peak_rss_mb_per_stage"] = peaks
    return out


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
    args = ap.parse_args()
    out = run(
        args.blocks,
        args.seed,
        not args.no_dense,
        not args.in_memory,
        args.partitions,
        args.cache_mb,
        args.workers,
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
