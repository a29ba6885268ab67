"""Experiment ``matrix-masking``: Table 1 reproduced, privacy-loss tail, OLS identity."""

from __future__ import annotations

import json

import pytest

from censusdp.experiments.matrix_masking import PAPER_TABLE1, table1_rows
from censusdp.experiments.registry import run_experiment


def test_table1_all_36_rows_within_rounding():
    rows = table1_rows()
    assert len(rows) == 36 == len(PAPER_TABLE1)
    assert max(r["max_abs_diff"] for r in rows) <= 0.1
    assert all(r["ratio_matches"] for r in rows)


@pytest.mark.parametrize("col", ["a_necessary", "a_sufficient", "b_sufficient"])
def test_table1_detects_a_wrong_formula(col):
    """Power: perturbing a computed column by 1% moves some row past the 0.1 tolerance."""
    rows = table1_rows()
    assert max(abs(1.01 * r[col] - r[f"paper_{col}"]) for r in rows) > 0.1


def test_experiment_quick(tmp_path):
    out, metrics = run_experiment("matrix-masking", out=tmp_path / "x", quick=True, seed=1)
    saved = json.loads((out / "metrics.json").read_text())
    assert len(saved["rows"]) == 36
    assert saved["table1_max_abs_diff"] <= 0.1
    assert saved["ratio_integer_matches"] == 36
    tails = saved["privacy_loss_tail_setting_a"]
    assert all(t["tail_le_delta"] for t in tails if t["rule"] != "0.8 x necessary (11)")
    assert not any(t["tail_le_delta"] for t in tails if t["rule"] == "0.8 x necessary (11)")
    assert all(t["tail_le_delta"] for t in saved["privacy_loss_tail_setting_b_p1"])
    assert saved["ols_identity"]["max_abs_diff_full_mask"] < 1e-9
    assert (out / "report.md").is_file() and (out / "table1.png").is_file()
