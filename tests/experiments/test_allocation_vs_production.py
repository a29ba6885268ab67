"""allocation-vs-production: the optimised allocation beats production by ≥ 15%, predicted
and simulated, with a certified solver, and the simulations agree with the prediction."""

from __future__ import annotations

import json

import pytest

from censusdp.experiments import allocation_vs_production as avp
from censusdp.experiments.registry import run_experiment


def _check(out, metrics, releases):
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["releases"] == releases and metrics["goal_met"]
    for name in ("relative", "balanced"):
        m = metrics[name]
        assert m["certified"] and m["duality_gap"] <= avp.TOLERANCE
        assert m["predicted_improvement"] >= avp.GOAL
        assert m["simulated_improvement"] - m["simulated_improvement_ci95"] >= avp.GOAL
        # the simulated objective agrees with the exact prediction (z within 4)
        for who in ("production", "optimised"):
            z = (m[f"simulated_{who}"] - m[f"predicted_{who}"]) / (
                m[f"simulated_{who}_ci95"] / 1.96
            )
            assert abs(z) < 4, (name, who, z)
        verdicts = {t["verdict"] for t in m["targets"]}
        assert verdicts <= {"better", "worse", "held exactly", "same"} and "better" in verdicts
    report = (out / "report.md").read_text()
    assert f"{metrics['relative']['predicted_optimised']:.5g}" in report
    assert (out / "allocation_vs_production.png").stat().st_size > 0


@pytest.mark.slow
def test_quick_run_beats_production_predicted_and_simulated(tmp_path):
    """The quick form (1,500 blocks, 4 releases each; about 45 CPU seconds)."""
    out, metrics = run_experiment(
        "allocation-vs-production", out=tmp_path / "x", quick=True, seed=1
    )
    _check(out, metrics, avp.RELEASES_QUICK)


@pytest.mark.slow
def test_small_run_beats_production_predicted_and_simulated(tmp_path, monkeypatch):
    """A smaller form: 400 blocks, 3 releases, tolerance 1e-2 (about 35 CPU seconds: the
    two optimisations; the fast suite's form of the 15% goal, predicted, is the allocate
    command's test)."""
    monkeypatch.setattr(avp, "BLOCKS_QUICK", 400)
    monkeypatch.setattr(avp, "RELEASES_QUICK", 3)
    monkeypatch.setattr(avp, "TOLERANCE", 1e-2)
    out, metrics = run_experiment(
        "allocation-vs-production", out=tmp_path / "x", quick=True, seed=2
    )
    _check(out, metrics, 3)
