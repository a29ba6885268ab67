"""Hostile and malformed inputs through every subcommand (issue 21).

Each case is one line of :data:`CASES`: the command line (``{ws}`` is the workspace, which is
also the current directory), an optional change to the workspace, and fragments the error
must contain. Every case must end with exit status 2 (130 for Ctrl-C), exactly one line on
stderr naming the problem, no traceback, and the workspace — inputs, notes, earlier outputs —
byte for byte as it was, with nothing left behind (the whole tree is hashed before and after).
The inputs are small synthetic files made here; nothing needs ../shared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import numpy as np
import pandas as pd
from ppmf_fixtures import ppmf_persons
from run_specs import SMALL_DATA, SMALL_SPEC

from censusdp.app.cli import main

DATA = SMALL_DATA
SPEC = SMALL_SPEC
NHGIS = (
    "gisjoin,name,state,H78003_dp,H78024_dp,H78003_sf,H78024_sf\n"
    "G0100010,A,Alabama,3,4,3,5\nG0100030,B,Alabama,6,2,7,1\n"
    "G0200010,C,Alaska,1,1,2,0\nG0200020,D,Alaska,8,9,8,9\n"
)
NSPEC = """
[data]
source = "nhgis"
cells = ["H78003", "H78024"]
[hierarchy]
levels = ["nation", "state", "county"]
[privacy]
accounting = "zcdp"
rho = 0.5
[queries]
county = ["detailed"]
[invariants]
state = "detailed"
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = ["gls"]
"""
RUN = ["run", "spec.toml"]
PRIV = ["privatize", "nhgis.csv", "--spec", "nspec.toml"]

#: A small PPMF (2020 layout), its public blocks and a block → place file.
_BLOCKS = [(st, cou, "000100", "1", f"100{b}") for st, cou in (("01", "001"), ("02", "005"))
           for b in range(3)]  # fmt: skip
PPMF = ppmf_persons(np.random.default_rng(5), 40, _BLOCKS, household_share=0.9).to_csv(index=False)
PPMF_HEADER, PPMF_FIRST = PPMF.splitlines()[:2]
BLOCKS = "GEOID20\n" + "".join(f"{st}{cou}{tr}{blk}\n" for st, cou, tr, _, blk in _BLOCKS)
PLACES = "BLOCKID|PLACEFP\n" + "".join(
    f"{st}{cou}{tr}{blk}|{'00100' if st == '01' else ''}\n" for st, cou, tr, _, blk in _BLOCKS
)
PSPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
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
PPRIV = ["privatize", "ppmf.csv", "--spec", "pspec.toml"]
PREDSPEC = """
[predict]
schema = "pl94"
invariants = { nation = ["total"], state = ["total"] }
tables = ["total"]
[hierarchy]
synthetic = "state"
blocks = 60
seed = 2
"""
PRED = ["predict", "predspec.toml"]
#: A value planted in a confidential file: no message, output or file may ever hold it.
SECRET = "S3CR3T7391"
#: A PPMF without its header line: its first line is one person's record.
HEADLESS = PPMF_FIRST.rsplit(",", 1)[0] + f",{SECRET}\n" + "\n".join(PPMF.splitlines()[2:]) + "\n"


def _workspace(ws: Path) -> None:
    ws.mkdir()
    (ws / "data.csv").write_text(DATA)
    (ws / "spec.toml").write_text(textwrap.dedent(SPEC))
    (ws / "nhgis.csv").write_text(NHGIS)
    (ws / "nspec.toml").write_text(textwrap.dedent(NSPEC))
    (ws / "ppmf.csv").write_text(PPMF)
    (ws / "blocks.csv").write_text(BLOCKS)
    (ws / "places.txt").write_text(PLACES)
    (ws / "pspec.toml").write_text(PSPEC)
    (ws / "predspec.toml").write_text(PREDSPEC)
    (ws / "notes.txt").write_text("my notes, not censusdp's\n")
    (ws / "other").mkdir()
    (ws / "other" / "keep.txt").write_text("someone else's folder\n")


# -- workspace changes (each returns a function of the workspace) ----------------------------


def write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def go(ws: Path) -> None:
        p = ws / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())

    return go


def spec(old: str, new: str, name: str = "spec.toml") -> Callable[[Path], None]:
    def go(ws: Path) -> None:
        text = (ws / name).read_text()
        assert old in text, old
        (ws / name).write_text(text.replace(old, new))

    return go


def nspec(old: str, new: str) -> Callable[[Path], None]:
    return spec(old, new, "nspec.toml")


def pspec(old: str, new: str) -> Callable[[Path], None]:
    return spec(old, new, "pspec.toml")


def predspec(old: str, new: str) -> Callable[[Path], None]:
    return spec(old, new, "predspec.toml")


def cr_only(name: str) -> Callable[[Path], None]:
    """Rewrite ``name`` with bare-CR (old Mac OS) line ends."""

    def go(ws: Path) -> None:
        p = ws / name
        p.write_bytes(p.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r"))

    return go


def crlf(name: str) -> Callable[[Path], None]:
    return lambda ws: (ws / name).write_bytes((ws / name).read_bytes().replace(b"\n", b"\r\n"))


def bom(name: str) -> Callable[[Path], None]:
    return lambda ws: (ws / name).write_bytes(b"\xef\xbb\xbf" + (ws / name).read_bytes())


def parquet_source(ws: Path) -> None:
    spec('source = "csv"', 'source = "parquet"')(ws)
    spec('path = "data.csv"', 'path = "data.parquet"')(ws)


def symlink(name: str, to: str) -> Callable[[Path], None]:
    return lambda ws: (ws / name).symlink_to(ws / to)


def own(kind: str, name: str) -> Callable[[Path], None]:
    """An earlier output censusdp wrote (``run`` folder or ``privatize`` file + sidecar)."""

    def go(ws: Path) -> None:
        built = BUILT[kind]
        if kind == "run":
            shutil.copytree(built, ws / name)
        else:
            shutil.copy2(built, ws / name)
            shutil.copy2(
                built.with_name(built.name + ".censusdp.json"), ws / f"{name}.censusdp.json"
            )

    return go


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def go(ws: Path) -> None:
        for s in steps:
            s(ws)

    return go


@dataclass
class Case:
    id: str
    argv: list[str]
    expect: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = None
    owner: str | None = None  # another engineer's module: xfail until their fix is merged
    #: "clear": bad input, a one-line exit-2 error naming it; "refused": a legal path censusdp
    #: will not write (an input, someone else's file, a link, an output without --overwrite);
    #: "accepted": hostile-looking but valid input, handled (exit 0) and checked by ``check``.
    kind: str = "clear"
    env: dict[str, str] | None = None  # environment of the run (``{ws}`` is the workspace)
    secret: str | None = None  # a planted confidential value: never printed nor written
    check: Callable[[Path], None] | None = None  # accepted: what the outputs must hold


def C(id, argv, *expect, setup=None, owner=None, env=None, secret=None):  # noqa: N802
    """A clear error (one line per case)."""
    return Case(id, argv, tuple(expect), setup, owner, "clear", env, secret)


def R(id, argv, *expect, setup=None, owner=None):  # noqa: N802
    """A refused output path."""
    return Case(id, argv, tuple(expect), setup, owner, "refused")


def A(id, argv, check, setup=None, secret=None, env=None):  # noqa: N802
    """An accepted input: exit 0, the inputs untouched, ``check(ws)`` holds."""
    return Case(id, argv, (), setup, None, "accepted", env, secret, check)


# fmt: off
CASES = [
    # -- run: output paths ----------------------------------------------------------------
    R("run out=.", RUN + ["--out", "."], "--out '.'", "current"),
    C("run out=''", RUN + ["--out", ""], "--out", "empty"),
    R("run out=..", RUN + ["--out", ".."], "--out '..'"),
    R("run out=workspace (holds inputs)", RUN + ["--out", "{ws}"], "current directory"),
    R("run out=input dir by path", RUN + ["--out", "../ws"], "holds"),
    R("run out=dir holding --data", RUN + ["--data", "sub/d.csv", "--out", "sub"], "holds the input 'd.csv'", setup=write("sub/d.csv", DATA)),
    R("run out=dir holding the spec", ["run", "sub/s.toml", "--out", "sub"], "holds the input 's.toml'", setup=write("sub/s.toml", SPEC)),
    R("run out=data file", RUN + ["--out", "data.csv"], "is the input 'data.csv'"),
    R("run out=spec file", RUN + ["--out", "spec.toml"], "is the input 'spec.toml'"),
    R("run out=other file", RUN + ["--out", "notes.txt"], "'notes.txt' is a file"),
    R("run out=foreign dir", RUN + ["--out", "other"], "'keep.txt'", "not a censusdp output"),
    R("run out=foreign dir --overwrite", RUN + ["--out", "other", "--overwrite"], "'keep.txt'"),
    R("run out=symlink", RUN + ["--out", "link"], "symbolic link", setup=symlink("link", "other")),
    C("run out under a file", RUN + ["--out", "notes.txt/out"], "not a directory"),
    R("run own output, no --overwrite", RUN + ["--out", "prev"], "--overwrite", setup=own("run", "prev")),
    R("run own output + foreign file", RUN + ["--out", "prev", "--overwrite"], "'evaluation/mine.txt'", "did not write", setup=both(own("run", "prev"), write("prev/evaluation/mine.txt", "x"))),
    R("run own output edited", RUN + ["--out", "prev", "--overwrite"], "release/privacy.md", "changed", setup=both(own("run", "prev"), write("prev/release/privacy.md", "edited"))),
    R("run own output, marker forged", RUN + ["--out", "prev", "--overwrite"], "not a censusdp output", setup=both(own("run", "prev"), write("prev/censusdp-output.json", "{}"))),
    R("run [output] dir = .", RUN, "[output] dir", setup=spec("[estimators]", '[output]\ndir = "."\n[estimators]')),
    R("run [output] dir = workspace", RUN, "[output] dir", "current directory", setup=spec("[estimators]", '[output]\ndir = "../ws"\n[estimators]')),
    R("run [output] dir = other", RUN, "[output] dir", "'keep.txt'", setup=spec("[estimators]", '[output]\ndir = "other"\n[estimators]')),
    # -- run: options -----------------------------------------------------------------------
    C("run --seed -1", RUN + ["--seed", "-1"], "--seed", "non-negative"),
    C("run --seed abc", RUN + ["--seed", "abc"], "--seed"),
    C("run --seed 1.5", RUN + ["--seed", "1.5"], "--seed"),
    C("run --partitions 0", RUN + ["--partitions", "0"], "--partitions", "at least 1"),
    C("run --partitions -3", RUN + ["--partitions", "-3"], "--partitions"),
    C("run --partitions x", RUN + ["--partitions", "x"], "--partitions"),
    C("run --scheduler spark", RUN + ["--out", "o", "--scheduler", "spark"], "spark"),
    C("run unknown option", RUN + ["--bogus"], "--bogus"),
    C("run without spec", ["run"], "spec"),
    # -- run: specs -------------------------------------------------------------------------
    C("spec missing", ["run", "nope.toml"], "nope.toml"),
    C("spec is a directory", ["run", "other"], "other"),
    C("spec empty", RUN + ["--out", "o"], "spec.toml", setup=write("spec.toml", "")),
    C("spec binary", RUN + ["--out", "o"], "spec.toml", "UTF-8", setup=write("spec.toml", b"\xff\xfe\x00[")),
    C("spec toml syntax", RUN + ["--out", "o"], "spec.toml", "TOML", setup=spec("[mechanism]", "[mechanism")),
    C("spec unknown section", RUN + ["--out", "o"], "'extras'", setup=spec("[estimators]", "[extras]\nx = 1\n[estimators]")),
    C("spec epsilon 0", RUN + ["--out", "o"], "epsilon", setup=spec("epsilon = 1.0", "epsilon = 0.0")),
    C("spec epsilon negative", RUN + ["--out", "o"], "epsilon", setup=spec("epsilon = 1.0", "epsilon = -1.0")),
    C("spec epsilon nan", RUN + ["--out", "o"], "epsilon", setup=spec("epsilon = 1.0", "epsilon = nan")),
    C("spec epsilon 1e-300", RUN + ["--out", "o"], "epsilon", setup=spec("epsilon = 1.0", "epsilon = 1e-300")),
    C("spec epsilon 1e300", RUN + ["--out", "o"], "epsilon", setup=spec("epsilon = 1.0", "epsilon = 1e300")),
    C("spec shares", RUN + ["--out", "o"], "sum", setup=spec("county = 0.5 }", "county = 0.4 }")),
    C("spec [run] partitions 0", RUN + ["--out", "o"], "run.partitions", setup=spec("[estimators]", "[run]\npartitions = 0\n[estimators]")),
    C("spec [run] seed -1", RUN + ["--out", "o"], "run.seed", setup=spec("[estimators]", "[run]\nseed = -1\n[estimators]")),
    C("spec [run] repetitions 0", RUN + ["--out", "o"], "run.repetitions", setup=spec("[estimators]", "[run]\nrepetitions = 0\n[estimators]")),
    C("spec unknown estimator", RUN + ["--out", "o"], "magic", setup=spec('["gls"]', '["magic"]')),
    C("spec [output] dir empty", RUN, "output.dir", setup=spec("[estimators]", '[output]\ndir = ""\n[estimators]')),
    # -- run: data files --------------------------------------------------------------------
    C("data missing", RUN + ["--out", "o", "--data", "nope.csv"], "nope.csv"),
    C("data is a directory", RUN + ["--out", "o", "--data", "other"], "other"),
    C("data empty", RUN + ["--out", "o"], "data.csv", setup=write("data.csv", "")),
    C("data header only", RUN + ["--out", "o"], "data.csv", setup=write("data.csv", "fips,pop\n")),
    C("data ragged row", RUN + ["--out", "o"], "data.csv", "row", setup=write("data.csv", DATA + "02003,1,9,9\n")),
    C("data binary", RUN + ["--out", "o"], "data.csv", setup=write("data.csv", b"\x00\xff\xfe" * 50)),
    C("data negative count", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,-20"))),
    C("data fractional count", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,2.5"))),
    C("data missing count", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,"))),
    C("data text count", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,twenty"))),
    C("data inf count", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,inf"))),
    C("data duplicate leaf", RUN + ["--out", "o"], "01001", setup=write("data.csv", DATA.replace("02002,7", "01001,7"))),
    C("data missing column", RUN + ["--out", "o"], "people", setup=spec('cells = ["pop"]', 'cells = ["people"]')),
    C("parquet corrupt", RUN + ["--out", "o"], "data.parquet", setup=both(parquet_source, write("data.parquet", b"PAR1 not really"))),
    C("parquet is CSV", RUN + ["--out", "o"], "data.parquet", setup=both(parquet_source, write("data.parquet", DATA))),
    # -- privatize --------------------------------------------------------------------------
    R("privatize -o input", PRIV + ["-o", "nhgis.csv"], "is the input 'nhgis.csv'"),
    R("privatize -o spec", PRIV + ["-o", "nspec.toml"], "-o", "nspec.toml"),
    R("privatize -o dir holding input", ["privatize", "sub/n.csv", "--spec", "nspec.toml", "-o", "sub"], "holds the input 'n.csv'", setup=write("sub/n.csv", NHGIS)),
    R("privatize -o dir", PRIV + ["-o", "other"], "-o 'other'"),
    R("privatize -o existing dir.csv", PRIV + ["-o", "d.csv"], "is a directory", setup=write("d.csv/x", "x")),
    C("privatize -o xlsx", PRIV + ["-o", "out.xlsx"], "'.xlsx'", ".csv"),
    C("privatize -o no extension", PRIV + ["-o", "out"], "without extension"),
    R("privatize -o foreign csv", PRIV + ["-o", "theirs.csv"], "not a censusdp output", setup=write("theirs.csv", "a,b\n1,2\n")),
    R("privatize -o own, no --overwrite", PRIV + ["-o", "p.csv"], "--overwrite", setup=own("privatize", "p.csv")),
    R("privatize -o own, edited", PRIV + ["-o", "p.csv", "--overwrite"], "changed", setup=both(own("privatize", "p.csv"), write("p.csv", "gisjoin\nG1\n"))),
    R("privatize -o foreign sidecar", PRIV + ["-o", "n.csv"], "n.csv.censusdp.json", setup=write("n.csv.censusdp.json", "mine")),
    C("privatize -o ''", PRIV + ["-o", ""], "-o", "empty"),
    R("privatize -o .", PRIV + ["-o", "."], "-o '.'"),
    C("privatize -o under a file", PRIV + ["-o", "notes.txt/x.csv"], "not a directory"),
    R("privatize -o symlink", PRIV + ["-o", "l.csv"], "symbolic link", setup=symlink("l.csv", "notes.txt")),
    C("privatize --seed -5", PRIV + ["-o", "p.csv", "--seed", "-5"], "--seed"),
    C("privatize without -o", PRIV, "-o"),
    C("privatize input missing", ["privatize", "nope.csv", "--spec", "nspec.toml", "-o", "p.csv"], "nope.csv"),
    C("privatize spec not nhgis", ["privatize", "nhgis.csv", "--spec", "spec.toml", "-o", "p.csv"], "nhgis"),
    C("privatize input empty", PRIV + ["-o", "p.csv"], "nhgis.csv", setup=write("nhgis.csv", "")),
    C("privatize input header only", PRIV + ["-o", "p.csv"], "nhgis.csv", setup=write("nhgis.csv", NHGIS.splitlines()[0] + "\n")),
    C("privatize input ragged", PRIV + ["-o", "p.csv"], "nhgis.csv", setup=write("nhgis.csv", NHGIS + "G0200030,E,Alaska,1,1,1,1,1,1\n")),
    C("privatize input no gisjoin", PRIV + ["-o", "p.csv"], "'gisjoin'", setup=write("nhgis.csv", NHGIS.replace("gisjoin,", "geoid,"))),
    C("privatize input corrupt parquet", ["privatize", "n.parquet", "--spec", "nspec.toml", "-o", "p.csv"], "n.parquet", setup=write("n.parquet", b"PAR1 junk")),
    C("privatize input negative", PRIV + ["-o", "p.csv"], "row 2", "'H78003_sf'", setup=write("nhgis.csv", NHGIS.replace("B,Alabama,6,2,7,1", "B,Alabama,6,2,-7,1"))),
    C("privatize input duplicate", PRIV + ["-o", "p.csv"], "G0100010", setup=write("nhgis.csv", NHGIS.replace("G0100030", "G0100010"))),
    C("privatize spec bad key", PRIV + ["-o", "p.csv"], "mechanism.noise", setup=nspec('"discrete_gaussian"', '"cauchy"')),
    # -- experiment, demo, hierarchy, top level ---------------------------------------------
    C("experiment unknown", ["experiment", "no-such-study", "--out", "x"], "no-such-study"),
    R("experiment --out .", ["experiment", "laplace-conditioning", "--quick", "--out", "."], "--out '.'"),
    R("experiment --out foreign", ["experiment", "laplace-conditioning", "--quick", "--out", "other"], "'keep.txt'"),
    R("experiment --out holds --data", ["experiment", "laplace-conditioning", "--data", "{ws}/other/keep.txt", "--out", "{ws}/other"], "holds the input"),
    C("experiment --seed -1", ["experiment", "laplace-conditioning", "--seed", "-1"], "--seed"),
    R("demo --out .", ["demo", "--quick", "--out", "."], "--out '.'"),
    R("demo --out file", ["demo", "--quick", "--out", "notes.txt"], "is a file"),
    R("demo --out foreign", ["demo", "--quick", "--out", "other"], "'keep.txt'"),
    R("demo --out own run, no --overwrite", ["demo", "--quick", "--out", "prev"], "--overwrite", setup=own("run", "prev")),
    C("demo --seed -1", ["demo", "--seed", "-1"], "--seed"),
    C("hierarchy missing file", ["hierarchy", "describe", "nope.csv", "--level", "state=fips:2"], "nope.csv"),
    C("hierarchy missing column", ["hierarchy", "describe", "data.csv", "--level", "state=geo:2"], "geo"),
    C("hierarchy bad level", ["hierarchy", "describe", "data.csv", "--level", "state"], "state"),
    C("hierarchy empty file", ["hierarchy", "describe", "e.csv", "--level", "state=fips:2"], "e.csv", setup=write("e.csv", "")),
    C("hierarchy ragged", ["hierarchy", "describe", "data.csv", "--level", "state=fips:2"], "data.csv", setup=write("data.csv", DATA + "1,2,3,4\n")),
    C("unknown command", ["frobnicate"], "frobnicate"),
]
# fmt: on

#: Cases known to fail on this branch, fixed in another engineer's module.
XFAIL = {c.id: c.owner for c in CASES if c.owner}


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a digest of what it is (file bytes, link target, dir)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


BUILT: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def built(tmp_path_factory):
    """One real ``run`` output and one ``privatize`` output, copied into cases that need an
    earlier censusdp output."""
    d = tmp_path_factory.mktemp("built")
    _workspace(d / "ws")
    cwd = os.getcwd()
    os.chdir(d / "ws")
    try:
        assert main(["run", "spec.toml", "--out", str(d / "run"), "--seed", "1"]) == 0
        assert main(PRIV + ["-o", str(d / "p.csv"), "--seed", "1"]) == 0
    finally:
        os.chdir(cwd)
    BUILT.update(run=d / "run", privatize=d / "p.csv")
    return BUILT


def _params():
    for c in CASES:
        marks = [pytest.mark.xfail(strict=False, reason=f"owned by {c.owner}")] if c.owner else []
        yield pytest.param(c, id=c.id, marks=marks)


def test_enough_cases_and_the_totals_in_the_docstring():
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
    plain = [(tuple(c.argv), repr(c.env)) for c in CASES if c.setup is None]
    assert len(set(plain)) == len(plain)  # no two cases run one command on one workspace
    kinds = {k: sum(c.kind == k for c in CASES) for k in ("clear", "refused", "accepted")}
    assert sum(kinds.values()) == len(CASES)
    totals = (
        f"{len(CASES)} tried: {kinds['clear']} clear (exit 2, one line naming the problem), "
        f"{kinds['refused']} refused (exit 2, an output path censusdp will not write), "
        f"{kinds['accepted']} accepted (exit 0, checked)"
    )
    assert totals in " ".join(__doc__.split()), totals


def _files_hold(root: Path, secret: str, skip: dict[str, str]) -> list[str]:
    """Files under ``root`` (other than the unchanged ones in ``skip``) holding ``secret``."""
    hits = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not p.is_symlink() and rel not in skip:
            if secret.encode() in p.read_bytes():
                hits.append(rel)
    return hits


@pytest.mark.parametrize("case", list(_params()))
def test_hostile_input(case: Case, tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    _workspace(ws)
    if case.setup is not None:
        case.setup(ws)
    monkeypatch.chdir(ws)
    for key, value in (case.env or {}).items():
        monkeypatch.setenv(key, value.replace("{ws}", str(ws)))
    before = tree(tmp_path)
    argv = [a.replace("{ws}", str(ws)) for a in case.argv]
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [
        ln for ln in err.splitlines() if ln.strip() and not ln.startswith("censusdp: warning:")
    ]
    assert "Traceback" not in err + out
    if case.secret is not None:
        assert case.secret not in err + out, "a confidential value was printed"
        after = tree(tmp_path)
        unchanged = {k: v for k, v in before.items() if after.get(k) == v}
        held = _files_hold(tmp_path, case.secret, unchanged)
        assert not held, f"a confidential value was written to {held}"
    if case.kind == "accepted":
        assert code == 0, err
        assert not lines, err
        after = tree(tmp_path)
        assert {k: after.get(k) for k in before} == before, "an input changed"
        case.check(ws)
        return
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("censusdp: error: "), err
    for fragment in case.expect:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert tree(tmp_path) == before, "the workspace changed or something was left behind"


# -- subprocesses: Ctrl-C and exit statuses ---------------------------------------------------

#: Runs the CLI with one stage slowed down, touching READY when it is reached, so that SIGINT
#: lands there (while computing, or while the temporary output is being written).
# The child starts with SIGINT's default action, as a shell's foreground job does: a test
# process may be ignoring SIGINT at that moment (SIG_IGN survives exec, and Python then
# installs no KeyboardInterrupt), which made a clean-clone run wait out the pause.
WRAPPER = """
import signal, sys, time, pathlib
signal.signal(signal.SIGINT, signal.default_int_handler)
import censusdp.pipelines.runner as r
ready, stage = pathlib.Path(sys.argv[1]), sys.argv[2]
def pause():
    ready.touch()
    time.sleep(120)
