"""The cell path's acceptance step (σ > TABLE_SIGMA_MAX) of the exact discrete Gaussian sampler.

A proposal k uniform in cell c is accepted with probability exp(−γ), γ = (k² − d_c²)/(2σ²),
d_c the smallest |j| in the cell (Devroye 1986 §II.3; CKS 2020 Algorithm 1 draws the
Bernoulli). Two checks:

* the exponent, exactly, against rational arithmetic with d_c found by brute force, on a grid
  of cells and offsets (int64 and Python-integer paths);
* the law inside the cells, statistically: given its cell, a draw's γ has a known law; the
  standardised sum of γ − E[γ | cell] over 4·10⁶ draws is N(0, 1) under the right law and
  must reject (|z| > 4.89, α = 1e-6) the law of an acceptance with twice the exponent, made
  exactly by thinning the right draws with a second Bernoulli(exp(−γ)).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from censusdp.mechanisms.dg_table import cell_table, sample_discrete_gaussian_fast
from censusdp.mechanisms.discrete import bernoulli_exp
from censusdp.rng import KeyedRNG

ALPHA = 1e-6
Z_CRIT = float(stats.norm.isf(ALPHA / 2))  # 4.89


def smallest_abs(c: int, width: int) -> int:
    """min |j| over the cell {cL − h, …, cL + h}, by enumeration for narrow cells and by the
    interval's end points (or 0 when it holds 0) for wide ones."""
    h = (width - 1) // 2
    lo, hi = c * width - h, c * width + h
    if width <= 101:
        return min(abs(j) for j in range(lo, hi + 1))
    return 0 if lo <= 0 <= hi else min(abs(lo), abs(hi))


def grid(table) -> tuple[np.ndarray, np.ndarray]:
    """Proposals and their cells: the centre, first, middle and last cells of the table on
    both sides, every offset of a narrow cell, the ends and a few inner offsets of a wide one."""
    ext = table.extent + 1
    cells = sorted(
        {0, 1, 2, ext // 3, ext // 2, ext - 1, ext} | {-c for c in (1, 2, ext // 2, ext)}
    )
    width, h = table.width, table.half
    if width <= 15:
        offsets = list(range(-h, h + 1))
    else:
        offsets = [-h, -h + 1, -h + 2, -1, 0, 1, h // 3, h - 1, h]
    ks, cs = [], []
    for c in cells:
        for u in offsets:
            ks.append(c * width + u)
            cs.append(c)
    return np.array(ks, dtype=np.int64), np.array(cs, dtype=np.int64)


@pytest.mark.parametrize(
    "sigma2",
    [
        Fraction(128**2 + 1),  # the first cell table: width 3
        Fraction(2_000_001, 16),  # σ ≈ 353.6, q = 16: width 5
        Fraction(10**8),  # σ = 10⁴: width 157
        Fraction(10**12),  # σ = 10⁶: width 15,625
        Fraction(7 * 10**12 + 1, 1024),  # σ ≈ 8.3·10⁴, q = 1024
        Fraction(10**20),  # σ = 10¹⁰: numerators beyond int64, Python integers
    ],
)
def test_acceptance_exponent_is_exact(sigma2: Fraction) -> None:
    table = cell_table(sigma2)
    assert table.width > 1
    k, cells = grid(table)
    num, den = table.acceptance_exponent(k, cells)
    assert (num.dtype == object) == (sigma2 == 10**20)
    for kk, c, n in zip(k.tolist(), cells.tolist(), num.tolist(), strict=True):
        d = smallest_abs(c, table.width)
        gamma = Fraction(kk * kk - d * d) / (2 * sigma2)
        assert Fraction(int(n), den) == gamma, (kk, c)
        assert gamma >= 0  # an acceptance probability: exp(−γ) ≤ 1
    empty, _ = table.acceptance_exponent(k[:0], cells[:0])
    assert empty.size == 0


def within_cell_z(draws: np.ndarray, sigma2: Fraction, width: int) -> float:
    """z-score of Σ (γ − E[γ | cell]) over draws outside cell 0, under the right law.

    Given its cell c ≠ 0 a draw's offset r = |k| − d_c ∈ {0, …, L − 1} has law
    ∝ exp(−x_r), x_r = ((d_c + r)² − d_c²)/(2σ²), and γ = x_r."""
    h = (width - 1) // 2
    cells = (draws + h) // width
    keep = cells != 0
    k, c = np.abs(draws[keep]), np.abs(cells[keep])
    d = c * width - h
    s2 = float(sigma2)
    gamma = (k - d) * (k + d) / (2 * s2)
    uc, inverse = np.unique(c, return_inverse=True)
    du = (uc * width - h).astype(np.float64)[:, None]
    r = np.arange(width, dtype=np.float64)[None, :]
    x = (2 * du * r + r * r) / (2 * s2)
    w = np.exp(-x)
    w /= w.sum(axis=1, keepdims=True)
    mean = (w * x).sum(axis=1)
    var = (w * x * x).sum(axis=1) - mean**2
    return float((gamma - mean[inverse]).sum() / math.sqrt(var[inverse].sum()))


def test_law_inside_the_cells_with_power() -> None:
    """σ² = 128² + 1 (cells of width 3, the widest relative to σ): 4·10⁶ draws."""
    sigma2 = Fraction(128**2 + 1)
    table = cell_table(sigma2)
    rng = KeyedRNG.reproducible(20261128, warn=False)
    draws = sample_discrete_gaussian_fast(rng.generator("cells"), 4_000_000, sigma2)
    z = within_cell_z(draws, sigma2, table.width)
    assert abs(z) < Z_CRIT, z
    # power: the law of an acceptance exp(−2γ), exactly, by a second exact Bernoulli(exp(−γ))
    h = table.half
    num, den = table.acceptance_exponent(draws, (draws + h) // table.width)
    thinned = draws[bernoulli_exp(rng.generator("thin"), num, den)]
    z_wrong = within_cell_z(thinned, sigma2, table.width)
    assert z_wrong < -Z_CRIT, z_wrong
