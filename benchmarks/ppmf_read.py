"""Reading a PPMF: rows per second and peak memory of :func:`~censusdp.pipelines.io.ppmf.read_ppmf`.

Writes a synthetic PPMF of ``--rows`` persons (the 2021-04-28 layout: VINTAGE, TABBLKST,
TABBLKCOU, TABTRACT, TABBLKGRP, TABBLK, RTYPE, GQTYPE_PL, VOTING_AGE, CENHISP, CENRACE;
sorted by block as the Bureau's files are, about 28 persons per block as in 2010) to a
temporary file, a chunk of rows at a time, then reads it and prints one JSON object. Each
person's cell is drawn from the national 2020 shares of the 2,016 ``pl94`` cells
(:func:`~censusdp.hierarchy.synthetic.pl94_cell_shares`, ``--cells national``, the default)
or uniformly over them (``--cells uniform``: nearly every person its own block × cell pair,
the reader's worst case). Output:

- ``rows``, ``file_mb``, ``blocks``, ``nonzero_cells``;
- ``seconds`` (wall) and ``cpu_seconds`` of the read alone (the write is timed apart as
  ``write_seconds``); ``rows_per_second`` = rows / wall seconds; on a shared machine the
  difference between wall and CPU time is waiting;
- ``peak_rss_mb``: the read's own peak resident memory (Linux ``VmHWM``, reset after the
  write; the process peak from ``getrusage`` where ``/proc`` is missing).

Goal (issue 16): ≤ 2 GB and ≥ 2 million rows/s on 20 million rows.

Usage: ``python benchmarks/ppmf_read.py [--rows N] [--cells national|uniform] [--seed S]
[--keep PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from censusdp.hierarchy.synthetic import PL94_SHAPE, pl94_cell_shares
from censusdp.pipelines.io.ppmf import read_ppmf
from censusdp.rng import KeyedRNG

HEADER = b"VINTAGE,TABBLKST,TABBLKCOU,TABTRACT,TABBLKGRP,TABBLK,RTYPE,GQTYPE_PL,VOTING_AGE,CENHISP,CENRACE\n"
PERSONS_PER_BLOCK = 28
CHUNK_ROWS = 1_000_000


def _peak_mb(reset: bool = False) -> float:
    try:
        with open("/proc/self/status") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        return kb / 1024.0
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _digits(v: np.ndarray, width: int) -> np.ndarray:
    """(n, width) ASCII digits of non-negative integers, zero-padded."""
    p = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((v[:, None] // p) % 10 + ord("0")).astype(np.uint8)


def _rows(first: int, n: int, gen: np.random.Generator, cdf: np.ndarray | None) -> bytes:
    """Rows ``first … first + n − 1`` of the synthetic file as fixed-width CSV bytes; cells
    from the cumulative shares ``cdf`` (None: uniform)."""
    person = np.arange(first, first + n, dtype=np.int64)
    b = person // PERSONS_PER_BLOCK
    state = 1 + b // 300_000
    county = 1 + (b // 3_500) % 999
    tract = 100 + (b // 150) % 900_000
    bg = 1 + (b // 50) % 3
    block = bg * 1000 + b % 50
    if cdf is None:
        cell = gen.integers(0, 2016, n)
    else:
        cell = np.minimum(np.searchsorted(cdf, gen.random(n), side="right"), 2015)
    gq, va, hisp, race = np.unravel_index(cell, PL94_SHAPE)
    fields = [
        np.frombuffer(b"20210428", np.uint8)[None, :].repeat(n, 0),
        _digits(state, 2),
        _digits(county, 3),
        _digits(tract, 6),
        _digits(bg, 1),
        _digits(block, 4),
        _digits(np.where(gq == 0, 3, 5), 1),
        _digits(gq, 1),
        _digits(va + 1, 1),
        _digits(hisp + 1, 1),
        _digits(race + 1, 2),
    ]
    parts = []
    for f in fields:
        parts += [f, np.full((n, 1), ord(","), np.uint8)]
    parts[-1] = np.full((n, 1), ord("\n"), np.uint8)
    return np.hstack(parts).tobytes()


def write_ppmf(path: Path, rows: int, seed: int, cells: str = "national") -> None:
    """The synthetic PPMF of ``rows`` persons, written a chunk at a time."""
    rng = KeyedRNG.reproducible(seed, warn=False).child("benchmark_ppmf")
    cdf = np.cumsum(pl94_cell_shares().ravel()) if cells == "national" else None
    with path.open("wb") as f:
        f.write(HEADER)
        for i, first in enumerate(range(0, rows, CHUNK_ROWS)):
            f.write(_rows(first, min(CHUNK_ROWS, rows - first), rng.generator("rows", i), cdf))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--cells", choices=("national", "uniform"), default="national")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="write the file here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "ppmf.csv"
        t0 = time.perf_counter()
        write_ppmf(path, args.rows, args.seed, args.cells)
        write_s = time.perf_counter() - t0
        print(f"wrote {args.rows:,} rows in {write_s:.1f} s", file=sys.stderr)
        _peak_mb(reset=True)
        base = _peak_mb()
        t0, c0 = time.perf_counter(), time.process_time()
        got = read_ppmf(path)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out = {
            "rows": args.rows,
            "cells": args.cells,
            "file_mb": round(os.path.getsize(path) / 2**20, 1),
            "blocks": int(got.hierarchy.leaves.size),
            "nonzero_cells": int(got.count.size),
            "write_seconds": round(write_s, 2),
            "seconds": round(wall, 2),
            "cpu_seconds": round(cpu, 2),
            "rows_per_second": round(args.rows / wall),
            "peak_rss_mb": round(_peak_mb(), 1),
            "rss_before_read_mb": round(base, 1),
            "threads": os.cpu_count(),
        }
        assert int(got.count.sum()) == args.rows
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
