"""Experiment ``blowfish-ranges``: flat error under G¹_k, growing error for Privelet."""

from __future__ import annotations

import json

from censusdp.experiments.blowfish_ranges import growth
from censusdp.experiments.registry import run_experiment


def test_growth_detects_log_growth_and_flatness():
    ks = [64, 128, 256, 512]
    flat = growth(ks, [4.0, 4.0, 4.0, 4.0])
    cubic = growth(ks, [6.0**3, 7.0**3, 8.0**3, 9.0**3])
    assert abs(flat["slope_vs_log2k"]) < 1e-12
    assert abs(cubic["exponent_vs_log_log2k"] - 3.0) < 1e-9


def test_experiment_quick(tmp_path):
    out, _ = run_experiment("blowfish-ranges", out=tmp_path / "x", quick=True, seed=1)
    m = json.loads((out / "metrics.json").read_text())
    one = m["ranges_1d"]
    assert one["k"][0] == 64 and one["k"][-1] == 1024
    fits = one["growth"]
    # G¹_k: per-query error flat in k (bounded by 4/ε²); Privelet under ε-DP grows.
    assert abs(fits["blowfish_line_G1"]["relative_slope_vs_log2k"]) < 0.02
    assert max(one["mse_per_query"]["blowfish_line_G1"]) <= 4.0 / m["epsilon"] ** 2
    assert fits["dp_privelet"]["relative_slope_vs_log2k"] > 0.2
    assert fits["dp_privelet"]["exponent_vs_log_log2k"] > 2.0
    assert fits["blowfish_theta4_H"]["exponent_vs_log_log2k"] < 0.5
    two = m["ranges_2d"]["mse_per_query"]
    assert all(b < d for b, d in zip(two["blowfish_grid_G1"], two["dp_privelet_2d"], strict=True))
    for name in ("blowfish_line_G1", "dp_privelet"):
        assert abs(m["monte_carlo"][name]["z"]) < 4
    assert (out / "ranges_1d.png").is_file() and (out / "ranges_2d.png").is_file()
