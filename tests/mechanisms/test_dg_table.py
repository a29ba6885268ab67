"""The fixed-point inversion sampler of the discrete Gaussian (censusdp.mechanisms.dg_table).

χ² against the exact law at α = 1e-6 with power against 0.7× and 1.3× σ; table entries
against an independent mpmath computation of ⌊2³²F(c)⌋; words forced onto and beside table
entries against exact inversion of the same long uniform; the conditional law of the
resolver; determinism by key and label and independence of the partition."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache

import mpmath
import numpy as np
import pytest
from scipy import stats

from censusdp.mechanisms.dg_table import (
    WORD_BITS,
    CellTable,
    cell_table,
    sample_discrete_gaussian_fast,
)
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.rng import CHUNK, KeyedRNG

ALPHA = 1e-6
N = 200_000
SIGMAS = [Fraction(1, 2), 1, 3, 10, 100, 10**4, 10**6]


@cache
def exact_cdf(sigma2: Fraction, width: int, c: int, dps: int = 60) -> mpmath.mpf:
    """F(c) of the cell law by direct 60-digit summation (independent of Arb); the terms
    dropped beyond 16σ are below e⁻¹²⁸."""
    half = (width - 1) // 2
    with mpmath.workdps(dps):
        s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator

        def w(j: int) -> mpmath.mpf:
            d = max(abs(j) * width - half, 0)
            return mpmath.exp(-mpmath.mpf(d * d) / (2 * s2))

        reach = int(math.sqrt(float(sigma2)) * 16 / width) + 20 + abs(c)
        z = 1 + 2 * mpmath.fsum(w(j) for j in range(1, reach))
        lower = mpmath.fsum(w(j) for j in range(-reach, c + 1))
        return lower / z


def exact_inverse(sigma2: Fraction, width: int, u: Fraction, lo: int, hi: int) -> int:
    """min{c : u < F(c)} by bisection on [lo, hi] (F(lo) ≤ u < F(hi) checked)."""
    with mpmath.workdps(60):
        uu = mpmath.mpf(u.numerator) / u.denominator
        assert exact_cdf(sigma2, width, lo) <= uu < exact_cdf(sigma2, width, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if uu < exact_cdf(sigma2, width, mid):
                hi = mid
            else:
                lo = mid
        return hi


def binned_chi2(draws: np.ndarray, sigma: float, bins: int = 60) -> float:
    """χ² p-value of draws against a discrete Gaussian of scale σ on integer bins.

    Edges are integers; bin masses are exact sums of the pmf for σ ≤ 200 and the normal CDF
    with continuity correction beyond (the two agree to e^{−2π²σ²} by Poisson summation)."""
    s = float(sigma)
    if s <= 200:
        half = int(12 * s) + 3
        k = np.arange(-half, half + 1)
        pm = np.exp(-(k * k) / (2 * s * s))
        pm /= pm.sum()
        keep = pm * draws.size >= 5
        edges = np.concatenate([[-np.inf], k[keep][1:] - 0.5, [np.inf]])
        probs = np.array(
            [pm[(k > a) & (k < b)].sum() for a, b in zip(edges[:-1], edges[1:], strict=True)]
        )
    else:
        edges = np.unique(np.round(stats.norm.ppf(np.linspace(0, 1, bins + 1)[1:-1]) * s))
        edges = np.concatenate([[-np.inf], edges - 0.5, [np.inf]])
        probs = np.diff(stats.norm.cdf(edges / s))
    obs = np.histogram(draws, bins=edges)[0]
    exp = probs / probs.sum() * draws.size
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, obs.size - 1))


@pytest.mark.parametrize("sigma", SIGMAS)
def test_chi2_against_exact_law_with_power(rng, sigma):
    law = DiscreteGaussian(sigma)
    draws = law.sample(rng.generator(f"dgt/{sigma}"), N)
    assert draws.dtype == np.int64 and draws.shape == (N,)
    s = float(sigma)
    assert binned_chi2(draws, s) > ALPHA
    for factor in (0.7, 1.3):
        assert binned_chi2(draws, s * factor) < ALPHA, factor


@pytest.mark.parametrize(
    ("sigma2", "width"), [(Fraction(9), 1), (Fraction(7, 3), 1), (Fraction(400), 5)]
)
def test_table_entries_are_exact_floors(sigma2, width):
    table = CellTable(sigma2, width)
    scale = mpmath.mpf(2) ** WORD_BITS
    for i, c in enumerate(range(table.lowest, table.lowest + table.bounds.size)):
        ref = int(mpmath.floor(exact_cdf(sigma2, width, c) * scale))
        assert int(table.bounds[i]) == min(ref, 2**WORD_BITS - 1), c
    assert table.bounds[0] == 0 and table.bounds[-1] == 2**WORD_BITS - 1


@pytest.mark.parametrize(("sigma2", "width"), [(Fraction(9), 1), (Fraction(400), 5)])
def test_words_on_and_beside_boundaries_invert_exactly(sigma2, width):
    table = CellTable(sigma2, width)
    b = table.bounds.astype(np.int64)
    words = np.unique(np.clip(np.concatenate([b - 1, b, b + 1]), 0, 2**32 - 1))
    cells, amb = table.invert(words.astype(np.uint32))
    assert set(amb.tolist()) == set(np.flatnonzero(np.isin(words, b)).tolist())
    lo, hi = table.lowest - 30, table.lowest + table.bounds.size + 30
    ambiguous = set(amb.tolist())
    for j, w in enumerate(words.tolist()):
        if j not in ambiguous:
            u = Fraction(2 * w + 1, 2 ** (WORD_BITS + 1))  # any point of the word's interval
            assert cells[j] == exact_inverse(sigma2, width, u, lo, hi), w
    # Resolution against exact inversion of the same long uniform W·2⁶⁴ + E.
    for w in np.unique(b).tolist():
        for e in (1, 2**63, 2**64 - 2, 0x5DEECE66D, 0xFFFF0000FFFF0000):
            reads = iter([e, 0, 0, 0])
            got = table.resolve(w, lambda reads=reads: next(reads))
            u = Fraction((w << 64) | e, 2 ** (WORD_BITS + 64))
            assert got == exact_inverse(sigma2, width, u, lo, hi), (w, e)
    # Deep in either tail the first extra word does not settle it: U < 2⁻⁹⁶ or U > 1 − 2⁻⁹⁶.
    for w, first in ((0, 0), (2**32 - 1, 2**64 - 1)):
        for e in (1, 2**40, 0xDEADBEEF12345678):
            reads = iter([first, e, 0, 0])
            got = table.resolve(w, lambda reads=reads: next(reads))
            u = Fraction((((w << 64) | first) << 64) | e, 2 ** (WORD_BITS + 128))
            assert got == exact_inverse(sigma2, width, u, lo - 80, hi + 80), (w, e)


def test_resolver_conditional_law_is_inversion(rng):
    """Given W = C_c, P(out = c) = frac(2³²F(c)): binomial test at α = 1e-6 with power."""
    sigma2 = Fraction(9)
    table = cell_table(sigma2)
    gen = rng.generator("dgt/resolver")
    picked = 0
    for i in range(1, table.bounds.size - 1):
        w = int(table.bounds[i])
        c = table.lowest + i
        frac = float(exact_cdf(sigma2, 1, c) * 2**WORD_BITS - w)
        if not 0.2 < frac < 0.8:
            continue
        n = 3000
        outs = np.array([table.resolve(w, gen.bit_generator.random_raw) for _ in range(n)])
        assert set(np.unique(outs).tolist()) <= {c, c + 1}
        hits = int((outs == c).sum())
        assert stats.binomtest(hits, n, frac).pvalue > ALPHA
        wrong = 0.7 * frac if frac > 0.5 else 1.3 * frac
        assert stats.binomtest(hits, n, wrong).pvalue < ALPHA
        picked += 1
        if picked == 2:
            break
    assert picked == 2


def test_fast_path_matches_table_search(rng):
    """Guide-table answers equal a plain search of the entries for every certified word."""
    table = cell_table(Fraction(10**4))
    words = rng.generator("dgt/words").integers(0, 2**32, size=300_000, dtype=np.uint32)
    cells, amb = table.invert(words)
    i = np.searchsorted(table.bounds, words, side="left")
    ok = np.ones(words.size, dtype=bool)
    ok[amb] = False
    assert np.array_equal(cells[ok], table.lowest + i[ok])
    assert np.array_equal(np.sort(amb), np.flatnonzero(table.bounds[i] == words))


def test_determinism_by_key_and_label_and_partition():
    rng = KeyedRNG.reproducible(17, warn=False)
    law = DiscreteGaussian(10)
    a = law.sample(rng.generator("n", 3), 50_000)
    b = law.sample(rng.generator("n", 3), 50_000)
    c = law.sample(rng.generator("n", 4), 50_000)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    other = KeyedRNG.reproducible(18, warn=False)
    assert not np.array_equal(a, law.sample(other.generator("n", 3), 50_000))
    n = CHUNK + 1000
    whole = rng.draw("level/total", n, 0, n, law.sample)
    parts = np.concatenate(
        [
            rng.draw("level/total", n, lo, hi, law.sample)
            for lo, hi in ((0, 7), (7, CHUNK + 3), (CHUNK + 3, n))
        ]
    )
    assert np.array_equal(whole, parts)
    sub = rng.restrict({"level/total": [1]})
    assert np.array_equal(sub.draw("level/total", n, CHUNK, n, law.sample), whole[CHUNK:])
    assert law.sample(rng.generator("empty"), 0).shape == (0,)
    assert law.sample(rng.generator("one"), 1).dtype == np.int64


def test_chacha20_source_is_exact_and_differs(rng):
    gen_a, gen_b = rng.generator("src"), rng.generator("src")
    a = sample_discrete_gaussian_fast(gen_a, N, Fraction(9), source="chacha20")
    b = sample_discrete_gaussian_fast(gen_b, N, Fraction(9))
    assert not np.array_equal(a, b)
    assert binned_chi2(a, 3.0) > ALPHA and binned_chi2(a, 3.9) < ALPHA
    with pytest.raises(ValueError, match="source"):
        sample_discrete_gaussian_fast(gen_a, 3, Fraction(9), source="mt19937")


def test_huge_sigma_python_integer_acceptance(rng):
    """σ = 10¹⁰: the acceptance exponent leaves int64, exact Python integers take over."""
    draws = DiscreteGaussian(10**10).sample(rng.generator("dgt/huge"), 3000)
    assert draws.dtype == np.int64
    z = draws.mean() / (1e10 / math.sqrt(draws.size))
    assert abs(z) < 5.3
    assert 0.8 < draws.var() / 1e20 < 1.25
