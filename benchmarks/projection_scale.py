"""Projected Laplace noise at census-block scale: prints JSON {coordinates, seconds, ...}.

8.2 million coordinates (≈ the number of populated 2010 census blocks) under 52 state-total
invariants: draw e ~ Lap(1/ε) per coordinate from KeyedRNG keyed chunks, then apply Π_N by
subtracting each state's mean (O(n), no matrix). Group sizes are generated here (a
reproducible Dirichlet split of the coordinates). Run: ``python benchmarks/projection_scale.py``.
"""

from __future__ import annotations

import json
import resource
import time

import numpy as np

from censusdp.mechanisms import Laplace, group_projection_variances, project_group_totals
from censusdp.rng import KeyedRNG

N = 8_200_000
GROUPS = 52
EPSILON = 1.0


def main() -> dict:
    rng = KeyedRNG.reproducible(52, warn=False)
    shares = np.random.default_rng(0).dirichlet(np.full(GROUPS, 2.0))
    sizes = np.maximum(1, np.floor(shares * N).astype(np.int64))
    sizes[-1] += N - sizes.sum()
    groups = np.repeat(np.arange(GROUPS, dtype=np.int64), sizes)
    law = Laplace(1.0 / EPSILON)

    t0 = time.perf_counter()
    e = rng.draw("benchmark/block", N, 0, N, law.sample)[:, 0]
    t1 = time.perf_counter()
    noise = project_group_totals(e, groups)
    t2 = time.perf_counter()

    sums = np.bincount(groups, weights=noise, minlength=GROUPS)
    var = group_projection_variances(groups, law.variance)
    return {
        "coordinates": N,
        "invariants": GROUPS,
        "seconds": t2 - t0,
        "seconds_draw": t1 - t0,
        "seconds_project": t2 - t1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "max_abs_group_sum_of_noise": float(np.abs(sums).max()),
        "smallest_group": int(sizes.min()),
        "mean_projected_variance": float(var.mean()),
        "empirical_variance": float(noise.var()),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
