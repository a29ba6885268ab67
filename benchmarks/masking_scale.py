"""Benchmark: block-diagonal matrix masking (setting B) of 1,000,000 × 10 scaled microdata.

Prints one JSON object: rows, p, block size, number of blocks, σ, seconds, peak_rss_mb.
Run: ``python benchmarks/masking_scale.py [--rows N] [--p P] [--block M]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from censusdp.mechanisms.masking import mask
from censusdp.rng import KeyedRNG


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--p", type=int, default=10)
    ap.add_argument("--block", type=int, default=1000)
    args = ap.parse_args(argv)
    rng = KeyedRNG.secure()
    x = rng.generator("bench/data").uniform(-1.0, 1.0, (args.rows, args.p))
    t0 = time.perf_counter()
    release = mask(x, 0.1, 0.01, rng, setting="B", block=args.block)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    out = {
        "rows": args.rows,
        "p": args.p,
        "block_size": args.block,
        "blocks": int(release.block_sizes.size),
        "smallest_block": int(release.block_sizes.min()),
        "sigma": release.sigma,
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(peak, 1),
        "finite": bool(np.isfinite(release.values).all()),
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
