"""The lattice experiments: delinquent children, intersecting constraints, Illinois."""

from __future__ import annotations

import json

import numpy as np
import pytest

from censusdp.errors import DataError
from censusdp.experiments.delinquent_children import TABLE
from censusdp.experiments.intersecting_constraints import SUBSETS
from censusdp.experiments.registry import run_experiment


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
    for f in ("metrics.json", "report.md", "tv_bound.png", "noise_boxplots.png"):
        assert (out / f).is_file()
    assert json.loads((out / "metrics.json").read_text())["margins_exact"] is True


def test_census_county_without_data_raises(tmp_path):
    with pytest.raises(DataError):
        run_experiment(
            "census-county-integer",
            out=tmp_path / "x",
            quick=True,
            seed=1,
            data=tmp_path / "missing.csv",
        )


@pytest.mark.slow
def test_census_county_integer(shared_file, tmp_path):
    data = shared_file("county_totalpop_2010.csv")
    out, m = run_experiment(
        "census-county-integer", out=tmp_path / "x", quick=True, seed=1, data=data
    )
    assert m["n_counties"] == 102 and m["invariant_exact"] is True
    assert m["max_abs_mean_z"] < 4
    assert (out / "illinois_noise_boxplots.png").is_file()
    assert np.isfinite(m["mean_abs_noise_baseline"])
