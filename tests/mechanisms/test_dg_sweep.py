"""The exact discrete Gaussian sampler over the whole σ range, each σ under a time limit.

σ runs log-spaced from 0.01 to 10⁶, with the scales that used to hang the table build
(σ² = 155/4096, 1/25, 13/256: the top entry 2³²F(M) lay within 2⁻²¹ of 2³² and was rounded at
53 bits), scales near σ = 0.2 and 0.35, the smallest σ² the laws accept (1/1024), and both
sides of every boundary between the sampler's code paths: the smallest table (extent 1, up
to σ ≈ 0.30), the last pure table (σ = 128 = TABLE_SIGMA_MAX) and the first cell tables
(σ² = 128² + 1: cells of width 3; σ = 256: width 5).

Each σ's draws meet a χ² goodness-of-fit test against the exact pmf at α = 1e-6, and the same
test rejects the laws of scale 0.7σ and 1.3σ (power) wherever those laws can be told apart
from the right one with the draws at hand: below σ ≈ 0.19 the discrete Gaussian is, to within
2·exp(−1/(2σ²)) < 10⁻⁶ per draw, the point mass at 0, and so are its 30%-wrong neighbours;
there the test is the exact binomial law of the number of non-zero draws.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from censusdp.mechanisms.dg_table import TABLE_SIGMA_MAX, cell_table, sample_discrete_gaussian_fast
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.rng import KeyedRNG

ALPHA = 1e-6
#: Expected count of draws a 30%-wrong law moves, below which no test can be expected to
#: tell it from the right law: the point-mass regime (see :func:`moved_draws`).
DETECTABLE = 40
#: Every σ from here (σ² = 155/4096) up must show power against both 30%-wrong scales.
POWER_FROM = 0.194
#: Draws per σ in the fast sweep: 2·10⁷ where the point mass starts to spread (0.15 ≤ σ < 0.25:
#: power needs ~40 draws off 0, and P(k ≠ 0) ≥ 2·10⁻⁶ from σ² = 155/4096 up; the table
#: path draws 2·10⁷ in ~0.05 s), 2·10⁶ elsewhere below σ = 1, 2·10⁵ from σ = 1 up (power
#: to spare).
N_EDGE, N_SMALL, N_LARGE = 20_000_000, 2_000_000, 200_000


def draws_for(sigma2: Fraction) -> int:
    if Fraction(9, 400) <= sigma2 < Fraction(1, 16):  # 0.15 ≤ σ < 0.25
        return N_EDGE
    return N_SMALL if sigma2 < 1 else N_LARGE


EXACT_PMF_SIGMA_MAX = 10**4


def sigma2_of(sigma: float) -> Fraction:
    """An exact σ² near σ² (σ rounded to a fraction with denominator ≤ 1000, squared)."""
    return Fraction(sigma).limit_denominator(1000) ** 2


def sweep(per_decade: int) -> list[Fraction]:
    logs = np.linspace(-2, 6, 8 * per_decade + 1)
    special = [
        Fraction(155, 4096),  # σ ≈ 0.195: hung the table build
        Fraction(1, 25),  # σ = 0.2: hung
        Fraction(13, 256),  # σ ≈ 0.225: hung
        Fraction(1, 1024),  # the smallest σ² the laws accept (σ = 10⁻⁶ is rounded up to it)
        Fraction(9, 100),  # σ = 0.3: the table grows past extent 1 near here
        Fraction(1, 10),
        Fraction(49, 400),  # σ = 0.35
        Fraction(1, 8),  # σ ≈ 0.354
        Fraction(TABLE_SIGMA_MAX**2),  # the last pure table (width 1)
        Fraction(TABLE_SIGMA_MAX**2 + 1),  # the first cell table (width 3)
        Fraction((2 * TABLE_SIGMA_MAX) ** 2 - 1),  # the last width 3
        Fraction((2 * TABLE_SIGMA_MAX) ** 2),  # the first width 5
    ]
    return sorted({*(sigma2_of(10.0**x) for x in logs), *special})


def law_bins(sigma2: Fraction, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bins of the discrete Gaussian law for a χ² test of ``n`` draws: the integer right edges
    e₀ < e₁ < … (bin i is (e_{i−1}, e_i], the last bin (e_last, ∞)) and the bin masses.

    Masses are exact sums of the pmf up to σ = 10⁴ (support ±(14σ + 2), the rest below
    e⁻⁹⁸); beyond, normal-CDF differences at half-integers, which by Euler–Maclaurin differ
    from the sums by at most max|f′|/24 ≤ 0.011/σ² per edge (≤ 10⁻¹⁰ here) and by Poisson
    summation in the normaliser by e^{−2π²σ²}. About 200 equiprobable bins (an integer that
    holds a quantile is a bin of its own: the mode 0 when σ is small), merged so that every
    expected count is at least 5."""
    s = math.sqrt(float(sigma2))
    bins = max(2, min(200, n // 50))
    quantiles = np.linspace(0, 1, bins + 1)[1:-1]
    if s <= EXACT_PMF_SIGMA_MAX:
        half = math.ceil(14 * s) + 2
        k = np.arange(-half, half + 1)
        pmf = np.exp(-(k * k) / (2 * float(sigma2)))
        pmf /= pmf.sum()
        cdf = np.cumsum(pmf)
        edges = k[np.minimum(np.searchsorted(cdf, quantiles), k.size - 1)]
        edges = np.unique(np.concatenate([edges, edges - 1]))  # a heavy integer is a bin
        at = np.searchsorted(k, edges)
        upper = np.concatenate([cdf[at], [1.0]])
    else:
        edges = np.unique(np.round(stats.norm.ppf(quantiles) * s)).astype(np.int64)
        upper = np.concatenate([stats.norm.cdf((edges + 0.5) / s), [1.0]])
    mass = np.diff(upper, prepend=0.0)
    edge_list, mass_list = edges.tolist(), mass.tolist()
    while len(mass_list) > 1 and min(mass_list) * n < 5:  # merge into the smaller neighbour
        i = int(np.argmin(mass_list))
        left = i == len(mass_list) - 1 or (i > 0 and mass_list[i - 1] < mass_list[i + 1])
        small = mass_list.pop(i)
        if left:
            mass_list[i - 1] += small
            edge_list.pop(i - 1)  # bin i − 1 now ends where bin i ended
        else:
            mass_list[i] += small  # the old bin i + 1
            edge_list.pop(i)  # it now starts where bin i started
    return np.array(edge_list, dtype=np.int64), np.array(mass_list)


def gof_pvalue(draws: np.ndarray, sigma2: Fraction) -> float:
    """p-value of ``draws`` against the discrete Gaussian of scale σ² (χ² on :func:`law_bins`;
    with a single bin, the exact binomial test of the number of draws outside the mode 0)."""
    n = draws.size
    edges, mass = law_bins(sigma2, n)
    if mass.size == 1:
        outside = int(np.count_nonzero(draws))
        z = 1.0 + 2.0 * sum(math.exp(-(j * j) / (2 * float(sigma2))) for j in (1, 2, 3))
        p_out = 1.0 - 1.0 / z
        if p_out == 0.0:
            return 1.0 if outside == 0 else 0.0
        return float(stats.binomtest(outside, n, p_out).pvalue)
    counts = bin_counts(draws, edges)
    expected = mass * n
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(stat, mass.size - 1))


def bin_counts(draws: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``draws`` in (−∞, e₀], (e₀, e₁], …, (e_last, ∞): through one count per value
    (``bincount``, linear time) when the draws span few values, else by search."""
    lo, hi = int(draws.min()), int(draws.max())
    if hi - lo > 10**6:
        return np.bincount(np.searchsorted(edges, draws, side="left"), minlength=edges.size + 1)
    below = np.concatenate([[0], np.cumsum(np.bincount(draws - lo))])  # below[j]: draws < lo + j
    at = np.clip(edges - lo + 1, 0, hi - lo + 1)  # draws ≤ edge
    return np.diff(np.concatenate([[0], below[at], [draws.size]]))


def moved_draws(sigma2: Fraction, factor: float, n: int) -> float:
    """n·TV(law σ, law factor·σ): how many of n draws a wrong scale moves, in expectation.
    Below :data:`DETECTABLE` no test of n draws can tell the two laws apart reliably."""
    s = math.sqrt(float(sigma2))
    half = math.ceil(14 * s * max(1.0, factor)) + 2
    if half > 10**6:  # far from the point-mass regime: the laws differ by O(1) in TV
        return float(n)
    k = np.arange(-half, half + 1)
    a = np.exp(-(k * k) / (2 * float(sigma2)))
    b = np.exp(-(k * k) / (2 * float(sigma2) * factor * factor))
    return float(n * 0.5 * np.abs(a / a.sum() - b / b.sum()).sum())


def check_sigma(sigma2: Fraction, n: int, label: str) -> dict:
    start = time.process_time()
    table = cell_table(sigma2)
    built = time.process_time()
    draws = sample_discrete_gaussian_fast(
        KeyedRNG.reproducible(20261128, warn=False).generator(label), n, sigma2
    )
    drawn = time.process_time()
    assert draws.dtype == np.int64 and draws.shape == (n,)
    p = gof_pvalue(draws, sigma2)
    assert p > ALPHA, (float(sigma2), p)
    powered = []
    for factor in (0.7, 1.3):
        if moved_draws(sigma2, factor, n) >= DETECTABLE:
            p_bad = gof_pvalue(draws, sigma2 * Fraction(factor).limit_denominator(10) ** 2)
            assert p_bad < ALPHA, (float(sigma2), factor, p_bad)
            powered.append(factor)
    if math.sqrt(float(sigma2)) >= POWER_FROM:
        assert powered == [0.7, 1.3], (float(sigma2), powered)
    return {
        "width": table.width,
        "entries": table.bounds.size,
        "build_s": built - start,
        "draw_s": drawn - built,
        "powered": powered,
    }


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sigma2", sweep(per_decade=3), ids=lambda s: f"sigma={math.sqrt(s):.6g}")
def test_sweep_terminates_and_fits_the_exact_law(sigma2: Fraction) -> None:
    check_sigma(sigma2, draws_for(sigma2), f"sweep/{sigma2}")


def test_sweep_covers_the_paths_and_the_hangs() -> None:
    """The fast sweep holds the hanging scales and both sides of each code-path boundary."""
    s2 = sweep(per_decade=3)
    assert min(s2) == Fraction(1, 10**4) and max(s2) == 10**12
    assert {Fraction(155, 4096), Fraction(1, 25), Fraction(13, 256)} <= set(s2)
    widths = {cell_table(x).width for x in s2 if TABLE_SIGMA_MAX**2 - 1 <= x <= 2**16}
    assert widths == {1, 3, 5}
    extents = {cell_table(x).extent for x in s2 if x < 1}
    assert 1 in extents and 2 in extents


def test_power_needs_moved_draws() -> None:
    """The power criterion is what the χ² sees: at σ = 0.1 a 30%-wrong law moves no draw in
    expectation (and indeed passes), at σ = 0.3 it moves thousands (and fails)."""
    assert moved_draws(Fraction(1, 100), 1.3, N_SMALL) < 1e-3
    assert moved_draws(Fraction(9, 100), 1.3, N_SMALL) > 1000
    assert moved_draws(Fraction(10**12), 0.7, N_SMALL) == N_SMALL


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deep_sweep() -> None:
    """Twelve σ per decade, 2·10⁷ draws each."""
    for s2 in sweep(per_decade=12):
        check_sigma(s2, 20_000_000, f"deep/{s2}")


def test_laws_smallest_sigma_is_sampled() -> None:
    """σ = 10⁻⁶ (the bottom of SCALE_RANGE) becomes σ² = 1/1024 and draws zeros, promptly."""
    law = DiscreteGaussian(1e-6)
    assert law.sigma2 == Fraction(1, 1024)
    draws = law.sample(KeyedRNG.reproducible(5, warn=False).generator("tiny"), 100_000)
    assert gof_pvalue(draws, law.sigma2) > ALPHA
    assert not draws.any()
