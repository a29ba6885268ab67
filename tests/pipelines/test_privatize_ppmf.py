"""``censusdp privatize PPMF.csv --spec SPEC -o OUT`` (pipelines.privatize_ppmf).

One small synthetic PPMF through the CLI: the privacy statement printed and in the
manifest; both products' P1–P5 tables for every level (``_se`` on the unbiased ones only);
the non-negative microdata read back by the PPMF reader tabulate to the non-negative
tables exactly, every level, and meet the invariants (nation and state totals of the
input) ``==``; the size-class report, with the confidential evaluation only on request.
Malformed PPMFs exit 2 naming file, row and column, with nothing written.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.app.cli import main
from censusdp.pipelines.io.outputs import lattice_moe
from censusdp.pipelines.io.ppmf import read_ppmf
from censusdp.pipelines.products.pl94_tables import level_tables, pl94_codebook, tabulate

SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
delta = 1e-10
[hierarchy]
blocks = "blocks.csv"
[areas]
file = "places.txt"
level = "place"
block_column = "BLOCKID"
area_column = "PLACEFP"
skip_blank = true
[report]
repetitions = 2
"""
#: The spec without a public block list (and without areas).
SPEC_NO_BLOCKS = SPEC.split("[hierarchy]")[0] + "[report]\nrepetitions = 2\n"


def _blocks():
    out = []
    for st, counties in (("01", ("001", "003")), ("02", ("005",))):
        for cou in counties:
            for tract in ("000100", "000200"):
                for bg in ("1", "2"):
                    out += [(st, cou, tract, bg, f"{bg}{b:03d}") for b in range(2)]
    return out


def _public_blocks() -> list[str]:
    """Every block of the public geography: the PPMF's, an empty block in every block group
    and an empty tract."""
    occupied = ["".join((st, cou, tr, blk)) for st, cou, tr, _, blk in _blocks()]
    empty = sorted({b[:12] + "999" for b in occupied}) + ["010010003001000", "010010003001001"]
    return occupied + empty


#: Place 00100 is the whole tract 01001000100 (its empty blocks too), 00200 crosses states.
WHOLE_TRACT = "01001000100"


def _place(block: str) -> str:
    if block.startswith(WHOLE_TRACT):
        return "00100"
    if block.startswith("010030002001") or block.startswith("020050001002"):
        return "00200"
    return ""


def _ppmf(tmp: Path, n: int = 1500) -> tuple[Path, Path]:
    frame = ppmf_persons(np.random.default_rng(3), n, _blocks(), household_share=0.9)
    data = tmp / "ppmf.csv"
    frame.to_csv(data, index=False)
    blocks = _public_blocks()
    pd.DataFrame({"GEOID20": blocks[::-1]}).to_csv(tmp / "blocks.csv", index=False)
    lines = ["BLOCKID|PLACEFP", *(f"{b}|{_place(b)}" for b in blocks)]
    (tmp / "places.txt").write_text("\n".join(lines) + "\n")
    spec = tmp / "spec.toml"
    spec.write_text(SPEC)
    return data, spec


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """One privatize run (with --evaluate) that every test of the module reads, whichever
    runs first: ``(data, release folder, argv, printed)``."""
    tmp = tmp_path_factory.mktemp("ppmf")
    data, spec = _ppmf(tmp)
    out = tmp / "out"
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(out), "--seed", "4"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*argv, "--evaluate"]) == 0
    return data, out / "release", argv, printed.getvalue()


