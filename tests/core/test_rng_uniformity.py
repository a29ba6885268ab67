"""Sanity of the ChaCha20 output: χ² uniformity at α = 1e-6, with power checks.

A fixed-seed test can fail only if the generator (or its wiring) is broken; the power checks
show that the same test rejects a realistically biased sampler on the same sample size.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from censusdp.rng import KeyedRNG

ALPHA = 1e-6
N = 10**6


def _chi2_uniform_pvalue(values: np.ndarray, k: int) -> float:
    counts = np.bincount(values, minlength=k)
    assert counts.shape == (k,), "values outside [0, k)"
    return float(stats.chisquare(counts).pvalue)


def _stream() -> np.random.Generator:
    return KeyedRNG.reproducible(20261121, warn=False).generator("test/uniformity")


def test_bytes_are_uniform():
    raw = np.frombuffer(_stream().bytes(N), dtype=np.uint8)
    assert _chi2_uniform_pvalue(raw, 256) > ALPHA


def test_bytes_test_has_power():
    # an off-by-one range folded onto the top value: byte 255 twice as likely as the others
    g = _stream()
    biased = np.minimum(g.integers(0, 257, size=N), 255)
    assert _chi2_uniform_pvalue(biased, 256) < ALPHA


def test_bounded_integers_are_uniform():
    assert _chi2_uniform_pvalue(_stream().integers(0, 100, size=N), 100) > ALPHA


def test_integer_test_rejects_modulo_bias():
    # the classic bug: reduce a random byte modulo 100 (values < 56 are 50% likelier)
    raw = np.frombuffer(_stream().bytes(N), dtype=np.uint8)
    assert _chi2_uniform_pvalue(raw % 100, 100) < ALPHA


def test_successive_words_are_independent():
    # 2-D χ² on pairs of consecutive 4-bit nibbles from 64-bit words
    words = _stream().integers(0, 2**63, size=N // 2, dtype=np.int64)
    nib = (words & 0xF).astype(np.int64)
    pairs = nib[:-1] * 16 + nib[1:]
    assert _chi2_uniform_pvalue(pairs, 256) > ALPHA
    # power: a sticky sampler that repeats the previous value 2% of the time
    sticky = nib.copy()
    repeat = KeyedRNG.reproducible(1, warn=False).generator("mask").random(sticky.size) < 0.02
    for i in np.flatnonzero(repeat[1:]) + 1:
        sticky[i] = sticky[i - 1]
    assert _chi2_uniform_pvalue(sticky[:-1] * 16 + sticky[1:], 256) < ALPHA
