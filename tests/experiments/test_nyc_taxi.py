"""The nyc-taxi experiment: data loading, synthetic month, quick run, consistent releases."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError
from censusdp.experiments.nyc_taxi import (
    ESTIMATORS,
    LEVELS,
    MCMC_ESTIMATORS,
    PAPER_TABLE2,
    TV_TARGET,
    _error_table,
    load_taxi,
    restrict,
    synthetic_month,
)
from censusdp.experiments.registry import run_experiment
from censusdp.pipelines.report import markdown_table

LOOKUP = "taxi_zone_lookup.csv"
SAMPLE = "taxi_pickups_2019-02_sample_by_zone.csv"


@pytest.fixture
def taxi(shared_file):
    return load_taxi(shared_file(LOOKUP), shared_file(SAMPLE))


def test_hierarchy_is_city_six_boroughs_263_zones(taxi):
    h, leaf, zones = taxi
    assert h.names == LEVELS
    assert h.sizes == (1, 6, 263)
    assert set(h.levels[1].codes.tolist()) == {
        "Bronx",
        "Brooklyn",
        "EWR",
        "Manhattan",
        "Queens",
        "Staten Island",
    }
    ewr = h.levels[1].codes.tolist().index("EWR")
    assert h.levels[1].child_count[ewr] == 1
    assert zones.loc[zones["borough"] == "EWR", "zone"].tolist() == ["001"]
    assert "264" not in zones["zone"].tolist() and "265" not in zones["zone"].tolist()
    # the sample holds 10,000 trips, 93 of them in the two 'Unknown' zones
    assert leaf.shape == (263, 1) and leaf.sum() == 10_000 - 93
    by_borough = dict(zip(h.levels[1].codes.tolist(), h.aggregate(leaf)[1][:, 0], strict=True))
    assert by_borough["Manhattan"] == 9159


def test_synthetic_month_total_and_smoothing(taxi, rng):
    _, leaf, _ = taxi
    month = synthetic_month(leaf, rng.generator("t"))
    assert month.shape == leaf.shape and month.dtype == np.int64
    assert month.sum() == 2_979_431
    # add-one smoothing: every zone, including the sample's empty ones, has trips
    assert (leaf == 0).any() and (month > 0).all()
    expected = 2_979_431 * (leaf[:, 0] + 1) / (leaf.sum() + leaf.size)
    z = (month[:, 0] - expected) / np.sqrt(expected)
    assert np.abs(z).max() < 6


def test_missing_zone_row_is_a_data_error(tmp_path):
    lookup = tmp_path / "lookup.csv"
    counts = tmp_path / "counts.csv"
    ids = np.arange(1, 264)
    pd.DataFrame(
        {"LocationID": ids, "Borough": np.repeat(list("ABCDEF"), 44)[:263], "Zone": "z"}
    ).to_csv(lookup, index=False)
    pd.DataFrame({"LocationID": ids[:-1], "trips": 1}).to_csv(counts, index=False)
    with pytest.raises(DataError, match="LocationID 263"):
        load_taxi(lookup, counts)


def test_without_data_raises_data_error(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        run_experiment("nyc-taxi", out=tmp_path / "x", quick=True, seed=1, data=tmp_path / "no")


def test_restrict_keeps_the_chosen_zones(taxi):
    h, leaf, zones = taxi
    hs, sub = restrict(h, leaf, zones, ("EWR", "Staten Island"), max_zones=10)
    assert hs.names == LEVELS and hs.sizes == (1, 2, 11)
    assert sub.shape == (11, 1)
    codes = dict(zip(zones["zone"], leaf[:, 0], strict=True))
    assert sub[:, 0].tolist() == [codes[c] for c in hs.leaves.codes.tolist()]


@pytest.mark.slow  # ~80 s of CPU: seven estimators, MCMC certificates at three budgets
def test_quick_run_table_and_consistent_releases(shared_file, tmp_path):
    shared_file(LOOKUP)
    shared_file(SAMPLE)
    out, metrics = run_experiment("nyc-taxi", out=tmp_path / "x", quick=True, seed=1)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["data"] == "synthetic_month"
    assert on_disk["zones"] == 11 and on_disk["l1_denominator"] == 14
    table = on_disk["table"]
    keys = {(r["epsilon"], r["level"], r["estimator"]) for r in table}
    assert keys == {(e, k, n) for e in (0.5, 1.0, 2.0) for k in (1, 2, 3) for n in ESTIMATORS}
    for r in table:
        expected = 1 if r["estimator"] in ("conditioning", "conditioning_nonneg") else 2
        assert r["runs"] == expected, r
        assert math.isfinite(r["normalized_l1"]) and r["normalized_l1"] >= 0
    # every MCMC release is certified: TV bound < 0.01, gibbs moves
    assert on_disk["tv_bound_max"] < TV_TARGET
    for name in MCMC_ESTIMATORS:
        assert set(on_disk["tv_bounds"][name]) == {"0.5", "1", "2"}
        for eps, d in on_disk["conditioning_diagnostics"]["synthetic_month"][name].items():
            assert d["certified"] and d["tv_bound"] < TV_TARGET, (name, eps)
            assert d["kernel"] == "gibbs" and len(d["runs"]) == 1  # one MCMC call
            assert d["releases"] == (2 if name == "mh" else 1)  # ℳ_MH: one per run
            assert math.isfinite(d["rhat_max"])
            assert ("data-dependent" in d["runs"][0]["privacy"]) == (name.endswith("nonneg"))
            assert ("curator-side" in d["runs"][0]["privacy"]) == (name == "mh")
    # the released tables: zones sum to boroughs, boroughs to the city, for every estimator
    est = pd.read_csv(out / "estimates_run0.csv", dtype={"code": str, "parent": str})
    assert set(est["estimator"]) == set(ESTIMATORS)
    for (eps, name), g in est.groupby(["epsilon", "estimator"]):
        for child, parent in (("zone", "borough"), ("borough", "city")):
            sums = g[g["level"] == child].groupby("parent")["value"].sum()
            up = g[g["level"] == parent].set_index("code")["value"]
            assert sorted(sums.index) == sorted(up.index) and len(up) == (
                2 if child == "zone" else 1
            )
            for code, total in sums.items():
                assert total == pytest.approx(up[code], abs=1e-6), (eps, name, code)
        if name in ("topdown", "conditioning_nonneg"):
            assert (g.loc[g["level"] == "zone", "value"] >= 0).all(), (eps, name)
        if name == "topdown":
            assert (g["value"] == np.round(g["value"])).all()
    for name, worst in on_disk["consistency_max_residual"]["synthetic_month"].items():
        assert worst < 1e-6, name
    # the paper's numbers are shown beside ours, labelled, with the TV bounds
    report = (out / "report.md").read_text()
    assert "paper ℳ_MH" in report and f"{PAPER_TABLE2[(1.0, 3)][0]:.6f}" in report
    assert "TV bound, conditioning" in report and "quick" in report
    first = next(r for r in table if r["estimator"] == "gls" and r["level"] == 3)
    assert f"{first['normalized_l1']:.4f}" in report
    assert "plain DP argument does not cover" in report
    assert (out / "error_by_level.png").stat().st_size > 0


def test_table_without_conditioning_has_no_tv_columns():
    rows = [
        {"epsilon": e, "level": k, "estimator": n, "normalized_l1": 0.5, "runs": 3}
        for e in (0.5, 1.0, 2.0)
        for k in (1, 2, 3)
        for n in ("topdown", "gls")
    ]
    table = _error_table(rows, {}, with_paper=False)
    assert len(table) == 9 and all(len(row) == 4 for row in table)
    lines = markdown_table(pd.DataFrame(table)).splitlines()
    assert "TV bound" not in lines[0] and "TopDown-style [3]" in lines[0]
    assert len(lines) == 2 + 9 and all(line.count("|") == 5 for line in lines)
