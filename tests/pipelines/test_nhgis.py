"""NHGIS-style batch files: layouts, encodings, malformed input, round trips."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError
from censusdp.pipelines.io.nhgis import read_batch, write_batch

WIDE = "gisjoin,name,state,A1_dp,A2_dp,A1_sf,A2_sf\nG0100010,Autauga,1,5,6,4,7\nG0100030,Baldwin,1,9,0,10,1\n"


def _write(tmp_path, text, name="f.csv", encoding="utf-8"):
    p = tmp_path / name
    p.write_bytes(text.encode(encoding))
    return p


def test_wide_layout_reads_sf_as_truth_and_writes_dp_and_se(tmp_path):
    b = read_batch(_write(tmp_path, WIDE))
    assert (b.layout, b.cells, b.key_columns) == (
        "wide",
        ["A1", "A2"],
        ["gisjoin", "name", "state"],
    )
    assert b.truth.tolist() == [[4, 7], [10, 1]]
    out = write_batch(
        b, np.array([[1.0, 2.0], [3.0, 4.0]]), np.full((2, 2), 0.5), tmp_path / "o.csv"
    )
    got = pd.read_csv(out, dtype=str)
    assert list(got.columns) == ["gisjoin", "name", "state", "A1_dp", "A1_se", "A2_dp", "A2_se"]
    assert got["gisjoin"].tolist() == ["G0100010", "G0100030"]
    assert not any(c.endswith("_sf") for c in got.columns)  # the confidential input never leaves


def test_long_layout_uses_sf_version_and_keeps_leading_zeros(tmp_path):
    text = "gisjoin,fips,version,M,F\nG0100010,01001,sf2010,1,2\nG0100010,01001,ddp,3,4\n"
    b = read_batch(_write(tmp_path, text))
    assert (b.layout, b.cells, b.truth.tolist()) == ("long", ["M", "F"], [[1, 2]])
    out = write_batch(b, np.array([[1.5, 2.5]]), None, tmp_path / "o.csv")
    got = pd.read_csv(out, dtype=str)
    assert got.loc[0, "fips"] == "01001" and got.loc[0, "version"] == "censusdp"


def test_latin1_is_detected(tmp_path):
    text = WIDE.replace("Autauga", "Doña Ana")
    b = read_batch(_write(tmp_path, text, encoding="latin-1"))
    assert b.encoding == "latin-1"
    assert "Doña Ana" in b.frame["name"].tolist()
    out = write_batch(b, b.truth.astype(float), None, tmp_path / "o.csv")
    assert "Doña Ana".encode("latin-1") in out.read_bytes()


def test_parquet_round_trip(tmp_path):
    src = pd.read_csv(_write(tmp_path, WIDE), dtype=str)
    src.to_parquet(tmp_path / "f.parquet")
    b = read_batch(tmp_path / "f.parquet")
    assert b.truth.tolist() == [[4, 7], [10, 1]]
    out = write_batch(b, b.truth.astype(float), None, tmp_path / "o.parquet")
    assert pd.read_parquet(out)["A1_dp"].tolist() == [4.0, 10.0]


@pytest.mark.parametrize(
    ("text", "kwargs", "match"),
    [
        (
            WIDE.replace("G0100030", "G0100010"),
            {},
            r"duplicate gisjoin 'G0100010' in data rows \[1, 2\]",
        ),
        (WIDE.replace(",10,1\n", ",-10,1\n"), {}, r"data row 2, column 'A1_sf': count is negative"),
        (
            WIDE.replace(",10,1\n", ",1.5,1\n"),
            {},
            r"data row 2, column 'A1_sf': count is not an integer",
        ),
        (WIDE.replace(",10,1\n", ",,1\n"), {}, r"data row 2, column 'A1_sf': missing"),
        (WIDE.replace("gisjoin", "geoid"), {}, r"no 'gisjoin' column"),
        (WIDE.replace("_sf", "_xx"), {}, r"_sf columns"),
        (WIDE, {"cells": ["B*"]}, r"cell pattern 'B\*' matches no column"),
        ("gisjoin,version,M\nG1,ddp,1\n", {}, r"which version is the input"),
    ],
)
def test_malformed_batch_files_name_the_problem(tmp_path, text, kwargs, match):
    with pytest.raises(DataError, match=match) as info:
        read_batch(_write(tmp_path, text), **kwargs)
    assert "f.csv" in str(info.value)


def test_forced_wrong_encoding_is_reported_with_position(tmp_path):
    p = _write(tmp_path, WIDE.replace("Autauga", "Doña"), encoding="latin-1")
    with pytest.raises(DataError, match=r"cannot decode as 'utf-8' at byte \d+"):
        read_batch(p, encoding="utf-8")


def test_shared_under1_file(shared_file):
    b = read_batch(shared_file("nhgis_ppdd_20200527_county_under1.csv"))
    assert b.layout == "wide" and b.cells == ["H78003", "H78024"]
    assert b.truth.shape == (3221, 2)
