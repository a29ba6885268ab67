"""The Release results object: frozen, replaced not mutated, intervals and a summary by level."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from release_fixtures import release_for, two_level

from censusdp.errors import SpecError
from censusdp.estimation import intervals


def _release():
    gen = np.random.default_rng(21)  # test data only, not privacy noise
    h, cells, counts = two_level(gen)
    return release_for(gen, h, cells, counts), counts


def test_a_release_is_frozen_and_replace_makes_a_new_one():
    rel, _ = _release()
    with pytest.raises(dataclasses.FrozenInstanceError):
        rel.estimator = "other"
    other = rel.replace(estimator="relabelled", variances=None)
    assert (rel.estimator, other.estimator) == ("gls", "relabelled")
    assert rel.variances is not None and other.variances is None
    assert other.estimates is rel.estimates


def test_conf_int_is_the_normal_interval_by_level_name():
    rel, counts = _release()
    lo, hi = rel.conf_int("county", alpha=0.1)
    ref_lo, ref_hi = intervals(rel, 2, 0.1)
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)
    np.testing.assert_allclose((hi - lo) / 2, 1.6448536269514722 * rel.standard_errors("county"))
    lo99, hi99 = rel.conf_int("county", alpha=0.01)
    assert np.all(lo99 <= lo) and np.all(hi <= hi99)
    with pytest.raises(SpecError, match="alpha"):
        rel.conf_int("county", alpha=1.5)
    with pytest.raises(SpecError, match="no variances"):
        rel.replace(variances=None).conf_int("county")


def test_summary_has_one_row_per_level_and_a_short_repr():
    rel, counts = _release()
    s = rel.summary()
    assert list(s.index) == list(rel.hierarchy.names)
    assert list(s["nodes"]) == [lv.size for lv in rel.hierarchy.levels]
    np.testing.assert_allclose(s["total"], [c.sum() for c in counts], rtol=1e-9)
    assert s.loc["state", "max_se"] > 0
    assert np.isnan(rel.replace(variances=None).summary()["mean_se"]).all()
    text = repr(rel)
    assert text.startswith("<Release gls: real, 2 cells, levels nation=1, state=4, county=24")
    assert len(text) < 200
