"""Structured tree GLS on a synthetic pl94 state, against the dense tree GLS on a subtree.

A random state → county → tract → block group → block tree (``--blocks`` blocks, default
about 5,000), random counts in the ``pl94`` histogram (hhgq 8 × votingage 2 × hispanic 2 ×
cenrace 63 = 2,016 cells, most of them zero as in real blocks), the 2020 production strategy
of docs/design.md § Census histograms (11 marginal queries per geounit; the state, county, tract, block-group and
block level shares and per-level query shares of ``ProductionCandidate20210527US``, ρ
rescaled so the five levels keep their share of ρ = 293764/114921), Gaussian noise with
σ² = 1/(2ρ_q), the state total invariant.

Stages, each timed in a fresh process (``fork``) that reports its own peak resident memory
(``VmHWM``):

* ``structured`` — :func:`measure_products`, :func:`structured_gls`, then the standard error
  of every row of the 11 queries at every node of every level (``query_variances``);
* ``dense_subtree`` — the same workload on one block group cut to ``--dense-blocks`` blocks
  (one block-group root), run by the dense general path of :func:`tree_gls` (a 2,016 × 2,016
  matrix per node) and by :func:`structured_gls`; the largest relative difference of their
  estimates is reported (they must agree). A county-sized subtree is beyond the dense path:
  its per-node covariances alone would take ``nodes × 2,016² × 8`` bytes (reported as
  ``dense_county_covariance_bytes``), so its time is reported per node.

``structured`` also reports the CPU seconds of the GLS (and per block; ``_warm``: a second run in
the same process, without loading the compiled kernels) and the SHA-256 of
the estimates' and covariance blocks' float bytes (``digest_estimates_covariances``).

Prints one JSON object. No figure is asserted; run on an otherwise idle machine for timings.

Usage: ``python benchmarks/structured_gls.py [--blocks N] [--dense-blocks M] [--seed S]``
(``--dense-blocks 0``: the structured stage alone, the quick setting for its CPU per block).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import time
import warnings
from fractions import Fraction

import numpy as np
from pl94_state import LEVEL_SHARES, QUERIES, QUERY_SHARES, RHO  # the production allocation

from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_measure import measure_products, product_invariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

LEVELS = ["state", "county", "tract", "block_group", "block"]
TOTAL_RHO = RHO
F = Fraction
US_SHARE = LEVEL_SHARES["nation"]  # the nation level, not in this benchmark


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def state_tree(gen: np.random.Generator, blocks: int) -> Hierarchy:
    """Random fan-outs scaled so the state has about ``blocks`` blocks."""
    counties = max(1, round(blocks / 1000))
    tracts = gen.integers(8, 13, size=counties)
    bgs = gen.integers(2, 5, size=int(tracts.sum()))
    per_bg = blocks / bgs.sum()
    blk = np.maximum(1, gen.poisson(per_bg, size=int(bgs.sum())))
    child_counts = [np.array([counties]), tracts, bgs, blk]
    codes, parents, n = [["S"]], [None], 1
    for d, cc in enumerate(child_counts, start=1):
        par = np.repeat(np.arange(n), cc)
        codes.append([f"{d}-{i}" for i in range(par.size)])
        parents.append(par)
        n = par.size
    return Hierarchy.from_parents(LEVELS, codes, parents)


def plan_for(schema: Schema, levels: list[str]) -> list:
    """(level, query, law) of the production allocation for ``levels``."""
    level_total = sum(LEVEL_SHARES[lv] for lv in LEVELS)
    scale = TOTAL_RHO * F(level_total, level_total + US_SHARE)
    plan = []
    for lv in levels:
        rho_level = scale * F(LEVEL_SHARES[lv], level_total)
        for text, share in zip(QUERIES, QUERY_SHARES[lv], strict=True):
            rho = float(rho_level * share)
            plan.append((lv, ProductQuery.parse(schema, text), Gaussian.from_rho(rho)))
    return plan


def synthetic_counts(gen, h: Hierarchy, schema: Schema) -> list[np.ndarray]:
    """Sparse block histograms: ~30 people per block over a skewed cell distribution."""
    p = gen.dirichlet(np.full(schema.n_cells, 0.05))
    n = h.leaves.size
    people = gen.poisson(30, size=n)
    cells = gen.choice(schema.n_cells, size=int(people.sum()), p=p)
    owner = np.repeat(np.arange(n), people)
    flat = np.zeros((n, schema.n_cells), dtype=np.int64)
    np.add.at(flat, (owner, cells), 1)
    return h.aggregate(flat.reshape(n, *schema.shape))


def release_digest(rel) -> str:
    """SHA-256 of the float64 bytes of every level's estimates and covariance blocks (in
    block order): the same on every machine and BLAS since the per-block algebra runs on
    :mod:`censusdp.estimation.gls.block_kernels` (issue 36)."""
    h = hashlib.sha256()
    for k, est in enumerate(rel.estimates):
        h.update(np.ascontiguousarray(est, dtype=np.float64).tobytes())
        for _, b in sorted(rel.covariances[k].blocks.items()):
            h.update(np.ascontiguousarray(b, dtype=np.float64).tobytes())
    return h.hexdigest()


def run_structured(args, out) -> None:
    from censusdp.estimation.gls.structured import structured_gls

    warnings.simplefilter("ignore")
    schema = Schema.load("pl94")
    gen = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    h = state_tree(gen, args.blocks)
    counts = synthetic_counts(gen, h, schema)
    lc = dict(zip(h.names, counts, strict=True))
    t1 = time.perf_counter()
    meas = measure_products(lc, plan_for(schema, LEVELS), KeyedRNG.reproducible(args.seed))
    inv = [product_invariant(lc, "state", ProductQuery.parse(schema, "total"))]
    t2, c2 = time.perf_counter(), time.process_time()
    rel = structured_gls(h, schema, meas, inv)
    t3, c3 = time.perf_counter(), time.process_time()
    structured_gls(h, schema, meas, inv)  # again, the compiled kernels loaded: the warm CPU
    ts, cs = time.perf_counter(), time.process_time()
    c_warm = cs - c3
    n_se = 0
    for k in range(h.depth):
        for text in QUERIES:
            n_se += rel.query_standard_errors(k, text).size
    t4, c4 = time.perf_counter(), time.process_time()
    err = rel.query_estimates("block", "total") - ProductQuery.parse(schema, "total").apply(
        counts[-1]
    )
    out.put(
        {
            "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
            "cells": schema.n_cells,
            "noisy_counts": int(sum(m.values.size for m in meas)),
            "seconds_synthetic_data": t1 - t0,
            "seconds_measure": t2 - t1,
            "seconds_gls": t3 - t2,
            "seconds_gls_solve": rel.diagnostics["seconds_solve"],
            "cpu_seconds_gls": c3 - c2,
            "cpu_us_gls_per_block": 1e6 * (c3 - c2) / h.sizes[-1],
            "cpu_us_gls_per_block_warm": 1e6 * c_warm / h.sizes[-1],
            "cpu_seconds_standard_errors": c4 - cs,
            "digest_estimates_covariances": release_digest(rel),
            "seconds_standard_errors": t4 - ts,
            "seconds_total_measure_gls_ses": (t3 - t1) + (t4 - ts),
            "standard_errors_computed": n_se,
            "peak_rss_mb": vm_hwm_mb(),
            "block_total_rmse": float(np.sqrt(np.mean(err**2))),
            "rho": rel.privacy.rho,
            "privacy": rel.privacy.text().split(". ")[0],
        }
    )


def run_dense(args, out) -> None:
    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.estimation.gls.tree import (
        gls_downward,
        gls_finish,
        gls_plan,
        gls_top,
        gls_upward,
        whole_forest,
    )
    from censusdp.mechanisms.queries import Invariant, Measurement

    warnings.simplefilter("ignore")
    schema = Schema.load("pl94")
    gen = np.random.default_rng(args.seed)
    names = ["block_group", "block"]
    m = args.dense_blocks
    h = Hierarchy.from_parents(
        names, [["BG"], [f"b{i}" for i in range(m)]], [None, np.zeros(m, dtype=np.int64)]
    )
    counts = synthetic_counts(gen, h, schema)
    lc = dict(zip(h.names, counts, strict=True))
    meas = measure_products(lc, plan_for(schema, names), KeyedRNG.reproducible(args.seed))
    inv = [product_invariant(lc, "block_group", ProductQuery.parse(schema, "total"))]
    t0 = time.perf_counter()
    rel = structured_gls(h, schema, meas, inv)
    t1 = time.perf_counter()
    hwm_structured = vm_hwm_mb()
    dmeas = [Measurement(h.level_index(x.level), x.query.to_query(), x.values, x.law) for x in meas]
    dinv = [Invariant(0, inv[0].query.to_query(), inv[0].values)]
    t2 = time.perf_counter()
    # tree_gls's passes without its exact-release guard (an exact rational rank of the
    # 2,604 × 2,016 stacked query matrix, not part of the estimator's cost)
    plan, pm, pi = gls_plan(h, schema.cells, dmeas, dinv)
    state = gls_upward(plan, whole_forest(h), pm, pi)
    zhat, Phat = gls_top(plan, h, 0, pm, pi, [state.message()])
    zhat, Phat = gls_downward(plan, state, zhat[-1], Phat[-1])
    dense_est, _, _ = gls_finish(plan, zhat, Phat, True)
    t3 = time.perf_counter()
    diff = max(
        float(np.abs(rel.estimates[k].reshape(h.sizes[k], -1) - dense_est[k]).max())
        / max(1.0, float(np.abs(dense_est[k]).max()))
        for k in range(h.depth)
    )
    out.put(
        {
            "nodes": int(sum(h.sizes)),
            "seconds_structured": t1 - t0,
            "seconds_dense_tree_gls": t3 - t2,
            "dense_seconds_per_node": (t3 - t2) / sum(h.sizes),
            "ratio_dense_over_structured": (t3 - t2) / (t1 - t0),
            "peak_rss_mb_structured": hwm_structured,
            "peak_rss_mb_with_dense": vm_hwm_mb(),
            "max_relative_difference_of_estimates": diff,
        }
    )


def in_process(fn, args) -> dict:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(args, q))
    p.start()
    res = q.get()
    p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=5000)
    ap.add_argument("--dense-blocks", type=int, default=4, help="0: skip the dense subtree")
    ap.add_argument("--seed", type=int, default=2020)
    args = ap.parse_args()
    if args.dense_blocks < 0:
        ap.error("--dense-blocks must be 0 (skip) or more (the dense path needs a block group)")
    out = {
        "schema": "pl94",
        "strategy": "ProductionCandidate20210527US (docs/design.md § Census histograms), state total invariant",
        "structured": in_process(run_structured, args),
    }
    if args.dense_blocks:
        dense = in_process(run_dense, args)
        county_nodes = 1 + 10 + 30 + 1000
        out |= {
            "dense_subtree": dense,
            "dense_county_nodes_assumed": county_nodes,
            "dense_county_covariance_bytes": county_nodes * 2016**2 * 8,
            "dense_county_seconds_extrapolated": dense["dense_seconds_per_node"] * county_nodes,
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
