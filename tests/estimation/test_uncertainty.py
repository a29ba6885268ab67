"""Standard errors, intervals and coverage of GLS releases; rounding variance in releases."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation import (
    coverage,
    intervals,
    round_release,
    standard_errors,
    tree_gls,
)
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import Invariant, Measurement, Query
from censusdp.rng import KeyedRNG

PRIVACY = PrivacyStatement("zcdp", rho=0.5, invariants=("state: total",))


def two_level(gen, n_states=4, per_state=6, K=2):
    par = np.repeat(np.arange(n_states), per_state)
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [
            ["US"],
            [f"{s:02d}" for s in range(n_states)],
            [f"{p:02d}{i:03d}" for i, p in enumerate(par)],
        ],
        [None, np.zeros(n_states, int), par],
    )
    cells = [f"c{j}" for j in range(K)]
    counts = h.aggregate(gen.integers(0, 500, size=(h.leaves.size, K)))
    return h, cells, counts


def release_for(gen, h, cells, counts, sigma=3.0):
    q, t = Query.detailed(cells), Query.total(cells)
    meas = [
        Measurement(k, q, counts[k] + gen.normal(0, sigma, counts[k].shape), Gaussian(sigma))
        for k in (1, 2)
    ]
    inv = [Invariant(1, t, t.apply(counts[1]).astype(float))]
    return tree_gls(h, cells, meas, inv, PRIVACY)


def test_intervals_cover_at_nominal_rate():
    gen = np.random.default_rng(3)
    h, cells, counts = two_level(gen)
    hits, n = [], 0
    for _ in range(250):
        rel = release_for(gen, h, cells, counts)
        lo, hi = intervals(rel, "county", 0.1)
        est, se = rel.level("county"), standard_errors(rel, "county")
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
    se = standard_errors(rel, "county", include_rounding=True)
    np.testing.assert_allclose(se**2, rounded.variances[2])
    # above the leaves p(1 − p) is not the rounding variance of a sum: refused
    with pytest.raises(SpecError, match="leaf cells only"):
        standard_errors(rel, "state", include_rounding=True)


def test_errors():
    gen = np.random.default_rng(4)
    h, cells, counts = two_level(gen)
    rel = release_for(gen, h, cells, counts)
    with pytest.raises(SpecError, match="alpha"):
        intervals(rel, "county", 1.5)
    rel.variances = None
    with pytest.raises(SpecError, match="no variances"):
        standard_errors(rel, "county")
    with pytest.raises(SpecError, match="shape"):
        coverage(np.zeros(2), np.zeros(3), np.ones(2))
