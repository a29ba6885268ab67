"""Controlled (bipartite) rounding of large values: the real 3,221-county × 36-cell table and
synthetic tables built the same way.

Bordering the raw values left line sums off their integers by ``n · ulp(Σ|x|)`` (1e-7 for a
county of 10 million), above the kernel's 1e-9 tolerance, so ``round_bipartite`` raised
``DataError`` on the real county table; :func:`controlled_round` keeps the bookkeeping on an
exact integer grid.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import DataError
from censusdp.estimation import round_bipartite, round_release, tree_gls
from censusdp.estimation.integer.laminar import (
    TOL,
    bordered,
    cancel_cycles,
    controlled_round,
    rounding_variance,
)
from censusdp.hierarchy import Hierarchy
from censusdp.paths import repo_root
from censusdp.rng import KeyedRNG


def _exact_sums(x: np.ndarray, axis: int | None) -> np.ndarray:
    """Correctly rounded sums of the float values (math.fsum), the reference for floor/ceil."""
    if axis is None:
        return np.array(math.fsum(x.ravel()))
    m = x if axis == 1 else x.T
    return np.array([math.fsum(row) for row in m])


def _within(got: np.ndarray, real: np.ndarray) -> bool:
    """Every ``got`` is ⌊real⌋ or ⌈real⌉ (exactly ``real`` when it is an integer)."""
    return bool(np.all((got >= np.floor(real)) & (got <= np.ceil(real))))


def _county_like(
    seed: int, n: int, K: int, sigma: float, hold: str
) -> tuple[np.ndarray, np.ndarray]:
    """A state's counties × cells of estimates as national_scale's GLS gives them: lognormal
    magnitudes up to ~1e7 per cell, real fractions; ``hold`` makes the state total ("total"),
    every county total ("rows") or every state cell ("cols") an integer in exact arithmetic,
    which the float values then meet only to their resolution. Returns (values, integer
    targets of the held lines, empty when none)."""
    g = np.random.default_rng(seed)
    big = np.floor(g.lognormal(9.0, sigma, (n, K)))
    f = g.uniform(0.0, 1.0, (n, K))
    tgt = np.empty(0)
    if hold == "rows":
        f[:, -1] = 0.0
        f[:, -1] = (np.ceil(f.sum(1)) - f.sum(1)) % 1.0
        tgt = big.sum(1) + np.rint(f.sum(1))
    elif hold == "cols":
        f[-1] = 0.0
        f[-1] = (np.ceil(f.sum(0)) - f.sum(0)) % 1.0
        tgt = big.sum(0) + np.rint(f.sum(0))
    elif hold == "total":
        f[-1, -1] = 0.0
        f[-1, -1] = (math.ceil(f.sum()) - f.sum()) % 1.0
        tgt = np.array([big.sum() + round(f.sum())])
    return big + f, tgt


HOLDS = ("none", "total", "rows", "cols")


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 60),
    K=st.integers(8, 48),
    sigma=st.floats(1.0, 2.5),
    hold=st.sampled_from(HOLDS),
)
def test_large_tables_round_within_floor_ceil_and_hold_exact_lines(seed, n, K, sigma, hold):
    x, tgt = _county_like(seed, n, K, sigma, hold)
    got = controlled_round(x, np.random.default_rng(seed), TOL)
    assert got.dtype == np.int64
    assert np.all((got == np.floor(x)) | (got == np.ceil(x)))
    rows, cols, tot = _exact_sums(x, 1), _exact_sums(x, 0), _exact_sums(x, None)
    assert _within(got.sum(1), rows)
    assert _within(got.sum(0), cols)
    assert _within(got.sum(), tot)
    held = {"rows": got.sum(1), "cols": got.sum(0), "total": np.array([got.sum()])}
    if hold != "none":
        assert np.array_equal(held[hold], tgt.astype(np.int64))


@pytest.mark.parametrize("hold", HOLDS)
def test_raw_value_bordering_fails_on_the_same_tables(hold):
    """The synthetic tables are in the regime the real table hit: rounding the bordered raw
    values (the old path) raises the audit's DataError on them, controlled_round does not."""
    failed = 0
    for seed in range(8):
        x, _ = _county_like(seed, 40, 36, 2.0, hold)
        try:
            cancel_cycles(bordered(x, TOL), np.random.default_rng(seed), TOL)
        except DataError as e:
            assert "not integers within float resolution" in str(e)
            failed += 1
        got = controlled_round(x, np.random.default_rng(seed), TOL)
        assert _within(got.sum(0), _exact_sums(x, 0))
    assert failed >= 4  # most of them (all 20 of 20 seeds but with held columns: 16)


