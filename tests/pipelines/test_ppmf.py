"""The PPMF reader: the histogram equals a pandas group-by of the file, exactly, and
malformed files are refused naming file, row, column and code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.errors import DataError
from censusdp.pipelines.io.ppmf import LEVELS, read_block_list, read_ppmf

PL94_COLUMNS = [
    "VINTAGE", "TABBLKST", "TABBLKCOU", "TABTRACT", "TABBLKGRP", "TABBLK",
    "RTYPE", "GQTYPE_PL", "VOTING_AGE", "CENHISP", "CENRACE",
]  # fmt: skip


def _persons(gen: np.random.Generator, n: int) -> pd.DataFrame:
    """``n`` persons in a few blocks of two states, with every attribute varied."""
    blocks = [
        ("01", "001", "020100", "1", "1001"),
        ("01", "001", "020100", "1", "1002"),
        ("01", "001", "020100", "2", "2001"),
        ("01", "003", "010100", "1", "1000"),
        ("06", "037", "101110", "3", "3010"),
        ("06", "037", "101110", "3", "3011"),
    ]
    frame = ppmf_persons(gen, n, blocks, household_share=0.8)
    frame.insert(0, "VINTAGE", "20210428")
    return frame[PL94_COLUMNS]


def _write(frame: pd.DataFrame, path: Path, sep: str = ",") -> Path:
    frame.to_csv(path, index=False, sep=sep)
    return path


def _expected(frame: pd.DataFrame) -> pd.Series:
    """The slow obvious reference: a pandas group-by of the persons."""
    cell = (
        (
            (frame.GQTYPE_PL.astype(int) * 2 + frame.VOTING_AGE.astype(int) - 1) * 2
            + frame.CENHISP.astype(int)
            - 1
        )
        * 63
        + frame.CENRACE.astype(int)
        - 1
    )
    block = frame.TABBLKST + frame.TABBLKCOU + frame.TABTRACT + frame.TABBLK
    return pd.DataFrame({"block": block, "cell": cell}).groupby(["block", "cell"]).size()


@pytest.mark.parametrize("block_bytes", [1 << 12, 1 << 24])  # many batches, one batch
def test_histogram_equals_pandas_group_by(tmp_path: Path, block_bytes: int) -> None:
    frame = _persons(np.random.default_rng(5), 3000)
    got = read_ppmf(_write(frame, tmp_path / "ppmf.csv"), block_bytes=block_bytes)
    leaves = got.hierarchy.leaves.codes
    series = pd.Series(
        got.count, index=pd.MultiIndex.from_arrays([leaves[got.block].astype(object), got.cell])
    )
    want = _expected(frame)
    assert series.index.tolist() == want.index.tolist()
    assert series.to_numpy().tolist() == want.to_numpy().tolist()
    assert got.persons == len(frame) and int(got.count.sum()) == len(frame)
    assert got.layout == "pl94"
    # sorted by block, then cell
    assert bool(np.all(np.diff(got.block * 2016 + got.cell) > 0))


def test_hierarchy_levels_and_codes(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(1), 500)
    h = read_ppmf(_write(frame, tmp_path / "p.csv")).hierarchy
    assert h.names == LEVELS
    assert h["state"].codes.tolist() == ["01", "06"]
    assert h["county"].codes.astype(object).tolist() == ["01001", "01003", "06037"]
    assert h["block_group"].codes.astype(object).tolist() == [
        "010010201001", "010010201002", "010030101001", "060371011103",
    ]  # fmt: skip
    assert h.leaves.codes.astype(object).tolist()[:2] == ["010010201001001", "010010201001002"]
    # every block lies in the block group its rows name
    bg_of_block = h["block_group"].codes[h.ancestor_index("block", "block_group")].astype(object)
    want = dict(
        zip(
            frame.TABBLKST + frame.TABBLKCOU + frame.TABTRACT + frame.TABBLK,
            frame.TABBLKST + frame.TABBLKCOU + frame.TABTRACT + frame.TABBLKGRP,
            strict=True,
        )
    )
    assert bg_of_block.tolist() == [want[b] for b in h.leaves.codes.astype(object)]


def test_dense_and_totals_agree(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(2), 800)
    got = read_ppmf(_write(frame, tmp_path / "p.csv"))
    dense = got.dense()
    assert dense.shape == (got.hierarchy.leaves.size, 8, 2, 2, 63)
    assert dense.reshape(dense.shape[0], -1).sum(axis=1).tolist() == got.block_totals().tolist()
    part = got.dense(1, 3)
    assert (part == dense[1:3]).all()


def test_pipe_separated_mdf_with_comments_and_ce_names(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(3), 400).drop(columns="VINTAGE")
    frame = frame.rename(columns={"TABTRACT": "TABTRACTCE", "TABBLKGRP": "TABBLKGRPCE"})
    path = tmp_path / "mdf.txt"
    path.write_text("# schema PL94 MDF\n# build 1.0\n")
    with path.open("a") as f:
        frame.to_csv(f, index=False, sep="|")
    got = read_ppmf(path)
    back = frame.rename(columns={"TABTRACTCE": "TABTRACT", "TABBLKGRPCE": "TABBLKGRP"})
    assert got.count.tolist() == _expected(back).to_numpy().tolist()


def test_demonstration_layout_recodes_gqtype_and_age(tmp_path: Path) -> None:
    rows = pd.DataFrame(
        {
            "TABBLKST": ["44"] * 6,
            "TABBLKCOU": ["007"] * 6,
            "TABTRACT": ["000100"] * 6,
            "TABBLKGRP": ["1"] * 6,
            "TABBLK": ["1000"] * 6,
            "RTYPE": ["3", "3", "5", "5", "5", "5"],
            "GQTYPE": ["000", "000", "101", "602", "801", "904"],
            "QAGE": ["17", "18", "40", "5", "0", "115"],
            "CENHISP": ["1", "2", "1", "1", "2", "1"],
            "CENRACE": ["01", "63", "07", "01", "02", "03"],
        }
    )
    got = read_ppmf(_write(rows, tmp_path / "demo.csv"))
    assert got.layout == "demonstration"
    hhgq = np.array([0, 0, 1, 6, 7, 7])
    va = np.array([0, 1, 1, 0, 0, 1])
    hisp = np.array([0, 1, 0, 0, 1, 0])
    race = np.array([0, 62, 6, 0, 1, 2])
    want = np.sort(((hhgq * 2 + va) * 2 + hisp) * 63 + race)
    assert got.cell.tolist() == want.tolist() and got.count.tolist() == [1] * 6


def test_blank_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(4), 50)
    path = _write(frame, tmp_path / "p.csv")
    lines = path.read_text().splitlines()
    lines.insert(1, "," * (len(PL94_COLUMNS) - 1))
    path.write_text("\n".join(lines) + "\n")
    got = read_ppmf(path)
    assert got.skipped_blank == 1 and got.persons == 50


# -- malformed files -------------------------------------------------------------------------
def _bad(tmp_path: Path, column: str, row: int, value: str) -> Path:
    frame = _persons(np.random.default_rng(9), 40)
    frame.loc[row, column] = value
    return _write(frame, tmp_path / "bad.csv")


@pytest.mark.parametrize(
    ("column", "value", "words"),
    [
        ("TABBLKCOU", "1", ["3 digits", "1 characters", "zero-pad"]),
        ("TABTRACT", "02010", ["5 characters"]),
        ("TABBLK", "10a1", ["not all digits"]),
        ("CENRACE", "64", ["outside the pl94 schema", "01 to 63"]),
        ("GQTYPE_PL", "8", ["outside the pl94 schema"]),
        ("VOTING_AGE", "0", ["outside the pl94 schema"]),
        ("CENHISP", "3", ["outside"]),
        ("CENRACE", "", ["0 characters"]),
    ],
)
def test_bad_codes_name_file_row_and_column_never_the_code(
    tmp_path: Path, column: str, value: str, words: list[str]
) -> None:
    path = _bad(tmp_path, column, 17, value)
    with pytest.raises(DataError) as err:
        read_ppmf(path, block_bytes=1 << 10)
    msg = str(err.value)
    assert "bad.csv" in msg and "data row 18" in msg and repr(column) in msg
    assert repr(value) not in msg  # a person's code is confidential: never echoed
    for w in words:
        assert w in msg


def test_rtype_must_agree_with_gqtype(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(9), 40)
    frame.loc[5, ["RTYPE", "GQTYPE_PL"]] = ["5", "0"]
    with pytest.raises(
        DataError, match=r"data row 6, column 'RTYPE'.*agree with GQTYPE_PL in the same row"
    ):
        read_ppmf(_write(frame, tmp_path / "r.csv"))


def test_block_in_two_block_groups_is_refused_with_both_rows(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(9), 40)
    target = frame.index[(frame.TABBLK == "1001")][1]
    frame.loc[target, "TABBLKGRP"] = "2"
    first = int(frame.index[frame.TABBLK == "1001"][0]) + 1
    with pytest.raises(DataError) as err:
        read_ppmf(_write(frame, tmp_path / "bg.csv"), block_bytes=1 << 10)
    msg = str(err.value)
    assert f"data row {target + 1}, column 'TABBLKGRP'" in msg
    assert "010010201001001" in msg and f"data row {first}" in msg


def test_missing_columns_and_empty_files(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(9), 5)
    with pytest.raises(DataError, match="no column 'TABBLK'"):
        read_ppmf(_write(frame.drop(columns="TABBLK"), tmp_path / "a.csv"))
    with pytest.raises(DataError, match="no person attributes of a known PPMF layout"):
        read_ppmf(_write(frame.drop(columns="GQTYPE_PL"), tmp_path / "b.csv"))
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(DataError, match="empty file"):
        read_ppmf(tmp_path / "e.csv")
    (tmp_path / "h.csv").write_text(",".join(PL94_COLUMNS) + "\n")
    with pytest.raises(DataError, match="no persons"):
        read_ppmf(tmp_path / "h.csv")
    with pytest.raises(DataError, match="no such file"):
        read_ppmf(tmp_path / "missing.csv")


def test_messages_never_contain_counts(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(9), 40)
    frame.loc[3, "CENRACE"] = "99"
    with pytest.raises(DataError) as err:
        read_ppmf(_write(frame, tmp_path / "c.csv"))
    # the only numbers are the row, the code and the documented valid range
    assert "count" not in str(err.value).lower()


def test_rows_of_different_layouts_read_the_same(tmp_path: Path) -> None:
    """Rows of unequal width (a VINTAGE of varying length, quoted fields) go through the CSV
    parser; the histogram is the same."""
    frame = _persons(np.random.default_rng(6), 600)
    frame["VINTAGE"] = np.where(np.arange(600) % 7 == 0, "2021-04-28 eps 12.2", "x")
    got = read_ppmf(_write(frame, tmp_path / "v.csv"), block_bytes=1 << 11)
    quoted = tmp_path / "q.csv"
    frame.to_csv(quoted, index=False, quoting=1)  # csv.QUOTE_ALL
    for result in (got, read_ppmf(quoted, block_bytes=1 << 11)):
        assert result.count.tolist() == _expected(frame).to_numpy().tolist()


def test_a_code_too_short_on_every_row_is_refused(tmp_path: Path) -> None:
    frame = _persons(np.random.default_rng(7), 30)
    frame["TABBLKST"] = frame["TABBLKST"].str.lstrip("0")  # '06' → '6' on every row
    frame = frame[frame.TABBLKST == "6"]
    with pytest.raises(DataError, match=r"data row 1, column 'TABBLKST': the geocode has 1 char"):
        read_ppmf(_write(frame, tmp_path / "s.csv"))


PPMF_SPEC = """
[data]
source = "ppmf"
path = "{path}"

