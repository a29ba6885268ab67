"""A sum held exactly by an invariant has variance 0 after rounding, never a float-error
negative that ``sum_standard_errors`` would turn into NaN (found by the levels-by-name
hypothesis cases)."""

from __future__ import annotations

import warnings

import numpy as np

from censusdp.prelude import (
    DiscreteGaussian,
    KeyedRNG,
    Query,
    Table,
    invariant,
    measure,
    round_release,
    tree_gls,
)


def test_held_state_totals_have_zero_standard_errors_after_rounding():
    table = Table.from_midwest()
    h, cells, counts = table.hierarchy, table.cells, table.all_levels()
    total = Query.total(cells)
    for seed in range(4):
        rng = KeyedRNG.reproducible(seed, warn=False)
        plan = [
            (level, Query.detailed(cells), DiscreteGaussian(3)) for level in ("state", "county")
        ]
        meas = measure(h.names, counts, plan, rng)
        inv = [
            invariant(counts, level, total, level_names=h.names) for level in ("nation", "state")
        ]
        release = tree_gls(h, cells, meas, inv, covariance=True)
        integer = round_release(release, rng, method="totals", invariants=inv, queries=[total])
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            var = integer.sum_variances("state", total)
            se = integer.sum_standard_errors("state", total)
        assert np.all(var >= 0.0) and np.all(np.isfinite(se))
        assert np.all(se < 1e-6)  # held exactly: only float error of the solve is left
        # the counties are not held: their standard errors are real
        assert np.all(integer.sum_standard_errors("county", total) > 0.5)
