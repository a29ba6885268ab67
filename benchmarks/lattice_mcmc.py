"""Benchmark of the lattice mechanisms through the certified release path; prints JSON.

For each case the release policy runs exactly as a release would
(:func:`censusdp.estimation.integer.lattice_release.certify`: ≥ 200 L-lag coupled pairs for the TV
bound, 16 over-dispersed chains for R̂, moves chosen by
:func:`~censusdp.estimation.integer.lattice_release.default_mode`), and the benchmark records

* ``iterations_per_second``: engine steps per second of a batch of 200 chains (and of one
  chain), in the certified mode;
* ``iterations_to_tv_0.01`` / ``sweeps_to_tv_0.01``: the certified ``T`` (first step whose
  L-lag bound is below 0.01);
* ``seconds_to_tv_0.01``: wall time of one chain running ``T`` steps — the sampling cost of
  one released draw whose law is within the (estimated) TV 0.01 of the target;
* ``certify_seconds``: wall time of the certificate itself (coupled pairs and R̂);
* mode, lag, TV bound, R̂ and meeting-time quantiles (engine steps and sweeps).

Cases: the 4 × 4 delinquent-children table (both margins invariant) with the ℓ₁ (Gibbs
moves) and ℓ₂ (Metropolis moves) generalized Laplace at ε = 0.2; Illinois' 102 counties
(state total invariant; the county count comes from ``county_totalpop_2010.csv`` when the
shared data is present, else a synthetic 102-county group — only the count matters, the noise
chain never sees the data) with ℓ₁ at ε = 0.192, beside the exact rejection sampler and the
random-walk pair moves this path replaced (how many of 200 coupled pairs meet within a cap).

Run: ``python benchmarks/lattice_mcmc.py [--skip-random-walk]``. Never a timed assertion in
the test suite.

References
----------
Dharangutte, Gao, Gong & Yu, "Integer Subspace Differential Privacy", AAAI 2023, §4–5.
Biswas, Jacob & Vanetti (2019), "Estimating convergence of Markov chains with L-lag
couplings", NeurIPS.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from censusdp.estimation.conditioning.diagnostics import meeting_times
from censusdp.estimation.integer.lattice_release import (
    certify,
    lattice_engine,
    steps_per_sweep,
    tune_scale,
)
from censusdp.jsonable import to_jsonable
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeLaplace,
    sample_group_laplace_l1,
    table_margins_incidence,
)
from censusdp.paths import shared_data_file
from censusdp.rng import KeyedRNG

QUANTILES = (0.5, 0.9, 0.99, 1.0)


def _steps_per_second(eng, dim: int, n_chains: int, gen, *, min_seconds: float = 1.0) -> float:
    """Engine steps per second of a batch of ``n_chains`` chains (after a short warm-up)."""
    cs = eng.init(np.zeros((n_chains, dim), np.int64))
    for _ in range(20):
        eng.step(cs, gen)
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(50):
            eng.step(cs, gen)
        n += 50
        secs = time.perf_counter() - t0
        if secs >= min_seconds:
            return n / secs


def bench_certified(lattice, law, rng: KeyedRNG, *, n_chains: int = 200) -> dict:
    """Certify as a release would, then time the certified engine."""
    t0 = time.perf_counter()
    rep = certify(lattice, law, rng)
    certify_seconds = time.perf_counter() - t0
    k = steps_per_sweep(lattice, rep.mode)
    eng = lattice_engine(lattice, law, rep.a, mode=rep.mode)
    gen = rng.generator("bench/throughput")
    ips = _steps_per_second(eng, lattice.dim, n_chains, gen)
    ips_one = _steps_per_second(eng, lattice.dim, 1, gen)
    cs = eng.init(np.zeros((1, lattice.dim), np.int64))
    t0 = time.perf_counter()
    for _ in range(rep.iterations):
        eng.step(cs, gen)
    one_chain = time.perf_counter() - t0
    tau = rep.meeting_times
    q = {f"q{int(100 * p)}" if p < 1 else "max": float(np.quantile(tau, p)) for p in QUANTILES}
    return {
        "dim": lattice.dim,
        "lattice_rank": lattice.n_directions,
        "law": repr(law),
        "mode": rep.mode,
        "steps_per_sweep": k,
        "proposal_a": rep.a,
        "pilot_acceptance": rep.acceptance,
        "chains": n_chains,
        "iterations_per_second": ips,
        "chain_steps_per_second": ips * n_chains,
        "iterations_per_second_one_chain": ips_one,
        "lag": rep.lag,
        "lag_sweeps": rep.lag / k,
        "coupled_pairs": rep.n_coupled,
        "iterations_to_tv_0.01": rep.iterations,
        "sweeps_to_tv_0.01": rep.sweeps,
        "tv_bound_at_T": rep.tv_bound,
        "seconds_to_tv_0.01": one_chain,
        "certify_seconds": certify_seconds,
        "rhat_max": rep.rhat_max,
        "rhat_chains": rep.rhat_chains,
        "rhat_iterations": rep.rhat_iterations,
        "meeting_time_steps": q,
        "meeting_time_sweeps": {name: v / k for name, v in q.items()},
    }


def bench_random_walk(lattice, law, gen, *, cap: int) -> dict:
    """The Metropolis pair moves (tuned double-geometric steps): pairs met within ``cap``."""
    a, acc = tune_scale(lattice, law, gen, mode="single")
    eng = lattice_engine(lattice, law, a, mode="single")
    lag = 25 * lattice.n_directions
    z = np.zeros((200, lattice.dim), np.int64)
    t0 = time.perf_counter()
    res = meeting_times(eng, z, z, lag, gen, max_iterations=cap)
    return {
        "mode": "single (random-walk pair moves, Metropolis)",
        "proposal_a": a,
        "pilot_acceptance": acc,
        "lag": lag,
        "coupled_pairs": 200,
        "step_cap": cap,
        "pairs_met": int(np.isfinite(res.meeting_times).sum()),
        "coupling_seconds": time.perf_counter() - t0,
    }


def illinois_counties() -> tuple[int, str]:
    """Illinois' county count from the shared data, else 102 (synthetic group)."""
    path = shared_data_file("county_totalpop_2010.csv")
    if path is None:
        return 102, "synthetic (102 counties, shared data absent)"
    import pandas as pd

    df = pd.read_csv(path, dtype={"state_fips": str})
    return int((df["state_fips"].astype(int) == 17).sum()), "county_totalpop_2010.csv"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-random-walk", action="store_true")
    parser.add_argument("--random-walk-cap", type=int, default=50_000)
    args = parser.parse_args(argv)
    rng = KeyedRNG.reproducible(20260101, warn=False)  # a benchmark, never a release
    t_all = time.perf_counter()
    result: dict = {"python": platform.python_version(), "machine": platform.machine()}
    table = IntegerLattice.from_incidence(table_margins_incidence(4, 4))
    for norm in ("l1", "l2"):
        result[f"delinquent_4x4_{norm}_eps0.2"] = bench_certified(
            table, LatticeLaplace(0.2, norm), rng.child(f"table/{norm}")
        )
    n, source = illinois_counties()
    il = GroupSumLattice(np.zeros(n, np.int64))
    law = LatticeLaplace(0.192, "l1")
    bench = bench_certified(il, law, rng.child("illinois"))
    bench["counties_source"] = source
    gen = rng.generator("illinois/exact")
    t0 = time.perf_counter()
    sample_group_laplace_l1(il, 0.192, gen, 1000)
    bench["exact_sampler_seconds_per_1000_draws"] = time.perf_counter() - t0
    if not args.skip_random_walk:
        bench["random_walk_comparison"] = bench_random_walk(
            il, law, rng.generator("illinois/random-walk"), cap=args.random_walk_cap
        )
    result[f"illinois_{n}_l1_eps0.192"] = bench
    result["total_seconds"] = time.perf_counter() - t_all
    print(json.dumps(to_jsonable(result), indent=2))  # NaN → null


if __name__ == "__main__":
    main()
