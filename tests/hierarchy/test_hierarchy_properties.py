"""Hypothesis properties: canonical order, aggregation, storage, subtrees."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import censusdp.hierarchy.core as core
from censusdp.errors import CensusDPError, HierarchyError
from censusdp.hierarchy import (
    Hierarchy,
    Table,
    as_codes,
    from_columns,
    load_hierarchy,
    load_table,
    save_hierarchy,
    save_table,
    validate,
)
from censusdp.hierarchy.core import _canonical_order

CODE = st.text("ab01Z", min_size=1, max_size=4)


@st.composite
def trees(draw):
    """Rows = root-to-leaf code paths of a random tree (codes unique within a level)."""
    depth = draw(st.integers(1, 3))
    n = draw(st.integers(1, 5))
    codes = draw(st.lists(CODE, min_size=n, max_size=n, unique=True))
    paths = [(c,) for c in codes]
    for _ in range(depth - 1):
        fan = [draw(st.integers(1, 3)) for _ in paths]
        codes = draw(st.lists(CODE, min_size=sum(fan), max_size=sum(fan), unique=True))
        it = iter(codes)
        paths = [p + (next(it),) for p, f in zip(paths, fan, strict=True) for _ in range(f)]
    df = pd.DataFrame(paths, columns=[f"l{k}" for k in range(depth)]).astype("str")
    df["x"] = draw(st.lists(st.integers(0, 50), min_size=len(df), max_size=len(df)))
    df["y"] = draw(st.lists(st.integers(0, 50), min_size=len(df), max_size=len(df)))
    return df


def _levels(df):
    return [(c, c) for c in df.columns if c.startswith("l")]


@settings(max_examples=60, deadline=None)
@given(trees(), st.data())
def test_from_columns_canonical_under_row_permutation(df, data):
    perm = data.draw(st.permutations(range(len(df))))
    shuffled = df.iloc[list(perm)].reset_index(drop=True)
    h1, r1 = from_columns(df, _levels(df))
    h2, r2 = from_columns(shuffled, _levels(df))
    validate(h1)
    assert h1 == h2
    for lv in h1.levels:  # canonical = sorted by (parent, code)
        assert np.array_equal(np.lexsort((lv.codes, lv.parent)), np.arange(lv.size))
    leaf_col = _levels(df)[-1][1]
    assert df[leaf_col].to_numpy()[r1].tolist() == h1.leaves.codes.tolist()
    assert shuffled[leaf_col].to_numpy()[r2].tolist() == h1.leaves.codes.tolist()


@settings(max_examples=60, deadline=None)
@given(trees(), st.data())
def test_from_parents_canonical_under_permutation(df, data):
    h, _ = from_columns(df, _levels(df))
    names, codes, parents = [h.names[0]], [h.levels[0].codes], [None]
    inv_prev = np.zeros(1, np.int64)
    for lv in h.levels[1:]:
        perm = np.asarray(data.draw(st.permutations(range(lv.size))), dtype=np.int64)
        names.append(lv.name)
        codes.append(lv.codes[perm])
        parents.append(inv_prev[lv.parent[perm]])
        inv_prev = np.empty_like(perm)
        inv_prev[perm] = np.arange(perm.size)
    h2, orders = Hierarchy.from_parents(names, codes, parents, return_order=True)
    assert h2 == h
    for k in range(1, h.depth):
        assert codes[k][orders[k]].tolist() == h.levels[k].codes.tolist()


@settings(max_examples=60, deadline=None)
@given(trees())
def test_aggregate_equals_brute_force_dict_sums(df):
    levels = _levels(df)
    t = Table.from_frame(df, levels, ["x", "y"])
    agg = t.all_levels()
    assert agg[0].tolist() == [[int(df["x"].sum()), int(df["y"].sum())]]
    for k, (name, _) in enumerate(levels, start=1):
        sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        for row in df.itertuples(index=False):
            d = row._asdict()
            key = tuple(d[c] for _, c in levels[:k])
            sums[key][0] += d["x"]
            sums[key][1] += d["y"]
        h = t.hierarchy
        anc = [h.levels[j].codes[h.ancestor_index(k, j)] for j in range(1, k + 1)]
        keys = list(zip(*[a.tolist() for a in anc], strict=True))
        assert agg[k].tolist() == [sums[key] for key in keys]
        assert len(keys) == len(sums)
        assert np.array_equal(t.level_counts(name), agg[k])


@settings(max_examples=25, deadline=None)
@given(trees())
def test_storage_round_trip(df):
    t = Table.from_frame(df, _levels(df), ["x", "y"])
    with tempfile.TemporaryDirectory() as d:
        for suffix in (".npz", ".parquet"):
            assert (
                load_hierarchy(save_hierarchy(t.hierarchy, Path(d) / f"h{suffix}")) == t.hierarchy
            )
            back = load_table(save_table(t, Path(d) / f"t{suffix}"))
            assert back.hierarchy == t.hierarchy
            assert np.array_equal(back.leaf_counts, t.leaf_counts)


@settings(max_examples=40, deadline=None)
@given(trees(), st.data())
def test_subtree_matches_descendant_ranges(df, data):
    h, _ = from_columns(df, _levels(df))
    k = data.draw(st.integers(0, h.depth - 1))
    node = data.draw(st.integers(0, h.levels[k].size - 1))
    s = h.subtree(k, node)
    validate(s)
    for d, lv in enumerate(s.levels):
        lo, hi = h.descendant_range(k, node, k + d)
        assert lv.codes.tolist() == h.levels[k + d].codes[lo:hi].tolist()
        if d:
            assert (lv.parent + h.descendant_range(k, node, k + d - 1)[0]).tolist() == h.levels[
                k + d
            ].parent[lo:hi].tolist()
    assert s.depth == h.depth - k


@pytest.mark.parametrize("int_sort_min", [2, 1 << 30])  # integer-word sort / string sort
@settings(max_examples=100, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 3), st.text("ab01Zé\u00ff\u4e00", max_size=18))))
def test_canonical_order_equals_lexsort(int_sort_min, pairs):
    parent = np.array([p for p, _ in pairs], dtype=np.int64)
    codes = as_codes([c for _, c in pairs])

    def order(c, p):
        o = _canonical_order(c, p)
        return np.arange(c.size) if o is None else o

    want = np.lexsort((codes, parent))
    with patch.object(core, "INT_SORT_MIN", int_sort_min):
        assert np.array_equal(order(codes, parent), want)
        assert _canonical_order(codes[want], parent[want]) is None or len(set(pairs)) < len(pairs)


@settings(max_examples=80, deadline=None)
@given(trees())
def test_prefix_nesting_check_equals_brute_force(df):
    levels = _levels(df)
    # make most codes nest by prefixing the parent's code; keep some raw codes
    for k in range(1, len(levels)):
        col, up = levels[k][1], levels[k - 1][1]
        nest = df[col].str.len() % 2 == 0
        df.loc[nest, col] = df.loc[nest, up] + df.loc[nest, col]
    try:
        h, _ = from_columns(df, levels)
    except CensusDPError:  # prefixing can create duplicate or non-nesting codes
        return
    brute = all(
        str(c).startswith(str(h.levels[k - 1].codes[p]))
        for k in range(2, h.depth)
        for c, p in zip(h.levels[k].codes, h.levels[k].parent, strict=True)
    )
    if brute:
        validate(h, nesting="prefix")
    else:
        with pytest.raises(HierarchyError, match="do not nest"):
            validate(h, nesting="prefix")
