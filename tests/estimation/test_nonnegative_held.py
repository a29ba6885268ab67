"""The non-negative product with held cells (structural zeros): held cells are exactly 0,
children sum to parents, even where the totals pass alone would leave a parent's cell with
no child that may hold it."""

from __future__ import annotations

import numpy as np

from censusdp.estimation.integer.nonnegative import nonnegative_top
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema


def test_a_cell_only_one_child_may_hold_goes_there():
    s = Schema.load("sex_age5")
    K = s.n_cells
    h = Hierarchy.from_parents(["r", "c"], [["r"], ["a", "b", "c"]], [None, np.zeros(3, np.int64)])
    root = np.zeros(K)
    root[0], root[1] = 5.0, 20.0  # cell 0 (5 persons) may only be held by child "a"
    kids = np.zeros((3, K))
    kids[0, 0], kids[0, 1] = 1.0, -4.0  # "a": its total estimate −3 → the totals pass gives 0
    kids[1, 0], kids[1, 1] = 4.0, 15.0  # "b": holds cell 0 at zero (its 4 is noise)
    kids[2, 1] = 9.0
    held = [np.zeros((1, K), bool), np.zeros((3, K), bool)]
    held[1][1:, 0] = True
    inv = [ProductInvariant("r", ProductQuery.parse(s, "total"), np.array([[25]]))]
    for seed in range(5):
        c = nonnegative_top(h, s, [root.reshape(1, *s.shape), kids.reshape(3, *s.shape)],
                            KeyedRNG.reproducible(seed, warn=False), invariants=inv,
                            held=held).counts  # fmt: skip
        leaves = c[1].reshape(3, K)
        assert leaves.min() >= 0 and np.all(leaves[held[1]] == 0)
        assert np.array_equal(leaves.sum(axis=0), c[0].reshape(K))
        assert leaves[0, 0] == 5 and int(c[0].sum()) == 25
    # without the held cells the same estimates put persons where they cannot be
    free = nonnegative_top(h, s, [root.reshape(1, *s.shape), kids.reshape(3, *s.shape)],
                           KeyedRNG.reproducible(0, warn=False), invariants=inv).counts  # fmt: skip
    assert free[1].reshape(3, K)[1:, 0].sum() > 0
