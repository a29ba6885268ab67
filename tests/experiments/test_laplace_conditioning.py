"""laplace-conditioning: conditioned 5/6 λ² vs projected 4/3 λ² at n = 3."""

from __future__ import annotations

import json

import numpy as np
import pytest

from censusdp.estimation.conditioning.gibbs_moves import GibbsTreeMoves
from censusdp.experiments.laplace_conditioning import (
    TV_TARGET,
    conditioned_sum_problem,
    conditioned_variance,
    exact_conditioned_var_n3,
    projected_variance,
)
from censusdp.experiments.registry import run_experiment


def test_exact_quadrature_gives_five_sixths():
    assert abs(exact_conditioned_var_n3() - 5 / 6) < 1e-6


def test_the_engine_is_the_conditioning_problem_with_gibbs_moves():
    prob = conditioned_sum_problem(5)
    assert prob.kernel == "gibbs" and isinstance(prob.moves, GibbsTreeMoves)
    # state [e | w]: 5 noise coordinates, then 5 leaf offsets; the start is all zeros
    assert prob.layout.dim == 10 and prob.layout.w_offset == 5
    assert np.array_equal(prob.z0, np.zeros((5, 1)))


def test_n3_conditioned_and_projected_variances(rng):
    gen = rng.generator("test/laplace-n3")
    res = conditioned_variance(3, gen, n_chains=2000, n_records=100, thin=2)
    assert res["tv_bound"] < TV_TARGET and res["kernel"] == "gibbs"
    assert abs(res["conditioned_var_over_lambda2"] / (5 / 6) - 1) < 0.03
    assert abs(res["conditioned_var_over_lambda2"] - 5 / 6) < 4 * res["conditioned_se"] + 1e-3
    assert res["max_sum_residual"] < 1e-9
    pv, pse = projected_variance(3, gen, 200_000)
    assert abs(pv / (4 / 3) - 1) < 0.03 and abs(pv - 4 / 3) < 4 * pse
    # power: the projected variance is clearly not the conditioned one
    assert pv - res["conditioned_var_over_lambda2"] > 0.4


@pytest.mark.slow
def test_quick_experiment_writes_outputs(tmp_path):
    out, metrics = run_experiment("laplace-conditioning", out=tmp_path / "x", quick=True, seed=1)
    n3 = metrics["n3"]
    assert abs(n3["conditioned_var_over_lambda2"] / (5 / 6) - 1) < 0.03
    assert abs(n3["projected_var_over_lambda2"] / (4 / 3) - 1) < 0.03
    assert n3["tv_bound"] < 0.01
    on_disk = json.loads((out / "metrics.json").read_text())
    assert set(on_disk["n3"]) >= {
        "conditioned_var_over_lambda2",
        "projected_var_over_lambda2",
        "tv_bound",
        "exact_conditioned_var_over_lambda2",
    }
    assert (out / "variance_vs_n.png").is_file() and (out / "report.md").is_file()
    assert np.all(np.diff([r["n"] for r in on_disk["sweep"]]) > 0)
    # every n of the sweep is certified
    assert all(r["tv_bound"] < TV_TARGET for r in on_disk["sweep"])
    assert on_disk["max_tv_bound"] < TV_TARGET


def test_overdispersed_start_stays_on_the_noise_scale():
    # scrambling by exact Gibbs moves of a 3x wider law: spread, but never explosive (a Gibbs
    # step scaled by 3 overshoots the conditional's centre and doubles the distance to it)
    prob = conditioned_sum_problem(102)
    gen = np.random.default_rng(3)
    states = prob.initial_states(20, gen, spread=prob.default_spread)
    e = states[:, :102]
    assert np.all(np.abs(e.sum(axis=1)) < 1e-9)  # the invariant holds
    assert 1.0 < e.std() < 10.0  # wider than Laplace(1) (sd 1.41), on its scale
    assert np.abs(e).max() < 100.0