if stage == "write":
    orig = r.write_evaluation
    def slow(*a, **k):
        orig(*a, **k)
        pause()
    r.write_evaluation = slow
else:
    orig = r._estimate
    def slow(*a, **k):
        pause()
        return orig(*a, **k)
    r._estimate = slow
from censusdp.app.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.getpgid(int(p.name)) == pgid:
                    alive.append(int(p.name))
            except OSError:
                continue
    return alive


@pytest.mark.parametrize(
    "stage, scheduler",
    [
        ("write", "sync"),
        pytest.param("compute", "threads", marks=pytest.mark.slow),
        pytest.param("compute", "distributed", marks=pytest.mark.slow),  # ~30 s: a cluster
    ],
)
def test_ctrl_c_one_line_exit_130_nothing_left(stage, scheduler, tmp_path):
    ws = tmp_path / "ws"
    _workspace(ws)
    before = tree(tmp_path)
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(ready), stage]
        + ["run", "spec.toml", "--out", "out", "--scheduler", scheduler],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 90, "the run never reached the stage"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ready.unlink()
    assert proc.returncode == 130, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "censusdp: interrupted; nothing was written"
    ], err
    assert tree(tmp_path) == before  # no output, no temporary
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "worker processes outlived the run"


def test_exit_status_in_a_real_process(tmp_path):
    ws = tmp_path / "ws"
    _workspace(ws)
    argv = ["privatize", "nhgis.csv", "--spec", "nspec.toml", "-o", "nhgis.csv"]
    refused = subprocess.run(
        [sys.executable, "-m", "censusdp.app", *argv], cwd=ws, capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        "censusdp: error: -o 'nhgis.csv' is the input 'nhgis.csv'; censusdp never writes over "
        "its inputs"
    ]
    assert (ws / "nhgis.csv").read_text() == NHGIS


