"""The lattice experiments: delinquent children, intersecting constraints, Illinois."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from censusdp.errors import DataError
from censusdp.experiments.census_county_integer import two_sample
from censusdp.experiments.delinquent_children import TABLE
from censusdp.experiments.intersecting_constraints import SUBSETS
from censusdp.experiments.registry import run_experiment

ALPHA = 1e-6


def _z_limit(n_cells: int) -> float:
    """|mean|/SE threshold at family-wise level α over n_cells normal cell means."""
    return float(stats.norm.isf(ALPHA / (2 * n_cells)))


def test_table_data():
    assert TABLE.sum(axis=1).tolist() == [20, 55, 25, 35]  # Gamma is 25, not 35
    assert TABLE.sum(axis=0).tolist() == [50, 35, 30, 20] and TABLE.sum() == 135
    sets = [set(s) for s in SUBSETS]
    assert all(sets[i] & sets[j] for i in range(3) for j in range(i + 1, 3))
    assert sets[0] & sets[1] & sets[2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["delinquent-children", "intersecting-constraints"])
def test_table_experiments(name, tmp_path):
    out, m = run_experiment(name, out=tmp_path / "x", quick=True, seed=1)
    assert m["margins_exact"] is True and m["all_integer"] is True
    assert m["max_abs_mean_z"] < 4
    assert m["tv_bound_final"] < 0.05
    assert m["iteration_tv_below_0.01"] == m["iterations"] > 0
    assert m["moves"] == {"l1": "gibbs", "l2": "single"}  # l2 is not separable
    for t in m["targets"].values():
        assert t["tv_bound_final"] < 0.01 and t["rhat_max"] < 1.01
    for f in ("metrics.json", "report.md", "tv_bound.png", "noise_boxplots.png"):
        assert (out / f).is_file()
    assert json.loads((out / "metrics.json").read_text())["margins_exact"] is True
    report = (out / "report.md").read_text()
    assert "Gibbs" in report and "Metropolis" in report


def test_census_county_without_data_raises(tmp_path):
    with pytest.raises(DataError):
        run_experiment(
            "census-county-integer",
            out=tmp_path / "x",
            quick=True,
            seed=1,
            data=tmp_path / "missing.csv",
        )


def _synthetic_counties(path, sizes: dict[int, int]) -> None:
    """A county_totalpop_2010.csv-shaped file: states → county counts, made-up populations."""
    gen = np.random.default_rng(7)
    rows = []
    for state, n in sizes.items():
        for c in range(n):
            pop = int(gen.integers(500, 200_000))
            rows.append(
                {
                    "state_fips": f"{state:02d}",
                    "county_fips": f"{2 * c + 1:03d}",
                    "fips": f"{state:02d}{2 * c + 1:03d}",
                    "pop_sf2010": pop,
                    "pop_ddp_20191029": pop + int(gen.integers(-40, 40)),
                    "pop_ppdd_20200527": pop + int(gen.integers(-20, 20)),
                }
            )
    pd.DataFrame(rows).to_csv(path, index=False)


def _check_county_metrics(m: dict) -> None:
    assert m["invariant_exact"] is True and m["all_integer"] is True
    assert m["sampler"].startswith("certified lattice MCMC")
    assert m["tv_bound_final"] <= m["tv_requested"] == 0.01
    assert m["rhat_max"] < 1.01
    assert m["cross_check_min_p_bonferroni"] > ALPHA
    for n, c in m["certificates"].items():
        assert c["mode"] == "gibbs" and c["n_coupled"] >= 200 and c["rhat_chains"] >= 4
        assert c["tv_bound"] < 0.01 and c["rhat_max"] < 1.01, n
    for s in m["per_state"].values():
        assert s["max_abs_mean_z"] < _z_limit(s["n_counties"])


def test_census_county_integer_synthetic_illinois(tmp_path):
    """Default run: Illinois only (here a synthetic 12-county state 17 beside another)."""
    data = tmp_path / "counties.csv"
    _synthetic_counties(data, {17: 12, 18: 5})
    out, m = run_experiment(
        "census-county-integer", out=tmp_path / "x", quick=True, seed=3, data=data
    )
    assert m["states"] == ["17"] and m["n_counties"] == 12
    _check_county_metrics(m)
    assert m["certificate"]["iterations"] == m["iterations"]
    assert "moves" in m and "Gibbs" in m["moves"]
    for f in ("illinois_noise_boxplots.png", "illinois_mcmc_vs_exact.png", "illinois_tv_bound.png"):
        assert (out / f).is_file()
    report = (out / "report.md").read_text()
    assert "Gibbs group-matching moves" in report and "Monte Carlo estimate" in report
    assert "Cross-check against the exact sampler" in report


def test_census_county_integer_all_states_synthetic(tmp_path):
    """``--all``: one certificate per county count, a one-county state released exactly."""
    data = tmp_path / "counties.csv"
    _synthetic_counties(data, {11: 1, 10: 3, 17: 5, 44: 3, 50: 4})
    out, m = run_experiment(
        "census-county-integer",
        out=tmp_path / "x",
        quick=True,
        seed=4,
        data=data,
        all_units=True,
    )
    assert m["states"] == ["10", "11", "17", "44", "50"] and m["n_counties"] == 16
    assert sorted(int(n) for n in m["certificates"]) == [3, 4, 5]
    assert m["per_state"]["11"]["certificate_counties"] is None  # lattice {0}
    assert m["per_state"]["11"]["mean_abs_noise_lattice"] == 0.0
    _check_county_metrics(m)
    assert (out / "all_states_noise.png").is_file()
    assert "## All states" in (out / "report.md").read_text()


def test_two_sample_cross_check_has_power():
    gen = np.random.default_rng(11)
    a = gen.laplace(0, 5, (800, 6)).round().astype(np.int64)
    b = gen.laplace(0, 5, (800, 6)).round().astype(np.int64)
    c = gen.laplace(0, 7, (800, 6)).round().astype(np.int64)
    same, diff = two_sample(a, b), two_sample(a, c)
    assert min(same["ks_p_l1norm"], same["chi2_p_min_bonferroni"]) > ALPHA
    assert diff["ks_p_l1norm"] < ALPHA and diff["p_mean_abs_bonferroni"] < ALPHA


@pytest.mark.slow
def test_census_county_integer(shared_file, tmp_path):
    data = shared_file("county_totalpop_2010.csv")
    out, m = run_experiment(
        "census-county-integer", out=tmp_path / "x", quick=True, seed=1, data=data
    )
    assert m["n_counties"] == 102 and m["states"] == ["17"]
    _check_county_metrics(m)
    assert m["certificate"]["mode"] == "gibbs"
    assert (out / "illinois_noise_boxplots.png").is_file()
    assert np.isfinite(m["mean_abs_noise_baseline"])


def test_cli_all_flag_reaches_the_experiment(tmp_path, capsys):
    from censusdp.app.cli import main

    data = tmp_path / "counties.csv"
    _synthetic_counties(data, {17: 3, 44: 3})  # one certificate serves both states
    args = ["experiment", "census-county-integer", "--quick", "--data", str(data)]
    # without --all the study runs Illinois (17) alone: test_census_county_integer_synthetic_illinois
    assert main([*args, "--all", "--out", str(tmp_path / "a"), "--seed", "5"]) == 0
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["states"] == ["17", "44"]
