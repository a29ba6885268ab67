"""TopDown-style with the ``pl94`` schema over one synthetic state down to blocks: prints JSON.

The state, its 2,016-cell person histogram, the production strategy and allocation and the
measurements are those of ``benchmarks/pl94_state.py`` (imported, not copied): nation →
state → county → tract → block group → block, 11 product queries per geounit (no ``total``
at the nation), discrete Gaussian noise, the nation and state totals invariant. On these
measurements it runs :func:`~censusdp.estimation.topdown.schema.topdown_schema` (the
Bureau's multi-pass L2 and rounder per parent, its production query orderings, the
``nurse_nva_0`` structural zero) and, unless ``--no-gls``, the structured GLS, and reports
wall and CPU seconds per level and in total, peak resident memory, the per-parent rates and
the ratio of TopDown-style to structured GLS time. ``--max-parents N`` stops each level
after ``N`` solved parents (the rest are left at zero and reported as not run) when the full
state is out of reach: the rates then still say what the full run costs.

Measured (2026-11-24, 2-core machine shared with other jobs, seed 0, 50,000 blocks, 1.39 M
persons; 14 counties, 330 tracts, 983 block groups): TopDown-style 345 s wall, 308 CPU s,
peak 2.5 GB — county 2 CPU s (1 parent), tract 130 CPU s (14 parents), block group 37 CPU s
(259 parents), block 138 CPU s (983 parents, L1 two thirds of it); structured GLS on the same
measurements 27 CPU s (63 s wall under a load of 8), so TopDown-style costs about 11× its CPU
time. Every level integer, non-negative, consistent; the state total equals the blocks' sum.

Sharing structures between parents of one pattern (children, active cells, queries;
``estimation/topdown/sparse.py``), measured 2026-11-24 at ``--blocks 5000 --seed 0`` on the
same machine under a load of 8–14: before (commit c2f50c6) TopDown-style 42.1 CPU s (254 s
wall) — tract 26.5, block group 3.9, block 11.4 CPU s; after (88fb213) 41.3 CPU s (235 s
wall) — 25.9, 3.7, 11.4; the output is identical (block-group mean absolute cell error
0.040664 in both). The cache answered 2,257 of 5,698 look-ups, nearly all within a parent:
block groups rarely share an active-cell set, so across parents there is little to share, and
the HiGHS and Clarabel runs, which must start afresh for every parent, dominate. Where shapes
do repeat — the 52 state parents of the real county table run after run — TopDown-style
takes 10.2 CPU s per run with sharing against 11.5–12.1 without (``topdown-fidelity``
setup at ρ*, three runs each, identical output). ``--no-pattern-cache`` turns sharing off.

Usage: ``python benchmarks/topdown_scale.py [--blocks N] [--seed S] [--no-gls]
[--no-pattern-cache]``.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021). DAS_2020_Redistricting_Production_Code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pl94_state import (  # noqa: E402
    PL94_SHAPE,
    RHO,
    _cpu,
    _peak_mb,
    _stage_peak_mb,
    measure_state,
    measurements,
    strategy,
)

import censusdp.estimation.topdown.sparse as topdown_sparse  # noqa: E402
from censusdp.budget import PrivacyStatement  # noqa: E402
from censusdp.estimation.gls.structured import structured_gls  # noqa: E402
from censusdp.estimation.topdown.schema import (  # noqa: E402
    TopDownOptions,
    _solve_parent,
    bureau_pl94_ordering,
    structural_zero_mask,
    topdown_schema,
)
from censusdp.hierarchy.synthetic import synthetic_state  # noqa: E402
from censusdp.mechanisms.product_measure import ProductInvariant  # noqa: E402
from censusdp.mechanisms.product_query import ProductQuery  # noqa: E402
from censusdp.rng import KeyedRNG  # noqa: E402
from censusdp.schema import Schema  # noqa: E402

#: The Bureau's ``nurse_nva_0`` edit: no person under 18 in a nursing facility.
NURSE_NVA_0 = [("hhgq * votingage", ("Nursing facilities/Skilled-nursing facilities",
                                     "Under 18 years"))]  # fmt: skip


def _log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:8.1f} s] {msg}", file=sys.stderr, flush=True)


def sample_rates(h, schema, meas, tensors, zeros, per_level: int) -> dict:
    """Per level, ``per_level`` parents (evenly spaced among those with several children)
    solved from their *true* histograms: seconds and CPU seconds per parent, and the level's
    time extrapolated to all its parents. For a state whose full run is out of reach."""
    ordering = bureau_pl94_ordering(h.names)
    out = {}
    for k in range(1, h.depth):
        up, lv = h.levels[k - 1], h.levels[k]
        todo = np.flatnonzero(up.child_count > 1)
        if not todo.size:
            continue
        pick = todo[np.linspace(0, todo.size - 1, min(per_level, todo.size)).astype(int)]
        parents = tensors[k - 1].reshape(up.size, -1)
        l1 = tuple(tuple(ProductQuery.parse(schema, t) for t in p) for p in ordering[lv.name][1])
        opts = dict(n_cells=schema.n_cells, zero=zeros, l2=ordering[lv.name][0], l1=l1, slack=0.1)
        rates = []
        for p in pick:
            lo, hi = int(up.child_start[p]), int(up.child_start[p] + up.child_count[p])
            sub = [(mm.query, np.asarray(mm.values)[lo:hi], mm.variance)
                   for mm in meas if mm.level == lv.name]  # fmt: skip
            t0 = time.perf_counter()
            _, info = _solve_parent((parents[p], sub, [], hi - lo, f"{lv.name} {p}"), opts)
            rates.append((time.perf_counter() - t0, info["cpu_seconds"], info["active"], hi - lo))
        r = np.array(rates)
        out[lv.name] = {
            "parents_sampled": int(pick.size),
            "parents_to_solve": int(todo.size),
            "mean_children": float(r[:, 3].mean()),
            "mean_active_cells": float(r[:, 2].mean()),
            "seconds_per_parent": float(r[:, 0].mean()),
            "cpu_seconds_per_parent": float(r[:, 1].mean()),
            "level_seconds_extrapolated": float(r[:, 0].mean() * todo.size),
            "level_cpu_seconds_extrapolated": float(r[:, 1].mean() * todo.size),
        }
    return out


def run(blocks: int, seed: int, gls: bool, sample: int = 0) -> dict:
    t_start = time.perf_counter()
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    schema = Schema.load("pl94")
    plan = strategy(schema)
    rng = KeyedRNG.reproducible(seed, warn=False)
    values, tensors, _ = measure_state(h, state.leaf_counts[:, 0], seed, plan, rng)
    total = ProductQuery.parse(schema, "total")
    invs = [ProductInvariant(lvl, total, total.apply(tensors[k].reshape(-1, *PL94_SHAPE)))
            for k, lvl in enumerate(h.names[:2])]  # fmt: skip
    meas = measurements(h, plan, values)
    zeros = structural_zero_mask(schema, NURSE_NVA_0)
    claimed = PrivacyStatement("zcdp", rho=float(RHO), mechanism="discrete_gaussian")
    t_data = time.perf_counter() - t_start
    _stage_peak_mb()
    if sample:
        _log(t_start, f"state {h} measured; sampling {sample} parents per level")
        rates = sample_rates(h, schema, meas, tensors, zeros, sample)
        total = sum(v["level_cpu_seconds_extrapolated"] for v in rates.values())
        return {
            "blocks": int(h.sizes[-1]),
            "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
            "mode": f"sample: {sample} parents per level from true parent histograms",
            "levels": rates,
            "cpu_seconds_extrapolated_below_root": total,
            "peak_rss_mb": _peak_mb(),
        }
    _log(t_start, f"state {h} measured; TopDown-style")

    t0, c0 = time.perf_counter(), _cpu()
    rel = topdown_schema(
        h, schema, meas, invs, TopDownOptions(
            structural_zeros=zeros, privacy=claimed, progress=lambda s: _log(t_start, s),
        ),
    )  # fmt: skip
    t_td, c_td = time.perf_counter() - t0, _cpu() - c0
    peak_td = _stage_peak_mb()
    est_block = rel.estimates[-1]
    persons = int(state.leaf_counts.sum())
    truth_bg = tensors[-1]
    err_bg = np.abs(rel.estimates[-2] - truth_bg.reshape(truth_bg.shape[0], -1))
    out: dict = {
        "blocks": int(h.sizes[-1]),
        "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
        "persons": persons,
        "cells": int(np.prod(PL94_SHAPE)),
        "seconds_data_and_measurement (not counted)": t_data,
        "topdown": {
            "seconds": t_td,
            "cpu_seconds": c_td,
            "peak_rss_mb": peak_td,
            "levels": rel.diagnostics["levels"],
            "per_parent_seconds": {
                lvl: (d["seconds"] / d["parents_solved"] if d["parents_solved"] else None)
                for lvl, d in rel.diagnostics["levels"].items()
            },
            "pattern_cache": topdown_sparse.pattern_cache_stats(),
            "block_total_equals_state_total": int(est_block.sum()) == persons,
            "min_count": int(min(e.min() for e in rel.estimates)),
            "block_group_mean_abs_cell_error": float(err_bg.mean()),
        },
    }
    del rel, est_block
    if gls:
        _log(t_start, "structured GLS on the same measurements")
        t0, c0 = time.perf_counter(), _cpu()
        structured_gls(h, schema, meas, invs, privacy=claimed)
        t_gls, c_gls = time.perf_counter() - t0, _cpu() - c0
        out["structured_gls"] = {
            "seconds": t_gls,
            "cpu_seconds": c_gls,
            "peak_rss_mb": _stage_peak_mb(),
        }
        out["ratio_topdown_over_gls"] = {"wall": t_td / t_gls, "cpu": c_td / c_gls}
    out["wall_seconds"] = time.perf_counter() - t_start
    # clear_refs also resets getrusage's ru_maxrss: the process peak is the stages' largest
    stage_peaks = [peak_td, out.get("structured_gls", {}).get("peak_rss_mb")]
    out["peak_rss_mb"] = max(_peak_mb(), *(p for p in stage_peaks if p is not None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gls", action="store_true", help="skip the structured GLS")
    ap.add_argument(
        "--no-pattern-cache",
        action="store_true",
        help="build every parent's matrices afresh (no sharing between parents of one shape)",
    )
    ap.add_argument(
        "--sample",
        type=int,
        default=0,
        help="only time N parents per level (from true histograms) and extrapolate",
    )
    args = ap.parse_args()
    if args.no_pattern_cache:
        topdown_sparse.PATTERN_CACHE_SIZE = 0
    print(json.dumps(run(args.blocks, args.seed, not args.no_gls, args.sample), indent=2))


if __name__ == "__main__":
    main()
