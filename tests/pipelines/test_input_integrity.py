"""Input that would be silently misread is refused: duplicated columns, code columns taken
for counts, codes that lost a leading zero (exit 2, naming file, row and column)."""

from __future__ import annotations

import pandas as pd
import pytest

from censusdp.app.cli import main

DATA = "fips,pop\n01001,10\n01003,20\n02013,5\n02016,7\n"
SPEC = """
[data]
source = "{source}"
path = "{path}"
cells = {cells}
[hierarchy]
levels = ["nation", "state", "county"]
{codes}
[privacy]
accounting = "pure"
epsilon = 1.0
[queries]
county = ["detailed"]
[mechanism]
noise = "discrete_laplace"
[estimators]
run = ["gls"]
"""
CODES = 'codes = { state = "fips:2", county = "fips" }'


def _run(tmp_path, data, *, cells='["pop"]', source="csv", name="d.csv", codes=CODES):
    path = tmp_path / name
    if isinstance(data, pd.DataFrame):
        data.to_parquet(path)
    else:
        path.write_text(data)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(source=source, path=name, cells=cells, codes=codes))
    out = tmp_path / "out"
    return main(["run", str(spec), "--out", str(out), "--seed", "1"]), out


@pytest.mark.parametrize(
    ("data", "cells", "expect"),
    [
        # a duplicated count column: pandas would read the second as 'pop.1' and ignore it
        ("fips,pop,pop\n01001,10,11\n01003,20,21\n", '["pop"]', ["'pop' occurs twice"]),
        ("fips,pop,pop\n01001,10,11\n01003,20,21\n", '["pop*"]', ["'pop' occurs twice"]),
        # a glob matching the code column
        (DATA, '["*"]', ["matches the code column 'fips'"]),
        (DATA, '["fips"]', ["matches the code column 'fips'"]),
        # a lost leading zero: '1003' would nest under state '10'
        (
            DATA.replace("01003", "1003"),
            '["pop"]',
            ["data row 2", "column 'fips'", "'1003'", "zero-pad them to 5"],
        ),
    ],
)
def test_misreadable_input_is_refused(tmp_path, capsys, data, cells, expect):
    code, out = _run(tmp_path, data, cells=cells)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "d.csv" in err and all(e in err for e in expect), err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not out.exists()


def test_duplicated_parquet_column_is_refused(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table([["01001", "01003"], [10, 20], [11, 21]], names=["fips", "pop", "pop"])
    pq.write_table(table, tmp_path / "d.parquet")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(source="parquet", path="d.parquet", cells='["pop"]', codes=CODES))
    assert main(["run", str(spec), "--out", str(tmp_path / "o"), "--seed", "1"]) == 2
    assert "'pop' occurs twice" in capsys.readouterr().err


def test_gisjoin_that_lost_a_leading_zero_is_refused(tmp_path, capsys):
    text = "gisjoin,A_sf\nG0100010,4\nG100030,5\n"  # state 01 read as a number somewhere
    code, out = _run(tmp_path, text, cells='["A"]', source="nhgis", codes="")
    err = capsys.readouterr().err
    assert code == 2
    for part in ("d.csv", "data row 2", "column 'gisjoin'", "'G100030'", "8"):
        assert part in err, err


def test_consistent_widths_and_distinct_columns_still_run(tmp_path, capsys):
    code, out = _run(tmp_path, DATA)
    assert code == 0, capsys.readouterr().err
    est = pd.read_parquet(out / "release" / "estimates.parquet")
    assert sorted(est.loc[est["level"] == "state", "code"].unique()) == ["01", "02"]
