"""``censusdp privatize PPMF.csv --spec SPEC -o OUT`` (pipelines.privatize_ppmf).

One small synthetic PPMF through the CLI: the privacy statement printed and in the
manifest; both products' P1–P5 tables for every level (``_se`` on the unbiased ones only);
the non-negative microdata read back by the PPMF reader tabulate to the non-negative
tables exactly, every level, and meet the invariants (nation and state totals of the
input) ``==``; the size-class report, with the confidential evaluation only on request.
Malformed PPMFs exit 2 naming file, row and column, with nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.app.cli import main
from censusdp.pipelines.pl94_tables import level_tables, pl94_codebook, tabulate
from censusdp.pipelines.ppmf import read_ppmf

SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
delta = 1e-10
[report]
repetitions = 2
"""


def _blocks():
    out = []
    for st, counties in (("01", ("001", "003")), ("02", ("005",))):
        for cou in counties:
            for tract in ("000100", "000200"):
                for bg in ("1", "2"):
                    out += [(st, cou, tract, bg, f"{bg}{b:03d}") for b in range(2)]
    return out


def _ppmf(tmp: Path, n: int = 1500) -> tuple[Path, Path]:
    frame = ppmf_persons(np.random.default_rng(3), n, _blocks(), household_share=0.9)
    data = tmp / "ppmf.csv"
    frame.to_csv(data, index=False)
    spec = tmp / "spec.toml"
    spec.write_text(SPEC)
    return data, spec


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppmf")
    data, spec = _ppmf(tmp)
    out = tmp / "out"
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(out), "--seed", "4"]
    return data, out, argv


def test_privatize_writes_both_products_and_the_statement(release, capsys):
    data, out, argv = release
    assert main([*argv, "--evaluate"]) == 0
    printed = capsys.readouterr().out
    assert "induced subspace differential privacy" in printed
    assert "nation: total; state: total" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["privacy"]["guarantee"] == "induced subspace differential privacy"
    assert manifest["privacy"]["delta"] == 1e-10
    assert "BIASED" in manifest["products"]["nonnegative"]
    assert "seed" not in json.dumps(manifest["spec"])
    levels = read_ppmf(data).hierarchy.names
    columns = list(pl94_codebook().columns)
    for level in levels:
        unb = pd.read_csv(out / "unbiased" / f"pl94_{level}.csv", dtype={"GEOID": str})
        nn = pd.read_csv(out / "nonnegative" / f"pl94_{level}.csv", dtype={"GEOID": str})
        assert list(nn.columns) == ["GEOID", *columns]  # no standard errors: biased
        assert {f"{c}_se" for c in columns} <= set(unb.columns)
        assert (unb[[f"{c}_se" for c in columns]].to_numpy() >= 0).all()
        assert (nn[columns].to_numpy() >= 0).all()
        assert len(unb) == len(nn)
    assert (out / "size_classes.md").exists() and (out / "size_classes.png").exists()
    assert "CONFIDENTIAL" in (out / "evaluation" / "size_classes.md").read_text()
    assert "CONFIDENTIAL" not in (out / "size_classes.md").read_text()


def test_microdata_tabulate_to_the_nonnegative_tables_and_the_invariants(release):
    data, out, _ = release
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
    data, out, argv = release
    assert main(argv) == 2  # the output of the first test exists; no --overwrite
    assert "overwrite" in capsys.readouterr().err
    bad = [*argv]
    bad[bad.index("-o") + 1] = str(data)
    assert main(bad) == 2
    assert data.read_text().startswith("TABBLKST")


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ppmf.csv", "spec.toml"]


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
