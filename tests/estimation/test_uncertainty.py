"""Standard errors, intervals and coverage of GLS releases; rounding variance in releases."""

from __future__ import annotations

import numpy as np
import pytest
from release_fixtures import release_for, two_level

from censusdp.errors import SpecError
from censusdp.estimation import coverage, round_release
from censusdp.mechanisms.queries import Query
from censusdp.rng import KeyedRNG


def test_intervals_cover_at_nominal_rate():
    gen = np.random.default_rng(3)
    h, cells, counts = two_level(gen)
    hits, n = [], 0
    for _ in range(250):
        rel = release_for(gen, h, cells, counts)
        lo, hi = rel.conf_int("county", 0.1)
        est, se = rel.level("county"), rel.standard_errors("county")
        inside = (lo <= counts[2]) & (counts[2] <= hi)
        assert coverage(est, counts[2], se, 0.1) == pytest.approx(inside.mean())
        hits.append(inside.ravel())
        n += inside.size
    share = float(np.concatenate(hits).mean())
    assert n >= 10_000
    assert 0.89 <= share <= 0.91, share


def test_rounding_variance_added_and_invariants_exact_after_rounding():
    gen = np.random.default_rng(4)
    h, cells, counts = two_level(gen)
    rel = release_for(gen, h, cells, counts)
    rounded = round_release(rel, KeyedRNG.reproducible(1, warn=False), method="totals")
    assert rounded.integer and rounded.estimates[-1].dtype == np.int64
    assert np.array_equal(rounded.totals("state"), counts[1].sum(1))
    extra = rounded.variances[2] - rel.variances[2]
    assert np.all((extra >= 0) & (extra <= 0.25))
    # a leaf cell's rounding variance is at most 1/4; a sum's above the leaves may be more
    assert 0 < rounded.diagnostics["rounding_variance_max"]
    se = rel.standard_errors("county", include_rounding=True)
    np.testing.assert_allclose(se**2, rounded.variances[2])
    lo, hi = rel.conf_int("county", include_rounding=True)
    np.testing.assert_allclose((hi - lo) / 2, 1.6448536269514722 * se)
    # above the leaves p(1 − p) is not the rounding variance of a sum: refused
    with pytest.raises(SpecError, match="leaf cells only"):
        rel.standard_errors("state", include_rounding=True)
    # nor is it a query row's: refused, not the cells' intervals in its place
    total = Query.total(cells)
    with pytest.raises(SpecError, match="not a query's"):
        rel.conf_int("county", query=total, include_rounding=True)
    lo, hi = rel.conf_int("county", query=total, include_rounding=False)
    assert lo.shape == (h.levels[2].size, 1)


def test_errors():
    gen = np.random.default_rng(4)
    h, cells, counts = two_level(gen)
    rel = release_for(gen, h, cells, counts)
    with pytest.raises(SpecError, match="alpha"):
        rel.conf_int("county", 1.5)
    rel = rel.replace(variances=None)
    assert rel.standard_errors("county") is None
    for rounding in (False, True):
        with pytest.raises(SpecError, match="no variances"):
            rel.conf_int("county", include_rounding=rounding)
    with pytest.raises(SpecError, match="shape"):
        coverage(np.zeros(2), np.zeros(3), np.ones(2))
