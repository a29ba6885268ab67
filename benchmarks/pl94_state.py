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
- ``structured_gls`` and ``standard_errors``: when :mod:`censusdp.estimation.structured_gls`
  is present (reported ``absent`` otherwise — not faked);
- ``rounding``: absent until a rounding of schema histograms exists;
- ``dense_county``: the existing dense :func:`~censusdp.estimation.tree_gls` (2,016-cell
  histogram, dense query matrices, ``K × K`` per node) on the subtree of the county with the
  fewest blocks, on the same noisy measurements, for the ratio.

``seconds`` is the wall time of the counted stages (the synthetic data are timed apart);
``peak_rss_mb`` the process's peak resident memory (``resource.getrusage``). The privacy
statement is derived from the measurements (Σ Δ₂²/(2σ²) with the sensitivities computed from
the queries) and compared with the production total.

Usage: ``python benchmarks/pl94_state.py [--blocks N] [--seed S] [--no-dense]``.

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
import resource
import time
from fractions import Fraction

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.estimation import tree_gls
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import PL94_SHAPE, pl94_partitions, synthetic_state
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Measurement, Query, measure_range
from censusdp.rng import CHUNK, KeyedRNG
from censusdp.schema import Schema

#: The 11 queries per geounit, in the order of the production strategy.
QUERIES = (
    "total",
    "cenrace",
    "hispanic",
    "votingage",
    "hhinstlevels",
    "hhgq",
    "hispanic * cenrace",
    "votingage * cenrace",
    "votingage * hispanic",
    "votingage * hispanic * cenrace",
    "detailed",
)

