"""Progress on stderr of the PPMF, units and codebook routes of ``privatize`` and of
``predict`` (issue 37).

With ``-v`` each route writes its stage lines (``censusdp: ...``, :mod:`censusdp.progress`)
and its bars run to the end (PPMF: the release over the blocks; PPMF and units: the
size-class simulation over its releases); with ``-q``, and by default when stderr is not
a terminal (as here, captured), stderr stays empty and stdout is the same; an input
refused after a stage line still ends stderr with exactly one error line. Commands run in-process (``main``),
so the bars and the logger write to the captured stderr.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.app.cli import main

PPMF_SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
[report]
repetitions = 2
"""

PREDICT_SPEC = """
[predict]
schema = "pl94"
invariants = { nation = ["total"], state = ["total"] }
tables = ["total"]
[hierarchy]
synthetic = "state"
blocks = 60
seed = 2
"""

BLOCKS = [
    (st, cou, "000100", "1", f"1{b:03d}")
    for st, cou in (("01", "001"), ("01", "003"), ("02", "005"))
    for b in range(3)
]


@pytest.fixture
def ppmf(tmp_path, monkeypatch):
    """A 300-person PPMF over 9 blocks and its spec, in the working directory."""
    monkeypatch.chdir(tmp_path)
    ppmf_persons(np.random.default_rng(5), 300, BLOCKS, household_share=0.9).to_csv(
        "ppmf.csv", index=False
    )
    (tmp_path / "spec.toml").write_text(PPMF_SPEC)
    return ["privatize", "ppmf.csv", "--spec", "spec.toml", "--blocks-from-data"]


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_ppmf_route_shows_its_stages_and_bars(ppmf, capsys):
    code, out, err = _run(capsys, [*ppmf, "-o", "out-v", "-v"])
    assert code == 0, err
    stages = [line for line in err.splitlines() if line.startswith("censusdp: ")]
    assert stages[0] == "censusdp: reading the PPMF (ppmf.csv)"
    assert stages[1].startswith("censusdp: read in ") and "block 9" in stages[1]
    assert stages[2].startswith("censusdp: measure, GLS, rounding and tables of both products")
    assert stages[3].startswith("censusdp: released in ")
    assert (
        stages[4]
        == "censusdp: size-class report: 2 simulated release(s) from the released histogram"
    )
    assert stages[5].startswith("censusdp: size-class report in ")
    assert len(stages) == 6
    assert "censusdp release: 100%" in err and "9/9" in err  # every block, once
    assert "censusdp size classes: 100%" in err and "2/2" in err
    assert "error" not in err
    # not a terminal: no bar and no line by default, none with -q; the same results
    for flags, name in (([], "out-d"), (["-q"], "out-q")):
        code, other, err = _run(capsys, [*flags, *ppmf, "-o", name])
        assert code == 0 and err == ""
        assert other.replace(name, "out-v") == out


def test_ppmf_refused_after_a_stage_line_ends_with_one_error(ppmf, capsys, tmp_path):
    """A bad code in a data row: the stage line was written, then the one error line."""
    lines = (tmp_path / "ppmf.csv").read_text().splitlines()
    header, row = lines[0].split(","), lines[1].split(",")
    row[header.index("CENRACE")] = "99"
    (tmp_path / "ppmf.csv").write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    code, out, err = _run(capsys, [*ppmf, "-o", "bad", "-v"])
    assert code == 2
    assert err.startswith("censusdp: reading the PPMF (ppmf.csv)\n")
    assert err.count("error") == 1
    assert err.rstrip("\n").split("\n")[-1].startswith("censusdp: error: ")
    assert "CENRACE" in err
    assert not (tmp_path / "bad").exists()


