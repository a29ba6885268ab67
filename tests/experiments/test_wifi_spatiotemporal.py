"""The wifi-spatiotemporal experiment: crossed-margin projection, exact invariants, cell variance."""

from __future__ import annotations

import json

import numpy as np
import pytest

from censusdp.experiments.registry import run_experiment
from censusdp.experiments.wifi_spatiotemporal import invariant_rank, synthetic_counts
from censusdp.mechanisms.projection import (
    dense_projector,
    project_dense,
    project_row_column_totals,
    row_column_indicator_matrix,
    row_column_projection_variance,
    row_column_rank,
)
from censusdp.rng import KeyedRNG

EXACT = (1 - 1 / 14) * (1 - 1 / 24)


@pytest.mark.parametrize(("r", "c"), [(2, 2), (3, 5), (14, 24)])
def test_double_centering_is_the_orthogonal_projection(r, c):
    gen = KeyedRNG.reproducible(r * 100 + c, warn=False).generator("test")
    e = gen.normal(size=(3, r, c))
    C = row_column_indicator_matrix(r, c)
    assert np.linalg.matrix_rank(C) == row_column_rank(r, c) == r + c - 1
    C_full_rank = C[:-1]  # the last column total is implied by the others and the rows
    got = project_row_column_totals(e)
    for t in range(3):
        ref = project_dense(e[t].ravel(), C_full_rank)
        np.testing.assert_allclose(got[t].ravel(), ref, atol=1e-12)
    np.testing.assert_allclose(got.sum(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(got.sum(axis=-2), 0, atol=1e-12)
    diag = np.diag(dense_projector(C_full_rank))
    np.testing.assert_allclose(diag, row_column_projection_variance(r, c), rtol=1e-12)


def test_rank_of_the_campus_invariants_is_740():
    assert invariant_rank() == 740 == row_column_rank(14, 24, 20)


def test_synthetic_counts_are_deterministic_and_shaped():
    a = synthetic_counts(KeyedRNG.reproducible(3, warn=False).generator("wifi/truth"))
    b = synthetic_counts(KeyedRNG.reproducible(3, warn=False).generator("wifi/truth"))
    assert a.shape == (20, 14, 24) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 0 and a.sum() > 1000
    dorms, lectures = a[5:10].sum(axis=(0, 1)), a[0:5].sum(axis=(0, 1))
    assert dorms[2] > dorms[11] and lectures[10] > lectures[2]  # night vs midday peaks


def _check(out, m, runs, tol):
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["runs"] == runs and on_disk["cells"] == 6720
    assert on_disk["rank"] == 740
    assert on_disk["mean_cell_variance"] == pytest.approx(EXACT, rel=1e-12)
    assert abs(on_disk["mean_cell_variance_empirical"] - EXACT) < tol
    assert on_disk["cell_variance_q05"] < EXACT < on_disk["cell_variance_q95"]
    assert on_disk["invariants_exact"] is True
    assert on_disk["invariants_max_relative_deviation"] <= 1e-9
    assert abs(on_disk["mean_error"]) < 5 * on_disk["mean_error_se"]
    for name in ("wifi_timeseries.png", "cell_variance_hist.png", "report.md"):
        assert (out / name).stat().st_size > 0
    assert f"{m['mean_cell_variance_empirical']:.4f}" in (out / "report.md").read_text()


def test_quick_run_variance_and_invariants(tmp_path):
    out, m = run_experiment("wifi-spatiotemporal", out=tmp_path / "x", quick=True, seed=1)
    # 20 runs: the mean cell variance has standard error 0.890·√(2 / ((6720 − 740)·19))
    # ≈ 0.0037; 0.02 is over five standard errors
    _check(out, m, 20, 0.02)


@pytest.mark.slow
def test_full_run_meets_the_acceptance_tolerance(tmp_path):
    out, m = run_experiment("wifi-spatiotemporal", out=tmp_path / "x", quick=False, seed=1)
    # 50 runs: standard error ≈ 0.0023; acceptance 0.01 (over four standard errors)
    _check(out, m, 50, 0.01)
