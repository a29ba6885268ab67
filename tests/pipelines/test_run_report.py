"""The evaluation report stays small at any scale, and the release is kept apart from it."""

from __future__ import annotations

import json
import struct
import textwrap

import numpy as np
import pandas as pd
from run_specs import SMALL_DATA, SMALL_SPEC

from censusdp.app.cli import main
from censusdp.pipelines.report import CONFIDENTIAL_LABEL, MAX_GROUPS, write_figures, write_report


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def _inputs(groups: int, reps: int = 2):
    rng = np.random.default_rng(0)
    ests = ["gls", "topdown"]
    reg = pd.DataFrame(
        {
            "repetition": np.repeat(np.arange(reps), groups * len(ests)),
            "estimator": np.tile(np.repeat(ests, groups), reps),
            "group": np.tile([f"g{i:06d}" for i in range(groups)], reps * len(ests)),
            "n": 8,
            "slope": rng.normal(size=groups * len(ests) * reps),
            "intercept": 0.0,
            "se": 1.0,
            "t": 0.0,
            "p": rng.uniform(size=groups * len(ests) * reps),
        }
    )
    levels = ["nation", "state", "county", "tract"]
    metrics = pd.DataFrame(
        [
            {
                "repetition": r,
                "estimator": e,
                "level": lv,
                "nodes": 1,
                "total_mae": 1.0,
                "total_rmse": 1.5,
                "total_mean_error": 0.1,
                "cell_mae": 1.0,
            }
            for r in range(reps)
            for e in ests
            for lv in levels
        ]
    )
    sizes = pd.DataFrame(
        {
            "estimator": np.repeat(ests, 3),
            "size_class": ["0", "1–9", "10–99"] * 2,
            "leaves": 5,
            "mean_error": 0.5,
            "rmse": 1.0,
        }
    )
    manifest = {
        "data": {"source": "csv", "levels": levels, "nodes": [1, 2, 3, groups], "cells": ["pop"]},
        "spec": {
            "privacy": {"accounting": "pure", "epsilon": 1.0},
            "mechanism": {"noise": "x"},
            "estimators": {"run": ests, "integer": "round"},
        },
        "repetitions": reps,
        "scheduler": "sync",
        "partitions": 1,
        "cut_level": "state",
        "reproducible_mode": True,
        "measurements": [
            {"level": "tract", "query": "detailed", "budget": 1.0, "law": "L", "variance": 2.0}
        ],
        "privacy": {"gls": {"text": "ε-DP"}, "topdown": {"text": "ε-DP"}},
        "timings_seconds": {"total": 1.0},
    }
    return metrics, reg, sizes, manifest


def test_report_and_figures_are_bounded_for_many_groups(tmp_path):
    metrics, reg, sizes, manifest = _inputs(groups=5_000)
    figs = write_figures(tmp_path, metrics, reg, manifest, sizes=sizes)
    report = write_report(tmp_path, metrics, reg, manifest, figs, sizes=sizes)
    text = report.read_text()
    assert CONFIDENTIAL_LABEL in text
    assert len(text.splitlines()) < 150  # was one line per group (40,058 lines at 2M rows)
    assert "5,000 groups" in text and "regressions.parquet" in text
    for name in figs:
        w, h = _png_size(tmp_path / name)
        assert w <= 1600 and h <= 600, (name, w, h)


def test_few_groups_are_shown_one_by_one(tmp_path):
    metrics, reg, sizes, manifest = _inputs(groups=MAX_GROUPS)
    figs = write_figures(tmp_path, metrics, reg, manifest, sizes=sizes)
    text = write_report(tmp_path, metrics, reg, manifest, figs, sizes=sizes).read_text()
    assert f"g{MAX_GROUPS - 1:06d}" in text


SPEC = SMALL_SPEC + "[run]\nrepetitions = 2\n"


def test_release_folder_holds_only_the_release(tmp_path, monkeypatch):
    (tmp_path / "data.csv").write_text(SMALL_DATA)
    (tmp_path / "spec.toml").write_text(textwrap.dedent(SPEC))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "spec.toml", "--out", "out"]) == 0
    release = tmp_path / "out" / "release"
    assert sorted(p.name for p in release.iterdir()) == [
        "estimates.parquet",
        "manifest.json",
        "privacy.md",
    ]
    est = pd.read_parquet(release / "estimates.parquet")
    assert list(est.columns) == ["level", "code", "cell", "estimator", "value", "se", "moe"]
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["confidential"] is False
    assert "metrics" not in json.dumps(manifest) and "error" not in json.dumps(manifest).lower()
    evaluation = tmp_path / "out" / "evaluation"
    ev = json.loads((evaluation / "manifest.json").read_text())
    assert ev["confidential"] is True and ev["label"] == CONFIDENTIAL_LABEL
    assert (evaluation / "CONFIDENTIAL.txt").read_text().strip() == CONFIDENTIAL_LABEL
    assert (evaluation / "report.md").read_text().count(CONFIDENTIAL_LABEL) == 1
    assert len(pd.read_csv(evaluation / "metrics.csv")) == 2 * 3  # repetitions × levels