RHO = Fraction(293764, 114921)
F = Fraction
LEVEL_SHARES = {
    "nation": F(104, 4099),
    "state": F(1440, 4099),
    "county": F(447, 4099),
    "tract": F(687, 4099),
    "block_group": F(1256, 4099),
    "block": F(165, 4099),
}
#: Query shares per level in the order of :data:`QUERIES` (``None``: not measured).
QUERY_SHARES = {
    "nation": (None, *(F(v, 4097) for v in (52, 26, 26, 26, 26, 130, 130, 26)),
               F(26, 241), F(189, 241)),
    "state": (*(F(v, 4097) for v in (3773, 6, 6, 6, 6, 6, 12, 12, 6)), F(2, 241),
              F(230, 4097)),
    "county": tuple(F(v, 4097) for v in (3126, 10, 10, 10, 10, 10, 28, 28, 10, 101, 754)),
    "tract": (F(1567, 4102), F(4, 2051), *(F(5, 4102),) * 4, F(1933, 4102), F(10, 2051),
              F(5, 4102), F(67, 4102), F(241, 2051)),
    "block_group": tuple(F(v, 4099) for v in (1705, 3, 3, 3, 3, 3, 1055, 9, 3, 24, 1288)),
    "block": tuple(F(v, 4097) for v in (5, 9, 5, 5, 5, 5, 21, 21, 5, 71, 3945)),
}  # fmt: skip
N_CELLS = int(np.prod(PL94_SHAPE))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def strategy(schema: Schema) -> list[tuple[str, ProductQuery, DiscreteGaussian]]:
    """(level, query, law) of the production strategy: σ² = Δ₂²/(2 ρ · level share · query
    share), Δ₂ computed from the query (1 for every query here)."""
    assert sum(LEVEL_SHARES.values()) == 1
    plan = []
    for level, shares in QUERY_SHARES.items():
        assert sum(s for s in shares if s is not None) == 1, level
        for text, share in zip(QUERIES, shares, strict=True):
            if share is None:
                continue
            q = ProductQuery.parse(schema, text)
            rho_q = RHO * LEVEL_SHARES[level] * share
            sens2 = F(q.l1_sensitivity)  # Δ₂² = the largest column count of a 0/1 matrix
            plan.append((level, q, DiscreteGaussian.from_sigma2(sens2 / (2 * rho_q))))
    return plan


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
) -> tuple[dict, list[np.ndarray], dict]:
    """Noisy answers of ``plan`` at every node, the block level one keyed chunk at a time.

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
    t = dict(generate=0.0, apply=0.0, noise=0.0, draws=0)
    bounds = [*range(0, n_blocks, CHUNK), n_blocks]
    for _, block, cell, count in pl94_partitions(populations, seed, bounds):
        t0 = time.perf_counter()
        lo = int(bounds[_])
        hi = int(bounds[_ + 1])
        bg_sum += np.bincount(bg_of[block] * N_CELLS + cell, count, n_bg * N_CELLS).astype(
            np.int64
        )
        x = _dense_chunk(block, cell, count, lo, hi)
        t1 = time.perf_counter()
        t["generate"] += t1 - t0
        for q, law in block_plan:
            t1 = time.perf_counter()
            truth = q.apply(x)
            t2 = time.perf_counter()
            noisy = measure_range(truth, names[-1], n_blocks, lo, q, law, rng)
            if np.abs(noisy).max(initial=0) >= 2**31:
                raise OverflowError("a noisy block count does not fit int32")
            values[(names[-1], q.name)][lo:hi] = noisy
            t["apply"] += t2 - t1
            t["noise"] += time.perf_counter() - t2
            t["draws"] += truth.size
        del x, truth, noisy

    t0 = time.perf_counter()
    tensors = [bg_sum.reshape(n_bg, N_CELLS)]
    for k in range(D - 2, 0, -1):
        tensors.append(h.aggregate_up(k, tensors[-1]))
    tensors = tensors[::-1]
    t["generate"] += time.perf_counter() - t0
    for lvl, q, law in plan:
        k = names.index(lvl)
        if k == D - 1:
            continue
        t1 = time.perf_counter()
        truth = q.apply(tensors[k].reshape(-1, *PL94_SHAPE))
        t2 = time.perf_counter()
        values[(lvl, q.name)] = measure_range(truth, lvl, h.sizes[k], 0, q, law, rng)
        t["apply"] += t2 - t1
        t["noise"] += time.perf_counter() - t2
        t["draws"] += truth.size
    return values, tensors, t


def dense_county(
    h: Hierarchy,
    schema: Schema,
    plan: list[tuple[str, ProductQuery, DiscreteGaussian]],
    values: dict,
) -> dict:
    """The dense tree GLS (``K × K`` per node) on the county with the fewest blocks, on the
    benchmark's own noisy measurements of that county's subtree (no invariant inside it)."""
    k = h.level_index("county")
    sizes = [np.diff(h.descendant_range(k, c, h.depth - 1)) for c in range(h.sizes[k])]
    c = int(np.argmin(sizes))
    sub = h.subtree(k, c)
    dense_q = {q.name: Query(q.name, q.dense(), q.labels) for _, q, _ in plan}
    meas, rho = [], 0.0
    for lvl, q, law in plan:
        if lvl not in sub.names:
            continue
        d = sub.names.index(lvl)
        lo, hi = h.descendant_range(k, c, lvl)
        meas.append(Measurement(d, dense_q[q.name], values[(lvl, q.name)][lo:hi].astype(np.int64),
                                law))  # fmt: skip
        rho += law.privacy(q.l2_sensitivity)
    privacy = PrivacyStatement("zcdp", rho=rho, mechanism="discrete_gaussian")
    t0 = time.perf_counter()
    rel = tree_gls(sub, schema.cells, meas, [], privacy)
    seconds = time.perf_counter() - t0
    return {
        "county": str(h[k].codes[c]),
        "nodes_per_level": dict(zip(sub.names, sub.sizes, strict=True)),
        "blocks": int(sub.sizes[-1]),
        "seconds": seconds,
        "gls_path": rel.diagnostics.get("path"),
    }


def run(blocks: int, seed: int, dense: bool) -> dict:
    t_start = time.perf_counter()
    state = synthetic_state(seed, blocks=blocks)
    h = state.hierarchy
    schema = Schema.load("pl94")
    plan = strategy(schema)
    rho = sum(law.privacy(q.l2_sensitivity) for _, q, law in plan)
    t_data = time.perf_counter() - t_start

    rng = KeyedRNG.reproducible(seed, warn=False)
    t0 = time.perf_counter()
    values, tensors, tm = measure_state(h, state.leaf_counts[:, 0], seed, plan, rng)
    t_measure = time.perf_counter() - t0 - tm["generate"]
    t_data += tm["generate"]
    invariant_totals = {lvl: tensors[k].sum(axis=1) for k, lvl in enumerate(h.names[:2])}
    rss_after_measure = _peak_mb()

    stages = {
        "measure (apply queries + noise)": t_measure,
        "structured_gls": "absent: censusdp.estimation.structured_gls is not on this branch",
        "standard_errors": "absent: they come from the structured GLS",
        "rounding": "absent: no rounding of schema histograms exists yet",
    }
    counted = t_measure
    out = {
        "blocks": int(h.sizes[-1]),
        "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
        "persons": int(state.leaf_counts.sum()),
        "cells": N_CELLS,
        "queries_per_geounit": len(QUERIES),
        "noisy_counts_per_geounit": sum(ProductQuery.parse(schema, t).n_rows for t in QUERIES),
        "seconds": counted,
        "seconds_per_stage": stages,
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
            "invariant_totals_held": int(invariant_totals["state"][0]) == int(
                state.leaf_counts.sum()
            ),
        },
        "peak_rss_mb_after_measure": rss_after_measure,
    }
    if dense:
        out["dense_county"] = dense_county(h, schema, plan, values)
    out["wall_seconds"] = time.perf_counter() - t_start
    out["peak_rss_mb"] = _peak_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=160_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-dense", action="store_true", help="skip the dense one-county path")
    args = ap.parse_args()
    print(json.dumps(run(args.blocks, args.seed, not args.no_dense), indent=2))


if __name__ == "__main__":
    main()
