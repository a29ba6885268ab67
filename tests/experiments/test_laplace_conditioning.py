"""laplace-conditioning: conditioned 5/6 λ² vs projected 4/3 λ² at n = 3."""

from __future__ import annotations

import json

import numpy as np
import pytest

from censusdp.experiments.laplace_conditioning import (
    conditioned_variance,
    exact_conditioned_var_n3,
    projected_variance,
)
from censusdp.experiments.registry import run_experiment


def test_exact_quadrature_gives_five_sixths():
    assert abs(exact_conditioned_var_n3() - 5 / 6) < 1e-6


def test_n3_conditioned_and_projected_variances(rng):
    gen = rng.generator("test/laplace-n3")
    res = conditioned_variance(3, gen, n_chains=2000, n_records=100, thin=5)
    assert res["tv_bound"] < 0.01
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
