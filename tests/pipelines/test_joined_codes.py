"""Level codes joined from several columns (``county = ["state_fips", "county_fips"]``):
zero-padding, declared widths, nesting checked with file, row, column and level named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from censusdp.errors import DataError, SpecError
from censusdp.pipelines.data import load_data
from censusdp.pipelines.spec import CodeSpec
from censusdp.pipelines.specs import load_spec, parse_spec

SPECS = Path(__file__).parents[1] / "core" / "specs"
ROWS = "state_fips,county_fips,employed,unemployed\n1,1,10,2\n1,3,20,3\n6,37,30,4\n"


def _spec_dir(tmp_path: Path, rows: str = ROWS) -> Path:
    shutil.copy(SPECS / "joined_codes.toml", tmp_path / "s.toml")
    (tmp_path / "labour_force.csv").write_text(rows)
    return tmp_path / "s.toml"


def test_the_fixture_parses_into_joined_code_specs(tmp_path: Path) -> None:
    spec = load_spec(_spec_dir(tmp_path))
    assert spec.hierarchy.codes == {
        "state": CodeSpec("state_fips", None, ("state_fips",), (2,)),
        "county": CodeSpec("state_fips+county_fips", None, ("state_fips", "county_fips"), (2, 3)),
    }
    assert str(spec.hierarchy.codes["county"]) == "state_fips:2+county_fips:3"
    assert spec.to_dict()["hierarchy"]["codes"]["state"] == "state_fips:2"


def test_codes_are_zero_padded_and_joined(tmp_path: Path) -> None:
    table = load_data(load_spec(_spec_dir(tmp_path))).table
    h = table.hierarchy
    assert h["state"].codes.tolist() == ["01", "06"]
    assert h["county"].codes.tolist() == ["01001", "01003", "06037"]
    assert table.cells == ("employed", "unemployed")  # the code columns are not cells
    assert table.leaf_counts.tolist() == [[10, 2], [20, 3], [30, 4]]


def test_widths_from_the_data_pad_to_the_widest_value(tmp_path: Path) -> None:
    rows = "state_fips,county_fips,employed,unemployed\n1,1,1,1\n17,31,1,1\n"
    path = _spec_dir(tmp_path, rows)
    text = path.read_text().replace(
        'codes.county = { columns = ["state_fips", "county_fips"], widths = [2, 3] }',
        'codes.county = ["state_fips", "county_fips"]',
    )
    text = text.replace(
        'codes.state = { columns = ["state_fips"], widths = [2] }', 'codes.state = ["state_fips"]'
    )
    path.write_text(text)
    h = load_data(load_spec(path)).table.hierarchy
    assert h["state"].codes.tolist() == ["01", "17"]
    assert h["county"].codes.tolist() == ["0101", "1731"]  # county width 2: the widest seen


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ("1,1234,1,1\n", ["data row 1", "column 'county_fips'", "'1234'", "level 'county'",
                          "declared width 3"]),
        ("1,,1,1\n", ["data row 1", "column 'county_fips'", "missing code", "'county'"]),
    ],
)  # fmt: skip
def test_bad_joined_codes_name_file_row_column_and_level(
    tmp_path: Path, rows: str, words: list[str]
) -> None:
    path = _spec_dir(tmp_path, "state_fips,county_fips,employed,unemployed\n" + rows)
    with pytest.raises(DataError) as err:
        load_data(load_spec(path))
    msg = str(err.value)
    assert msg.startswith("labour_force.csv")
    for w in words:
        assert w in msg, msg


def test_a_joined_code_must_extend_its_parent(tmp_path: Path) -> None:
    path = _spec_dir(tmp_path)
    path.write_text(
        path.read_text().replace(
            '["state_fips", "county_fips"], widths', '["county_fips", "state_fips"], widths'
        )
    )
    with pytest.raises(DataError) as err:
        load_data(load_spec(path))
    msg = str(err.value)
    assert "data row 2, columns ['county_fips', 'state_fips']" in msg
    assert "'03001' of level 'county' does not extend the code '01' of level 'state'" in msg


@pytest.mark.parametrize(
    ("codes", "key"),
    [
        ({"state": []}, "hierarchy.codes.state"),
        ({"state": ["a", "a"]}, "hierarchy.codes.state"),
        ({"state": [1]}, "hierarchy.codes.state[0]"),
        ({"state": {"columns": ["a", "b"], "widths": [2]}}, "hierarchy.codes.state.widths"),
        ({"state": {"columns": ["a"], "widths": [0]}}, "hierarchy.codes.state.widths"),
        ({"state": {"columns": ["a"], "width": [2]}}, "hierarchy.codes.state.width"),
        ({"state": {"widths": [2]}}, "hierarchy.codes.state.columns"),
    ],
)
def test_malformed_joined_code_specs_name_the_key(codes: dict, key: str) -> None:
    doc = {
        "data": {"source": "csv", "path": "x.csv", "cells": ["a"]},
        "hierarchy": {"levels": ["nation", "state"], "codes": codes},
        "privacy": {"accounting": "zcdp", "rho": 1.0},
        "queries": {"state": ["total"]},
        "invariants": {"nation": "total"},
        "mechanism": {"noise": "discrete_gaussian"},
    }
    with pytest.raises(SpecError) as err:
        parse_spec(doc, "s.toml")
    assert key in str(err.value), str(err.value)