def test_unbiased_at_large_magnitude_and_rejects_a_wrong_law():
    """E[rounded] = x within 4 standard errors on values near 2e7 with the total held; the
    same draws reject values whose fractions are off by 0.05 (power)."""
    g = np.random.default_rng(11)
    x = 2e7 + np.floor(g.uniform(0, 1e5, (3, 4))) + g.uniform(0.05, 0.95, (3, 4))
    x[-1, -1] -= math.fsum(x.ravel()) % 1.0  # the total an integer (to float resolution)
    R = 3000
    gen = np.random.default_rng(12)
    acc = np.zeros_like(x)
    total = round(math.fsum(x.ravel()))
    for _ in range(R):
        r = controlled_round(x, gen, TOL)
        assert r.sum() == total
        acc += r - np.floor(x)
    mean = acc / R
    frac = x - np.floor(x)
    se = np.sqrt(rounding_variance(x) / R)
    assert np.all(np.abs(mean - frac) < 4 * se)
    wrong = np.clip(frac + 0.05, 0.0, 1.0)
    assert np.any(np.abs(mean - wrong) > 4 * se)


def _county_release(path):
    """The national_scale benchmark's county problem: sex × age cells at every level measured
    with discrete Gaussian noise, state totals invariant, tree GLS."""
    import pandas as pd

    from censusdp.budget import PrivacyStatement
    from censusdp.hierarchy import Table
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import Query, invariant, measure

    df = pd.read_csv(path, dtype={"fips": str})
    df = df[df["version"] == "sf2010"]
    table = Table.from_frame(df, [("state", "fips", 2), ("county", "fips")], "[MF]_*")
    h, cells, counts = table.hierarchy, table.cells, table.all_levels()
    rng = KeyedRNG.reproducible(3, warn=False)
    law = DiscreteGaussian(4)
    plan = [(k, q, law) for k in range(3) for q in (Query.total(cells), Query.detailed(cells))]
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 1, Query.total(cells))]
    privacy = PrivacyStatement("zcdp", rho=6 * law.privacy(1.0), invariants=("state: total",))
    return tree_gls(h, cells, meas, invs, privacy), counts, invs


def test_real_county_table_rounds_with_exact_state_totals(shared_file):
    rel, counts, invs = _county_release(shared_file("county_sex_age5_2010.csv"))
    h = rel.hierarchy
    x = rel.estimates[-1]
    assert x.shape == (3221, 36)
    assert np.abs(x).max() > 1e5  # magnitudes where raw-value bordering drifted
    got = round_bipartite(h, x, KeyedRNG.reproducible(4, warn=False))
    leaves = got[-1]
    assert np.all((leaves == np.floor(x)) | (leaves == np.ceil(x)))
    assert np.array_equal(got[1].sum(1), counts[1].sum(1))  # state totals: the invariant
    assert got[0].sum() == counts[0].sum()
    assert _within(leaves.sum(1), _exact_sums(x, 1))  # each county's total
    par = h.leaves.parent
    for s in range(h.levels[1].size):  # each state's sex × age cells (52 states)
        assert _within(got[1][s], _exact_sums(x[par == s], 0))
    out = round_release(
        rel, KeyedRNG.reproducible(5, warn=False), method="bipartite", invariants=invs
    )
    assert out.diagnostics["invariants_exact"] == {"state: total": True}
    assert np.array_equal(out.estimates[1].sum(1), counts[1].sum(1))


def test_national_scale_benchmark_real_counties_runs(shared_file):
    shared_file("county_sex_age5_2010.csv")
    path = repo_root() / "benchmarks" / "national_scale.py"
    spec = importlib.util.spec_from_file_location("national_scale_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.real_counties(0)
    assert out["counties"] == 3221 and out["cells"] == 36
    assert out["state_totals_exact_after_rounding"] is True


def test_one_level_hierarchy_rounds_its_single_matrix():
    """Depth 1 (no parents): the leaf matrix itself is rounded with its totals kept."""
    h = Hierarchy.from_parents(["nation"], [["us"]], [None])
    x, _ = _county_like(3, 1, 36, 2.0, "rows")
    got = round_bipartite(h, x, KeyedRNG.reproducible(6, warn=False))
    assert np.array_equal(got[0].sum(1), np.rint(_exact_sums(x, 1)).astype(np.int64))