def test_privatize_writes_both_products_and_the_statement(release):
    data, out, argv, printed = release
    assert "induced subspace differential privacy" in printed
    assert "nation: total; state: total" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["privacy"]["guarantee"] == "induced subspace differential privacy"
    assert manifest["privacy"]["delta"] == 1e-10
    assert "BIASED" in manifest["products"]["nonnegative"]
    assert "seed" not in json.dumps(manifest["spec"])
    assert not any("blocks-from-data" in n for n in manifest["privacy"]["notes"])
    levels = read_ppmf(data).hierarchy.names
    columns = list(pl94_codebook().columns)
    n_blocks = len(pd.read_csv(out / "unbiased" / "pl94_block.csv", dtype={"GEOID": str}))
    assert n_blocks == len(_public_blocks())  # the empty blocks are released too
    for level in (*levels, "place"):
        codes = {c: str for c in ("GEOID", *(f"{lv}_GEOID" for lv in levels))}
        unb = pd.read_csv(out / "unbiased" / f"pl94_{level}.csv", dtype=codes)
        nn = pd.read_csv(out / "nonnegative" / f"pl94_{level}.csv", dtype=codes)
        # every row carries its ancestors' codes (below the nation): a GEOID's prefixes
        k = levels.index(level) if level in levels else 1
        parents = [f"{lv}_GEOID" for lv in levels[1:k]]
        assert list(nn.columns) == ["GEOID", *parents, *columns]  # no standard errors: biased
        for p in parents:
            width = {"state": 2, "county": 5, "tract": 11, "block_group": 12}[p[:-6]]
            assert (unb[p] == unb["GEOID"].str[:width]).all() and (nn[p] == unb[p]).all()
        assert list(unb.columns[len(parents) + 1 : len(parents) + 4]) == [
            "P1_001N", "P1_001N_se", "P1_001N_moe",
        ]  # fmt: skip
        assert {f"{c}_se" for c in columns} | {f"{c}_moe" for c in columns} <= set(unb.columns)
        assert (unb[[f"{c}_se" for c in columns]].to_numpy() >= 0).all()
        moe = unb[[f"{c}_moe" for c in columns]]
        assert (moe.dtypes == np.int64).all() and (unb[columns].dtypes == np.int64).all()
        assert np.array_equal(moe.to_numpy(), lattice_moe(unb[[f"{c}_se" for c in columns]]))
        assert (nn[columns].to_numpy() >= 0).all()
        assert len(unb) == len(nn)
    for product in ("unbiased", "nonnegative"):  # a dictionary of every table column
        dic = pd.read_csv(out / product / "data_dictionary.csv", keep_default_na=False)
        cols = set(pd.read_csv(out / product / "pl94_long.csv", nrows=0).columns)
        for level in (*levels, "place"):
            cols |= set(pd.read_csv(out / product / f"pl94_{level}.csv", nrows=0).columns)
        assert set(dic["column"]) == cols, product
    assert (out / "size_classes.md").exists() and (out / "size_classes.png").exists()
    # --evaluate lays the output out as `run` does: the confidential comparison beside the
    # release folder, never inside it
    top = out.parent
    assert sorted(p.name for p in top.iterdir()) == [
        "censusdp-output.json",
        "evaluation",
        "release",
    ]
    assert not (out / "evaluation").exists()
    assert "CONFIDENTIAL" in (top / "evaluation" / "size_classes.md").read_text()
    assert (top / "evaluation" / "CONFIDENTIAL.txt").is_file()
    assert manifest["products"] and "../evaluation/" in json.dumps(manifest)
    assert (
        f"wrote {top}/release/" in printed and f"wrote {top}/evaluation/ (CONFIDENTIAL" in printed
    )
    assert "CONFIDENTIAL" not in (out / "size_classes.md").read_text()


def test_microdata_tabulate_to_the_nonnegative_tables_and_the_invariants(release):
    data, out, _, _ = release
    truth = read_ppmf(data)
    micro = read_ppmf(out / "nonnegative" / "microdata.csv")
    h = truth.hierarchy
    got = level_tables(micro.hierarchy, micro.block, micro.cell, micro.count)
    columns = list(pl94_codebook().columns)
    for level, t in got.items():
        nn = pd.read_csv(out / "nonnegative" / f"pl94_{level}.csv", dtype={"GEOID": str})
        mine = pd.DataFrame(tabulate(t.histograms), columns=columns)
        mine.insert(0, "GEOID", np.asarray(t.codes, dtype=str))
        # the microdata hold the non-empty blocks of the release; the tables every block
        merged = nn.merge(mine, on="GEOID", how="left", suffixes=("", "_micro")).fillna(0)
        for c in columns:
            assert np.array_equal(merged[c].to_numpy(), merged[f"{c}_micro"].to_numpy()), c
    persons = truth.block_totals()
    state = h.ancestor_index(h.names[-1], "state")
    want = np.bincount(state, weights=persons, minlength=h.levels[1].size).astype(np.int64)
    mstate = micro.hierarchy.ancestor_index(micro.hierarchy.names[-1], "state")
    have = np.bincount(mstate, weights=micro.block_totals()).astype(np.int64)
    assert np.array_equal(have, want)
    assert micro.persons == truth.persons
    for level in ("nation", "state"):
        unb = pd.read_csv(out / "unbiased" / f"pl94_{level}.csv", dtype={"GEOID": str})
        nn = pd.read_csv(out / "nonnegative" / f"pl94_{level}.csv", dtype={"GEOID": str})
        assert np.array_equal(unb["P1_001N"].to_numpy(), nn["P1_001N"].to_numpy())
    assert int(nn["P1_001N"].sum()) == truth.persons


