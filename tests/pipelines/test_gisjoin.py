"""GISJOIN codes of every NHGIS summary level: layouts, parsing into FIPS parts, nesting of
the spine levels, and off-spine areas refused as hierarchy levels with what to do instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from censusdp.errors import DataError, SpecError
from censusdp.hierarchy import GISJOIN_LENGTHS, gisjoin
from censusdp.pipelines.data import load_data
from censusdp.pipelines.specs import parse_spec

# One real-shaped code per level and its parts (Cook County, Illinois; Los Angeles; the
# Acoma Pueblo area of the PPDD AIANHH file; ...).
EXAMPLES = {
    "state": ("G170", {"state": "17"}),
    "county": ("G1700310", {"state": "17", "county": "031"}),
    "cousub": ("G170031014000", {"state": "17", "county": "031", "cousub": "14000"}),
    "tract": ("G1700310010100", {"state": "17", "county": "031", "tract": "010100"}),
    "block_group": (
        "G17003100101001",
        {"state": "17", "county": "031", "tract": "010100", "block_group": "1"},
    ),
    "block": (
        "G17003100101001000",
        {"state": "17", "county": "031", "tract": "010100", "block": "1000"},
    ),
    "place": ("G06044000", {"state": "06", "place": "44000"}),
    "aianhh": ("G0010", {"aianhh": "0010"}),
    "sdelm": ("G06000001", {"state": "06", "sdelm": "00001"}),
    "sdsec": ("G06000002", {"state": "06", "sdsec": "00002"}),
    "sduni": ("G06022710", {"state": "06", "sduni": "22710"}),
    "sldu": ("G500A01", {"state": "50", "sldu": "A01"}),
    "sldl": ("G250013", {"state": "25", "sldl": "013"}),
    "cd": ("G06034", {"state": "06", "cd": "34"}),
}


def test_every_level_has_an_example_of_its_length() -> None:
    for lay in gisjoin.LAYOUTS:
        code, parts = EXAMPLES[lay.level]
        assert len(code) == lay.length, lay.level
        got = gisjoin.parse([code], lay.level)
        assert {k: v.tolist() for k, v in got.items()} == {k: [v] for k, v in parts.items()}


def test_spine_lengths_are_the_builders_lengths() -> None:
    assert GISJOIN_LENGTHS == {
        "state": 4, "county": 8, "cousub": 13, "tract": 14, "block_group": 15, "block": 18,
    }  # fmt: skip
    assert {lay.level for lay in gisjoin.LAYOUTS if not lay.on_spine} == {
        "place", "aianhh", "sdelm", "sdsec", "sduni", "sldu", "sldl", "cd",
    }  # fmt: skip


def test_aliases_name_the_same_layout() -> None:
    assert gisjoin.layout("blck_grp") is gisjoin.layout("block_group")
    assert gisjoin.layout("stleg_up").level == "sldu"
    with pytest.raises(SpecError, match="'zip' is not a GISJOIN summary level"):
        gisjoin.layout("zip")


@given(
    state=st.integers(0, 99),
    county=st.integers(0, 999),
    tract=st.integers(0, 999_999),
    block=st.integers(0, 9999),
)
def test_block_parts_round_trip(state: int, county: int, tract: int, block: int) -> None:
    """Against the obvious reference: the code is the parts zero-padded and joined."""
    code = f"G{state:02d}0{county:03d}0{tract:06d}{block:04d}"
    got = gisjoin.parse([code], "block")
    assert (got["state"][0], got["county"][0], got["tract"][0], got["block"][0]) == (
        f"{state:02d}", f"{county:03d}", f"{tract:06d}", f"{block:04d}",
    )  # fmt: skip
    # every spine level's code is a prefix of the block's
    for level, n in GISJOIN_LENGTHS.items():
        if level != "cousub":
            gisjoin.parse([code[:n]], level)


def test_a_place_code_given_as_a_county_says_what_it_is() -> None:
    """The issue's example: 'G06000135' was refused as 'not a GISJOIN code of level county'."""
    with pytest.raises(DataError) as err:
        gisjoin.parse(["G0100010", "G06000135"], "county", source="p.csv")
    msg = str(err.value)
    assert "p.csv, data row 2, column 'gisjoin'" in msg and "'G06000135'" in msg
    assert "layout of place" in msg and "block → place equivalency" in msg
    assert "8 characters" in msg


def test_a_lost_leading_zero_is_named() -> None:
    with pytest.raises(DataError, match=r"data row 5.*'G100030'.*leading zero was probably lost"):
        gisjoin.parse(["G100030"], "county", rows=[4])


@pytest.mark.parametrize("level", ["place", "aianhh", "sduni", "sldl", "cd", "stleg_up"])
def test_off_spine_levels_are_refused_in_a_hierarchy(level: str) -> None:
    with pytest.raises(SpecError) as err:
        gisjoin.check_hierarchy_levels(["state", level], "s.toml")
    msg = str(err.value)
    assert msg.startswith(f"s.toml: level '{level}'")
    assert "do not nest" in msg and "equivalency" in msg


def test_spine_levels_must_nest_in_order() -> None:
    assert [x.level for x in gisjoin.check_hierarchy_levels(["state", "county", "blck_grp"])] == [
        "state", "county", "block_group",
    ]  # fmt: skip
    with pytest.raises(SpecError, match="'tract' does not nest in 'cousub'"):
        gisjoin.check_hierarchy_levels(["county", "cousub", "tract"])
    with pytest.raises(SpecError, match="'state' does not nest in 'county'"):
        gisjoin.check_hierarchy_levels(["county", "state"])


def _spec(tmp_path: Path, levels: list[str], rows: str) -> tuple[object, Path]:
    data = tmp_path / "d.csv"
    data.write_text("gisjoin,A_sf\n" + rows)
    doc = {
        "data": {"source": "nhgis", "path": str(data), "cells": ["A"]},
        "hierarchy": {"levels": levels},
        "privacy": {"accounting": "zcdp", "rho": 1.0},
        "queries": {levels[-1]: ["total"]},
        "mechanism": {"noise": "discrete_gaussian"},
        "invariants": {levels[0]: "total"},
    }
    return parse_spec(doc, "s.toml", tmp_path), data


def test_nhgis_source_refuses_a_place_level_and_reads_block_groups(tmp_path: Path) -> None:
    spec, _ = _spec(tmp_path, ["nation", "state", "place"], "G06044000,5\n")
    with pytest.raises(SpecError, match=r"hierarchy.levels: level 'place': places .* equivalency"):
        load_data(spec)
    rows = "G01000100201001,3\nG01000100201002,4\nG01000300010001,5\n"
    spec, _ = _spec(tmp_path, ["nation", "state", "county", "tract", "blck_grp"], rows)
    h = load_data(spec).table.hierarchy
    assert h.names == ("nation", "state", "county", "tract", "blck_grp")
    assert h["tract"].codes.tolist() == ["G0100010020100", "G0100030001000"]


def test_nhgis_source_names_a_place_file_read_as_counties(tmp_path: Path) -> None:
    spec, _ = _spec(tmp_path, ["nation", "state", "county"], "G0100010,1\nG06000135,2\n")
    with pytest.raises(DataError) as err:
        load_data(spec)
    msg = str(err.value)
    assert re.search(r"d.csv, data row 2, column 'gisjoin': 'G06000135'", msg)
    assert "layout of place" in msg
