"""Confidential columns never leave ``privatize``: output columns are an allow-list.

Sentinel values (unique numbers that occur nowhere else) are planted in every spelling of a
confidential column an NHGIS-style file can carry — an unreleased ``_sf`` column, ``_SF``,
``_sf2010``, a duplicated ``_sf`` column (pandas would read ``H78003_sf.1``), a plain extra
count column — and every output file, the captured stdout/stderr and the warnings are
searched for them.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.pipelines.io.nhgis import ColumnsNotWritten, read_batch

SENTINELS = {
    "H78024_sf": [987654321, 987654322, 987654323, 987654324],
    "H78005_SF": [987654331, 987654332, 987654333, 987654334],
    "pop_sf2010": [987654341, 987654342, 987654343, 987654344],
    "pop_total": [987654351, 987654352, 987654353, 987654354],
    "notes": [987654361, 987654362, 987654363, 987654364],
}
UNITS = ["G0100010", "G0100030", "G0200130", "G0200200"]

SPEC = """
[data]
source = "nhgis"
cells = ["H78003"]
{extra}
[hierarchy]
levels = ["nation", "state", "county"]

[privacy]
accounting = "zcdp"
rho = 0.5

[queries]
county = ["detailed"]

[invariants]
state = "total"

[mechanism]
noise = "discrete_gaussian"

[estimators]
run = ["gls"]
integer = "round"
"""


def _wide(sentinels: dict[str, list[int]]) -> str:
    df = pd.DataFrame(
        {
            "gisjoin": UNITS,
            "name": ["Autauga", "Baldwin", "Aleutians East", "Aleutians West"],
            "state": ["1", "1", "2", "2"],
            "H78003_dp": [30, 41, 12, 9],
            "H78003_sf": [31, 40, 11, 10],
            "H78024_dp": [1, 2, 3, 4],
            **sentinels,
        }
    )
    return df.to_csv(index=False)


def _setup(tmp_path: Path, text: str, extra: str = "") -> tuple[Path, Path, Path]:
    src = tmp_path / "in"
    src.mkdir()
    data = src / "data.csv"
    data.write_text(text)
    spec = src / "spec.toml"
    spec.write_text(SPEC.format(extra=extra))
    dest = tmp_path / "out"
    dest.mkdir()
    return data, spec, dest / "release.csv"


def _leaks(dest: Path, *texts: str) -> list[str]:
    """Sentinels found in any file under ``dest`` or in the given texts."""
    blobs = [p.read_bytes().decode("latin-1") for p in dest.rglob("*") if p.is_file()]
    blobs += list(texts)
    every = [str(v) for vals in SENTINELS.values() for v in vals]
    return [v for v in every if any(v in b for b in blobs)]


def _privatize(data: Path, spec: Path, out: Path) -> tuple[int, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["privatize", str(data), "--spec", str(spec), "-o", str(out), "--seed", "7"])
    return code, [str(w.message) for w in caught]


def test_no_confidential_column_variant_reaches_the_output(tmp_path, capsys):
    data, spec, out = _setup(tmp_path, _wide(SENTINELS))
    code, messages = _privatize(data, spec, out)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    got = pd.read_csv(out, dtype=str)
    assert list(got.columns) == ["gisjoin", "name", "state", "H78003_dp", "H78003_se", "H78003_moe"]
    assert _leaks(out.parent, captured.out, captured.err, *messages) == []
    # the run names what it dropped (names only)
    dropped = [m for m in messages if "not written" in m]
    assert len(dropped) == 1
    for name in [*SENTINELS, "H78024_dp"]:
        assert name in dropped[0]


def test_the_sentinel_check_can_fail(tmp_path):
    """The search finds a planted value when it is there (the test above is not vacuous)."""
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "x.csv").write_text(f"a\n{SENTINELS['pop_sf2010'][2]}\n")
    assert _leaks(dest) == [str(SENTINELS["pop_sf2010"][2])]


def test_duplicated_confidential_column_is_refused_without_echoing_values(tmp_path, capsys):
    header_dup = _wide(SENTINELS).replace("H78024_sf", "H78003_sf", 1)  # H78003_sf twice
    data, spec, out = _setup(tmp_path, header_dup)
    code, messages = _privatize(data, spec, out)
    err = capsys.readouterr().err
    assert code == 2
    assert "'H78003_sf' occurs twice" in err and "data.csv" in err
    assert not out.exists()
    assert _leaks(out.parent, err, *messages) == []


def test_two_spellings_of_one_confidential_column_are_refused(tmp_path, capsys):
    text = _wide({"H78003_SF": SENTINELS["H78005_SF"]})
    data, spec, out = _setup(tmp_path, text)
    code, _ = _privatize(data, spec, out)
    err = capsys.readouterr().err
    assert code == 2 and "'H78003_sf' and 'H78003_SF'" in err
    assert _leaks(out.parent, err) == []


def test_long_layout_writes_only_identifiers_and_released_cells(tmp_path, capsys):
    rows = []
    for i, g in enumerate(UNITS):
        rows.append([g, "01001", "sf2010", 30 + i, SENTINELS["pop_total"][i]])
        rows.append([g, "01001", "ppdd", 29 + i, SENTINELS["notes"][i]])
    text = pd.DataFrame(rows, columns=["gisjoin", "fips", "version", "M", "pop_total"]).to_csv(
        index=False
    )
    data, spec, out = _setup(tmp_path, text)
    spec.write_text(SPEC.format(extra="").replace('cells = ["H78003"]', 'cells = ["M"]'))
    code, messages = _privatize(data, spec, out)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    got = pd.read_csv(out, dtype=str)
    assert list(got.columns) == ["gisjoin", "fips", "version", "M", "M_se", "M_moe"]
    assert _leaks(out.parent, captured.out, captured.err, *messages) == []
    assert any("pop_total" in m for m in messages)


@pytest.mark.parametrize("pattern", ["*", "fips", "f*"])
def test_a_cell_pattern_matching_a_code_column_is_refused(tmp_path, pattern):
    text = "gisjoin,fips,version,M\nG0100010,01001,sf2010,3\n"
    (tmp_path / "f.csv").write_text(text)
    from censusdp.errors import DataError

    with pytest.raises(DataError, match=r"matches the identifier column '(fips|gisjoin)'"):
        read_batch(tmp_path / "f.csv", cells=[pattern])


def test_parquet_with_integer_codes_keeps_every_digit(tmp_path):
    df = pd.DataFrame({"gisjoin": ["G0100010"], "A_sf": [2**53 + 1]})
    df.to_parquet(tmp_path / "f.parquet")
    b = read_batch(tmp_path / "f.parquet")
    assert b.truth.tolist() == [[2**53 + 1]]


def test_dropped_columns_warning_names_columns_only(tmp_path):
    (tmp_path / "f.csv").write_text(
        textwrap.dedent(
            """\
            gisjoin,A_sf,secret
            G0100010,1,987654399
            """
        )
    )
    b = read_batch(tmp_path / "f.csv")
    assert b.dropped == ["secret"]
    from censusdp.pipelines.io.nhgis import write_batch

    with pytest.warns(ColumnsNotWritten, match="secret") as rec:
        write_batch(b, b.truth.astype(float), None, tmp_path / "o.csv")
    assert "987654399" not in str(rec[0].message)
    assert "987654399" not in (tmp_path / "o.csv").read_text()
