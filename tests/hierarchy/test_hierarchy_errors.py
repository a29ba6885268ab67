"""Malformed hierarchies and tables: the right error type, naming code/level/row/column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy import (
    Hierarchy,
    Level,
    Table,
    add_level,
    check_additive,
    check_leaf_data,
    from_columns,
    from_edges,
    from_gisjoin,
    parse_level_spec,
    validate,
)


def raises(exc: type[Exception], fn, *args, **kwargs) -> str:
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc
    return str(info.value)


STATES = [("US", "IL", "state"), ("US", "WI", "state")]


def test_cycle():
    edges = [
        *STATES,
        ("IL", "Cook", "county"),
        ("Kane", "Lake", "county"),
        ("Lake", "Kane", "county"),
    ]
    msg = raises(HierarchyError, from_edges, edges)
    assert "cycle" in msg and "'Lake'" in msg and "'Kane'" in msg and "county" in msg


def test_cycle_without_any_root():
    msg = raises(HierarchyError, from_edges, [("A", "B", "x"), ("B", "A", "x")])
    assert "cycle" in msg and "'A'" in msg and "'x'" in msg


def test_two_parents():
    edges = [*STATES, ("IL", "Lake", "county"), ("WI", "Lake", "county")]
    msg = raises(HierarchyError, from_edges, edges)
    assert "two parents" in msg and "'Lake'" in msg and "'county'" in msg
    assert "'IL'" in msg and "'WI'" in msg


def test_orphan_inferred_and_with_levels():
    edges = [*STATES, ("IL", "Cook", "county"), ("IL", "Lake", "county"), ("XX", "Dane", "county")]
    msg = raises(HierarchyError, from_edges, edges)
    assert "orphan" in msg and "'Dane'" in msg and "'county'" in msg and "'XX'" in msg
    msg = raises(HierarchyError, from_edges, edges, levels=["nation", "state", "county"])
    assert "orphan" in msg and "'Dane'" in msg and "'county'" in msg and "'state'" in msg


def test_duplicate_code_within_level():
    h = Hierarchy.from_parents(
        ["nation", "state", "county"], [["US"], ["A", "B"], ["x", "x"]], [None, [0, 0], [0, 1]]
    )
    msg = raises(HierarchyError, validate, h)
    assert "'x'" in msg and "'county'" in msg and "twice" in msg


def test_duplicate_leaf_rows():
    df = pd.DataFrame({"fips": ["17031", "17001", "17031"]})
    msg = raises(DataError, from_columns, df, [("state", "fips", 2), ("county", "fips")])
    assert "'17031'" in msg and "'county'" in msg and "rows 1 and 3" in msg


def test_repeated_edge():
    msg = raises(HierarchyError, from_edges, [*STATES, ("IL", "Cook", "county")] * 2)
    assert "repeats" in msg and "'IL'" in msg and "'state'" in msg


def test_empty_level():
    def lv(name, codes, parent):
        n = len(codes)
        z = np.zeros(n, np.int64)
        return Level(
            name,
            np.asarray(codes, dtype=np.dtypes.StringDType()),
            np.asarray(parent, np.int64),
            z,
            z,
        )

    h = Hierarchy([lv("nation", ["US"], [-1]), lv("state", [], [])])
    msg = raises(HierarchyError, validate, h)
    assert "'state'" in msg and "empty" in msg
    msg = raises(HierarchyError, from_edges, STATES, levels=["nation", "state", "county"])
    assert "'county'" in msg and "empty" in msg


def test_codes_that_do_not_nest_from_columns():
    df = pd.DataFrame({"state": ["17", "55", "17"], "county": ["001", "001", "003"]})
    msg = raises(HierarchyError, from_columns, df, [("state", "state"), ("county", "county")])
    assert "'001'" in msg and "'county'" in msg and "'17'" in msg and "'55'" in msg
    assert "data row 1" in msg and "data row 2" in msg


def test_codes_that_do_not_nest_prefix_check():
    df = pd.DataFrame({"state": ["17", "55"], "county": ["17001", "17003"]})
    h, _ = from_columns(df, [("state", "state"), ("county", "county")])
    validate(h)  # structurally fine
    msg = raises(HierarchyError, validate, h, nesting="prefix")
    assert "'17003'" in msg and "'county'" in msg and "'55'" in msg


def test_non_leaf_node_without_children():
    h = Hierarchy.from_parents(
        ["nation", "state", "county"], [["US"], ["A", "B"], ["a1"]], [None, [0, 0], [0]]
    )
    msg = raises(HierarchyError, validate, h)
    assert "'B'" in msg and "'state'" in msg and "no children" in msg


def test_leaf_without_data():
    h, _ = from_columns(
        pd.DataFrame({"c": ["17001", "17003"]}), [("state", "c", 2), ("county", "c")]
    )
    msg = raises(HierarchyError, check_leaf_data, h, ["17001"], source="f.csv")
    assert "'17003'" in msg and "'county'" in msg and "no data row" in msg
    msg = raises(HierarchyError, check_leaf_data, h, ["17001", "17003", "99999"], source="f.csv")
    assert "data row 3" in msg and "'99999'" in msg and "f.csv" in msg


def test_parent_not_sum_of_children():
    h, _ = from_columns(
        pd.DataFrame({"c": ["17001", "17003", "55001"]}), [("state", "c", 2), ("county", "c")]
    )
    counts = np.array([[3, 4], [5, 6], [7, 8]], dtype=np.int64)
    levels = h.aggregate(counts)
    check_additive(h, levels)
    levels[1] = levels[1].copy()
    levels[1][1, 1] += 1  # state 55, cell 1
    msg = raises(HierarchyError, check_additive, h, levels, cells=["a", "b"])
    assert "'55'" in msg and "'state'" in msg and "'b'" in msg
    assert not any(str(v) in msg for v in (8, 9))  # no counts in the message


@pytest.mark.parametrize(
    ("value", "what"),
    [(-4, "negative"), (np.nan, "missing"), (2.5, "not an integer"), ("abc", "not a number")],
)
def test_bad_counts(value, what):
    df = pd.DataFrame(
        {"fips": ["17001", "17003", "17005"], "pop": pd.Series([31, 47, 53], dtype=object)}
    )
    df.loc[1, "pop"] = value
    if not isinstance(value, str):
        df["pop"] = pd.to_numeric(df["pop"])
    msg = raises(
        DataError,
        Table.from_frame,
        df,
        [("state", "fips", 2), ("county", "fips")],
        "pop",
        source="x.csv",
    )
    assert what in msg and "data row 2" in msg and "'pop'" in msg and "x.csv" in msg
    assert str(value) not in msg or isinstance(value, float) and np.isnan(value)


def test_missing_columns():
    df = pd.DataFrame({"fips": ["17001"], "pop": [1]})
    msg = raises(
        DataError,
        Table.from_frame,
        df,
        [("state", "st"), ("county", "fips")],
        "pop",
        source="x.csv",
    )
    assert "'st'" in msg and "'state'" in msg and "x.csv" in msg
    msg = raises(DataError, Table.from_frame, df, [("county", "fips")], ["M_*"], source="x.csv")
    assert "'M_*'" in msg and "x.csv" in msg


def test_missing_code_and_numeric_code_column():
    df = pd.DataFrame({"fips": ["17001", None]})
    msg = raises(DataError, from_columns, df, [("county", "fips")])
    assert "data row 2" in msg and "'fips'" in msg
    msg = raises(DataError, from_columns, pd.DataFrame({"fips": [17001]}), [("state", "fips", 2)])
    assert "'fips'" in msg and "numeric" in msg


@pytest.mark.parametrize("bad", ["G17003100", "1700310", "G1710310", "G17003X0", "G1700311"])
def test_bad_gisjoin(bad):
    msg = raises(DataError, from_gisjoin, ["G1700010", bad], ("state", "county"))
    assert "row 2" in msg and repr(bad) in msg and "'county'" in msg


def test_bad_level_spec_and_unknown_gisjoin_level():
    assert raises(HierarchyError, parse_level_spec, "state") and "'state'" in raises(
        HierarchyError, parse_level_spec, "state"
    )
    assert "'zip'" in raises(HierarchyError, from_gisjoin, ["G1700010"], ("state", "zip"))


def test_add_level_orphan_and_duplicate():
    h, _ = from_columns(pd.DataFrame({"c": ["17001"]}), [("county", "c")])
    msg = raises(HierarchyError, add_level, h, "tract", ["17009"], ["t1"])
    assert "'t1'" in msg and "'17009'" in msg and "orphan" in msg and "'county'" in msg
    msg = raises(HierarchyError, add_level, h, "tract", ["17001", "17001"], ["t1", "t1"])
    assert "'t1'" in msg and "'tract'" in msg
