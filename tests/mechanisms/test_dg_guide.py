"""The guide-table lookup of the exact discrete Gaussian sampler against brute-force inversion.

``CellTable.invert`` must return, for every 32-bit word W, either "ambiguous" exactly when W
equals a table entry, or the cell ``lowest + #{entries < W}`` (then ``C_{c−1} < W < C_c``:
the certified inversion of the module's proof sketch). The reference counts the entries
below W by comparing W with every entry. The words checked are every bucket's first and
last word (2¹⁷ words: where the guide table decides) and every entry and its neighbours,
on tables chosen so that the guide's edge cases occur: an entry that is a bucket's first
word with the next entry a whole bucket or more above it (σ² = 3035/16, entry 62 is
2464·2¹⁶), and the point-mass tables of small σ whose first and last entries repeat.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from censusdp.mechanisms.dg_table import GUIDE_BITS, WORD_BITS, CellTable, cell_table

SHIFT = WORD_BITS - GUIDE_BITS
BUCKET = 1 << SHIFT


def brute_force(bounds: np.ndarray, lowest: int, words: np.ndarray) -> tuple[np.ndarray, ...]:
    """(cells, ambiguous mask): count the entries below each word, entry by entry."""
    w = words.astype(np.int64)
    below = np.zeros(w.size, dtype=np.int64)
    equal = np.zeros(w.size, dtype=bool)
    for b in bounds.astype(np.int64).tolist():
        below += b < w
        equal |= b == w
    return lowest + below, equal


def boundary_words(bounds: np.ndarray) -> np.ndarray:
    starts = np.arange(1 << GUIDE_BITS, dtype=np.int64) << SHIFT
    b = bounds.astype(np.int64)
    words = np.concatenate([starts, starts + BUCKET - 1, b - 1, b, b + 1])
    return np.unique(np.clip(words, 0, (1 << WORD_BITS) - 1)).astype(np.uint32)


TABLES = [
    Fraction(1, 100),  # σ = 0.1: entries 0, 0, 2³² − 1, 2³² − 1
    Fraction(155, 4096),  # σ ≈ 0.19: 0, 7846, 4294959449, 2³² − 1
    Fraction(9),
    Fraction(3035, 16),  # an entry on a bucket's first word, a whole bucket below the next
    Fraction(128**2),  # the largest pure table: 1,596 entries
    Fraction(10**8),  # a cell table (width 157)
]


@pytest.mark.parametrize("sigma2", TABLES, ids=str)
def test_lookup_equals_brute_force_inversion_at_every_boundary_word(sigma2: Fraction) -> None:
    table = cell_table(sigma2)
    words = boundary_words(table.bounds)
    cells, amb = table.invert(words)
    ref_cells, ref_amb = brute_force(table.bounds, table.lowest, words)
    assert np.array_equal(np.sort(amb), np.flatnonzero(ref_amb))
    assert np.array_equal(cells[~ref_amb], ref_cells[~ref_amb])


def test_guide_buckets_lie_strictly_between_two_entries() -> None:
    """Every bucket the guide answers lies strictly between the entries of its cell, and
    the guide answers every bucket that does (nothing falls back to the search needlessly)."""
    for sigma2 in TABLES:
        table = cell_table(sigma2)
        b = table.bounds.astype(np.int64)
        starts = np.arange(1 << GUIDE_BITS, dtype=np.int64) << SHIFT
        ends = starts + BUCKET - 1
        # a whole bucket has one cell iff no entry lies in [start, end]: i entries below it
        i, _ = brute_force(b, 0, starts)
        through_end, _ = brute_force(b, 0, ends + 1)
        whole = (i == through_end) & (i > 0) & (i < b.size)
        guided = table.guide != np.iinfo(np.int64).min
        assert np.array_equal(guided, whole), sigma2
        assert np.array_equal(table.guide[guided], table.lowest + i[guided])


def test_the_edge_cases_are_present() -> None:
    """The tables above hold the cases a wrong guide would get wrong (no vacuous check)."""
    b = CellTable(Fraction(3035, 16)).bounds.astype(np.int64)
    on_start = np.flatnonzero((b[:-1] % BUCKET == 0) & (b[1:] - b[:-1] >= BUCKET))
    assert on_start.size and on_start[-1] > 0
    tiny = cell_table(Fraction(1, 100)).bounds.tolist()
    assert tiny == [0, 0, 2**32 - 1, 2**32 - 1]
