"""Bias regressions leave out units of size 0 before taking log(size) — at every caller.

The size-bias study (Gao, Gong & Yu 2022, §5.1) regresses a unit's error on log(true size)
within each group. A unit of size 0 has log 0 = −∞: kept, it turns its group's slope into NaN
(and counts towards the group's size), so the group silently stops counting as negative or
significant. Here tiny tables with a zero-population county go through the county-bias
experiment's per-state regressions and summaries and the run pipeline's scoring, and the
slopes must be those of the positive units alone (scipy's ``linregress`` as reference).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from censusdp.budget import PrivacyStatement
from censusdp.estimation.release import Release
from censusdp.experiments import census_county_bias as ccb
from censusdp.hierarchy import Hierarchy
from censusdp.pipelines.runner import _score

#: two states: "01" has 8 counties, one of population 0; "02" has 6, one of them 0, so it
#: falls below the 6 counties a state needs once that one is left out
SIZES = np.array(
    [0.0, 120, 900, 4_000, 15_000, 60_000, 250_000, 1_000_000, 50, 0, 800, 9e3, 7e4, 5e5]
)
STATE = np.array(["01"] * 8 + ["02"] * 6)
POSITIVE_01 = (STATE == "01") & (SIZES > 0)


def _errors() -> np.ndarray:
    """Errors with a clear negative slope on log size in state 01 (small areas biased up)."""
    gen = np.random.default_rng(3)  # test data only, not privacy noise
    return 40.0 - 3.0 * np.log1p(SIZES) + gen.normal(0.0, 0.5, SIZES.size)


def test_county_bias_regressions_drop_zero_population_counties():
    err = _errors()
    reg = ccb._state_regressions(err, SIZES, STATE)
    assert list(reg["group"]) == ["01"]
    row = reg.iloc[0]
    ref = stats.linregress(np.log(SIZES[POSITIVE_01]), err[POSITIVE_01])
    assert int(row["n"]) == 7
    assert row["slope"] == pytest.approx(ref.slope, rel=1e-9)
    assert row["p"] == pytest.approx(ref.pvalue, rel=1e-6)
    assert row["slope"] < 0 and row["p"] < ccb.ALPHA

    two_runs = np.stack([err, err + np.random.default_rng(4).normal(0.0, 0.5, err.size)])
    s = ccb._summaries(two_runs, SIZES, STATE)
    assert (s["states"], s["negative"], s[f"significant_negative_{'001'}"]) == (1, 1, 1)
    assert s["per_run_negative"] == [1, 1]
    assert s["significant_negative_states"] == [ccb.STATE_ABBR.get("01", "01")]


def test_run_scoring_regressions_drop_zero_population_leaves():
    n = SIZES.size
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], ["01", "02"], [f"c{i:02d}" for i in range(n)]],
        [None, np.zeros(2, np.int64), (STATE == "02").astype(np.int64)],
    )
    truth_leaf = SIZES[:, None]
    released_leaf = truth_leaf + _errors()[:, None]
    release = Release(
        "gls", h, ("all",), h.aggregate(released_leaf), None, PrivacyStatement("pure", epsilon=1.0)
    )
    _, reg = _score(release, h.aggregate(truth_leaf), 0, 1)
    assert list(reg["group"]) == ["01"]
    row = reg.iloc[0]
    ref = stats.linregress(np.log(SIZES[POSITIVE_01]), _errors()[POSITIVE_01])
    assert int(row["n"]) == 7
    assert row["slope"] == pytest.approx(ref.slope, rel=1e-9)
    assert np.isfinite(reg[["slope", "intercept", "se", "t", "p"]].to_numpy()).all()
