"""Drawing a window of a keyed chunk (censusdp.mechanisms.dg_table.sample_discrete_gaussian_window).

A window ``[a, b)`` must equal ``sample_discrete_gaussian_fast(gen, size)[a:b]`` bit for bit:
on the table path through ``AESCounter.advance`` and, when the window holds a word equal to a
table entry, by replaying the resolutions of the ambiguous words before it; on the cell path
by drawing whole. The reference is the whole draw itself (the slow obvious computation)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.mechanisms.dg_table import (
    _invert_window,
    cell_table,
    sample_discrete_gaussian_fast,
    sample_discrete_gaussian_window,
)
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.rng import CHUNK, KeyedRNG, aes_key

RNG = KeyedRNG.reproducible(1, warn=False)


def test_windows_around_ambiguous_words_equal_the_whole_draw() -> None:
    # σ = 127: a 1,584-entry table, an ambiguous word every ≈ 2.7 M draws; chunk 1 of stream
    # "x" under seed 1 holds two in its first 3,000,001 draws
    s2, size = Fraction(127**2), 3_000_001
    table = cell_table(s2)
    pos, _ = _invert_window(table, aes_key(RNG.generator("x", 1)), 0, size, None)
    assert pos.size >= 2  # the resolution path is exercised, not skipped
    full = sample_discrete_gaussian_fast(RNG.generator("x", 1), size, s2)
    p, q = int(pos[0]), int(pos[1])
    # the second ambiguous word's resolution starts after the first's words: a window from
    # between them must replay the first (prefix scan), one from after both must replay both
    for a, b in [(0, size), (p, p + 1), (q, q + 1), (p + 1, q + 1), (q - 5, size), (q + 1, size),
                 (1, 2), (size - 1, size), (p - 3, p + 3), (7, 7)]:  # fmt: skip
        got = sample_discrete_gaussian_window(RNG.generator("x", 1), size, a, b, s2)
        assert np.array_equal(got, full[a:b]), (a, b)


@settings(max_examples=40, deadline=None)
@given(
    sigma2=st.sampled_from([Fraction(1, 4), Fraction(5), Fraction(81, 16), Fraction(3969)]),
    size=st.integers(1, 200_000),
    data=st.data(),
)
def test_any_window_equals_the_slice(sigma2: Fraction, size: int, data) -> None:
    a = data.draw(st.integers(0, size))
    b = data.draw(st.integers(a, size))
    full = sample_discrete_gaussian_fast(RNG.generator("w", size), size, sigma2)
    got = sample_discrete_gaussian_window(RNG.generator("w", size), size, a, b, sigma2)
    assert got.dtype == np.int64 and np.array_equal(got, full[a:b])


def test_cell_path_window_is_the_slice() -> None:
    s2 = Fraction(10**8)  # σ = 10⁴: cells of width > 1, variable words per draw
    assert cell_table(s2).width > 1
    full = sample_discrete_gaussian_fast(RNG.generator("c"), 5000, s2)
    got = sample_discrete_gaussian_window(RNG.generator("c"), 5000, 1234, 4321, s2)
    assert np.array_equal(got, full[1234:4321])


def test_keyed_draw_of_a_range_equals_the_slice_of_the_whole_level() -> None:
    """KeyedRNG.draw with the law's window: a range inside and across chunks equals the whole
    stream's slice, and the other laws (no window of their own) still do."""
    law = DiscreteGaussian(Fraction(9, 4))
    n, width = CHUNK + 3000, 3
    whole = RNG.draw("lvl/q", n, 0, n, law.sample, width)
    for a, b in [(5, 17), (CHUNK - 10, CHUNK + 10), (CHUNK + 1, n), (0, CHUNK)]:
        got = RNG.draw("lvl/q", n, a, b, law.sample, width, window=law.sample_window)
        assert np.array_equal(got, whole[a:b]), (a, b)
