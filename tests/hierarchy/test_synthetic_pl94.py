"""The synthetic pl94 person histogram and the synthetic state (hierarchy.synthetic)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given, settings
from hypothesis import strategies as hs

from censusdp.errors import DataError
from censusdp.hierarchy import validate
from censusdp.hierarchy.synthetic import (
    PL94_SHAPE,
    pl94_cell_shares,
    pl94_histogram,
    pl94_partitions,
    synthetic_state,
)
from censusdp.rng import CHUNK
from censusdp.schema import Schema

ALPHA = 1e-6
N_CELLS = int(np.prod(PL94_SHAPE))


@pytest.fixture(scope="module")
def state():
    return synthetic_state(5, blocks=20_000)


@pytest.fixture(scope="module")
def hist(state):
    return pl94_histogram(state, 7)


def _chi2_p(counts: np.ndarray, shares: np.ndarray) -> float:
    """Pearson χ² p-value of multinomial ``counts`` against ``shares`` (cells expected < 5
    pooled into one bin)."""
    counts, shares = counts.ravel(), shares.ravel()
    expected = shares * counts.sum()
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    ok = exp > 0
    assert obs[~ok].sum() == 0  # nothing lands where the shares are zero
    return float(st.chisquare(obs[ok], exp[ok]).pvalue)


# -- the synthetic state -----------------------------------------------------------------------


def test_state_levels_codes_and_size():
    s = synthetic_state(1, blocks=150_000)
    h = s.hierarchy
    assert h.names == ("nation", "state", "county", "tract", "block_group", "block")
    assert h.sizes[:2] == (1, 1) and h.sizes[-1] == 150_000
    assert h.sizes[2] < h.sizes[3] < h.sizes[4] < h.sizes[5]
    for name, width in [("county", 5), ("tract", 11), ("block_group", 12), ("block", 15)]:
        assert set(np.strings.str_len(h[name].codes).tolist()) == {width}
    validate(h, nesting="prefix")
    pop = s.leaf_counts[:, 0]
    assert (pop >= 0).all() and 0.25 < float((pop == 0).mean()) < 0.45
    # 2010 U.S. persons per block (27.9), Poisson total within 6 SD
    assert abs(int(pop.sum()) - 27.87 * 150_000) < 6 * np.sqrt(27.87 * 150_000) + 1


def test_state_is_deterministic_and_seeded(state):
    again = synthetic_state(5, blocks=20_000)
    assert again.hierarchy == state.hierarchy
    assert np.array_equal(again.leaf_counts, state.leaf_counts)
    assert not np.array_equal(synthetic_state(6, blocks=20_000).leaf_counts, state.leaf_counts)


def test_tiny_state_has_every_level():
    h = synthetic_state(0, blocks=3).hierarchy
    assert h.sizes == (1, 1, 1, 1, 1, 3)


# -- the shares ----------------------------------------------------------------------------


def test_shares_reproduce_the_published_national_figures():
    p = pl94_cell_shares()
    assert p.shape == PL94_SHAPE == Schema.load("pl94").shape
    assert (p >= 0).all() and p.sum() == pytest.approx(1.0, abs=1e-14)
    persons = 331_449_281
    assert p.sum((0, 1, 3))[1] == pytest.approx(62_080_044 / persons, rel=1e-12)
    assert p.sum((0, 2, 3))[1] == pytest.approx(258_343_281 / persons, rel=1e-12)
    assert 1 - p.sum((1, 2, 3))[0] == pytest.approx(8_239_016 / persons, rel=1e-12)
    p42 = np.array([2_263_602, 151_493, 1_502_264, 76_300, 2_521_090, 353_056, 1_119_518])
    gq = p.sum((1, 2, 3))[1:]
    np.testing.assert_allclose(gq / gq.sum(), p42 / p42.sum(), rtol=1e-12)
    # race alone and Two or More Races by Hispanic origin (2020 P2, thousands)
    race7 = np.array(
        [[191_698, 39_941, 2_252, 19_619, 623, 1_690, 13_509],
         [12_579, 1_164, 1_475, 267, 67, 26_226, 20_341]], dtype=float,
    )  # fmt: skip
    by_h = p.sum((0, 1))  # (hispanic, cenrace)
    got7 = np.concatenate([by_h[:, :6], by_h[:, 6:].sum(1, keepdims=True)], axis=1)
    np.testing.assert_allclose(
        got7 / got7.sum(1, keepdims=True), race7 / race7.sum(1, keepdims=True), rtol=1e-12
    )
    # the long tail: every one of the 57 multi-race cells is possible, none is large
    multi = p.sum((0, 1, 2))[6:]
    assert (multi > 0).all() and multi.max() < 0.06


def test_largest_cell_is_adult_non_hispanic_white_in_households():
    schema = Schema.load("pl94")
    top = schema.cells[int(np.argmax(pl94_cell_shares()))]
    assert top == schema.separator.join(
        ["Household", "18 years and over", "Not Hispanic or Latino", "White alone"]
    )


def test_no_minors_in_adult_correctional_or_nursing_facilities():
    p = pl94_cell_shares()
    assert (p[[1, 3], 0] == 0).all()
    assert (p[[1, 3], 1] > 0).all()


# -- the sparse histogram ----------------------------------------------------------------------


def test_sparse_totals_equal_block_populations(state, hist):
    block, cell, count = hist
    pop = state.leaf_counts[:, 0]
    for a in hist:
        assert a.dtype == np.int64
    assert (count > 0).all()
    assert ((cell >= 0) & (cell < N_CELLS)).all()
    key = block * N_CELLS + cell
    assert (np.diff(key) > 0).all()  # sorted, one entry per (block, cell)
    assert np.array_equal(np.bincount(block, weights=count, minlength=pop.size), pop)
    assert int(count.sum()) == int(pop.sum())
    assert not np.isin(np.flatnonzero(pop == 0), block).any()


def test_histogram_is_deterministic_and_seeded(state, hist):
    again = pl94_histogram(state, 7)
    assert all(np.array_equal(a, b) for a, b in zip(hist, again, strict=True))
    other = pl94_histogram(state, 8)
    assert other[0].size != hist[0].size or not np.array_equal(other[2], hist[2])


def test_partitions_by_county_rebuild_the_whole_and_regenerate_alone(state, hist):
    h = state.hierarchy
    bounds = [h.descendant_range("county", c, "block")[0] for c in range(h.sizes[2])]
    bounds.append(h.sizes[-1])
    parts = list(pl94_partitions(state, 7, bounds))
    assert [p[0] for p in parts] == list(range(len(bounds) - 1))
    for k in range(3):
        whole = np.concatenate([p[k + 1] for p in parts])
        assert np.array_equal(whole, hist[k])
    i = len(parts) // 2
    alone = pl94_histogram(state, 7, bounds[i], bounds[i + 1])
    assert all(np.array_equal(a, b) for a, b in zip(alone, parts[i][1:], strict=True))


@settings(max_examples=25, deadline=None)
@given(
    pop=hs.lists(hs.integers(0, 400), min_size=1, max_size=600),
    cuts=hs.lists(hs.floats(0, 1), max_size=6),
)
def test_any_split_equals_the_whole(pop, cuts):
    pop = np.array(pop, np.int64)
    bounds = sorted({0, pop.size, *(int(c * pop.size) for c in cuts)})
    whole = pl94_histogram(pop, 3)
    parts = list(pl94_partitions(pop, 3, bounds))
    for k in range(3):
        assert np.array_equal(np.concatenate([p[k + 1] for p in parts]), whole[k])
    assert np.array_equal(np.bincount(whole[0], whole[2], minlength=pop.size), pop)


def test_ranges_across_chunk_boundaries():
    pop = np.full(3 * CHUNK // 50 + 7, 50, np.int64)  # persons span four keyed chunks
    whole = pl94_histogram(pop, 0)
    mid = pop.size // 2 + 1
    left, right = pl94_histogram(pop, 0, 0, mid), pl94_histogram(pop, 0, mid)
    for k in range(3):
        assert np.array_equal(np.concatenate([left[k], right[k]]), whole[k])


def test_shares_within_tolerance_with_power(hist):
    _, cell, count = hist
    totals = np.bincount(cell, weights=count, minlength=N_CELLS).astype(np.int64)
    p = pl94_cell_shares()
    assert _chi2_p(totals, p) > ALPHA
    # marginals one by one, and power: the same test rejects a share 30% too high
    x = totals.reshape(PL94_SHAPE)
    hispanic, minors, gq, two_or_more = 1, 0, slice(1, None), slice(6, None)
    for axes, idx in [((0, 1, 3), hispanic), ((0, 2, 3), minors), ((1, 2, 3), gq),
                      ((0, 1, 2), two_or_more)]:  # fmt: skip
        obs, pm = x.sum(axes), p.sum(axes)
        assert _chi2_p(obs, pm) > ALPHA
        wrong = pm.copy()
        wrong[idx] *= 1.3
        assert _chi2_p(obs, wrong / wrong.sum()) < ALPHA
    wrong = p.copy()
    wrong[:, :, 1] *= 1.3  # Hispanic share 30% too high, on the full joint
    assert _chi2_p(totals, wrong / wrong.sum()) < ALPHA


def test_bad_populations_are_refused():
    with pytest.raises(DataError, match="non-negative integer"):
        pl94_histogram(np.array([3, -1]), 0)
    with pytest.raises(DataError, match="non-negative integer"):
        pl94_histogram(np.array([1.5, 2.0]), 0)
    with pytest.raises(ValueError, match="outside"):
        pl94_histogram(np.array([3, 1]), 0, 1, 5)
    with pytest.raises(ValueError, match="increase"):
        list(pl94_partitions(np.array([3, 1]), 0, [0, 2, 1]))