[hierarchy]
levels = ["nation", "state", "county", "tract", "block_group", "block"]

[privacy]
accounting = "zcdp"
rho = 1.0
level_shares = {{ county = 0.5, block = 0.5 }}

[queries]
county = ["total"]
block = ["detailed"]

[invariants]
nation = "total"

[mechanism]
noise = "discrete_gaussian"

[estimators]
run = ["gls"]
integer = "round"

[run]
seed = 3
"""


def test_ppmf_source_loads_the_block_table(tmp_path: Path) -> None:
    from censusdp.pipelines.data import load_data
    from censusdp.pipelines.specs import load_spec

    frame = _persons(np.random.default_rng(11), 300)
    path = _write(frame, tmp_path / "p.csv")
    (tmp_path / "s.toml").write_text(PPMF_SPEC.format(path=path))
    spec = load_spec(tmp_path / "s.toml")  # no data.cells: the pl94 schema gives them
    table = load_data(spec).table
    got = read_ppmf(path)
    assert table.cells[0] == "Household_Under 18 years_Not Hispanic or Latino_White alone"
    assert len(table.cells) == 2016 and table.hierarchy.names == LEVELS
    assert (table.leaf_counts == got.dense().reshape(-1, 2016)).all()


@pytest.mark.slow  # dense GLS over 2,016 cells: about 30 s on a shared machine
def test_privatize_run_on_a_ppmf_keeps_the_invariant(tmp_path: Path) -> None:
    import pandas as pd

    from censusdp.pipelines.runner import run_spec
    from censusdp.pipelines.specs import load_spec

    frame = _persons(np.random.default_rng(12), 200)
    path = _write(frame, tmp_path / "p.csv")
    (tmp_path / "s.toml").write_text(PPMF_SPEC.format(path=path))
    run_spec(load_spec(tmp_path / "s.toml"), out=tmp_path / "out", progress=False)
    est = pd.read_parquet(tmp_path / "out" / "release" / "estimates.parquet")
    nation = est[(est.level == "nation")]["value"].sum()
    assert nation == len(frame)


@pytest.mark.parametrize(
    ("column", "value", "words"),
    [
        ("TABTRACT", "20100", ["data row 4", "column 'TABTRACT'", "6 digits"]),
        ("CENRACE", "70", ["data row 4", "column 'CENRACE'", "outside the pl94 schema"]),
    ],
)
def test_cli_run_on_a_malformed_ppmf_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, value: str, words: list[str]
) -> None:
    from censusdp.app.cli import main

    frame = _persons(np.random.default_rng(13), 30)
    frame.loc[3, column] = value
    path = _write(frame, tmp_path / "ppmf.csv")
    (tmp_path / "s.toml").write_text(PPMF_SPEC.format(path=path))
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "s.toml"), "--out", str(out), "--seed", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "ppmf.csv" in err and all(w in err for w in words), err
    assert "Traceback" not in err and not out.exists()
    assert repr(value) not in err  # a value of a data row is never echoed


def test_demonstration_layout_names_qgqtyp_and_refuses_an_age_past_115(tmp_path: Path) -> None:
    rows = pd.DataFrame(
        {
            "TABBLKST": ["44", "44"],
            "TABBLKCOU": ["007", "007"],
            "TABTRACT": ["000100", "000100"],
            "TABBLKGRP": ["1", "1"],
            "TABBLK": ["1000", "1000"],
            "QGQTYP": ["000", "301"],
            "QAGE": ["30", "116"],
            "CENHISP": ["1", "1"],
            "CENRACE": ["01", "01"],
        }
    )
    with pytest.raises(DataError, match=r"data row 2, column 'QAGE': the code is outside"):
        read_ppmf(_write(rows, tmp_path / "q.csv"))
    rows.loc[1, "QAGE"] = "80"
    got = read_ppmf(_write(rows, tmp_path / "q.csv"))
    assert got.layout == "demonstration"
    assert got.cell.tolist() == [
        (0 * 2 + 1) * 2 * 63,
        (3 * 2 + 1) * 2 * 63,
    ]  # household, nursing; adults


def test_public_block_list_adds_the_empty_blocks_and_keeps_every_count(tmp_path: Path) -> None:
    """On the public block hierarchy every listed block is a leaf (the empty ones with zero
    counts) and every person keeps its block and cell (against the pandas reference)."""
    frame = _persons(np.random.default_rng(8), 800)
    hist = read_ppmf(_write(frame, tmp_path / "p.csv"))
    occupied = list(np.array(hist.hierarchy.levels[-1].codes.tolist(), dtype=str))
    empty = ["010010201001999", "010030101002000", "060370101103999", "720010001001000"]
    listed = tmp_path / "BlockAssign.txt"
    rows = [f"{b}|{i % 3}" for i, b in enumerate(empty[::-1] + occupied)]
    listed.write_text("BLOCKID|PLACEFP\n" + "\n".join(rows) + "\n")
    h = read_block_list(listed)
    assert h.names == LEVELS and h.sizes[-1] == len(occupied) + len(empty)
    assert "72" in set(np.array(h.levels[1].codes.tolist(), dtype=str))  # a state with no person
    on = hist.on_blocks(h, listed.name)
    codes = np.array(h.levels[-1].codes.tolist(), dtype=str)
    got = pd.Series(on.count, index=pd.MultiIndex.from_arrays([codes[on.block], on.cell]))
    want = _expected(frame)
    assert got.sort_index().to_dict() == want.sort_index().to_dict()
    assert np.all(np.diff(on.block) >= 0)
    totals = on.block_totals()
    assert np.all(totals[np.isin(codes, empty)] == 0) and totals.sum() == len(frame)
    bg = np.array(h.levels[4].codes.tolist(), dtype=str)[h.ancestor_index("block", "block_group")]
    assert all(g == b[:12] for g, b in zip(bg, codes, strict=True))  # block group: first digit


def test_block_list_errors_name_file_row_and_column(tmp_path: Path) -> None:
    listed = tmp_path / "blocks.csv"
    listed.write_text("GEOID\n010010201001001\n01001020100100\n")
    with pytest.raises(DataError, match=r"blocks.csv, data row 2, column 'GEOID': .*15-digit"):
        read_block_list(listed)
    listed.write_text("GEOID\n010010201001001\n010010201001001\n")
    with pytest.raises(DataError, match=r"data row 2, column 'GEOID': block .* listed twice"):
        read_block_list(listed)
    listed.write_text("code\n010010201001001\n")
    with pytest.raises(DataError, match=r"no block code column"):
        read_block_list(listed)
    assert read_block_list(listed, column="code").sizes[-1] == 1
    # a PPMF block in another block group than the list's
    frame = _persons(np.random.default_rng(1), 50)
    hist = read_ppmf(_write(frame, tmp_path / "p.csv"))
    codes = np.array(hist.hierarchy.levels[-1].codes.tolist(), dtype=str)
    i = int(np.flatnonzero(codes == "010010201001001")[0])
    listed.write_text("GEOID\n" + "\n".join(codes) + "\n")
    h = read_block_list(listed)
    assert hist.on_blocks(h).hierarchy is h
    listed.write_text("GEOID\n" + "\n".join(np.delete(codes, i)) + "\n")
    with pytest.raises(
        DataError, match=r"p.csv, data row \d+, column 'TABBLK': block 010010201001001"
    ):
        hist.on_blocks(read_block_list(listed), "blocks.csv")