def test_predict_shows_its_stages(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pred.toml").write_text(PREDICT_SPEC)
    code, out, err = _run(capsys, ["predict", "pred.toml", "--out", "out-v", "-v"])
    assert code == 0, err
    assert err.splitlines()[0] == "censusdp: reading the spec (pred.toml) and its public geography"
    assert err.splitlines()[1].startswith(
        "censusdp: a predict spec, pl94 schema; nodes per level: "
    )
    assert err.splitlines()[2].startswith("censusdp: predicting the standard errors (")
    assert err.splitlines()[3].startswith("censusdp: writing out-v/ (")
    assert len(err.splitlines()) == 4
    for flags, name in (([], "out-d"), (["-q"], "out-q")):
        code, other, err = _run(capsys, [*flags, "predict", "pred.toml", "--out", name])
        assert code == 0 and err == ""
        assert other.replace(name, "out-v") == out


def test_predict_refused_after_a_stage_line_ends_with_one_error(tmp_path, monkeypatch, capsys):
    """An areas file naming a block the hierarchy lacks: refused after the stage lines."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pred.toml").write_text(PREDICT_SPEC)
    (tmp_path / "areas.csv").write_text("block,area\nNOSUCHBLOCK,A\n")
    argv = ["predict", "pred.toml", "--out", "o", "--areas", "areas.csv", "-v"]
    code, out, err = _run(capsys, argv)
    assert code == 2
    assert "censusdp: reading the areas (areas.csv)\n" in err
    assert err.count("error") == 1
    assert err.rstrip("\n").split("\n")[-1].startswith("censusdp: error: ")
    assert not (tmp_path / "o").exists()


UNITS_COLUMNS = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE", "TABBLK")


def _units_file(path, gen: np.random.Generator, n: int) -> None:
    """``n`` housing units (occupied with probability 0.7) over the blocks of :data:`BLOCKS`
    in the DAS MDF unit layout (the units route's input)."""
    b = gen.integers(0, len(BLOCKS), n)
    frame = pd.DataFrame(
        {
            "SCHEMA_TYPE_CODE": "MUD",
            "SCHEMA_BUILD_ID": "1.1.0",
            **{col: [BLOCKS[i][j] for i in b] for j, col in enumerate(UNITS_COLUMNS)},
            "RTYPE": "2",
            "HH_STATUS": np.where(gen.random(n) < 0.7, "1", "2"),
        }
    )
    frame.to_csv(path, sep="|", index=False)


def test_units_route_shows_its_stages_and_bar(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _units_file(tmp_path / "units.csv", np.random.default_rng(7), 200)
    argv = ["privatize", "units.csv", "--blocks-from-data", "--repetitions", "2"]
    code, out, err = _run(capsys, [*argv, "-o", "out-v", "-v"])
    assert code == 0, err
    stages = [line for line in err.splitlines() if line.startswith("censusdp: ")]
    assert stages[0] == "censusdp: reading the units file (units.csv)"
    assert stages[1].startswith("censusdp: read in ") and "block 9" in stages[1]
    assert stages[2].startswith("censusdp: released in ")
    assert stages[3] == "censusdp: size-class report: 2 simulated release(s)"
    assert stages[4].startswith("censusdp: size-class report in ")
    assert len(stages) == 5
    assert "censusdp size classes: 100%" in err and "2/2" in err
    for flags, name in (([], "out-d"), (["-q"], "out-q")):
        code, other, err = _run(capsys, [*flags, *argv, "-o", name])
        assert code == 0 and err == ""
        assert other.replace(name, "out-v") == out


@pytest.mark.parametrize("route", ["flat", "hierarchy"])
def test_codebook_routes_show_their_stages(route, tmp_path, monkeypatch, capsys):
    from censusdp.pipelines.io.codebook import Codebook
    from tests.pipelines.test_codebook_hierarchy import SPEC, county_codes, write_county_file
    from tests.pipelines.test_privatize_codebook import synthetic_truth

    monkeypatch.chdir(tmp_path)
    ppdd = Codebook.load("ppdd")
    write_county_file(tmp_path / "c.csv", ppdd, synthetic_truth(ppdd, n=6, seed=3), county_codes(6))
    spec = SPEC.format(codebook="ppdd", rho=1.0).replace("[run]\nseed = 5\n", "")
    if route == "flat":  # one level of rows, no hierarchy: a file out
        spec = spec.split("[hierarchy]")[0].replace("[privacy]", 'level = "county"\n[privacy]')
    (tmp_path / "spec.toml").write_text(spec)
    suffix = ".csv" if route == "flat" else ""
    argv = ["privatize", "c.csv", "--spec", "spec.toml"]
    code, out, err = _run(capsys, [*argv, "-o", f"out-v{suffix}", "-v"])
    assert code == 0, err
    stages = err.splitlines()
    assert stages[0] == f"censusdp: reading c.csv (codebook {ppdd.source})"
    assert stages[1].startswith("censusdp: read in ")
    assert stages[2].startswith("censusdp: re") and "writing" in stages[2]
    assert len(stages) == (3 if route == "flat" else 4)
    code, other, err = _run(capsys, ["-q", *argv, "-o", f"out-q{suffix}"])
    assert code == 0 and err == ""
    assert other.replace("out-q", "out-v") == out
