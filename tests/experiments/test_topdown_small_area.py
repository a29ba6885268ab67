"""The topdown-small-area experiment runs and reports finite bias regressions."""

from __future__ import annotations

import json
import math

import pytest

from censusdp.experiments.registry import run_experiment


def _check(out, metrics, runs):
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["runs"] == metrics["runs"] == runs
    for name in ("topdown", "gls"):
        for key in ("slope", "slope_se", "mean_abs_error"):
            assert math.isfinite(on_disk[name][key]), (name, key)
        assert on_disk[name]["slope_se"] > 0
    assert (out / "error_vs_log_size.png").stat().st_size > 0
    report = (out / "report.md").read_text()
    assert f"{metrics['topdown']['slope']:.3f}" in report
    assert f"{metrics['gls']['slope']:.3f}" in report


def test_quick_run_computes_both_regressions(tmp_path):
    out, metrics = run_experiment("topdown-small-area", out=tmp_path / "x", quick=True, seed=1)
    _check(out, metrics, 10)


@pytest.mark.slow
def test_full_run_topdown_slope_negative_gls_not(tmp_path):
    out, metrics = run_experiment("topdown-small-area", out=tmp_path / "x", quick=False, seed=1)
    _check(out, metrics, 50)
    td, gls = metrics["topdown"], metrics["gls"]
    assert td["slope"] < -2 * td["slope_se"]
    assert abs(gls["slope"]) < 4 * gls["slope_se"]
