"""The fused table sampler (censusdp.mechanisms.dg_kernel) against the numpy path it replaces.

Its AES-128-CTR words are randomgen's ``AESCounter`` words (the slow obvious source), and its
draws are the numpy inversion's (``CellTable.sample_cells`` on the same words, the reference
``sample_discrete_gaussian_fast(..., kernel=False)``) draw for draw over σ (hypothesis), the
small-σ scales of test_dg_sweep.py included; so the laws tested there (χ² with power) and every
digest stay as they were. Ties (words equal to a table entry) go through the same exact
resolution. The fused ``answers + noise`` equals the sum of the two.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from randomgen import AESCounter

from censusdp.mechanisms import dg_kernel
from censusdp.mechanisms.dg_kernel import aes_half_words, invert_aes_window, invert_words
from censusdp.mechanisms.dg_table import (
    TABLE_SIGMA_MAX,
    add_discrete_gaussian_window,
    cell_table,
    sample_discrete_gaussian_fast,
    sample_discrete_gaussian_window,
)
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, measure_range, stream_label
from censusdp.rng import CHUNK, KeyedRNG, aes_key

RNG = KeyedRNG.reproducible(36, warn=False)
#: The small scales of test_dg_sweep.py (the table builds that hung, the point-mass regime,
#: the smallest accepted σ², the growth past extent 1) and the last pure table.
SWEEP_SMALL = [
    Fraction(155, 4096), Fraction(1, 25), Fraction(13, 256), Fraction(1, 1024), Fraction(9, 100),
    Fraction(1, 10), Fraction(49, 400), Fraction(1, 8), Fraction(TABLE_SIGMA_MAX**2),
]  # fmt: skip
#: Any rational σ² of the table path (σ ≤ 128), numerator and denominator spread.
SIGMA2 = st.one_of(
    st.sampled_from(SWEEP_SMALL),
    st.builds(Fraction, st.integers(1, 16384 * 64), st.integers(1, 64)).filter(
        lambda s: s <= TABLE_SIGMA_MAX**2
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    key=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    positions=st.lists(st.integers(0, 2**40), min_size=1, max_size=20),
)
def test_aes_words_are_randomgens(key: tuple[int, int], positions: list[int]) -> None:
    k = np.array(key, dtype=np.uint64)
    want = []
    for h in positions:
        bitgen = AESCounter(key=k, counter=0)
        bitgen.advance(h // 2)
        want.append((int(bitgen.random_raw()) >> (32 * (h % 2))) & 0xFFFFFFFF)
    assert aes_half_words(k, np.array(positions)).tolist() == want


def test_aes_words_of_a_run_are_randomgens() -> None:
    """A long run, every offset of a group of four blocks, both ends unaligned."""
    key = np.array([0x0123456789ABCDEF, 0xFEDCBA9876543210], dtype=np.uint64)
    raw = AESCounter(key=key, counter=0).random_raw(5000)
    halves = np.empty(2 * raw.size, np.uint32)
    halves[0::2], halves[1::2] = raw & np.uint64(0xFFFFFFFF), raw >> np.uint64(32)
    pos = np.arange(3, 9997)
    assert np.array_equal(aes_half_words(key, pos), halves[pos])


@settings(max_examples=80, deadline=None)
@given(sigma2=SIGMA2, size=st.integers(0, 70_000), label=st.integers(0, 10**6))
def test_fused_equals_numpy_path_draw_for_draw(sigma2: Fraction, size: int, label: int) -> None:
    fused = sample_discrete_gaussian_fast(RNG.generator("k", label), size, sigma2)
    numpy_path = sample_discrete_gaussian_fast(
        RNG.generator("k", label), size, sigma2, kernel=False
    )
    assert fused.dtype == np.int64 and np.array_equal(fused, numpy_path)


@pytest.mark.parametrize("sigma2", SWEEP_SMALL)
def test_sweep_scales_equal_numpy_path(sigma2: Fraction) -> None:
    n = 1_000_003
    fused = sample_discrete_gaussian_fast(RNG.generator("sweep"), n, sigma2)
    assert np.array_equal(fused, sample_discrete_gaussian_fast(RNG.generator("sweep"), n, sigma2,
                                                               kernel=False))  # fmt: skip


def test_ties_resolve_as_the_numpy_path() -> None:
    """σ = 127: a 1,584-entry table, a tie every ≈ 2.7 M draws; chunk 1 of stream "x" under
    seed 1 holds two in its first 3,000,001 draws (test_dg_window.py): the fused path finds the
    same positions and resolves them to the same cells, whole and in windows."""
    rng = KeyedRNG.reproducible(1, warn=False)
    s2, size = Fraction(127**2), 3_000_001
    table = cell_table(s2)
    key = aes_key(rng.generator("x", 1))
    out = np.empty(size, np.int64)
    ties = invert_aes_window(key, 0, table, out)
    _, amb = table.invert(aes_half_words(key, np.arange(size)))
    assert ties.size >= 2 and np.array_equal(ties, amb)
    want = sample_discrete_gaussian_fast(rng.generator("x", 1), size, s2, kernel=False)
    got = sample_discrete_gaussian_fast(rng.generator("x", 1), size, s2)
    assert np.array_equal(got, want)
    p = int(ties[1])
    answers = np.arange(p - 10, p + 10, dtype=np.int64).reshape(4, 5) * 1000
    noisy = add_discrete_gaussian_window(rng.generator("x", 1), size, p - 10, p + 10, s2, answers)
    assert np.array_equal(noisy, answers + want[p - 10 : p + 10].reshape(4, 5))


@settings(max_examples=40, deadline=None)
@given(sigma2=st.one_of(SIGMA2, st.just(Fraction(10**8))), size=st.integers(1, 50_000),
       data=st.data())  # fmt: skip
def test_fused_answers_plus_noise(sigma2: Fraction, size: int, data) -> None:
    a = data.draw(st.integers(0, size))
    b = data.draw(st.integers(a, size))
    seed = data.draw(st.integers(0, 2**32 - 1))
    wide = np.random.default_rng(seed).integers(-(2**40), 2**40, (b - a, 3), dtype=np.int64)
    answers = wide[:, 1]  # strided: a query's column of a wider table, read in place
    noise = sample_discrete_gaussian_window(RNG.generator("a", size), size, a, b, sigma2)
    got = add_discrete_gaussian_window(RNG.generator("a", size), size, a, b, sigma2, answers)
    assert got.dtype == np.int64 and np.array_equal(got, answers + noise)


def test_without_aesni_the_same_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback (randomgen's words, compiled inversion) gives the same draws."""
    s2, size = Fraction(81, 16), 100_001
    want = sample_discrete_gaussian_window(RNG.generator("f"), size, 17, size, s2)
    monkeypatch.setattr(dg_kernel, "HAVE_AESNI", False)
    got = sample_discrete_gaussian_window(RNG.generator("f"), size, 17, size, s2)
    assert np.array_equal(got, want)
    key = aes_key(RNG.generator("f"))
    assert np.array_equal(aes_half_words(key, np.array([5, 99])),
                          aes_half_words(key, np.arange(100))[[5, 99]])  # fmt: skip


