"""Unbiased dependent rounding: floor/ceil sums at every node, exact integer sums, E = x
(the bipartite mode's law: test_laminar_bipartite.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.estimation.integer.laminar import (
    pipage_round,
    round_tree,
    rounding_variance,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.rng import KeyedRNG


def tree_groups(h: Hierarchy, order: str, K: int) -> list[np.ndarray]:
    """The tree's laminar family as :func:`pipage_round` groups (cell-major or leaf-major)."""
    if order == "cells":  # items j * n_leaves + leaf
        groups = []
        for k in range(h.depth - 1, 0, -1):
            n_up = h.levels[k - 1].size
            par = h.levels[k].parent
            groups.append((np.arange(K)[:, None] * n_up + par[None, :]).reshape(-1))
        return groups
    n_leaves = h.leaves.size  # items leaf * K + j
    groups = [np.repeat(np.arange(n_leaves), K)]
    for k in range(h.depth - 1, 0, -1):
        groups.append(h.levels[k].parent)
    return groups


def zero_sum_within(groups: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``u`` minus its mean over each group (rows of ``u`` grouped by ``groups``)."""
    n = np.bincount(groups)
    return (
        u
        - (np.stack([np.bincount(groups, u[:, j]) for j in range(u.shape[1])], 1) / n[:, None])[
            groups
        ]
    )


def within(got: np.ndarray, real: np.ndarray) -> bool:
    return bool(np.all((got >= np.floor(real + 1e-9)) & (got <= np.ceil(real - 1e-9))))


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    gen = np.random.default_rng(seed)
    depth = draw(st.integers(2, 4))
    h = random_hierarchy(gen, [(1, 4)] * (depth - 1))
    K = draw(st.integers(1, 5))
    base = gen.integers(0, 20, size=(h.leaves.size, K)).astype(float)
    # level-1 node sums integer per cell (an invariant histogram), or per node total
    anc = h.ancestor_index(h.depth - 1, 1)
    per_cell = base + zero_sum_within(anc, gen.uniform(-0.9, 0.9, base.shape))
    tot = gen.uniform(-0.9, 0.9, base.shape)
    tot -= (np.bincount(anc, tot.sum(1)) / np.bincount(anc, np.full(anc.size, K)))[anc][:, None]
    per_total = base + tot
    return h, per_cell, per_total, seed


@settings(max_examples=100, deadline=None, derandomize=True)
@given(cases())
def test_tree_rounding_properties(case):
    h, per_cell, per_total, seed = case
    rng = KeyedRNG.reproducible(seed, warn=False)
    real = h.aggregate(per_cell)
    got = round_tree(h, per_cell, rng, mode="cells")
    for k in range(h.depth):
        assert got[k].dtype == np.int64
        assert within(got[k], real[k])
        if k <= 1:  # integer-valued sums are kept exactly
            assert np.array_equal(got[k], np.rint(real[k]).astype(np.int64))
    real = h.aggregate(per_total)
    got = round_tree(h, per_total, rng, mode="totals")
    assert within(got[-1], real[-1])
    for k in range(h.depth):
        assert within(got[k].sum(1), real[k].sum(1))
        if k <= 1:
            assert np.array_equal(got[k].sum(1), np.rint(real[k].sum(1)).astype(np.int64))


@pytest.mark.parametrize("mode", ["cells", "totals"])
def test_tree_rounding_unbiased_over_10000_repetitions(mode):
    gen = np.random.default_rng(1)
    h = random_hierarchy(gen, [(2, 3), (1, 4), (1, 3)])
    K = 3
    x = gen.uniform(-2, 8, size=(h.leaves.size, K))
    groups = tree_groups(h, mode, K)
    R = 10_000
    # R independent copies as one forest: copy r's groups are offset by r * (groups per copy)
    sizes = [int(g.max()) + 1 for g in groups]
    rep = np.arange(R)[:, None]
    forest = [(groups[0][None, :] + rep * sizes[0]).reshape(-1)]
    for g, s in zip(groups[1:], sizes[1:], strict=True):
        forest.append((g[None, :] + rep * s).reshape(-1))
    values = x.T.reshape(-1) if mode == "cells" else x.reshape(-1)
    out = pipage_round(
        np.tile(values, R), forest, KeyedRNG.reproducible(3, warn=False).generator("t")
    )
    out = out.reshape(R, -1)
    mean = out.mean(0)
    se = np.sqrt(rounding_variance(values) / R)
    live = se > 0
    assert np.all(np.abs(mean - values)[live] < 4 * se[live])
    assert np.all(out[:, ~live] == np.rint(values[~live]))
    assert np.all((out == np.floor(values)) | (out == np.ceil(values)))


def test_rounding_variance_is_p_one_minus_p():
    v = np.array([1.0, 2.25, -0.5, 3.9999999999])
    np.testing.assert_allclose(rounding_variance(v), [0.0, 0.1875, 0.25, 0.0])
    assert rounding_variance(np.linspace(-3, 3, 101)).max() <= 0.25
