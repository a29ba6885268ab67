"""The Release results object: frozen, replaced not mutated, intervals and a summary by level."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from release_fixtures import release_for, two_level

from censusdp.errors import SpecError
from censusdp.estimation.release import LevelRelease
from censusdp.estimation.uncertainty import normal_intervals


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
    ref_lo, ref_hi = normal_intervals(rel.level(2), np.sqrt(rel.variances[2]), 0.1)
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


def _structured():
    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.hierarchy.synthetic import random_hierarchy
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.product_measure import measure_products, product_invariant
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.rng import KeyedRNG
    from censusdp.schema import Schema

    s = Schema.load("sex_age5")
    gen = np.random.default_rng(5)  # test data only, not privacy noise
    h = random_hierarchy(gen, [(2, 2), (1, 3)])
    counts = h.aggregate(gen.integers(0, 20, size=(h.leaves.size, *s.shape)))
    lc = dict(zip(h.names, counts, strict=True))
    q = {t: ProductQuery.parse(s, t) for t in ("total", "sex * ageband", "detailed")}
    plan = [(lvl, q[t], DiscreteGaussian(2)) for lvl in h.names for t in q]
    meas = measure_products(lc, plan, KeyedRNG.reproducible(3, warn=False))
    return structured_gls(h, s, meas, [product_invariant(lc, "L0", q["total"])]), counts


def test_structured_release_shares_the_release_protocol():
    from censusdp.estimation import ReleaseProtocol

    rel, counts = _structured()
    plain, _ = _release()
    assert isinstance(rel, ReleaseProtocol) and isinstance(plain, ReleaseProtocol)
    lo, hi = rel.conf_int("L1", alpha=0.1, query="sex * ageband")
    est = rel.query_estimates("L1", "sex * ageband")
    se = rel.query_standard_errors("L1", "sex * ageband")
    np.testing.assert_allclose((lo + hi) / 2, est)
    np.testing.assert_allclose((hi - lo) / 2, 1.6448536269514722 * se)
    tlo, thi = rel.conf_int("L0")  # the total is invariant at the root: a zero-width interval
    np.testing.assert_allclose(thi - tlo, 0.0, atol=1e-9)
    with pytest.raises(SpecError, match="alpha"):
        rel.conf_int("L1", alpha=0.0)
    s = rel.summary()
    assert list(s.index) == list(rel.hierarchy.names) and set(s["se_of"]) == {"total"}
    np.testing.assert_allclose(s["total"], [c.sum() for c in counts], rtol=1e-9)  # consistent
    assert list(s.columns) == list(plain.summary().columns)
    assert s.loc["L0", "max_se"] < 1e-6 < s.loc["L2", "mean_se"]
    text = repr(rel)
    assert (
        text.startswith("<StructuredRelease sex_age5: 36 cells, levels L0=1,") and len(text) < 200
    )


def test_shapes_checked_and_repr_shared_by_release_and_level_release():
    gen = np.random.default_rng(5)
    h, cells, counts = two_level(gen)
    rel = release_for(gen, h, cells, counts)
    with pytest.raises(ValueError, match="one estimate array per level"):
        rel.replace(estimates=rel.estimates[:-1])
    with pytest.raises(ValueError, match=r"level 'county': estimates must be"):
        rel.replace(estimates=[*rel.estimates[:-1], rel.estimates[-1][:, :1]])
    parts = LevelRelease(
        "gls",
        tuple(h.names),
        tuple(lv.codes for lv in h.levels),
        tuple(cells),
        tuple(rel.estimates),
        rel.covariance,
        rel.privacy,
    )
    assert repr(parts) == repr(rel).replace("<Release", "<LevelRelease", 1)
    for name in h.names:
        assert np.array_equal(parts.conf_int(name)[0], rel.conf_int(name)[0])
    with pytest.raises(ValueError, match=r"level 'county': estimates must be"):
        dataclasses.replace(parts, estimates=(*parts.estimates[:-1], parts.estimates[-1][:1]))
