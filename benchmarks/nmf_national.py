"""The NMF route at national scale: a synthetic Noisy Measurement File read and estimated
state by state; prints one JSON object (issue 35).

Write (not counted): the synthetic U.S. of :mod:`pl94_national` (``--fraction F`` of every
level below the states, :func:`~censusdp.hierarchy.synthetic.synthetic_us` with block
groups), an AIAN part ``1ss`` in 34 states (their last county, states with at least two
counties; 52 + 34 = 86 state parts at full scale, 52 at 1/64 where every state has one
county), the ``pl94`` histogram state by state
(:func:`~censusdp.hierarchy.synthetic.histogram_range`), measured with the 2020 production
strategy and variances and *evaluation* noise (:func:`~censusdp.pipelines.io.nmf_writer.
simulate_nmf`), one NMF folder per state plus one for the US level
(:func:`~censusdp.pipelines.io.nmf_writer.write_nmf`, each an owned censusdp output), the
published state totals, and a block-assignment file per state (``--districts N``, default
435, apportioned to the states by population, at least one each, largest remainders; a
state's districts are runs of whole counties, tracts, block groups or blocks — the coarsest
level with at least as many units as districts — in code order, cut at equal shares of its
population).

Then, counted, the national pass (:mod:`censusdp.pipelines.products.nmf_release`'s steps; with one
state or ``--per-state``, each state alone, as before it):

* first, state after state: ``read`` (:func:`~censusdp.pipelines.io.nmf.read_nmf` +
  :func:`~censusdp.pipelines.io.nmf.collect_nmf` of the state's parts; the US level once)
  and ``up`` (:func:`~censusdp.pipelines.products.nmf_release.state_upward`, keeping only the state
  node's message); then ``top`` (:func:`~censusdp.pipelines.products.nmf_release.national_top`: the
  US level combined with the 52 messages at the root);
* then state after state again: ``gls``, the state's upward pass smoothed from the root —
  the pass kept from the first half while the kept ones fit in ``--cache-mb`` (default the
  partition driver's 1 GiB; :meth:`~censusdp.pipelines.products.nmf_release.StateUpward.
  nbytes`), else ``read`` (the second read) and the upward pass again —
  (:meth:`~censusdp.pipelines.products.nmf_release.NationalTop.estimate_state`), and the
  tabulation county / tract / block group as sums of blocks with their covariance sweeps
  (``--per-state``: :func:`~censusdp.pipelines.products.nmf_release.estimate_state`);
* ``districts``: the BAF's districts (:func:`~censusdp.pipelines.products.nmf_release.add_areas`:
  sums of blocks with their variance sweeps, the covariance matrix of their totals);
* ``tables``: P1–P5 with exact ``_se`` (:func:`~censusdp.pipelines.products.nmf_release.
  pl94_columns`) at every spine and tabulation level, the blocks and the districts (with
  their covariance), written as CSV (:class:`~censusdp.pipelines.products.nmf_release.
  StateTableWriter`, one owned output folder ``release``);
* ``integers``: the non-negative integer product (:func:`~censusdp.pipelines.products.nmf_integers.
  nmf_integers`: structural zeros held, state totals exact) and its tables under
  ``release/nonnegative/``.

The GLS holds the file's structural zeros (hhgq upper bounds of 0, nursing × under 18) at
every node (docs/design.md § The Noisy Measurement File): blocks of 16 over hhgq × votingage instead of 1 and 3.

Without ``--keep`` each state's NMF folder is removed once read — only after
:func:`censusdp.atomic.verify_output_dir` proves it the benchmark's own, unchanged output.
Without ``--keep`` a state's folder is removed after its last read (the first, when its
upward pass is kept). ``--per-state`` runs
the release before the national pass (the US level read for ρ only); the JSON says which
ran (``national_pass``, ``not_run``).

The JSON: blocks, nodes (tabulation and spine), state parts, wall and CPU seconds per stage
(summed over states) and in all, peak resident memory per stage (``VmHWM``, reset between
stages through ``/proc/self/clear_refs``) and of the process, bytes written (NMF, BAF,
tables) and read (the NMF's Parquet files), the derived ρ and the privacy statement, the
load averages before and after (the machine is shared).

**The national pass** (2026-11-28, commit 7348a32 against the per-state release of the same
code, ``--fraction 1/1024``, 8,008 blocks, 52 states, one BLAS thread, the machine under a
load of 13–22 so that wall is 2–8 × CPU; read the CPU seconds): per stage, CPU s per-state →
national: read 1.89 → 3.06 (every state read twice), up — → 1.55, top — → 0.02, GLS 7.66 →
6.97, districts 6.18 → 5.47, tables 21.2 → 20.6, integers 31.3 → 21.3 (the same code: the
load's noise, ±30 %); counted 68.7 → 59.6 CPU s (541.7 → 292.9 s wall); peak 681 → 667 MB;
bytes read 25.0 → 50.0 MB. The national pass adds the second read and one upward pass per
state (≈ 3 CPU s here, ≈ 5 % of the counted CPU), and no memory: the root holds one message
per state and block. ``--fraction 1/256`` was not run (≈ 35 min per run at that load).

**Upward states kept between the halves** (2026-11-28, commit 9bc00e0 against 92fbebe, the
same hour, one BLAS thread, load averages 4–21 so wall is 1.4–8 × CPU; read the CPU s): per
stage, CPU s before → after. ``--fraction 1/1024`` (8,008 blocks; all 52 states kept, 470
MB): read 3.12 → 2.29, up 6.98 → 7.65, top 0.47 → 0.50, GLS 8.89 → 6.83 (no second upward
pass), districts 6.15 → 6.56, tables 22.3 → 23.2, integers 32.0 → 32.4; counted 80.4 → 79.9
CPU s; bytes read 50.0 → 25.0 MB; peak 721 → 1,111 MB. ``--fraction 1/256`` (32,031 blocks;
32 of 52 states kept, 1.07 GB): read 9.47 → 6.06, up 6.08 → 5.50, GLS 19.9 → 14.4,
districts 35.1 → 29.1, tables 44.7 → 41.1, integers 36.7 → 33.8; counted 152.9 → 130.7 CPU
s; bytes read 190.1 → 134.5 MB; peak 1,658 → 2,341 MB. ``--fraction 1/64`` after only
(128,125 blocks, load 2–11; the same-hour baseline run was stopped for time): 11 of 52 states
kept (1.07 GB); read 30.3, up 22.4, GLS 51.9, districts 132.6, tables 118.0, integers 254.0;
counted 610.8 CPU s / 983.5 s wall; bytes read 723.2 MB of 389.2 MB written (2 × without
keeping); peak 6.60 GB in the integers stage, 4.83 GB in the GLS. The kept states trade up
to the budget (1 GiB) of memory for the second read and upward pass of each state kept.

**Districts, tables and integers restructured** (2026-11-28, this commit against c43eb8f
run beside it the same hour, ``--fraction 1/256``, 32,031 blocks, one BLAS thread, load
averages 8–13; read the CPU s): districts' covariance in one cross sweep
(:func:`~censusdp.estimation.gls.areas.area_query_covariance`: the blocks' total rows carried
up once, every two districts' terms where they meet) instead of ``n_areas − 1`` sweeps of the
pairs' unions; the 298 columns' SEs at once; frames as one float block; the area sweep's
scatter as one sparse product; the integers' sums as sparse products. Per stage, CPU s
before → after: read 7.7 → 6.6, up 7.3 → 4.8, GLS 14.6 → 11.8 (the tabulation sweeps),
districts 31.9 → 4.7, tables 49.7 → 38.9, integers 60.0 → 57.9; counted 172.0 → 125.6 CPU
s; peak 2,414 → 2,320 MB (the districts' stage 2,414 → 1,726). Rerun at load 4–9: 113.8
CPU s (districts 4.2, tables 34.0, integers 52.4). ``--fraction 1/64`` after (128,125
blocks, load 3–9; before: 610.8 counted, the figures above): read 28.8, up 20.8, GLS 44.2,
districts 9.7 (132.6), tables 103.1 (118.0), integers 355.3 (254.0: the same code but its
sums; HiGHS and the projections vary with the load); counted 564.0 CPU s / 1,347 s wall;
peak 6.54 GB in the integers stage (6.60), 4.51 GB in the GLS. Every table is byte-identical to the
one before but ``area_district_P1_001N_covariance.csv``, whose off-diagonal entries moved by
at most 3.1e-10 of the district's variance (its diagonal, the variances, is bit for bit):
both the unions' formula and the cross sweep sum the sweep's terms, far larger than a
district's variance, and round differently; the small-case tests against the dense
covariance hold at 1e-9. What bounds the rest: the integers (46 % of the counted CPU;
profiled, 73 % of them the non-negative projections' descent in
:mod:`censusdp.estimation.integer.nonnegative`, 25 % scipy HiGHS for the bound repair) and
the tables (31 %, about half of it pandas' CSV formatting); the peak is a state's whole
spine (integers and GLS), which only a per-county product
(:func:`~censusdp.pipelines.products.nmf_release.stream_state`) would bound.

Measured (2026-11-28, the shared 2-core machine, 23 GB, **under load**: load averages 1.8–5.7,
wall 1.6–3.7 × CPU; read the CPU seconds; one process, states in turn):

* **With the structural zeros held** (commit f460780; both runs with one BLAS thread, the
  baseline from commit cfc7aca rerun the same hour, load averages 4–12): ``--fraction
  1/1024``: read 1.5 CPU s (baseline 1.2), GLS 6.9 (4.1), districts 5.4 (1.9), tables 15.3
  (20.3: the held P5 columns write as short zeros, 86.8 MB of tables against 103.5),
  integers 20.4 (new); counted 50.0 CPU s (27.9), 29.6 without the integers; peak 597 MB
  (464). With OpenBLAS's default threads on the loaded machine the GLS took 77.6 CPU s
  (threads spinning on stacks of 16 × 16 factorisations): hence one thread by default.
  ``--fraction 1/64`` (commit f0ba7fe, one thread, load 4–8; baseline: the figures below):
  read 14.1 CPU s, GLS 46.2 (26.4), districts 134.0 (17.9: the pairs' sweeps on 16 × 16
  blocks, now in chunks), tables 100.3 (111.3), integers 274.9 (new); counted 571 CPU s /
  997 s wall (171 / 627), 296 CPU s without the integers; peak 6.09 GB in the integers
  stage, 3.71 GB in the GLS (2.93). A first 1/64 run before the chunking reached 14.5 GB
  in the districts' covariance and was stopped.
* ``--fraction 1/1024`` (8,008 blocks, 8,432 tabulation and 8,535 spine nodes, 52 state
  parts — one county per state, so no AIAN part and no measured county —, 435 districts):
  counted 111.1 s wall / 36.1 CPU s: read 4.0 / 1.5, GLS 13.3 / 4.5, districts 6.1 / 2.0,
  tables 83.3 / 27.6; peak 483 MB; NMF 25.0 MB written and read, tables 103.5 MB; write
  (not counted) 4.3 s. ρ derived 2.27593 (production 2.55623: the county level has no
  measured node). Load 4.1 → 5.0. (Commit a68b017: the totals not yet read back.)
* ``--fraction 1/64`` (128,125 blocks, 133,339 tabulation and 133,442 spine nodes, 52 state
  parts, 435 districts): counted **626.5 s wall / 171.0 CPU s**: read 48.2 / 13.8, GLS
  96.1 / 26.4, districts 69.0 / 17.9, tables 402.9 / 111.3; peak **2.93 GB** (the GLS
  stage; read 2.18, districts 2.08, tables 2.00 GB); NMF 389.2 MB written and
  read (removed state by state), tables 1.55 GB; write (not counted) 60.2 s wall / 17.7
  CPU s, 2.26 GB. ρ derived 2.27593. Load 4.8 → 5.7.
* ``--fraction 1/16`` (512,500 blocks, 533,191 tabulation and 533,328 spine nodes, 201
  counties, **86 state parts**, 435 districts): counted **916.1 s wall / 573.2 CPU s**:
  read 94.7 / 59.3, GLS 164.3 / 95.7, districts 72.8 / 47.6, tables 572.2 / 365.1; peak
  **8.13 GB** (the GLS of the largest state, 85,237 blocks; read 5.55, districts 5.57,
  tables 5.47 GB); NMF 1.60 GB written and read, tables 6.17 GB; write (not counted) 296.0 s
  wall / 73.3 CPU s, 6.28 GB. ρ derived 2.55462 (every level measured somewhere; production
  2.55623, the file's σ² being rounded up onto the sampler's grid). Load 4.8 → 1.8 (its
  write and first 10 states ran beside the 1/64 run).
* Cost per block: 4.5 (1/1024), 1.33 (1/64), 1.12 (1/16) CPU ms — tables take 64–77 %
  (per-column query estimates and SEs and the CSV's spreadsheet-safety pass, partly a fixed
  cost per state and level). Full scale (8.2 M blocks) by extrapolation, not measured:
  ≈ 9,000 CPU s in one process — about 2.5 × the 1 h goal before any use of the second core
  (states are independent) — and **memory over the 8 GB goal**: the peak follows the
  largest state (8.1 GB at 1/16 for its 85,237 blocks: ≈ 95 kB per block), whose whole spine
  :func:`~censusdp.pipelines.products.nmf_release.estimate_state` holds; the full tables would be
  ≈ 100 GB of CSV and the writer holds a state's NMF in memory too.

Usage: ``python benchmarks/nmf_national.py [--fraction F] [--out DIR] [--keep]
[--districts N] [--seed S] [--states K]`` (``--fraction`` accepts ``1/64``; ``--states``
fewer than 52 is a smoke test).

References
----------
U.S. Census Bureau (2023). 2020 Census Redistricting Data (P.L. 94-171) Noisy Measurement
    File; (2021) 2020 Census Block Assignment Files.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (spine, strategy, allocation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from fractions import Fraction
from pathlib import Path

# One BLAS thread unless told otherwise: the GLS's stacks of small (16 × 16 with structural
# zeros) factorisations gain nothing from threads, and on the shared, loaded 2-core machine
# OpenBLAS's threads spun 5-6x the CPU of the single-threaded run (measured 2026-11-28).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd

from censusdp.atomic import output_dir, output_file, verify_output_dir
from censusdp.errors import SpecError
from censusdp.hierarchy.core import Hierarchy, as_codes
from censusdp.hierarchy.synthetic import histogram_range, person_offsets
from censusdp.pipelines.io.nmf import collect_nmf, nmf_subtree_ids, read_nmf, read_state_totals
from censusdp.pipelines.io.nmf_writer import (
    TABULATION_LEVELS,
    simulate_nmf,
    write_nmf,
    write_state_totals,
)
from censusdp.pipelines.partition_driver import DEFAULT_CACHE_BYTES
from censusdp.pipelines.products.nmf_integers import INTEGER_FOLDER, nmf_integers, write_integers
from censusdp.pipelines.products.nmf_release import (
    FileNoise,
    StateTableWriter,
    add_areas,
    estimate_state,
    nation_tables,
    national_top,
    release_statement,
    state_upward,
)
from censusdp.rng import KeyedRNG
from censusdp.spreadsheet import write_csv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_stream import _process  # noqa: E402
from pl94_national import geography  # noqa: E402

#: States with an AIAN part in the 2020 NMF (52 states + 34 AIAN parts = 86 state parts).
AIAN_STATES = 34
#: Counted stages, in order (``up`` and ``top``: the national pass's first half, each
#: state's upward pass and the root; 0 when the states are released one by one).
STAGES = ("read", "up", "top", "gls", "districts", "tables", "integers")


def _reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:8.1f} s, peak {_process()['peak_mb']:7.0f} MB] {msg}",
          file=sys.stderr, flush=True)  # fmt: skip


def parse_fraction(text: str) -> float:
    """``0.015625`` or ``1/64``."""
    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(
            f"--fraction {text!r}: give a number such as 1/64"
        ) from None


def state_hierarchy(h: Hierarchy, state: int) -> tuple[Hierarchy, int]:
    """The tabulation hierarchy of one state under its own nation node (the levels
    :func:`~censusdp.pipelines.io.nmf_writer.simulate_nmf` takes) and its first block's
    index in ``h``."""
    sub = h.subtree("state", state)
    codes = [as_codes(["US"])] + [lv.codes for lv in sub.levels]
    parents = [None, np.zeros(1, np.int64)] + [lv.parent for lv in sub.levels[1:]]
    lo = h.descendant_range("state", state, "block")[0]
    return Hierarchy.from_parents(list(TABULATION_LEVELS), codes, parents), lo


def aian_flags(h: Hierarchy, n_states: int = AIAN_STATES) -> np.ndarray:
    """The last county of the first ``n_states`` states with at least two counties."""
    c = h["state"].child_count
    start = h["state"].child_start
    states = np.flatnonzero(c >= 2)[:n_states]
    flags = np.zeros(h["county"].size, bool)
    flags[start[states] + c[states] - 1] = True
    return flags


def apportion(pop: np.ndarray, seats: int) -> np.ndarray:
    """Seats per state by largest remainders, at least one each (equal shares when no state
    has people, so every seat is given)."""
    n = pop.size
    if seats < n:
        raise SpecError(f"--districts {seats}: give at least one per state ({n})")
    weights = pop if pop.sum() > 0 else np.ones_like(pop)
    quota = (seats - n) * weights / weights.sum()
    base = np.floor(quota).astype(np.int64)
    left = seats - n - int(base.sum())
    base[np.argsort(-(quota - base), kind="stable")[:left]] += 1
    return base + 1


def district_assignment(h: Hierarchy, pop: np.ndarray, lo: int, k: int) -> np.ndarray:
    """District (0..k-1) of each block of a one-state hierarchy ``h`` (blocks ``lo…`` of the
    national ``pop``): runs of whole units of the coarsest level with at least ``k`` units,
    cut at equal shares of the state's population (by the unit's population midpoint)."""
    bpop = pop[lo : lo + h["block"].size].astype(np.float64)
    for level in ("county", "tract", "block_group", "block"):
        if h[level].size >= k:
            break
    unit = h.ancestor_index("block", level)
    upop = np.bincount(unit, weights=bpop, minlength=h[level].size)
    total = upop.sum()
    if total == 0:
        d = np.minimum(np.arange(upop.size) * k // upop.size, k - 1)
    else:
        mid = np.cumsum(upop) - upop / 2
        d = np.minimum((mid * k / total).astype(np.int64), k - 1)
    return d[unit]


def write_stage(args: argparse.Namespace, out: Path) -> dict:
    """The synthetic NMF, state totals and BAFs under ``out`` (not counted)."""
    t0, c0 = time.perf_counter(), time.process_time()
    table = geography(args.fraction, args.seed, args.states)
    h = table.hierarchy
    pop = table.leaf_counts[:, 0].astype(np.int64)
    del table
    offset = person_offsets(pop)
    aian = aian_flags(h)
    rng = KeyedRNG.reproducible(args.seed, warn=False)
    n_states = h["state"].size
    state_pop = np.add.reduceat(pop, _state_block_starts(h))
    seats = apportion(state_pop, args.districts)
    nmf, inputs = out / "nmf", out / "inputs"
    nmf.mkdir(parents=True, exist_ok=True)
    us_cells = np.zeros(2016, np.int64)
    totals: dict[str, int] = {}
    parts = 0
    with output_dir(inputs, overwrite=True, command="nmf_national", option="--out") as tmp:
        for s in range(n_states):
            sh, lo = state_hierarchy(h, s)
            code = str(h["state"].codes[s])
            block, cell, count = histogram_range(pop, offset, args.seed, lo, lo + sh["block"].size)
            us_cells += np.bincount(cell, weights=count, minlength=2016).astype(np.int64)
            c_lo, c_hi = h.descendant_range("state", s, "county")
            subs = list(simulate_nmf(sh, block - lo, cell, count, evaluation_rng=rng,
                                     aian_counties=aian[c_lo:c_hi], with_us=False))  # fmt: skip
            parts += len(subs)
            write_nmf(nmf / f"state_{code}", subs, overwrite=True)
            totals[code] = int(count.sum())
            d = district_assignment(sh, pop, lo, int(seats[s]))
            frame = pd.DataFrame({
                "BLOCKID": np.asarray(sh["block"].codes, dtype=object),
                "DISTRICT": np.char.zfill((d + 1).astype(str), 3).astype(object),
            })  # fmt: skip
            write_csv(frame, tmp / f"baf_{code}.csv", index=False)
            del subs, block, cell, count
        write_state_totals(tmp / "state_totals.csv", totals)  # the published P1 totals
    # the US level: one node, every query but the total, from the national histogram
    one = np.flatnonzero(us_cells)
    us = next(simulate_nmf(state_hierarchy(h, 0)[0], np.zeros(one.size, np.int64), one,
                           us_cells[one], evaluation_rng=rng, with_us=True))  # fmt: skip
    write_nmf(nmf / "US", [us], overwrite=True)
    return {
        "blocks": int(h["block"].size),
        "tabulation_nodes": int(sum(h.sizes)),
        "nodes_per_level": dict(zip(h.names, map(int, h.sizes), strict=True)),
        "persons": int(pop.sum()),
        "state_parts": parts,
        "districts": int(seats.sum()),
        "bytes_written_nmf": _bytes(nmf),
        "bytes_written_inputs": _bytes(inputs),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "peak_rss_mb": _process()["peak_mb"],
    }


def _state_block_starts(h: Hierarchy) -> np.ndarray:
    """First block of each state (states' blocks are contiguous in canonical order)."""
    return np.array([h.descendant_range("state", s, "block")[0] for s in range(h["state"].size)])


def _remove_own(path: Path) -> None:
    """Remove a folder this benchmark wrote, only when its ownership manifest proves it."""
    doc = verify_output_dir(path, what="synthetic NMF folder")
    if doc.get("command") != "simulate_nmf":
        raise SpecError(f"{path}: not written by simulate_nmf; left in place")
    shutil.rmtree(path)


def estimate_stage(args: argparse.Namespace, out: Path) -> dict:
    """Read, GLS + SEs, tables and districts state by state (counted)."""
    nmf, inputs = out / "nmf", out / "inputs"
    wall = dict.fromkeys(STAGES, 0.0)
    cpu = dict.fromkeys(STAGES, 0.0)
    peak = dict.fromkeys(STAGES, 0.0)
    noise = FileNoise()
    bytes_read = 0
    spine_nodes = 0
    districts = 0
    seconds_removing = 0.0
    reset = _reset_peak()

    def timed(stage: str, fn):
        if reset:
            _reset_peak()
        t, c = time.perf_counter(), time.process_time()
        value = fn()
        wall[stage] += time.perf_counter() - t
        cpu[stage] += time.process_time() - c
        peak[stage] = max(peak[stage], _process()["peak_mb"])
        return value

    t_all, c_all = time.perf_counter(), time.process_time()
    us_root = nmf / "US"
    bytes_read += _bytes(us_root)
    (us,) = timed("read", lambda: list(read_nmf(us_root, subtrees=["US"])))
    noise.add(us.levels)
    totals = timed("read", lambda: read_state_totals(inputs / "state_totals.csv"))
    states = sorted(totals)
    national = len(states) > 1 and not args.per_state
    top = None
    kept: dict = {}  # upward states kept between the halves (within --cache-mb)
    kept_bytes = n_kept = 0
    if national:  # first half: each state's upward message, then the root with the US level
        items = []
        for state in states:
            root = nmf / f"state_{state}"
            bytes_read += _bytes(root)
            ids = nmf_subtree_ids(root)
            m = timed("read", lambda r=root, i=ids, s=state: collect_nmf(
                read_nmf(r, subtrees=i), {s: totals[s]}))  # fmt: skip
            up = timed("up", lambda m=m: state_upward(m))
            items.append(up.for_top())
            size = up.nbytes()
            if kept_bytes + size <= args.cache_mb * 2**20:
                kept[state], kept_bytes = up, kept_bytes + size
                noise.add(m.levels.values())
                if not args.keep:  # read once: its folder is no longer needed
                    t = time.perf_counter()
                    _remove_own(root)
                    seconds_removing += time.perf_counter() - t
            del m, up
        top = timed("top", lambda: national_top(us.levels[0], items))
        del items
        n_kept = len(kept)
        _log(t_all, f"national top: the US level combined with every state's message; "
                    f"{len(kept)} upward states kept ({kept_bytes / 1e6:.0f} MB)")  # fmt: skip
    int_rng = KeyedRNG.reproducible(args.seed, warn=False)  # benchmark: seeded rounding
    int_files: set[str] = set()
    with output_dir(out / "release", overwrite=True, command="nmf_national") as tmp:
        tables = StateTableWriter(tmp)
        for state in states:
            up = kept.pop(state, None)
            if up is None:
                root = nmf / f"state_{state}"
                bytes_read += _bytes(root)
                ids = nmf_subtree_ids(root)
                m = timed("read", lambda r=root, i=ids, s=state: collect_nmf(
                    read_nmf(r, subtrees=i), {s: totals[s]}))  # fmt: skip
                noise.add(m.levels.values())
                if not args.keep:
                    t = time.perf_counter()
                    _remove_own(root)
                    seconds_removing += time.perf_counter() - t
            else:
                m = up.measurements
            spine_nodes += int(sum(m.spine.hierarchy.sizes))
            if top is None:
                r = timed("gls", lambda m=m: estimate_state(m))
            elif up is not None:  # second half: the kept upward pass smoothed from the root
                r = timed("gls", lambda u=up: top.estimate_state(u))
            else:  # ... or the state's upward pass again
                r = timed("gls", lambda m=m: top.estimate_state(state_upward(m)))
            del up
            r = timed("districts", lambda r=r, s=state: add_areas(
                r, inputs / f"baf_{s}.csv", area_name="district"))  # fmt: skip
            districts += int(r.areas.codes.size)
            _log(t_all, f"state {state}: {m.spine.hierarchy['block'].size} blocks estimated")
            timed("tables", lambda r=r: tables.add_state(r))
            timed("integers", lambda r=r: write_integers(
                tmp / INTEGER_FOLDER, r, nmf_integers(r, int_rng), int_files))  # fmt: skip
            del m, r
        if top is not None:
            timed("tables", lambda: tables.add("pl94_nation.csv", nation_tables(top)))
        files = tables.files
    rho = noise.rho()
    return {
        "states": len(states),
        "spine_nodes": spine_nodes,
        "districts_released": districts,
        "wall": wall,
        "cpu": cpu,
        "peak": peak,
        "peak_reset_per_stage": reset,
        "seconds": time.perf_counter() - t_all,
        "cpu_seconds": time.process_time() - c_all,
        "bytes_read": bytes_read,
        "bytes_written_tables": _bytes(out / "release"),
        "files": files,
        "rho": rho,
        "statement": release_statement(
            rho, invariant_totals=True, levels=noise.levels(), us_used=national
        ),  # fmt: skip
        "national_pass": national,
        "upward_states_kept": n_kept,
        "upward_states_kept_bytes": kept_bytes,
        "seconds_removing_read_folders (not counted)": seconds_removing,
    }


def benchmark(args: argparse.Namespace) -> dict:
    """Write (not counted), then read + GLS + districts + tables state by state: the JSON."""
    t0 = time.perf_counter()
    out = Path(args.out)
    load_before = list(os.getloadavg())
    w = write_stage(args, out)
    _log(t0, f"wrote the synthetic NMF: {w['blocks']} blocks, {w['state_parts']} state parts, "
             f"{w['bytes_written_nmf'] / 1e6:.1f} MB")  # fmt: skip
    e = estimate_stage(args, out)
    _log(t0, f"read + estimated {e['states']} states in {e['seconds']:.1f} s")
    counted = {k: e["wall"][k] for k in STAGES}
    result = {
        "fraction": args.fraction,
        "seed": args.seed,
        "blocks": w["blocks"],
        "persons": w["persons"],
        "tabulation_nodes": w["tabulation_nodes"],
        "nodes_per_level": w["nodes_per_level"],
        "spine_nodes": e["spine_nodes"],
        "states": e["states"],
        "state_parts": w["state_parts"],
        "districts": w["districts"],
        "districts_released (non-empty)": e["districts_released"],
        "seconds_per_stage": counted,
        "cpu_seconds_per_stage": {k: e["cpu"][k] for k in STAGES},
        "peak_rss_mb_per_stage": {k: e["peak"][k] for k in STAGES},
        "seconds_counted (read + gls + districts + tables)": e["seconds"],
        "cpu_seconds_counted": e["cpu_seconds"],
        "write (not counted)": {
            "seconds": w["seconds"],
            "cpu_seconds": w["cpu_seconds"],
            "peak_rss_mb": w["peak_rss_mb"],
        },
        "peak_rss_mb": max(w["peak_rss_mb"], _process()["peak_mb"], *e["peak"].values()),
        "peak_rss_note": "per stage: VmHWM reset before each step of each state (clear_refs)"
        if e["peak_reset_per_stage"]
        else "per stage: not reset (clear_refs unavailable); the process peak includes the write",
        "bytes_written": {
            "nmf": w["bytes_written_nmf"],
            "state_totals_and_bafs": w["bytes_written_inputs"],
            "tables": e["bytes_written_tables"],
        },
        "bytes_read": e["bytes_read"],
        "nmf_removed_once_read": not args.keep,
        "seconds_removing_read_folders (not counted)": e[
            "seconds_removing_read_folders (not counted)"
        ],
        "privacy": {"rho_derived": e["rho"], "statement": e["statement"]},
        "integers": "stage 'integers': the non-negative integer product (structural "
        "zeros held, state totals exact; biased) of every state, its tables written under "
        "release/nonnegative/ (counted in the tables' bytes)",
        "national_pass": e["national_pass"],
        "upward_states_kept (read once; within --cache-mb)": e["upward_states_kept"],
        "upward_states_kept_bytes": e["upward_states_kept_bytes"],
        "not_run": {}
        if e["national_pass"]
        else {
            "national_gls_pass": "the release is per state (each state's GLS with its total "
            "invariant); the US level is read for the derived rho only",
        },
        "files": list(e["files"]),
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "wall_seconds_total": time.perf_counter() - t0,
    }
    out.mkdir(parents=True, exist_ok=True)
    with output_file(out / "result.json", overwrite=True, formats=[".json"],
                     command="nmf_national") as tmp:  # fmt: skip
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> dict:
    """Parse the options, run, print the JSON (and return it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=parse_fraction, default=1.0,
                    help="of every level below the states (e.g. 1/64)")  # fmt: skip
    ap.add_argument("--out", default="results/nmf_national")
    ap.add_argument("--keep", action="store_true", help="keep each state's NMF folder once read")
    ap.add_argument("--districts", type=int, default=435, help="districts over all states")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cache-mb",
        type=float,
        default=DEFAULT_CACHE_BYTES / 2**20,
        help="memory for the states' upward passes kept between the national "
        "pass's halves (a kept state is read once; 0: every state read twice)",
    )
    ap.add_argument("--states", type=int, default=52, help="fewer states: a smoke test")
    ap.add_argument("--per-state", action="store_true",
                    help="release the states one by one (no national pass; the US level "
                    "read for rho only): the release before the national pass")  # fmt: skip
    args = ap.parse_args(argv)
    result = benchmark(args)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
