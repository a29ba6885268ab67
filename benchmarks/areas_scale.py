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
:func:`~censusdp.estimation.areas.structured_area_covariance`), ``summary`` (SE quantiles over
places of the 11 strategy tables). ``peak_rss_mb`` is the process's peak resident memory. The
two routes' SEs are compared (largest relative difference). With ``--national`` the read
stage alone is also run on a block → area file of the 8.2-million-block synthetic U.S.

Measured on the shared 2-core development machine under load (seed 1: 30,000 places holding
98,086 of the 160,000 blocks, median 2 and at most 111 blocks each): read 0.43 s (0.18 CPU s),
prediction of the levels 0.81 s (0.31), with the places 2.13 s (0.79), the release route
5.46 s (2.16), the summary 2.37 s (0.93); whole process 29 s wall, 10.9 CPU s (most of it
building the synthetic state and writing the file), peak RSS 663 MB; the two routes agree to
1.4e-11 (relative). Place total SEs average 52.7 (at most 266) against 1.26 for tracts: under
the production allocation a block's total is weak (its budget is mostly on the detailed
cells), so places assembled from blocks need their own measurement (issue 16, Build 2).

Usage: ``python benchmarks/areas_scale.py [--blocks N] [--places N] [--seed S] [--national]``.

References
----------
U.S. Census Bureau (2021). 2020 Census Block Assignment Files (BAF).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from censusdp.estimation.areas import structured_area_covariance
from censusdp.estimation.predict import allocation_plan, predict_errors
from censusdp.estimation.structured_gls import structured_setup
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
    args = ap.parse_args(argv)

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
        us = synthetic_us(args.seed, blocks=8_200_000, block_groups=240_000).hierarchy
        uc = np.asarray(us.leaves.codes, dtype=object)
        _write_baf(tmp / "us.csv", uc, np.arange(uc.size) % 500_000)
        w, c = time.perf_counter(), _cpu()
        big = read_equivalency(tmp / "us.csv", us, block_column="BLOCKID", area_column="PLACEFP")
        stage("read_national", w, c)
        out["national_read"] = {"rows": int(big.leaf.size), **stages["read_national"]}
        out["peak_rss_mb"] = round(_peak_mb(), 0)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
