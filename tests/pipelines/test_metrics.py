"""Bias regressions and error metrics against scipy and the Census Bureau's published runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from censusdp.pipelines.metrics import (
    SIZE_CLASSES,
    error_metrics,
    group_regressions,
    size_class_metrics,
    slope_summary,
)


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


def test_small_groups_are_dropped():
    group = np.array([0] * 5 + [1] * 7)
    size = np.array([10.0] * 4 + [3.0] + list(range(1, 8)))
    err = np.arange(12, dtype=float)
    got = group_regressions(err, size, group)
    assert list(got["group"]) == [1]
    assert int(got["n"].iloc[0]) == 7


def test_zero_size_units_are_dropped_before_the_regression():
    """Units of size 0 (log 0 = −∞) are left out, and a group is kept on its positive units.

    Group "a" has 7 positive units and 3 of size 0 (so keeping them would give n = 10 and a
    slope of NaN); group "b" has 6 units of which one is of size 0, so it falls below
    ``min_members`` once that unit is dropped; group "c" is all zeros.
    """
    gen = np.random.default_rng(11)  # test data only, not privacy noise
    size_a = np.array([3.0, 0.0, 40.0, 900.0, 0.0, 12.0, 5000.0, 0.0, 77.0, 260.0])
    size_b = np.array([5.0, 50.0, 0.0, 500.0, 5000.0, 50000.0])
    size_c = np.zeros(6)
    size = np.concatenate([size_a, size_b, size_c])
    group = np.array(["a"] * 10 + ["b"] * 6 + ["c"] * 6)
    err = gen.normal(0.0, 3.0, size.size) - 0.5 * np.log1p(size)
    got = group_regressions(err, size, group)
    assert list(got["group"]) == ["a"]
    row = got.iloc[0]
    pos = (group == "a") & (size > 0)
    ref = stats.linregress(np.log(size[pos]), err[pos])
    assert int(row["n"]) == 7
    assert row["slope"] == pytest.approx(ref.slope, rel=1e-9)
    assert row["se"] == pytest.approx(ref.stderr, rel=1e-9)
    assert row["p"] == pytest.approx(ref.pvalue, rel=1e-7)
    assert np.isfinite(got[["slope", "intercept", "se", "t", "p"]].to_numpy()).all()


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


def test_error_metrics_percent_errors_leave_out_size_zero():
    m = error_metrics(np.array([0.0, 2.0, 12.0, 95.0]), np.array([0.0, 1.0, 10.0, 100.0]))
    assert m["mape"] == pytest.approx(100 * (1.0 + 0.2 + 0.05) / 3)
    assert m["over_10pct"] == 2  # 100% and 20% off; 5% is not, size 0 has no percent
    assert np.isnan(error_metrics(np.ones(2), np.zeros(2))["mape"])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    truth=st.lists(st.integers(0, 3000), min_size=0, max_size=40),
    seed=st.integers(0, 2**31 - 1),
)
def test_size_class_metrics_match_a_loop_over_areas(truth, seed):
    truth = np.asarray(truth, float)
    est = truth + np.random.default_rng(seed).normal(0.0, 5.0, truth.size).round()
    got = size_class_metrics(est, truth)
    assert list(got["size_class"]) == [c[0] for c in SIZE_CLASSES]
    for label, lo, hi in SIZE_CLASSES:
        errs, pct = [], []
        for e, t in zip(est, truth, strict=True):  # the obvious slow reference
            if lo <= t <= hi:
                errs.append(e - t)
                if t > 0:
                    pct.append(abs(e - t) / t)
        row = got[got["size_class"] == label].iloc[0]
        assert row["n"] == len(errs)
        if errs:
            assert row["mae"] == pytest.approx(np.mean(np.abs(errs)))
            assert row["rmse"] == pytest.approx(np.sqrt(np.mean(np.square(errs))))
            assert row["mean_error"] == pytest.approx(np.mean(errs), abs=1e-12)
        else:
            assert np.isnan(row["mae"])
        assert row["over_10pct"] == sum(p > 0.1 for p in pct)
        if pct:
            assert row["mape"] == pytest.approx(100 * np.mean(pct))
