"""Builders: from_columns, from_gisjoin, from_edges, add_level, Hierarchy.subtree."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import HierarchyError
from censusdp.hierarchy import (
    Hierarchy,
    LevelSpec,
    add_level,
    from_columns,
    from_edges,
    from_gisjoin,
    validate,
)

COUNTIES = pd.DataFrame(
    {
        "fips": ["17031", "55025", "17001", "55001", "17003"],
        "pop": [5, 4, 3, 2, 1],
    }
)


def test_from_columns_prefix_levels_and_leaf_rows():
    h, leaf_row = from_columns(COUNTIES, [("state", "fips", 2), LevelSpec("county", "fips")])
    assert h.names == ("nation", "state", "county")
    assert h.sizes == (1, 2, 5)
    assert h["state"].codes.tolist() == ["17", "55"]
    assert h["county"].codes.tolist() == ["17001", "17003", "17031", "55001", "55025"]
    assert h["county"].parent.tolist() == [0, 0, 0, 1, 1]
    assert COUNTIES["fips"].to_numpy()[leaf_row].tolist() == h["county"].codes.tolist()
    assert h.levels[0].codes.tolist() == ["US"]
    validate(h, nesting="prefix")


def test_from_columns_aggregate_matches_groupby():
    h, leaf_row = from_columns(COUNTIES, [("state", "fips", 2), ("county", "fips")])
    states = h.aggregate(COUNTIES["pop"].to_numpy()[leaf_row])[1]
    want = COUNTIES.groupby(COUNTIES["fips"].str[:2])["pop"].sum()
    assert states.tolist() == want.loc[h["state"].codes.tolist()].tolist()


def test_from_columns_duplicates_first():
    df = pd.concat([COUNTIES, COUNTIES.iloc[[2]]], ignore_index=True)
    h, leaf_row = from_columns(df, [("state", "fips", 2), ("county", "fips")], duplicates="first")
    assert h.sizes == (1, 2, 5)
    assert leaf_row.tolist() == [2, 4, 0, 3, 1]


def test_from_gisjoin_cook_county():
    h, leaf_row = from_gisjoin(["G5500250", "G1700310", "G1700010"], ("state", "county"))
    assert h["state"].codes.tolist() == ["G170", "G550"]
    assert h["county"].codes.tolist() == ["G1700010", "G1700310", "G5500250"]
    assert leaf_row.tolist() == [2, 1, 0]
    validate(h, nesting="prefix")


def test_from_gisjoin_cousub_level():
    codes = ["G250001000000", "G250001003690", "G250003012345"]
    h, _ = from_gisjoin(codes)
    assert h.names == ("nation", "state", "county", "cousub")
    assert h.sizes == (1, 1, 2, 3)
    assert h["county"].codes.tolist() == ["G2500010", "G2500030"]


EDGES = [
    ("US", "IL", "state"),
    ("US", "WI", "state"),
    ("IL", "Cook", "county"),
    ("WI", "Dane", "county"),
    ("IL", "Adams", "county"),
]


def test_from_edges_inferred_and_given_levels_agree():
    h1, rows1 = from_edges(EDGES, root_name="nation")
    h2, rows2 = from_edges(
        pd.DataFrame(EDGES, columns=["parent", "child", "level"]),
        levels=["nation", "state", "county"],
    )
    assert h1 == h2
    assert h1.names == ("nation", "state", "county")
    assert h1["county"].codes.tolist() == ["Adams", "Cook", "Dane"]
    assert [r.tolist() for r in rows1] == [[-1], [0, 1], [4, 2, 3]]
    assert [r.tolist() for r in rows2] == [[-1], [0, 1], [4, 2, 3]]


def test_from_edges_codes_repeated_across_levels_with_levels():
    edges = [("US", "A", "state"), ("A", "A", "county"), ("A", "B", "county")]
    h, _ = from_edges(edges, levels=["nation", "state", "county"])
    assert h.sizes == (1, 1, 2)
    assert h["county"].codes.tolist() == ["A", "B"]


def test_add_level_append_and_realign():
    h, _ = from_edges(EDGES, root_name="nation")
    r = add_level(h, "tract", ["Cook", "Dane", "Adams", "Cook"], ["c2", "d1", "a1", "c1"])
    assert r.hierarchy.names == ("nation", "state", "county", "tract")
    assert r.hierarchy["tract"].codes.tolist() == ["a1", "c1", "c2", "d1"]
    assert r.order[-1].tolist() == [2, 3, 0, 1]
    for k in range(3):
        assert r.order[k].tolist() == list(range(h.levels[k].size))
    tract_values = np.array([10, 20, 30, 40])[r.order[-1]]
    agg = r.hierarchy.aggregate(tract_values)
    assert agg[2].tolist() == [30, 50, 20]  # Adams, Cook, Dane


def test_add_level_insert_between_levels_keeps_sums():
    h, _ = from_edges(EDGES, root_name="nation")
    county_values = np.array([7, 11, 13])  # Adams, Cook, Dane
    before = h.aggregate(county_values)
    r = add_level(
        h,
        "division",
        ["IL", "IL", "WI"],
        ["north", "south", "west"],
        below="state",
        children={"Cook": "north", "Adams": "south", "Dane": "west"},
    )
    h2 = r.hierarchy
    assert h2.names == ("nation", "state", "division", "county")
    validate(h2)
    after = h2.aggregate(county_values[r.order[-1]])
    assert after[0].tolist() == before[0].tolist()
    assert after[1].tolist() == before[1].tolist()
    assert after[2].tolist() == [11, 7, 13]  # north (Cook), south (Adams), west (Dane)


def test_add_level_insert_refuses_non_nesting_child():
    h, _ = from_edges(EDGES, root_name="nation")
    with pytest.raises(HierarchyError) as e:
        add_level(
            h,
            "division",
            ["IL", "WI"],
            ["north", "west"],
            below="state",
            children={"Cook": "north", "Adams": "west", "Dane": "west"},
        )
    assert "'Adams'" in str(e.value) and "'county'" in str(e.value)


def test_add_level_refuses_childless_parent():
    h, _ = from_edges(EDGES, root_name="nation")
    with pytest.raises(HierarchyError) as e:
        add_level(h, "tract", ["Cook", "Dane"], ["c1", "d1"])
    assert "'Adams'" in str(e.value) and "'county'" in str(e.value)


def test_subtree_slices_the_descendants():
    df = pd.DataFrame({"b": ["0100101", "0100102", "0100201", "0200101", "0200102"]})
    h, _ = from_columns(df, [("state", "b", 2), ("county", "b", 5), ("block", "b")])
    s = h.subtree("state", 0)
    assert s.names == ("state", "county", "block")
    assert s.sizes == (1, 2, 3)
    assert s["block"].codes.tolist() == ["0100101", "0100102", "0100201"]
    assert s["block"].parent.tolist() == [0, 0, 1]
    validate(s)
    leaf = h.subtree("county", 2)
    assert leaf.sizes == (1, 2) and leaf["block"].codes.tolist() == ["0200101", "0200102"]
    assert h.subtree("block", 3).sizes == (1,)


def test_hierarchy_equality_by_value():
    a = Hierarchy.from_parents(["n", "s"], [["US"], ["b", "a"]], [None, [0, 0]])
    b = Hierarchy.from_parents(["n", "s"], [["US"], ["a", "b"]], [None, [0, 0]])
    c = Hierarchy.from_parents(["n", "s"], [["US"], ["a", "c"]], [None, [0, 0]])
    assert a == b and a != c