def test_output_over_the_input_and_an_existing_output_are_refused(release, capsys):
    data, out, argv, _ = release
    assert main(argv) == 2  # the output of the first test exists; no --overwrite
    assert "overwrite" in capsys.readouterr().err
    bad = [*argv]
    bad[bad.index("-o") + 1] = str(data)
    assert main(bad) == 2
    assert data.read_text().startswith("TABBLKST")


INPUTS = ["blocks.csv", "places.txt", "ppmf.csv", "spec.toml"]


@pytest.mark.parametrize(
    ("edit", "column"),
    [
        (lambda f: f.assign(TABTRACT=f.TABTRACT.where(f.index != 7, "0001")), "TABTRACT"),
        (lambda f: f.assign(CENRACE=f.CENRACE.where(f.index != 11, "64")), "CENRACE"),
        (lambda f: f.assign(TABBLKST=f.TABBLKST.where(f.index != 3, "0x")), "TABBLKST"),
    ],
    ids=["geocode width", "code outside the schema", "geocode not digits"],
)
def test_malformed_ppmf_exits_2_naming_file_row_and_column(tmp_path, capsys, edit, column):
    data, spec = _ppmf(tmp_path, n=40)
    frame = pd.read_csv(data, dtype=str)
    edit(frame).to_csv(data, index=False)
    out = tmp_path / "out"
    assert main(["privatize", str(data), "--spec", str(spec), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ppmf.csv" in err and "data row" in err and repr(column) in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == INPUTS


def test_ppmf_spec_errors_and_routing(tmp_path, capsys):
    data, spec = _ppmf(tmp_path, n=40)
    spec.write_text(SPEC.replace('source = "ppmf"', 'source = "nhgis"'))
    assert main(["privatize", str(data), "--spec", str(spec), "-o", str(tmp_path / "o")]) == 2
    assert 'source = "ppmf"' in capsys.readouterr().err
    spec.write_text(SPEC + "[extra]\n")
    assert main(["privatize", str(data), "--spec", str(spec), "-o", str(tmp_path / "o")]) == 2
    assert "extra" in capsys.readouterr().err
    assert main(["privatize", str(data), "-o", str(tmp_path / "o"), "--rho", "1"]) == 2
    assert "PPMF" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _table(out: Path, product: str, level: str) -> pd.DataFrame:
    return pd.read_csv(out / product / f"pl94_{level}.csv", dtype={"GEOID": str})


def _first_block(ppmf: Path) -> str:
    row = pd.read_csv(ppmf, dtype=str, nrows=1).iloc[0]
    return row.TABBLKST + row.TABBLKCOU + row.TABTRACT + row.TABBLK


def _drop_listed_block(tmp: Path, block: str) -> None:
    listed = pd.read_csv(tmp / "blocks.csv", dtype=str)
    listed[listed.GEOID20 != block].to_csv(tmp / "blocks.csv", index=False)


def test_places_are_sums_of_blocks_with_exact_standard_errors(release):
    """Both products' place tables are the sums of their blocks' rows; the place that is a
    whole tract has that tract's standard errors (the area sweep against the GLS); places
    are a row of the size-class report."""
    _, out, _, _ = release
    columns = list(pl94_codebook().columns)
    for product in ("unbiased", "nonnegative"):
        blocks = _table(out, product, "block")
        blocks = blocks.assign(place=[_place(g) for g in blocks.GEOID])
        want = blocks[blocks.place != ""].groupby("place")[columns].sum()
        have = _table(out, product, "place").set_index("GEOID")[columns]
        assert list(have.index) == ["00100", "00200"]
        assert np.array_equal(have.to_numpy(), want.loc[have.index].to_numpy())
    ses = [f"{c}_se" for c in columns]
    place = _table(out, "unbiased", "place").set_index("GEOID")
    tract = _table(out, "unbiased", "tract").set_index("GEOID")
    assert np.all(np.isfinite(place[ses].to_numpy())) and np.all(place[ses].to_numpy() > 0)
    # every column's _se carries the replicate rounding variance: the place's replicate
    # errors are its blocks' summed, the tract's are its own, and the tract's integers are
    # its blocks' sums, so the two agree (GLS part: the area sweep against the GLS)
    np.testing.assert_allclose(
        place.loc["00100", ses].to_numpy(float), tract.loc[WHOLE_TRACT, ses].to_numpy(float),
        rtol=1e-6,
    )  # fmt: skip
    # the other place is not a node: its SE is no node's
    assert not np.isclose(place.loc["00200", "P1_001N_se"], tract["P1_001N_se"]).any()
    assert "pl94_place.csv" in (out / "README.md").read_text()
    report = pd.read_csv(out / "size_classes.csv")
    assert set(report.level) == {"block", "block_group", "tract", "place"}
    assert report[report.level == "place"].n.sum() == 2 * 2  # two places, both products


def test_no_public_block_list_is_refused_unless_acknowledged(tmp_path, capsys):
    data, spec = _ppmf(tmp_path, n=300)
    spec.write_text(SPEC_NO_BLOCKS)
    out = tmp_path / "out"
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(out), "--seed", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no public block list" in err and "--blocks-from-data" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == INPUTS
    places = str(tmp_path / "places.txt")
    assert main([*argv, "--blocks-from-data", "--areas", places]) == 2
    assert "need every block" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == INPUTS
    assert main([*argv, "--blocks-from-data"]) == 0
    printed = capsys.readouterr().out
    assert "blocks-from-data" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert any(
        "set of blocks with at least one person" in r for r in manifest["privacy"]["reveals"]
    )
    assert manifest["privacy"]["data_dependent"] is True
    assert "occupied blocks is disclosed" in (out / "README.md").read_text()
    assert "blocks-from-data" in (out / "privacy.md").read_text()
    occupied = read_ppmf(data).hierarchy.sizes[-1]
    assert len(_table(out, "unbiased", "block")) == occupied < len(_public_blocks())
    # --blocks on the command line reaches the reader (a missing list is named; the full run
    # from a command-line list is the slow test below)
    argv2 = [*argv[:-4], "-o", str(tmp_path / "out2"), "--blocks", str(tmp_path / "nope.csv")]
    assert main(argv2) == 2
    assert "nope.csv: no such block list" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_a_block_list_on_the_command_line_releases_every_public_block(tmp_path):
    data, spec = _ppmf(tmp_path, n=300)
    spec.write_text(SPEC_NO_BLOCKS)
    out = tmp_path / "out"
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(out), "--seed", "2"]
    assert main([*argv, "--blocks", str(tmp_path / "blocks.csv")]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["privacy"]["notes"] or "blocks-from-data" not in str(manifest["privacy"])
    assert len(_table(out, "unbiased", "block")) == len(_public_blocks())


@pytest.mark.parametrize(
    ("break_inputs", "named"),
    [
        (  # a block of the PPMF (its first row's) the public list lacks
            lambda t: _drop_listed_block(t, _first_block(t / "ppmf.csv")),
            ("ppmf.csv", "data row 1,", "'TABBLK'"),
        ),
        (  # a block list code that is not a block GEOID
            lambda t: (t / "blocks.csv").write_text(
                (t / "blocks.csv").read_text().replace("\n0", "\n10", 1)
            ),
            ("blocks.csv", "data row 1", "'GEOID20'"),
        ),
        (  # an equivalency row of a block the geography does not have
            lambda t: (t / "places.txt").write_text(
                (t / "places.txt").read_text() + "019990001001000|00100\n"
            ),
            ("places.txt", "data row", "'BLOCKID'"),
        ),
        (  # a listed place with no block
            lambda t: (
                (t / "place_list.csv").write_text("PLACEFP\n00100\n00200\n00300\n"),
                (t / "spec.toml").write_text(
                    SPEC.replace("[report]", 'list = "place_list.csv"\n[report]')
                ),
            ),
            ("place_list.csv", "data row 3", "'PLACEFP'", "00300", "places.txt"),
        ),
    ],
    ids=["ppmf block not listed", "bad block code", "unknown block in places", "empty place"],
)
def test_geography_errors_exit_2_naming_file_row_and_column(tmp_path, capsys, break_inputs, named):
    data, spec = _ppmf(tmp_path, n=60)
    break_inputs(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "out"
    assert main(["privatize", str(data), "--spec", str(spec), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in named), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