@pytest.mark.parametrize(
    "sigma2", [Fraction(2), Fraction(1, 25), Fraction(155, 4096), Fraction(127**2), Fraction(9, 4)]
)
def test_invert_words_is_the_table_rule(sigma2: Fraction) -> None:
    """Every entry, its neighbours, both ends, every bucket's first and last word and random
    words: the compiled search (from the bucket's first entry) is np.searchsorted's."""
    table = cell_table(sigma2)
    b = table.bounds.astype(np.int64)
    buckets = np.arange(1 << 16, dtype=np.int64) << 16
    words = np.concatenate([b, b + 1, b - 1, buckets, buckets + 0xFFFF, [0, 2**32 - 1]])
    words = np.concatenate([words[(words >= 0) & (words < 2**32)],
                            np.random.default_rng(1).integers(0, 2**32, 10**6)]).astype(np.uint32)  # fmt: skip
    cells, amb = table.invert(words)
    out = np.empty(words.size, np.int64)
    ties = invert_words(words, table, out)
    assert np.array_equal(ties, amb)
    keep = np.setdiff1d(np.arange(words.size), amb)
    assert np.array_equal(out[keep], cells[keep])
    assert np.array_equal(out[amb], table.lowest + np.searchsorted(table.bounds, words[amb]))


def test_bad_arguments() -> None:
    table = cell_table(Fraction(2))
    key = aes_key(RNG.generator("b"))
    with pytest.raises(ValueError, match="int64"):
        invert_aes_window(key, 0, table, np.empty(3, np.int32))
    with pytest.raises(ValueError, match="answers"):
        add_discrete_gaussian_window(RNG.generator("b"), 10, 0, 5, Fraction(2), np.zeros(4))


def test_keyed_add_draws_equal_draw_plus_answers() -> None:
    """KeyedRNG.add_draws (one pass per chunk) = the exact answers + KeyedRNG.draw, ranges
    inside, across and at the ends of chunks; and measure_range takes that path for int64
    answers under the discrete Gaussian, with the same noisy answers as before."""
    law = DiscreteGaussian(Fraction(9, 4))
    n, width = CHUNK + 3000, 3
    whole = RNG.draw("lvl/q", n, 0, n, law.sample, width)
    answers = np.random.default_rng(0).integers(0, 10**6, (n, width), dtype=np.int64)
    for a, b in [(5, 17), (CHUNK - 10, CHUNK + 10), (CHUNK + 1, n), (0, CHUNK), (0, n), (9, 9)]:
        got = RNG.add_draws("lvl/q", n, a, b, answers[a:b], law.add_window, width)
        assert got.dtype == np.int64 and np.array_equal(got, answers[a:b] + whole[a:b]), (a, b)
    query = Query("q", np.eye(width, dtype=np.int64), ("a", "b", "c"))
    noise = RNG.draw(stream_label("lvl", "q"), n, 7, CHUNK + 9, law.sample, width)
    got = measure_range(answers[7 : CHUNK + 9], "lvl", n, 7, query, law, RNG)
    assert np.array_equal(got, answers[7 : CHUNK + 9] + noise)
    with pytest.raises(ValueError, match="shape"):
        RNG.add_draws("lvl/q", n, 0, 4, answers[:5], law.add_window, width)
