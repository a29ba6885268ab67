"""Exact standard errors of 30,000 synthetic places on the 160,000-block synthetic state:
prints one JSON object.

The synthetic state of :func:`~censusdp.hierarchy.synthetic.synthetic_state` (nation → state
→ county → tract → block group → block), the ``pl94`` production strategy and allocation
(11 queries per geounit, discrete Gaussian noise), nation and state totals invariant. Places
are runs of consecutive blocks in canonical (geographic) order with lognormal sizes, so they
straddle block-group, tract and county boundaries as real places do; about a third of the
blocks are in no place. The block → place file is written as a BAF-style CSV
(``BLOCKID,PLACEFP``) and read back with :func:`~censusdp.hierarchy.equivalency.read_equivalency`.

Stages (wall and CPU seconds; building the synthetic state and writing the CSV are not
counted): ``read`` (the equivalency file → leaf indices), ``predict_levels`` (the prediction
of every level, for reference), ``predict_areas`` (the same with ``areas=``: the extra time is
the area sweep over every block of the marginal basis's problems), ``release_areas`` (the same
covariances from the structured GLS setup of a release, on the tree's own nodes:
:func:`~censusdp.estimation.gls.areas.structured_area_covariance`), ``summary`` (SE quantiles over
places of the 11 strategy tables). ``peak_rss_mb`` is the process's peak resident memory. The
two routes' SEs are compared (largest relative difference). With ``--national`` a block →
place file of 32,000 places on the 8.2-million-block synthetic U.S. is read and predicted
(levels alone, then with the places).

Measured on the shared 2-core development machine under load (seed 1: 30,000 places holding
98,086 of the 160,000 blocks, median 2 and at most 111 blocks each): read 0.42 s (0.13 CPU s),
prediction of the levels 1.48 s (0.40), with the places 3.11 s (0.77), the release route
9.61 s (2.41), the summary 3.95 s (0.98); the two routes agree to 1.4e-11 (relative). Place
total SEs average 52.7 (at most 266) against 1.26 for tracts: under the production allocation a
block's total is weak (its budget is mostly on the detailed cells), so places assembled from
blocks need their own measurement (issue 16, Build 2). ``--national`` (32,000 places holding
5.45 million of the 8.2 million blocks): read 25.8 s wall (6.2 CPU s), prediction of the
levels 31.5 s (7.9), with the places 62.6 s (16.4); peak RSS of the whole process 2.75 GB
(the national hierarchy and the written file included); wall times are 4× the CPU times on
the loaded machine.

With ``--measured N1,N2,...`` the places are also *measured* (issue 16, Build 2) on a smaller
synthetic state (``--measured-blocks``, default 2,000 blocks): a release at 0.9 of the
production ρ (zero counts, so the estimate is the error), the places' totals measured with
the other 0.1 and the tree GLS updated exactly
(:func:`~censusdp.estimation.gls.area_measurements.update_with_areas`), for each number of places:
wall and CPU seconds of the update, its rank (places × 1 for totals) and the place total SEs
before and after. The update carries one column per place through every node, so its time
grows as nodes × places (and ``K`` as places³).

Measured under load (seed 1, 0.9/0.1 of the production ρ, place totals measured): 2,000 blocks
(2,055 nodes; release 2.7 s wall, 0.7 CPU s): 50 / 200 / 800 places, update 2.6 / 2.0 / 4.7 s
wall (0.44 / 0.62 / 1.42 CPU s); 8,000 blocks (8,214 nodes; release 14.8 s, 2.6 CPU s): 400 /
1,600 places, update 12.1 / 37.9 s wall (2.6 / 9.1 CPU s), peak RSS 1.6 / 2.5 GB. Mean place
total SE 125 / 74 / 43 (2,000 blocks) and 97 / 54 (8,000) summed from blocks, 1.40 measured
(the place's own measurement dominates: σ² = 1/(2 · 0.1 ρ) for a total). Memory is the
binding cost (``nodes × places`` per copy held by the passes): the per-state form of the
module docstring of :mod:`censusdp.estimation.gls.area_measurements` is what a national run needs.

Usage: ``python benchmarks/areas_scale.py [--blocks N] [--places N] [--seed S] [--national]
[--measured N1,N2 [--measured-blocks B] [--only-measured]]``.

References
----------
U.S. Census Bureau (2021). 2020 Census Block Assignment Files (BAF).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from censusdp.estimation.gls.areas import structured_area_covariance
from censusdp.estimation.gls.predict import allocation_plan, predict_errors
from censusdp.estimation.gls.structured import structured_setup
from censusdp.hierarchy.equivalency import read_equivalency
from censusdp.hierarchy.synthetic import synthetic_state, synthetic_us
from censusdp.mechanisms.product_measure import ProductInvariant, ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Schema


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def synthetic_places(n_blocks: int, n_places: int, seed: int) -> np.ndarray:
    """Place index of every block (−1: in no place): ``n_places`` runs of consecutive blocks
    with lognormal(0, 1) lengths covering about two thirds of the blocks, separated by gaps."""
    gen = np.random.default_rng(seed)
    w = gen.lognormal(0.0, 1.0, n_places)
    length = np.maximum(1, np.floor(w / w.sum() * n_blocks * 2 / 3)).astype(np.int64)
    gap = gen.multinomial(n_blocks - int(length.sum()), np.full(n_places, 1.0 / n_places))
    before = np.concatenate([[0], np.cumsum(length)[:-1]])  # blocks in earlier places
    start = np.cumsum(gap) + before
    place = np.full(n_blocks, -1, np.int64)
    idx = np.repeat(np.arange(n_places), length)
    place[np.repeat(start - before, length) + np.arange(idx.size)] = idx
    return place


def _write_baf(path: Path, codes: np.ndarray, place: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    keep = place >= 0
    fips = np.char.zfill(place[keep].astype(str), 5)
    table = pa.table(
        {"BLOCKID": np.asarray(codes[keep], dtype=object).tolist(), "PLACEFP": fips.tolist()}
    )
    pacsv.write_csv(table, path, write_options=pacsv.WriteOptions(quoting_style="none"))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=160_000)
    ap.add_argument("--places", type=int, default=30_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--national", action="store_true", help="also read an 8.2M-row file")
    ap.add_argument("--measured", default="", help="numbers of measured places, e.g. 50,200")
    ap.add_argument("--measured-blocks", type=int, default=2_000)
    ap.add_argument("--only-measured", action="store_true", help="skip the summed stages")
    args = ap.parse_args(argv)
    if args.only_measured:
        out = {"benchmark": "areas_scale", "measured": measured(args)}
        print(json.dumps(out, indent=2))
        return out

    h = synthetic_state(args.seed, blocks=args.blocks).hierarchy
    codes = np.asarray(h.leaves.codes, dtype=object)
    place = synthetic_places(h.leaves.size, args.places, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="areas_scale_"))
    _write_baf(tmp / "baf.csv", codes, place)
    print(f"hierarchy {dict(zip(h.names, h.sizes, strict=True))}", file=sys.stderr)

    schema = Schema.load("pl94")
    plan = allocation_plan(schema, levels=h.names)
    total = ProductQuery.parse(schema, "total")
    invariants = [("nation", total), ("state", total)]
    stages: dict[str, dict[str, float]] = {}

    def stage(name: str, w0: float, c0: float) -> None:
        stages[name] = {"seconds": time.perf_counter() - w0, "cpu_seconds": _cpu() - c0}
        print(f"[{stages[name]['seconds']:6.1f} s] {name}", file=sys.stderr, flush=True)

    w, c = time.perf_counter(), _cpu()
    eq = read_equivalency(
        tmp / "baf.csv", h, block_column="BLOCKID", area_column="PLACEFP", name="place"
    )
    stage("read", w, c)
    w, c = time.perf_counter(), _cpu()
    predict_errors(h, schema, plan, invariants)
    stage("predict_levels", w, c)
    w, c = time.perf_counter(), _cpu()
    pred = predict_errors(h, schema, plan, invariants, areas=eq)
    stage("predict_areas", w, c)
    w, c = time.perf_counter(), _cpu()
    meas = [ProductMeasurement(lvl, q, np.zeros((0, q.n_rows)), law) for lvl, q, law in plan]
    invs = [ProductInvariant(lvl, q, np.zeros((0, q.n_rows))) for lvl, q in invariants]
    setup = structured_setup(h, schema, meas, invs, check_values=False)
    cov = structured_area_covariance(setup, eq)
    stage("release_areas", w, c)
    w, c = time.perf_counter(), _cpu()
    summary = pred.summary()
    stage("summary", w, c)

    diff = 0.0
    for q in ("total", "hhgq", "votingage * hispanic * cenrace"):
        a = pred.areas.query_variances("place", q)
        b = cov.query_variances(ProductQuery.parse(schema, q))
        ok = np.isfinite(a)
        diff = max(diff, float((np.abs(a - b)[ok] / np.maximum(np.abs(b[ok]), 1e-300)).max()))
    places = summary[summary.level == "place"]
    shown = {
        f"{r.table}: {r.label}": {"se_mean": round(r.se_mean, 3), "se_max": round(r.se_max, 3)}
        for r in places.itertuples()
        if r.table in ("total", "votingage * hispanic") and r.row == 0
    }
    tracts = summary[(summary.level == "tract") & (summary.table == "total")]
    leaves = eq.leaves_per_area()
    out = {
        "benchmark": "areas_scale",
        "nodes": dict(zip(h.names, h.sizes, strict=True)),
        "places": eq.n_areas,
        "blocks_in_places": int(eq.leaf.size),
        "blocks_per_place": {
            "median": float(np.median(leaves)),
            "max": int(leaves.max()),
        },
        "stages": {k: {m: round(v, 2) for m, v in s.items()} for k, s in stages.items()},
        "seconds_areas": round(
            stages["read"]["seconds"]
            + stages["predict_areas"]["seconds"]
            - stages["predict_levels"]["seconds"],
            2,
        ),
        "peak_rss_mb": round(_peak_mb(), 0),
        "max_relative_difference_predict_vs_release": diff,
        "place_se": shown,
        "tract_total_se_mean": round(float(tracts.se_mean.iloc[0]), 3),
    }
    if args.national:
        del pred, cov, setup, summary
        us = synthetic_us(args.seed, blocks=8_200_000, block_groups=240_000).hierarchy
        uc = np.asarray(us.leaves.codes, dtype=object)
        _write_baf(tmp / "us.csv", uc, synthetic_places(uc.size, 32_000, args.seed))
        del uc
        w, c = time.perf_counter(), _cpu()
        big = read_equivalency(
            tmp / "us.csv", us, block_column="BLOCKID", area_column="PLACEFP", name="place"
        )
        stage("read_national", w, c)
        plan_us = allocation_plan(schema, levels=us.names)
        w, c = time.perf_counter(), _cpu()
        predict_errors(us, schema, plan_us, invariants)
        stage("predict_national_levels", w, c)
        w, c = time.perf_counter(), _cpu()
        pus = predict_errors(us, schema, plan_us, invariants, areas=big)
        stage("predict_national_areas", w, c)
        se = pus.areas.query_standard_errors("place", total)[:, 0]
        out["national"] = {
            "rows": int(big.leaf.size),
            "places": big.n_areas,
            "read": stages["read_national"],
            "predict_levels": stages["predict_national_levels"],
            "predict_with_places": stages["predict_national_areas"],
            "place_total_se_mean": round(float(se.mean()), 3),
        }
        out["peak_rss_mb"] = round(_peak_mb(), 0)
    if args.measured:
        out["measured"] = measured(args)
    print(json.dumps(out, indent=2))
    return out


def measured(args: argparse.Namespace) -> list[dict]:
    """The measured-places update on a ``--measured-blocks`` state, per number of places."""
    from fractions import Fraction

    from censusdp.estimation.gls.area_measurements import (
        area_plan,
        area_statement,
        measure_areas,
        update_with_areas,
    )
    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.hierarchy.equivalency import equivalency_from_arrays
    from censusdp.mechanisms.product_measure import measure_products
    from censusdp.rng import KeyedRNG

    h = synthetic_state(args.seed, blocks=args.measured_blocks).hierarchy
    schema = Schema.load("pl94")
    alloc = schema.allocation
    rho = Fraction(alloc.rho)
    plan = allocation_plan(schema, dataclasses.replace(alloc, rho=rho * 9 / 10), levels=h.names)
    total = ProductQuery.parse(schema, "total")
    rng = KeyedRNG.reproducible(args.seed, warn=False)
    zeros = [np.zeros((n, *schema.shape), np.int64) for n in h.sizes]
    meas = measure_products(zeros, plan, rng, level_names=h.names)
    invs = [ProductInvariant(lvl, total, np.zeros((h.sizes[h.level_index(lvl)], 1)))
            for lvl in ("nation", "state")]  # fmt: skip
    w, c = time.perf_counter(), _cpu()
    rel = structured_gls(h, schema, meas, invs)
    release = {"seconds": round(time.perf_counter() - w, 2), "cpu_seconds": round(_cpu() - c, 2)}
    print(f"release of {h.leaves.size} blocks: {release}", file=sys.stderr, flush=True)
    aplan = area_plan(schema, rho / 10)
    codes = np.asarray(h.leaves.codes, dtype=object)
    rows = []
    for n in [int(x) for x in args.measured.split(",")]:
        place = synthetic_places(h.leaves.size, n, args.seed)
        keep = place >= 0
        names = np.char.zfill(place[keep].astype(str), 5).astype(object)
        eq = equivalency_from_arrays(h, codes[keep], names, name="place")
        ameas = measure_areas(eq, zeros[-1], aplan, rng.child(f"areas/{n}"))
        stmt = area_statement(h.names, plan, "place", aplan, delta=None)
        stmt = dataclasses.replace(stmt, invariants=rel.privacy.invariants)
        w, c = time.perf_counter(), _cpu()
        got = update_with_areas(rel, eq, ameas, stmt)
        sec, cpu = time.perf_counter() - w, _cpu() - c
        before = got.prior_areas.query_standard_errors("place", total)[:, 0]
        after = got.areas.query_standard_errors("place", total)[:, 0]
        row = {
            "places": eq.n_areas,
            "blocks_in_places": int(eq.leaf.size),
            "nodes": int(sum(h.sizes)),
            "update_seconds": round(sec, 2),
            "update_cpu_seconds": round(cpu, 2),
            "rank": got.diagnostics["update_rank"],
            "place_total_se_mean_summed": round(float(before.mean()), 3),
            "place_total_se_mean_measured": round(float(after.mean()), 3),
            "release": release,
            "peak_rss_mb": round(_peak_mb(), 0),
        }
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
