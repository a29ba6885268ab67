"""Bias regressions and error metrics against scipy and the Census Bureau's published runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from censusdp.pipelines.metrics import error_metrics, group_regressions, slope_summary


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6))
def test_group_regressions_match_scipy_linregress(seed, n_groups):
    gen = np.random.default_rng(seed)  # test data only, not privacy noise
    sizes = gen.integers(6, 30, n_groups)
    group = np.repeat(np.arange(n_groups), sizes)
    size = gen.lognormal(8, 2, group.size) + 1
    err = gen.normal(0, 5, group.size) - 0.7 * np.log(size) * (group % 2)
    got = group_regressions(err, size, group)
    for _, row in got.iterrows():
        m = group == row["group"]
        ref = stats.linregress(np.log(size[m]), err[m])
        assert row["slope"] == pytest.approx(ref.slope, rel=1e-9, abs=1e-12)
        assert row["se"] == pytest.approx(ref.stderr, rel=1e-9)
        assert row["p"] == pytest.approx(ref.pvalue, rel=1e-7, abs=1e-300)


def test_small_groups_are_dropped_and_zero_sizes_ignored():
    group = np.array([0] * 5 + [1] * 7)
    size = np.array([10.0] * 4 + [0.0] + list(range(1, 8)))
    err = np.arange(12, dtype=float)
    got = group_regressions(err, size, group)
    assert list(got["group"]) == [1]
    assert int(got["n"].iloc[0]) == 7


def test_slope_summary_counts_and_chance():
    reg = pd.DataFrame({"slope": [-2.0, -1.0, 0.5, -0.1], "p": [0.001, 0.2, 0.001, 0.009]})
    s = slope_summary(reg, alpha=0.01)
    assert (s["states"], s["negative"], s["significant_negative_001"]) == (4, 3, 2)
    assert s["significant_positive"] == 1
    assert s["chance_expected_significant_negative"] == pytest.approx(0.02)


def test_error_metrics():
    m = error_metrics(np.array([1.0, 3.0]), np.array([2.0, 2.0]), l1_denominator=4)
    assert (m["mae"], m["rmse"], m["mean_error"], m["normalized_l1"]) == (1.0, 1.0, 0.0, 0.5)
    with pytest.raises(ValueError, match="shape"):
        error_metrics(np.zeros(2), np.zeros(3))


@pytest.mark.parametrize(
    ("column", "negative", "significant"),
    [("pop_ppdd_20200527", 41, 5), ("pop_ddp_20191029", 46, 41)],
)
def test_census_bureau_demonstration_runs_reproduce_published_counts(
    shared_file, column, negative, significant
):
    df = pd.read_csv(shared_file("county_totalpop_2010.csv"), dtype={"state_fips": str})
    reg = group_regressions(df[column] - df["pop_sf2010"], df["pop_sf2010"], df["state_fips"])
    s = slope_summary(reg, alpha=0.01)
    assert s["states"] == 48
    assert s["negative"] == negative
    assert s["significant_negative_001"] == significant
