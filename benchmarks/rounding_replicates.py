"""The cost of the replicate rounding variances on the pl94 state workload: prints one JSON object.

The workload of ``benchmarks/pl94_state.py`` (a synthetic state of ``--blocks`` blocks,
:func:`~censusdp.hierarchy.synthetic.synthetic_state`; the 2020 production strategy and
allocation; nation and state totals invariant) run through the streamed engine
:func:`~censusdp.pipelines.products.pl94_stream.stream_pl94` twice in one process, with the same key:
without replicates, then with ``--replicates R`` replicate roundings
(:mod:`~censusdp.estimation.integer.controlled`, "Replicate rounding variances": the top
and every partition rounded ``R`` more times with keys of their own, and each replicate's
errors in the 298 P1–P5 columns kept per node). Reported per run: CPU and wall seconds of
the rounding stage (the replicates and their tabulation run inside it), of the GLS and of
the whole stream (after an uncounted warm-up on a 100-block state); peak RSS. The release's integers are checked to be the same in both runs.
Per level it also prints the RMS over nodes of the GLS standard error and of the replicate
rounding SD (``sqrt(replicate_variance)``) for ``P1_001N`` and the mean over the 298 columns,
so the share of the rounding in ``_se`` can be read off.

Measured (``--blocks 4000 --replicates 32``, seed 0: 1 county, 26 tracts, 79 block groups;
2-core machine shared with five other jobs, ``nice``, numba caches warm): rounding CPU 1.04 s
without replicates, 37.8 s with (36×: 33 roundings and the errors' tabulation, which is about
a sixth of it); the whole stream's CPU 3.36 → 42.5 s (12.6×); the release's integers the
same. Per level the RMS rounding SD of ``P1_001N`` against its GLS SE: tract 0.40 / 1.28,
block group 0.44 / 1.11, block 0.41 / 34.4; over all 298 columns 2.31 / 4.90 (tract), 2.32 /
4.38 (block group), 2.15 / 13.4 (block), 1.75 / 5.15 at the county and above (invariant
totals: 0). The cost is ``R + 1`` roundings: the national stream (rounding 1,920 CPU s,
``benchmarks/pl94_national.py``) would spend about 17 CPU hours more, so replicates are an
option of :func:`~censusdp.pipelines.products.pl94_stream.stream_pl94` (default 0) that the PPMF route
turns on and the national benchmark leaves off.

Usage: ``python benchmarks/rounding_replicates.py [--blocks N] [--replicates R] [--seed S]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time

import numpy as np

from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.integer.controlled import replicate_variance
from censusdp.hierarchy.synthetic import synthetic_state
from censusdp.pipelines.products.pl94_stream import (
    Pl94StreamOptions,
    SyntheticHistogram,
    stream_pl94,
)
from censusdp.pipelines.products.pl94_tables import pl94_codebook, pl94_column_values
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema


def _run(h, schema, source, plan, seed: int, replicates: int) -> dict:
    digest = hashlib.sha256()
    acc: dict = {}
    cols = pl94_codebook().rows

    def take(piece, counts, reps) -> None:
        for j, lvl in enumerate(piece.names):
            digest.update(np.ascontiguousarray(counts[j]).tobytes())
            if reps is None:
                continue
            gls = pl94_column_values(lambda q, lvl=lvl: piece.query_standard_errors(lvl, q))
            rv = replicate_variance(reps[j])
            a = acc.setdefault(lvl, np.zeros(5))
            a += (gls[:, 0] @ gls[:, 0], rv[:, 0].sum(), float(np.sum(gls**2)),
                  float(rv.sum()), gls.shape[0])  # fmt: skip

    t0, c0 = time.perf_counter(), time.process_time()
    res = stream_pl94(
        h, schema, source, plan, KeyedRNG.reproducible(seed, warn=False),
        options=Pl94StreamOptions(rounding_replicates=replicates),
        on_top=lambda t: take(t.piece, t.counts, t.replicate_errors),
        on_partition=lambda p: take(p.piece, p.counts, p.replicate_errors),
    )  # fmt: skip
    d = res.diagnostics
    out = {
        "replicates": replicates,
        "cpu_seconds_rounding": d["cpu_seconds_rounding"],
        "seconds_rounding": d["seconds_rounding"],
        "cpu_seconds_gls": d["cpu_seconds_gls"],
        "cpu_seconds_stream": time.process_time() - c0,
        "seconds_stream": time.perf_counter() - t0,
        "release_digest": digest.hexdigest()[:16],
    }
    if acc:
        m = len(cols)
        out["per_level"] = {
            lvl: {
                "P1_001N_rms_gls_se": float(np.sqrt(a[0] / a[4])),
                "P1_001N_rms_rounding_sd": float(np.sqrt(a[1] / a[4])),
                "all_columns_rms_gls_se": float(np.sqrt(a[2] / (a[4] * m))),
                "all_columns_rms_rounding_sd": float(np.sqrt(a[3] / (a[4] * m))),
            }
            for lvl, a in acc.items()
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=4000)
    ap.add_argument("--replicates", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    schema = Schema.load("pl94")
    # warm-up on a tiny state (numba compiles, code paths first taken): not counted
    tiny = synthetic_state(args.seed, blocks=100)
    _run(tiny.hierarchy, schema, SyntheticHistogram(tiny.leaf_counts[:, 0], args.seed),
         allocation_plan(schema, levels=tiny.hierarchy.names), args.seed, 1)  # fmt: skip
    state = synthetic_state(args.seed, blocks=args.blocks)
    h = state.hierarchy
    plan = allocation_plan(schema, levels=h.names)
    source = SyntheticHistogram(state.leaf_counts[:, 0], args.seed)
    print(f"synthetic state {h}", file=sys.stderr)
    base = _run(h, schema, source, plan, args.seed, 0)
    print("without replicates: done", file=sys.stderr)
    reps = _run(h, schema, source, plan, args.seed, args.replicates)
    out = {
        "blocks": int(h.sizes[-1]),
        "nodes_per_level": dict(zip(h.names, h.sizes, strict=True)),
        "without_replicates": base,
        "with_replicates": reps,
        "same_release": base["release_digest"] == reps["release_digest"],
        "rounding_cpu_ratio": reps["cpu_seconds_rounding"] / base["cpu_seconds_rounding"],
        "stream_cpu_ratio": reps["cpu_seconds_stream"] / base["cpu_seconds_stream"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
