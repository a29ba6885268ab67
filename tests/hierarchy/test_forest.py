"""Forest (hierarchy/forest.py): a run of subtrees with local indices adds as the hierarchy."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.hierarchy.synthetic import random_hierarchy


def _run(h, first: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Nested node ranges of the subtrees of nodes ``[lo, hi)`` of level ``first``."""
    ranges = [(lo, hi)]
    for k in range(first + 1, h.depth):
        a = h.descendant_range(first, lo, k)[0]
        b = h.descendant_range(first, hi - 1, k)[1]
        ranges.append((a, b))
    return ranges


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    first=st.integers(0, 2),
    ends=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2),
)
def test_a_run_of_subtrees_adds_and_indexes_as_the_hierarchy(seed, first, ends):
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(1, 4), (1, 4), (1, 4)])
    n = h.sizes[first]
    a, b = sorted(int(round(e * (n - 1))) for e in ends)
    ranges = _run(h, first, a, b + 1)
    f = Forest.of(h, first, ranges)
    assert f.depth == h.depth - first
    assert f.sizes == tuple(hi - lo for lo, hi in ranges)
    leaf = gen.integers(-5, 6, size=(h.sizes[-1], 3))
    whole = h.aggregate(leaf)
    lo, hi = ranges[-1]
    mine = f.aggregate(leaf[lo:hi])
    for j, (lo_j, hi_j) in enumerate(ranges):
        assert np.array_equal(mine[j], whole[first + j][lo_j:hi_j])  # exact integer sums
    for j in range(f.depth - 1):
        lv, (lo_j, _), (lo_c, _) = h.levels[first + j], ranges[j], ranges[j + 1]
        assert np.array_equal(f.child_start(j), lv.child_start[lo_j : lo_j + f.sizes[j]] - lo_c)
        assert np.array_equal(
            f.parent(j + 1), h.levels[first + j + 1].parent[lo_c:][: f.sizes[j + 1]] - lo_j
        )
        ones = np.ones((1, 2))
        assert np.array_equal(
            f.sum_children(j, ones, shared=True),
            f.sum_children(j, np.ones((f.sizes[j + 1], 2))),
        )


def test_whole_forest_pickles_without_its_cache_and_names_nodes():
    h = random_hierarchy(np.random.default_rng(3), [(2, 3), (1, 2)])
    f = whole_forest(h)
    f.parent(1)  # fill the cache
    g = pickle.loads(pickle.dumps(f))
    assert (g.first, g.names, g.sizes) == (f.first, f.names, f.sizes)
    assert all(np.array_equal(x, y) for x, y in zip(g.child_count, f.child_count, strict=True))
    assert g._cache == {}
    assert f.code(1, 0) == str(h.levels[1].codes[0])
    assert f.without_codes().code(1, 0) == "#0"


def test_estimation_gls_re_exports_the_forest_for_one_release():
    import censusdp.estimation.gls.tree as gls

    assert gls.Forest is Forest and gls.whole_forest is whole_forest
