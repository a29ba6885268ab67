"""Benchmark of the lattice mechanisms on the shared MCMC engine; prints JSON.

* the 4 × 4 delinquent-children table (margins invariant), ℓ₁ generalized Laplace,
  ε = 0.2: engine iterations per second (200 chains) and seconds to certify TV < 0.01
  (200 L-lag coupled pairs);
* Illinois' 102 counties (state total invariant; synthetic Illinois-like sizes when the
  shared data is absent), ℓ₁ at ε = 0.192: pair-move iterations per second, whether the
  coupling certifies TV < 0.01 within a step cap, and the exact rejection sampler's speed.

Run: ``python benchmarks/lattice_mcmc.py``. Never a timed assertion in the test suite.
"""

from __future__ import annotations

import json
import time

import numpy as np

from censusdp.errors import ConvergenceError
from censusdp.estimation.diagnostics import iterations_for_tv, meeting_times
from censusdp.estimation.lattice_release import lattice_engine, tune_scale
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeLaplace,
    sample_group_laplace_l1,
    table_margins_incidence,
)
from censusdp.paths import shared_data_file


def _bench(lattice, law, gen, *, n_chains=200, cap=200_000) -> dict:
    a, acc = tune_scale(lattice, law, gen)
    eng = lattice_engine(lattice, law, a)
    cs = eng.init(np.zeros((n_chains, lattice.dim), np.int64))
    t0 = time.perf_counter()
    n_it = 2000
    for _ in range(n_it):
        eng.step(cs, gen)
    ips = n_it / (time.perf_counter() - t0)
    lag = 25 * lattice.n_directions
    z = np.zeros((200, lattice.dim), np.int64)
    t0 = time.perf_counter()
    res = meeting_times(eng, z, z, lag, gen, max_iterations=cap)
    secs = time.perf_counter() - t0
    t_star = iterations_for_tv(res.meeting_times, lag, 0.01) if res.all_met else None
    out = {
        "dim": lattice.dim,
        "lattice_rank": lattice.n_directions,
        "proposal_a": a,
        "pilot_acceptance": acc,
        "chains": n_chains,
        "iterations_per_second": ips,
        "chain_steps_per_second": ips * n_chains,
        "lag": lag,
        "coupled_pairs": 200,
        "all_pairs_met": res.all_met,
        "pairs_met": int(np.isfinite(res.meeting_times).sum()),
        "iterations_to_tv_0.01": t_star,
        "seconds_to_tv_0.01": secs if t_star is not None else None,
        "coupling_seconds": secs,
        "coupling_step_cap": cap,
    }
    return out


def main() -> None:
    gen = np.random.default_rng(20260101)
    table = IntegerLattice.from_incidence(table_margins_incidence(4, 4))
    result = {"delinquent_4x4_l1_eps0.2": _bench(table, LatticeLaplace(0.2, "l1"), gen)}
    path = shared_data_file("county_totalpop_2010.csv")
    n = 102
    source = "synthetic"
    if path is not None:
        import pandas as pd

        df = pd.read_csv(path, dtype={"state_fips": str})
        n = int((df["state_fips"].astype(int) == 17).sum())
        source = "county_totalpop_2010.csv"
    il = GroupSumLattice(np.zeros(n, np.int64))
    law = LatticeLaplace(0.192, "l1")
    try:
        bench = _bench(il, law, gen, cap=30_000)
    except ConvergenceError as exc:  # pragma: no cover
        bench = {"error": str(exc)}
    t0 = time.perf_counter()
    sample_group_laplace_l1(il, 0.192, gen, 1000)
    bench["exact_sampler_seconds_per_1000_draws"] = time.perf_counter() - t0
    bench["counties_source"] = source
    result["illinois_102_l1_eps0.192"] = bench
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
