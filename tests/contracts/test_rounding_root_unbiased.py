"""The root of tree rounding is unbiased: its leftover is floored or ceiled at random.

Every set of the rounding family must have E[rounded sum] = real sum (Srinivasan 2001); at the
root nothing is left to pair with, so each root set's leftover fraction f is rounded up with
probability f by its own uniform. A rounding that always floors there keeps every invariant
(integer sums have no leftover) and every floor/ceil bound, so only the mean shows it. Here
the root's real sums are far from integers (no invariant), and over independent keys the
rounded root of ``round_release`` — each cell in ``"cells"`` mode, the total in ``"totals"``
mode — must average to the real sum within 4 SE (SE² = f(1 − f)/R, exact) and take both its
floor and its ceiling. (``tests/estimation/test_rounding_variances.py`` checks the means of
``round_tree`` at every level, the root included, against the reported variances.)
"""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.estimation.integer.laminar import round_release
from censusdp.estimation.release import Release
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.rng import KeyedRNG

R = 120
K = 3
#: fractional parts of the root's real cell sums (the total's is 0.8): with R = 120 a root
#: that is always floored is ≥ 6 SE off, and never ceiled has probability ≤ 0.8¹⁵⁰ ≈ 3e-15
ROOT_FRACTIONS = np.array([0.25, 0.35, 0.2])


def _case():
    gen = np.random.default_rng(7)  # test data only, not privacy noise
    h = random_hierarchy(gen, [(2, 3), (2, 3)])
    x = gen.uniform(0.0, 9.0, size=(h.leaves.size, K))
    root = x.sum(axis=0)
    x[0] += np.floor(root) + ROOT_FRACTIONS - root  # set the root's fractional parts
    return h, x


def _check_root(rounded: np.ndarray, real: np.ndarray) -> None:
    """``rounded`` (R, m) integer roots of sets with real sums ``real`` (m,)."""
    f = real - np.floor(real)
    assert np.all((f > 0.19) & (f < 0.81))  # far from integral: a biased rule has room to show
    se = np.sqrt(f * (1 - f) / R)
    mean = rounded.mean(axis=0)
    assert np.all(np.abs(mean - real) < 4 * se), (mean, real, se)
    assert np.all((rounded == np.floor(real)) | (rounded == np.ceil(real)))
    assert np.all((rounded == np.floor(real)).any(axis=0)), "the root is never floored"
    assert np.all((rounded == np.ceil(real)).any(axis=0)), "the root is never ceiled"


@pytest.mark.parametrize("method", ["cells", "totals"])
def test_round_release_root_is_unbiased_and_takes_both_values(method):
    h, x = _case()
    est = h.aggregate(x)
    cells = tuple(f"c{j}" for j in range(K))
    release = Release("gls", h, cells, est, None, PrivacyStatement("pure", epsilon=1.0))
    roots = np.stack(
        [
            round_release(
                release, KeyedRNG.reproducible(5000 + r, warn=False), method=method
            ).estimates[0][0]
            for r in range(R)
        ]
    )
    if method == "cells":  # every (root, cell) sum is a set of the family
        _check_root(roots, est[0][0])
    else:  # the root total is
        _check_root(roots.sum(axis=1, keepdims=True), est[0][0].sum(keepdims=True))