def test_internal_errors_are_one_line_without_their_message(monkeypatch, tmp_path, capsys):
    """A bug (not bad input) is one line naming the exception type and place, exit 1; its
    message is not printed (it could hold a confidential value)."""
    import censusdp.pipelines.runner as runner

    def broken(*a, **k):
        raise ValueError("secret count 12345")

    ws = tmp_path / "ws"
    _workspace(ws)
    monkeypatch.chdir(ws)
    monkeypatch.setattr(runner, "load_data", broken)
    assert main(["run", "spec.toml", "--out", "o"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ValueError" in err and "12345" not in err
    assert not (ws / "o").exists()


def test_interrupt_while_writing_in_process(monkeypatch, tmp_path, capsys):
    import censusdp.pipelines.runner as runner

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    ws = tmp_path / "ws"
    _workspace(ws)
    monkeypatch.chdir(ws)
    before = tree(tmp_path)
    monkeypatch.setattr(runner, "write_evaluation", interrupted)
    assert main(["run", "spec.toml", "--out", "o"]) == 130
    assert capsys.readouterr().err == "censusdp: interrupted; nothing was written\n"
    assert tree(tmp_path) == before


def test_overwrite_replaces_only_censusdp_outputs(tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    _workspace(ws)
    monkeypatch.chdir(ws)
    own("run", "prev")(ws)
    own("privatize", "p.csv")(ws)
    assert main(RUN + ["--out", "prev", "--overwrite"]) == 0
    assert main(PRIV + ["-o", "p.csv", "--overwrite"]) == 0
    marker = json.loads((ws / "prev" / "censusdp-output.json").read_text())
    assert marker["command"] == "run" and "release/estimates.parquet" in marker["files"]
    side = json.loads((ws / "p.csv.censusdp.json").read_text())
    assert (
        side["kind"] == "file"
        and side["files"]["p.csv"] == hashlib.sha256((ws / "p.csv").read_bytes()).hexdigest()
    )
    assert sorted(p.name for p in ws.iterdir()) == sorted(
        [
            "data.csv",
            "spec.toml",
            "nhgis.csv",
            "nspec.toml",
            "notes.txt",
            "other",
            "prev",
            "p.csv",
            "p.csv.censusdp.json",
        ]
    )
