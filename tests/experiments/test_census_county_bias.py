"""The census-county-bias experiment: the Bureau's published slope counts and our estimators."""

from __future__ import annotations

import json

import numpy as np
import pytest

from censusdp.errors import DataError
from censusdp.experiments.census_county_bias import (
    EPSILON,
    QUICK_STATES,
    TV_TARGET,
    _lattice_errors,
    _sampled_states,
    load_counties,
)
from censusdp.experiments.registry import ExperimentContext, run_experiment

KEYS = (
    "states",
    "negative",
    "significant_negative_001",
    "mean_abs_error",
    "chance_expected_significant_negative",
)


def test_missing_data_file_raises_data_error(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        run_experiment(
            "census-county-bias", out=tmp_path / "x", quick=True, seed=1, data=tmp_path / "no.csv"
        )


@pytest.mark.slow  # ~50 s of CPU; fast forms: the Bureau's counts (tests/pipelines/test_metrics.py),
# the lattice errors below, size-0 counties (tests/contracts/test_size_zero_units.py)
def test_quick_run_reproduces_the_bureau_counts_and_unbiased_estimators(tmp_path, shared_file):
    data = shared_file("county_totalpop_2010.csv")
    out, m = run_experiment("census-county-bias", out=tmp_path / "x", quick=True, seed=1, data=data)
    on_disk = json.loads((out / "metrics.json").read_text())
    das19, das20 = on_disk["das_20191029"], on_disk["das_20200527"]
    assert (das20["states"], das20["negative"], das20["significant_negative_001"]) == (48, 41, 5)
    assert (das19["states"], das19["negative"], das19["significant_negative_001"]) == (48, 46, 41)
    assert on_disk["runs"] == 2
    for name in ("das_20191029", "das_20200527", "projected_laplace", "gls", "topdown"):
        for key in KEYS:
            assert on_disk[name][key] is not None, (name, key)
        assert on_disk[name]["states"] == 48
        assert on_disk[name]["chance_expected_significant_negative"] == pytest.approx(0.24)
    scale = 1 / EPSILON
    for name in ("projected_laplace", "gls"):
        s = on_disk[name]
        assert len(s["per_run_negative"]) == 2
        # unbiased: significant negatives within the 99% point of Binomial(48, 0.005)
        assert s["significant_negative_001"] <= s["chance_upper_99"]
        # Laplace of scale 1/ε, minus the state mean: mean |error| just under the scale
        assert 0.9 * scale < s["mean_abs_error"] < 1.05 * scale
    # the MCMC estimators: the quick subset of states, every release certified
    assert len(on_disk["sampled_states"]) == QUICK_STATES
    for name in ("conditioning", "lattice"):
        s = on_disk[name]
        for key in KEYS:
            assert s[key] is not None, (name, key)
        assert s["states"] == QUICK_STATES and s["runs"] == 2
        assert s["chance_expected_significant_negative"] == pytest.approx(QUICK_STATES * 0.005)
        assert s["significant_negative_001"] <= s["chance_upper_99"]
        assert s["convergence"]["tv_bound_max"] < TV_TARGET
    cond = on_disk["conditioning"]["convergence"]
    assert cond["kernel"] == ["gibbs"]
    assert cond["certified_calls"] == 2 * QUICK_STATES
    assert on_disk["lattice"]["convergence"]["rhat_max"] < 1.01
    assert "integer subspace DP" in on_disk["lattice"]["convergence"]["privacy"]
    assert len(on_disk["fig2_states"]) == 10 and "IL" not in on_disk["fig2_states"]
    for name in ("fig1_slopes_illinois.png", "fig2_ten_states.png", "illinois_by_estimator.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "Van Riper" in report and "| DAS 2020-05-27 | 1 | 48 | 41 | 5 |" in report
    assert f"{cond['tv_bound_max']:.4f}" in report


def test_lattice_errors_are_integer_and_keep_state_totals(tmp_path, shared_file, rng):
    ctx = ExperimentContext(out=tmp_path, data=shared_file("county_totalpop_2010.csv"))
    table, _ = load_counties(ctx)
    states = _sampled_states(table, quick=True)
    err, info = _lattice_errors(table, 3, rng, states)
    state = table.hierarchy.ancestor_index("county", "state")
    covered = np.isin(state, states)
    assert np.all(np.isfinite(err[:, covered])) and np.all(np.isnan(err[:, ~covered]))
    assert np.array_equal(err[:, covered], np.round(err[:, covered]))
    for s in states:
        assert np.all(err[:, state == s].sum(axis=1) == 0)
    assert info["tv_bound_max"] < TV_TARGET


def test_certify_sizes_is_one_certify_call_per_distinct_size():
    """One certificate per distinct group size ≥ 2 on its own stream, as the studies called
    certify by hand; a size-1 group (held by its total) gets none."""
    from censusdp.estimation.integer.lattice_release import certify
    from censusdp.experiments.census_county_bias import certify_sizes
    from censusdp.mechanisms.lattice import GroupSumLattice, LatticeLaplace
    from censusdp.rng import KeyedRNG

    rng = KeyedRNG.reproducible(3, warn=False)
    law = LatticeLaplace(EPSILON, "l1")
    out = certify_sizes([3, 1, 2, 3], law, rng, "c/{}")
    assert list(out) == [2, 3]
    for n, (rep, seconds) in out.items():
        ref = certify(GroupSumLattice(np.zeros(n, dtype=np.int64)), law, rng.child(f"c/{n}"))
        assert np.array_equal(rep.meeting_times, ref.meeting_times) and seconds >= 0
        assert (rep.iterations, rep.tv_bound, rep.lag) == (ref.iterations, ref.tv_bound, ref.lag)
    # another stream is another certificate's draw
    other = certify_sizes([3], law, rng, "d/{}")[3][0]
    assert not np.array_equal(other.meeting_times, out[3][0].meeting_times)
