"""Table: from_frame, cells by glob, level counts, midwest, subset_cells."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError
from censusdp.hierarchy import MIDWEST_CELLS, Table, check_additive, validate

FRAME = pd.DataFrame(
    {
        "fips": ["55025", "17031", "17001"],
        "name": ["Dane", "Cook", "Adams"],
        "M_0-4": [1, 2, 3],
        "F_0-4": [4, 5, 6],
        "M_5-9": [7, 8, 9],
        "other": [0, 0, 0],
    }
)
LEVELS = [("state", "fips", 2), ("county", "fips")]


def test_from_frame_globs_keep_file_order_and_align_rows():
    t = Table.from_frame(FRAME, LEVELS, ["M_*", "F_*"], source="f.csv")
    assert t.cells == ("M_0-4", "M_5-9", "F_0-4")
    assert t.hierarchy["county"].codes.tolist() == ["17001", "17031", "55025"]
    assert t.leaf_counts.dtype == np.int64
    assert t.leaf_counts.tolist() == [[3, 9, 6], [2, 8, 5], [1, 7, 4]]
    assert (t.n_leaves, t.n_cells) == (3, 3)


def test_level_counts_all_levels_total():
    t = Table.from_frame(FRAME, LEVELS, ["M_*", "F_*"])
    assert t.level_counts("state").tolist() == [[5, 17, 11], [1, 7, 4]]
    assert t.level_counts("nation").tolist() == [[6, 24, 15]]
    assert t.level_counts(-1).tolist() == t.leaf_counts.tolist()
    levels = t.all_levels()
    assert [lv.tolist() for lv in levels[:2]] == [
        t.level_counts(0).tolist(),
        t.level_counts(1).tolist(),
    ]
    check_additive(t.hierarchy, levels, cells=t.cells)
    assert t.total == 45
    assert t.cell_totals.tolist() == [6, 24, 15]


def test_subset_cells_and_to_frame():
    t = Table.from_frame(FRAME, LEVELS, ["M_*", "F_*"])
    s = t.subset_cells(["F_0-4", "M_0-4"])
    assert s.cells == ("F_0-4", "M_0-4")
    assert s.leaf_counts.tolist() == [[6, 3], [5, 2], [4, 1]]
    assert s.hierarchy is t.hierarchy
    f = t.to_frame("state")
    assert f["code"].tolist() == ["17", "55"]
    assert f["M_5-9"].tolist() == [17, 7]
    with pytest.raises(DataError, match="'X_\\*'"):
        t.subset_cells("X_*")


def test_string_count_columns_are_accepted():
    df = FRAME.astype({"M_0-4": str})
    t = Table.from_frame(df, LEVELS, "M_0-4")
    assert t.leaf_counts[:, 0].tolist() == [3, 2, 1]


def test_constructor_checks_shape_and_sign():
    t = Table.from_frame(FRAME, LEVELS, "M_0-4")
    with pytest.raises(DataError, match="shape"):
        Table(t.hierarchy, ("a", "b"), t.leaf_counts)
    with pytest.raises(DataError, match="'17031'.*'a'"):
        Table(t.hierarchy, ("a",), np.array([[1], [-1], [2]]))


#: Totals by state (IL, IN, MI, OH, WI) of the five race columns of ggplot2's ``midwest``,
#: as distributed by plotnine 0.15.9 (``plotnine.data.midwest``), the source of the packaged CSV.
MIDWEST_STATE_TOTALS = [
    [8952978, 1694273, 21836, 285311, 476204],
    [5020700, 432092, 12720, 37617, 41030],
    [7756086, 1291706, 55638, 104983, 86884],
    [9521756, 1154826, 20358, 91179, 58996],
    [4512523, 244539, 39387, 53583, 41737],
]


def test_midwest():
    t = Table.from_midwest()
    assert t.hierarchy.sizes == (1, 5, 437)
    assert t.cells == MIDWEST_CELLS
    assert t.hierarchy["state"].codes.tolist() == ["IL", "IN", "MI", "OH", "WI"]
    assert "IL-ADAMS" in t.hierarchy["county"].codes.tolist()
    validate(t.hierarchy, nesting="prefix")
    assert t.level_counts("state").tolist() == MIDWEST_STATE_TOTALS
    assert t.total == 42_008_942
    # a county of the source: Adams, IL
    adams = t.hierarchy["county"].codes.tolist().index("IL-ADAMS")
    assert t.leaf_counts[adams].tolist() == [63917, 1702, 98, 249, 124]


def test_midwest_csv_is_the_documented_file():
    """The packaged CSV is byte for byte the file whose provenance and SHA-256 the README
    beside it records."""
    import hashlib
    import re
    from importlib import resources

    data = resources.files("censusdp").joinpath("data")
    digest = hashlib.sha256(data.joinpath("midwest.csv").read_bytes()).hexdigest()
    note = data.joinpath("README.md").read_text(encoding="utf-8")
    recorded = re.search(r"SHA-256: `([0-9a-f]{64})`", note)
    assert recorded is not None
    assert digest == recorded.group(1)
    assert "MIT" in note and "2000 U.S. decennial census" in note
