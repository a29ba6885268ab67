"""Scale benchmark of the hierarchy layer: a national block file, built, validated, summed.

Prints JSON: ``blocks``, ``seconds`` (build + validate + aggregate), ``peak_rss_mb`` (peak
resident set size of the process, from ``resource.getrusage``), and seconds per stage:

* ``synthesize`` — :func:`censusdp.hierarchy.synthetic_us` (not counted in ``seconds``);
* ``frame`` — the block codes as a pandas string column, as a file reader would hand them
  over (not counted);
* ``build`` — :func:`censusdp.hierarchy.from_columns` with state = block[:2], county =
  block[:5], tract = block[:11], block = block code, and the counts aligned to the leaves;
* ``validate`` — :func:`censusdp.hierarchy.validate` with the prefix-nesting check;
* ``aggregate`` — :meth:`Hierarchy.aggregate` of the counts to every level.

Targets (2-core machine): ≤ 20 s and ≤ 3,000 MB at 8.2 million blocks.

Usage: ``python benchmarks/hierarchy_scale.py [--blocks N] [--shuffle] [--seed S]``
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa

from censusdp.hierarchy import from_columns, synthetic_us, validate
from censusdp.rng import KeyedRNG


def _peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8_200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shuffle", action="store_true", help="shuffle the rows before building")
    args = ap.parse_args(argv)

    scale = args.blocks / 8_200_000
    tracts = max(52 * 3, min(85_000, int(round(85_000 * scale))))
    counties = max(52, min(3221, int(round(3221 * scale**0.5)), tracts))
    stages: dict[str, float] = {}

    t = time.perf_counter()
    table = synthetic_us(
        args.seed,
        counties=counties,
        tracts=tracts,
        blocks=args.blocks,
        population=int(round(330_000_000 * scale)),
    )
    stages["synthesize"] = time.perf_counter() - t

    t = time.perf_counter()
    codes = np.asarray(table.hierarchy.leaves.codes, dtype=object)
    counts = table.leaf_counts[:, 0]
    if args.shuffle:
        perm = (
            KeyedRNG.reproducible(args.seed, warn=False)
            .generator("shuffle")
            .permutation(codes.size)
        )
        codes, counts = codes[perm], counts[perm]
    df = pd.DataFrame({"block": pd.Series(pa.array(codes, pa.large_string()), dtype="str")})
    df["population"] = counts
    del codes
    stages["frame"] = time.perf_counter() - t

    t = time.perf_counter()
    h, leaf_row = from_columns(
        df,
        [("state", "block", 2), ("county", "block", 5), ("tract", "block", 11), ("block", "block")],
    )
    leaf_counts = df["population"].to_numpy()[leaf_row]
    stages["build"] = time.perf_counter() - t

    t = time.perf_counter()
    validate(h, nesting="prefix")
    stages["validate"] = time.perf_counter() - t

    t = time.perf_counter()
    levels = h.aggregate(leaf_counts)
    stages["aggregate"] = time.perf_counter() - t

    same = h == table.hierarchy and bool((leaf_counts == table.leaf_counts[:, 0]).all())
    out = {
        "blocks": args.blocks,
        "seconds": round(stages["build"] + stages["validate"] + stages["aggregate"], 3),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "stages": {k: round(v, 3) for k, v in stages.items()},
        "levels": dict(zip(h.names, h.sizes, strict=True)),
        "total": int(levels[0][0]),
        "shuffled": args.shuffle,
        "matches_synthetic": same,
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
