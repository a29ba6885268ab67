"""Hostile and malformed inputs through every subcommand (issues 21 and 33).

Each case is one line of :data:`CASES`: the command line (``{ws}`` is the workspace, which is
also the current directory), an optional change to the workspace, and fragments the error
must contain. A rejected case must end with exit status 2 (130 for Ctrl-C), exactly one line
on stderr naming the problem (file, row, column, key or option), no traceback, and the
workspace — inputs, notes, earlier outputs — byte for byte as it was, with nothing left
behind (the whole tree is hashed before and after). An accepted case (hostile-looking but
valid: a BOM, CRLF line ends, names that a spreadsheet would run as formulas) must exit 0
with no error line, leave every input as it was, and its output must pass its check. A case
with a planted confidential value (``secret``) also fails if the value is printed or written
anywhere. The inputs are small synthetic files made here (an NHGIS batch, a run CSV, a PPMF
with its public blocks and places, a predict spec); nothing needs ../shared, and every case
runs in this process (the one with a dying Dask worker starts a real local cluster).

Totals (kept true by ``test_enough_cases_and_the_totals_in_the_docstring``):
294 tried: 236 clear (exit 2, one line naming the problem), 42 refused (exit 2, an output path
censusdp will not write), 16 accepted (exit 0, checked)

Every reproduction of issue 33's audit that goes through the command line is a case here
(the block "issue 33: every reproduction of the audit" and the blocks marked issue 33): rows
of two summary levels (composed by hand, or refused naming the row), ``--compose-with`` an
edited, foreign or bare folder or as the output, a persons release's statement (unit,
neighbour relation, exact counties, spend, one wording per product, ``--evaluate`` apart),
a user's look-alike temporaries, a σ where the sampler hung, CR-only line ends, budgets and
sizes at the limits, confidential values planted where a message could echo them, a dying
Dask worker; SIGTERM and Ctrl-C are the subprocess test ``test_ctrl_c_one_line_exit_130_
nothing_left``. The pl94 release store has no command that reads it: its forgeries are
tested through its API in ``test_pl94_store_integrity.py``.

Not covered: an unreadable file (chmod 000) — the suite runs as root in CI, where reading
always succeeds, so such a case could not fail; a worker killed in mid-computation is the
slow test ``test_a_worker_killed_while_computing_is_one_line`` (about 35 s: every retry waits
for a fresh worker process).
"""

from __future__ import annotations

import hashlib
import json
import math
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

import numpy as np
import pandas as pd
import pytest
from ppdd_fixtures import IL_COUNTIES_AND_PLACES, IL_PLACEA, SHARES, hand_rho, ppdd_file
from ppmf_fixtures import ppmf_persons
from run_specs import SMALL_DATA, SMALL_NHGIS, SMALL_NHGIS_SPEC, SMALL_SPEC

from censusdp.app.cli import main
from censusdp.atomic import MARKER
from censusdp.hierarchy.synthetic import synthetic_state
from censusdp.pipelines.io.codebook import Codebook

DATA = SMALL_DATA
SPEC = SMALL_SPEC
NHGIS = SMALL_NHGIS
NSPEC = SMALL_NHGIS_SPEC
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
#: A housing-unit file (MUD layout) over the PPMF's blocks: the units route's input, and the
#: release that ``--compose-with`` composes a persons release with.
UNITS = (
    "SCHEMA_TYPE_CODE|SCHEMA_BUILD_ID|TABBLKST|TABBLKCOU|TABTRACTCE|TABBLKGRPCE|TABBLK|RTYPE|HH_STATUS\n"
    + "".join(
        f"MUD|1.1.0|{st}|{cou}|{tr}|{bg}|{blk}|2|{1 + i % 2}\n"
        for i, (st, cou, tr, bg, blk) in enumerate(_BLOCKS * 4)
    )
)
UPRIV = ["privatize", "units.csv", "--blocks", "blocks.csv", "--repetitions", "2"]
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
    """An earlier output censusdp wrote (``run`` folder, ``privatize`` file + sidecar, or a
    PPMF ``persons`` or ``units`` release folder)."""

    def go(ws: Path) -> None:
        built = BUILT[kind]
        if kind in ("run", "persons", "units"):
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


#: ``sitecustomize`` that ends every process started by multiprocessing's spawn (Dask's
#: worker processes) at once, as the OOM killer or a ``kill -9`` would.
DIE_IN_SPAWNED_CHILD = (
    "import os, sys\nif 'spawn_main' in ' '.join(getattr(sys, 'orig_argv', ())):\n    os._exit(9)\n"
)
#: Block → area file for the predict spec's synthetic state (every block in one of 4 areas).
PRED_BLOCKS = [str(c) for c in synthetic_state(2, blocks=60).hierarchy.leaves.codes]
AREAS = "block,area\n" + "".join(f"{b},{i % 4:05d}\n" for i, b in enumerate(PRED_BLOCKS))
AREA_CODES = {f"{i:05d}": f"{i:05d}" for i in range(4)}
#: Area codes a spreadsheet would run, and how they must be written (-5 is a number: kept).
FORMULA_AREAS = {"=SUM(1+1)": "'=SUM(1+1)", "@cmd": "'@cmd", "-5": "-5", "+1-1": "'+1-1"}
#: NHGIS area names a spreadsheet would run, by GISJOIN, as they must be written.
FORMULA_NAMES = {
    "G0100010": "'=1+2",
    "G0100030": "'+cmd|' /C calc'!A0",
    "G0200010": "'@SUM(1)",
    "G0200020": "'-2+3",
}


def formula_areas(text: str) -> str:
    for i, code in enumerate(FORMULA_AREAS):
        text = text.replace(f",{i:05d}\n", f",{code}\n")
    return text


def formula_names(text: str) -> str:
    for (gisjoin, name), old in zip(FORMULA_NAMES.items(), "ABCD", strict=True):
        text = text.replace(f"{gisjoin},{old},", f"{gisjoin},{name[1:]},")
    return text


def released(out: str) -> Callable[[Path], None]:
    def check(ws: Path) -> None:
        est = pd.read_parquet(ws / out / "release" / "estimates.parquet")
        assert set(est.level) == {"nation", "state", "county"} and est.value.notna().all()

    return check


def names_kept(out: str, names: dict[str, str]) -> Callable[[Path], None]:
    """The privatized NHGIS file keeps its rows; formula names are written escaped, the
    counts stay numbers."""

    def check(ws: Path) -> None:
        got = pd.read_csv(ws / out, dtype={"gisjoin": str, "name": str})
        assert list(got.gisjoin) == ["G0100010", "G0100030", "G0200010", "G0200020"]
        assert all(got[c].dtype.kind in "if" for c in got.columns if c.endswith(("_dp", "_se")))
        for gisjoin, name in names.items():
            cell = got.loc[got.gisjoin == gisjoin, "name"].item()
            assert cell == name and cell[0] == "'" and cell[1] in "=+-@", cell

    return check


def predicted(out: str, areas: dict[str, str] | None = None) -> Callable[[Path], None]:
    """A prediction was written; with ``areas`` (code in the input → cell in areas.csv) the
    codes a spreadsheet would run start with an apostrophe, the rest and numbers as given."""

    def check(ws: Path) -> None:
        assert (ws / out / "summary.csv").is_file()
        if areas is not None:
            got = pd.read_csv(ws / out / "areas.csv", dtype={"area": str})
            assert sorted(got.area) == sorted(areas.values())
            assert got.leaves.dtype.kind == "i" and got.leaves.sum() == len(PRED_BLOCKS)
            for cell in got.area:
                assert cell[0] != "=" and cell[0] != "@" and cell[0] != "+"

    return check


# -- issue 33: the audit's reproductions -------------------------------------------------------


def ppdd_rows(name: str, codes: list[str], **extra: list[str]) -> Callable[[Path], None]:
    """An NHGIS file in the PPDD layout (the shipped ``ppdd`` codebook's columns) with these
    GISJOINs and identifier columns (:func:`ppdd_fixtures.ppdd_file`)."""
    return lambda ws: ppdd_file(ws / name, Codebook.load("ppdd"), codes, **extra)


def tamper(name: str, **privacy: object) -> Callable[[Path], None]:
    """Edit the privacy statement of a release's ``manifest.json`` in place."""

    def go(ws: Path) -> None:
        doc = json.loads((ws / name).read_text())
        doc["privacy"].update(privacy)
        (ws / name).write_text(json.dumps(doc, indent=2))

    return go


def composed(out: str, rho: float, levels: int) -> Callable[[Path], None]:
    """The rows of ``levels`` summary levels overlap: the statement's ρ is the hand
    composition, ``levels`` × one row's ρ (:func:`ppdd_fixtures.hand_rho`)."""

    def check(ws: Path) -> None:
        side = json.loads((ws / f"{out}.censusdp.json").read_text())
        one = hand_rho(SHARES, rho)
        assert math.isclose(side["rho_per_row"], one, rel_tol=1e-12)
        assert math.isclose(side["rho_derived"], levels * one, rel_tol=1e-12)
        assert side["privacy_statement"]["rho"] == side["rho_derived"]
        parts = " + ".join([f"{one:.6g}"] * levels)
        assert f"ρ = {parts} = {levels * one:.6g}" in side["privacy_statement"]["text"]

    return check


def persons_release(out: str) -> Callable[[Path], None]:
    """A PPMF persons release written with ``--evaluate``: the confidential evaluation beside
    the release, never inside it, and nothing of the temporary published; the statement names
    the privacy unit, the neighbour relation, the change's 2ρ, the counties released exactly
    through their state's invariant (both states have one county, as DC) and the spend beside
    its target; each product is described once, the same way in privacy.md and README.md."""

    def check(ws: Path) -> None:
        root, rel = ws / out, ws / out / "release"
        assert sorted(p.name for p in root.iterdir()) == [MARKER, "evaluation", "release"]
        assert (root / "evaluation" / "CONFIDENTIAL.txt").is_file()
        assert not [p.name for p in rel.rglob(".*")], "a hidden file was published"
        m = json.loads((rel / "manifest.json").read_text())
        priv, text = m["privacy"], (rel / "privacy.md").read_text()
        readme = (rel / "README.md").read_text()
        assert priv["unit"] == "person" and priv["neighbour"] == "add/remove"
        assert (
            "privacy unit: one person" in text and "adding or removing one person's record" in text
        )
        assert "changing one person's record" in text and "at most 2ρ" in text
        for st, cou in (("01", "001"), ("02", "005")):
            exact = f"county {st}{cou} (the only child of state {st}): total"
            assert (
                exact in priv["exact"] and exact in m["exact_through_invariants"] and exact in text
            )
        county = pd.read_csv(rel / "unbiased" / "pl94_county.csv", dtype={"GEOID": str})
        assert list(county["P1_001N_se"]) == [0, 0]  # exact, and the statement says so
        assert f"exactly ρ = {priv['rho']:.7g}" in text and "target was ρ = 2)" in text
        for step in m["product_steps"]:
            assert step["wording"] in text and step["wording"] in readme

    return check


def small_sigma(out: str) -> Callable[[Path], None]:
    """The run ended with σ² = 39/1024 (σ ≈ 0.195, where the exact sampler had hung)."""

    def check(ws: Path) -> None:
        released(out)(ws)
        m = json.loads((ws / out / "release" / "manifest.json").read_text())
        assert {x["law"] for x in m["measurements"]} == {"DiscreteGaussian(sigma2=39/1024)"}

    return check


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
    C("hierarchy describe a directory", ["hierarchy", "describe", "other", "--level", "state=fips:2"], "other"),
    C("hierarchy describe binary", ["hierarchy", "describe", "b.csv", "--level", "state=fips:2"], "b.csv", "UTF-8", setup=write("b.csv", b"\x00\xff" * 40)),
    C("hierarchy describe width 0", ["hierarchy", "describe", "data.csv", "--level", "state=fips:0"], "state=fips:0"),
    C("hierarchy describe width -2", ["hierarchy", "describe", "data.csv", "--level", "state=fips:-2"], "state=fips:-2"),
    C("hierarchy describe width x", ["hierarchy", "describe", "data.csv", "--level", "state=fips:x"], "state=fips:x"),
    C("hierarchy describe level twice", ["hierarchy", "describe", "data.csv", "--level", "state=fips:2", "--level", "state=fips:2"], "unique"),
    C("allocate without its options", ["allocate", "nope.toml"], "--target"),
    # -- issue 33: a Dask worker that dies ---------------------------------------------------
    # the workers must not leave sitecustomize's bytecode behind in the workspace
    C("run distributed: every worker dies starting", RUN + ["--out", "o", "--scheduler", "distributed"], "worker process died", "--scheduler threads", setup=write("die/sitecustomize.py", DIE_IN_SPAWNED_CHILD), env={"PYTHONPATH": "{ws}/die", "PYTHONDONTWRITEBYTECODE": "1"}),
    # -- issue 33: bare-CR (old Mac OS) line ends ------------------------------------------------
    C("spec CR-only line ends", RUN + ["--out", "o"], "spec.toml", "carriage return", setup=cr_only("spec.toml")),
    A("data with CR-only line ends", RUN + ["--out", "o"], released("o"), setup=cr_only("data.csv")),
    C("nhgis CR-only line ends", PRIV + ["-o", "p.csv"], "nhgis.csv", "carriage return", setup=cr_only("nhgis.csv")),
    C("nspec CR-only line ends", PRIV + ["-o", "p.csv"], "nspec.toml", "carriage return", setup=cr_only("nspec.toml")),
    C("ppmf CR-only line ends", PPRIV + ["-o", "o"], "ppmf.csv", "carriage return", setup=cr_only("ppmf.csv")),
    C("ppmf spec CR-only line ends", PPRIV + ["-o", "o"], "pspec.toml", "carriage return", setup=cr_only("pspec.toml")),
    C("areas file CR-only line ends", PPRIV + ["-o", "o"], "places.txt", "carriage return", setup=cr_only("places.txt")),
    C("block list CR-only line ends", PPRIV + ["-o", "o"], "blocks.csv", "carriage return", setup=cr_only("blocks.csv")),
    C("predict spec CR-only line ends", PRED + ["--out", "o"], "predspec.toml", "carriage return", setup=cr_only("predspec.toml")),
    C("predict --areas CR-only line ends", PRED + ["--out", "o", "--areas", "a.csv"], "a.csv", "carriage return", setup=both(write("a.csv", AREAS), cr_only("a.csv"))),
    # -- issue 33: budgets and sizes that rounded to 0 or 1, or would never end ----------------
    C("ppmf rho = 1e-300", PPRIV + ["-o", "o"], "pspec.toml", "privacy.rho", "1e-12", setup=pspec("rho = 2.0", "rho = 1e-300")),
    C("ppmf rho = 1e300", PPRIV + ["-o", "o"], "pspec.toml", "privacy.rho", "at most", setup=pspec("rho = 2.0", "rho = 1e300")),
    C("ppmf rho = 0", PPRIV + ["-o", "o"], "privacy.rho", "positive", setup=pspec("rho = 2.0", "rho = 0.0")),
    C("ppmf rho a string", PPRIV + ["-o", "o"], "privacy.rho", "a string", setup=pspec("rho = 2.0", 'rho = "2"')),
    C("ppmf rho inf", PPRIV + ["-o", "o"], "privacy.rho", "finite", setup=pspec("rho = 2.0", "rho = inf")),
    C("ppmf rho nan", PPRIV + ["-o", "o"], "privacy.rho", "finite", setup=pspec("rho = 2.0", "rho = nan")),
    C("ppmf area share 0.9999999999999999", PPRIV + ["-o", "o"], "pspec.toml", "areas.share", "0.9999999999999999", setup=pspec("skip_blank = true", "skip_blank = true\nshare = 0.9999999999999999")),
    C("ppmf area share 1e-300", PPRIV + ["-o", "o"], "areas.share", setup=pspec("skip_blank = true", "skip_blank = true\nshare = 1e-300")),
    C("ppmf area share 1", PPRIV + ["-o", "o"], "areas.share", "(0, 1)", setup=pspec("skip_blank = true", "skip_blank = true\nshare = 1.0")),
    C("ppmf delta 1", PPRIV + ["-o", "o"], "privacy.delta", setup=pspec("rho = 2.0", "rho = 2.0\ndelta = 1.0")),
    C("ppmf accounting pure", PPRIV + ["-o", "o"], "privacy.accounting", setup=pspec('accounting = "zcdp"', 'accounting = "pure"')),
    C("ppmf noise laplace", PPRIV + ["-o", "o"], "mechanism.noise", setup=pspec("[report]", '[mechanism]\nnoise = "laplace"\n[report]')),
    C("ppmf [report] repetitions 1", PPRIV + ["-o", "o"], "report.repetitions", setup=pspec("repetitions = 2", "repetitions = 1")),
    C("ppmf [report] repetitions 10^6", PPRIV + ["-o", "o"], "report.repetitions", "1000", setup=pspec("repetitions = 2", "repetitions = 1000000")),
    C("ppmf [report] repetitions 2^63-1", PPRIV + ["-o", "o"], "report.repetitions", setup=pspec("repetitions = 2", "repetitions = 9223372036854775807")),
    C("ppmf [run] seed -1", PPRIV + ["-o", "o"], "run.seed", setup=pspec("[report]", "[run]\nseed = -1\n[report]")),
    C("ppmf spec unknown section", PPRIV + ["-o", "o"], "'extra'", setup=pspec("[report]", "[extra]\nx = 1\n[report]")),
    C("ppmf spec unknown key", PPRIV + ["-o", "o"], "privacy.epsilon", setup=pspec("rho = 2.0", "rho = 2.0\nepsilon = 1.0")),
    C("ppmf --repetitions 10^12", PPRIV + ["-o", "o", "--repetitions", "1000000000000"], "--repetitions", "1000"),
    C("ppmf --repetitions 1", PPRIV + ["-o", "o", "--repetitions", "1"], "--repetitions"),
    C("ppmf --repetitions x", PPRIV + ["-o", "o", "--repetitions", "x"], "--repetitions"),
    C("predict blocks = -5", PRED + ["--out", "o"], "predspec.toml", "hierarchy.blocks", setup=predspec("blocks = 60", "blocks = -5")),
    C("predict blocks = 0 (not the default)", PRED + ["--out", "o"], "hierarchy.blocks", "omit it", setup=predspec("blocks = 60", "blocks = 0")),
    C("predict blocks = 10^15", PRED + ["--out", "o"], "hierarchy.blocks", setup=predspec("blocks = 60", "blocks = 1000000000000000")),
    C("predict blocks = 2^63", PRED + ["--out", "o"], "hierarchy.blocks", setup=predspec("blocks = 60", "blocks = 9223372036854775808")),
    C("predict blocks = 60.5", PRED + ["--out", "o"], "hierarchy.blocks", "integer", setup=predspec("blocks = 60", "blocks = 60.5")),
    C("predict seed = -1", PRED + ["--out", "o"], "hierarchy.seed", setup=predspec("seed = 2", "seed = -1")),
    C("predict seed = 2^63", PRED + ["--out", "o"], "hierarchy.seed", setup=predspec("seed = 2", "seed = 9223372036854775808")),
    C("run --partitions 10^12", RUN + ["--out", "o", "--partitions", "1000000000000"], "partitions", "at most"),
    C("spec [run] repetitions 10^12", RUN + ["--out", "o"], "run.repetitions", "at most", setup=spec("[estimators]", "[run]\nrepetitions = 1000000000000\n[estimators]")),
    C("spec [run] partitions 10^12", RUN + ["--out", "o"], "run.partitions", setup=spec("[estimators]", "[run]\npartitions = 1000000000000\n[estimators]")),
    # -- issue 33: confidential values never echoed (a planted value must not appear) ---------
    C("PPMF without header as [areas] file", PPRIV + ["-o", "o"], "secret.csv", "'BLOCKID'", secret=SECRET, setup=both(write("secret.csv", HEADLESS), pspec('file = "places.txt"', 'file = "secret.csv"'))),
    C("PPMF without header as block list", PPRIV + ["-o", "o"], "secret.csv", "header line", secret=SECRET, setup=both(write("secret.csv", HEADLESS), pspec('blocks = "blocks.csv"', 'blocks = "secret.csv"'))),
    C("PPMF without header as --areas", PPRIV + ["-o", "o", "--areas", "secret.csv"], "secret.csv", secret=SECRET, setup=write("secret.csv", HEADLESS)),
    C("PPMF without header as predict --areas", PRED + ["--out", "o", "--areas", "secret.csv"], "secret.csv", "'block'", secret=SECRET, setup=write("secret.csv", HEADLESS)),
    C("PPMF without its header", PPRIV + ["-o", "o"], "ppmf.csv", "header line", secret=SECRET, setup=write("ppmf.csv", HEADLESS)),
    C("PPMF as the [areas] file", PPRIV + ["-o", "o"], "ppmf.csv", "'BLOCKID'", setup=pspec('file = "places.txt"', 'file = "ppmf.csv"')),
    C("PPMF as the block list", PPRIV + ["-o", "o"], "ppmf.csv", "block_column", setup=pspec('blocks = "blocks.csv"', 'blocks = "ppmf.csv"')),
    C("PPMF code planted", PPRIV + ["-o", "o"], "data row 1", "'CENRACE'", secret=SECRET, setup=write("ppmf.csv", PPMF.replace(PPMF_FIRST, PPMF_FIRST.rsplit(",", 1)[0] + "," + SECRET))),
    C("PPMF geocode planted", PPRIV + ["-o", "o"], "data row 1", "'TABBLKST'", secret=SECRET, setup=write("ppmf.csv", PPMF.replace(PPMF_FIRST, SECRET + "," + PPMF_FIRST.split(",", 1)[1]))),
    C("PPMF CENRACE 64 not echoed", PPRIV + ["-o", "o"], "'CENRACE'", "outside", secret="'64'", setup=write("ppmf.csv", PPMF.replace(PPMF_FIRST, PPMF_FIRST.rsplit(",", 1)[0] + ",64"))),
    C("data without header, planted", RUN + ["--out", "o"], "data.csv", "'pop'", secret=SECRET, setup=write("data.csv", f"01001,{SECRET}\n01003,20\n")),
    C("nhgis without header, planted", PRIV + ["-o", "p.csv"], "nhgis.csv", "header line", secret=SECRET, setup=write("nhgis.csv", f"G0100010,{SECRET},Alabama,3,4,3,5\nG0100030,B,Alabama,6,2,7,1\n")),
    C("nhgis count planted", PRIV + ["-o", "p.csv"], "row 2", "'H78003_sf'", secret=SECRET, setup=write("nhgis.csv", NHGIS.replace("B,Alabama,6,2,7,1", f"B,Alabama,6,2,{SECRET},1"))),
    C("data count planted", RUN + ["--out", "o"], "row 2", "'pop'", secret=SECRET, setup=write("data.csv", DATA.replace("01003,20", f"01003,{SECRET}"))),
    # -- PPMF route: files -------------------------------------------------------------------
    C("ppmf empty", PPRIV + ["-o", "o"], "ppmf.csv", "empty", setup=write("ppmf.csv", "")),
    C("ppmf header only", PPRIV + ["-o", "o"], "ppmf.csv", "no persons", setup=write("ppmf.csv", PPMF_HEADER + "\n")),
    C("ppmf ragged row", PPRIV + ["-o", "o"], "ppmf.csv", "fields", setup=write("ppmf.csv", PPMF + "01,001\n")),
    C("ppmf UTF-16", PPRIV + ["-o", "o"], "ppmf.csv", "UTF-8", setup=write("ppmf.csv", PPMF.encode("utf-16"))),
    C("ppmf duplicate header", PPRIV + ["-o", "o"], "ppmf.csv", "columns 9 and 10", setup=write("ppmf.csv", PPMF.replace("CENRACE", "CENHISP", 1))),
    C("ppmf no CENRACE", PPRIV + ["-o", "o"], "'CENRACE'", setup=write("ppmf.csv", PPMF.replace("CENRACE", "RACE", 1))),
    C("ppmf block not in the list", PPRIV + ["-o", "o"], "ppmf.csv", "blocks.csv", setup=write("blocks.csv", BLOCKS.replace("010010001001000", "010010001001009"))),
    C("ppmf block list missing a block", PPRIV + ["-o", "o"], "not in blocks.csv", setup=write("blocks.csv", "\n".join(BLOCKS.splitlines()[:-1]) + "\n")),
    C("ppmf without a spec", ["privatize", "ppmf.csv", "-o", "o"], "--spec"),
    C("ppmf --rho", PPRIV + ["-o", "o", "--rho", "1"], "--rho"),
    C("ppmf --areas missing", PPRIV + ["-o", "o", "--areas", "nope.txt"], "nope.txt"),
    C("ppmf --blocks a directory", PPRIV + ["-o", "o", "--blocks", "other"], "other"),
    C("ppmf [areas] level = block", PPRIV + ["-o", "o"], "areas.level", setup=pspec('level = "place"', 'level = "block"')),
    C("ppmf [areas] file missing", PPRIV + ["-o", "o"], "nope.txt", setup=pspec('file = "places.txt"', 'file = "nope.txt"')),
    C("ppmf [areas] file a directory", PPRIV + ["-o", "o"], "other", setup=pspec('file = "places.txt"', 'file = "other"')),
    C("ppmf [hierarchy] blocks missing", PPRIV + ["-o", "o"], "nope.csv", setup=pspec('blocks = "blocks.csv"', 'blocks = "nope.csv"')),
    C("ppmf [hierarchy] blocks a directory", PPRIV + ["-o", "o"], "other", setup=pspec('blocks = "blocks.csv"', 'blocks = "other"')),
    C("areas file empty", PPRIV + ["-o", "o"], "places.txt", "empty", setup=write("places.txt", "")),
    C("areas file header only", PPRIV + ["-o", "o"], "places.txt", "no data rows", setup=write("places.txt", "BLOCKID|PLACEFP\n")),
    C("areas file block twice", PPRIV + ["-o", "o"], "places.txt", "listed again", setup=write("places.txt", PLACES + PLACES.splitlines()[1] + "\n")),
    C("areas file unknown block", PPRIV + ["-o", "o"], "places.txt", "'BLOCKID'", "not a block", setup=write("places.txt", PLACES + "019990001001000|00100\n")),
    C("block list empty", PPRIV + ["-o", "o"], "blocks.csv", "empty", setup=write("blocks.csv", "")),
    C("block list header only", PPRIV + ["-o", "o"], "blocks.csv", "no blocks", setup=write("blocks.csv", "GEOID20\n")),
    C("block list short GEOID", PPRIV + ["-o", "o"], "blocks.csv", "15-digit", setup=write("blocks.csv", BLOCKS + "0100\n")),
    C("block list block twice", PPRIV + ["-o", "o"], "blocks.csv", "twice", setup=write("blocks.csv", BLOCKS + BLOCKS.splitlines()[1] + "\n")),
    C("nhgis --evaluate", PRIV + ["-o", "p.csv", "--evaluate"], "--evaluate", "PPMF"),
    C("nhgis --repetitions", PRIV + ["-o", "p.csv", "--repetitions", "5"], "--repetitions"),
    C("nhgis --rho without codebook", PRIV + ["-o", "p.csv", "--rho", "1"], "--rho"),
    # -- predict ------------------------------------------------------------------------------
    C("predict schema unknown", PRED + ["--out", "o"], "'nope'", setup=predspec('schema = "pl94"', 'schema = "nope"')),
    C("predict schema missing", PRED + ["--out", "o"], "predict.schema", setup=predspec('schema = "pl94"\n', "")),
    C("predict schema file missing", PRED + ["--out", "o"], "mine.toml", setup=predspec('schema = "pl94"', 'schema = "mine.toml"')),
    C("predict unknown key", PRED + ["--out", "o"], "'predict.extra'", setup=predspec('tables = ["total"]', 'tables = ["total"]\nextra = 1')),
    C("predict unknown section", PRED + ["--out", "o"], "'extra'", setup=predspec("[hierarchy]", "[extra]\n[hierarchy]")),
    C("predict quantiles 2", PRED + ["--out", "o"], "predict.quantiles", setup=predspec('tables = ["total"]', 'tables = ["total"]\nquantiles = [2.0]')),
    C("predict quantiles nan", PRED + ["--out", "o"], "predict.quantiles", setup=predspec('tables = ["total"]', 'tables = ["total"]\nquantiles = [nan]')),
    C("predict invariant unknown level", PRED + ["--out", "o"], "'moon'", setup=predspec('state = ["total"]', 'moon = ["total"]')),
    C("predict invariant unknown query", PRED + ["--out", "o"], "'sex'", setup=predspec('state = ["total"]', 'state = ["sex * votingage"]')),
    C("predict table unknown", PRED + ["--out", "o"], "'nope'", setup=predspec('tables = ["total"]', 'tables = ["nope"]')),
    C("predict spec empty", PRED + ["--out", "o"], "predspec.toml", "empty", setup=write("predspec.toml", "")),
    C("predict spec missing", ["predict", "nope.toml", "--out", "o"], "nope.toml"),
    C("predict spec a directory", ["predict", "other", "--out", "o"], "other"),
    C("predict hierarchy file missing", PRED + ["--out", "o"], "hierarchy.file", setup=predspec('synthetic = "state"', 'file = "h.npz"')),
    C("predict hierarchy file corrupt", PRED + ["--out", "o"], "hierarchy.file", "'h.npz'", setup=both(write("h.npz", b"PK junk"), predspec('synthetic = "state"\nblocks = 60\nseed = 2', 'file = "h.npz"'))),
    C("predict [allocation] without levels", PRED + ["--out", "o"], "allocation", setup=predspec("[hierarchy]", "[allocation]\nrho = -1\n[hierarchy]")),
    C("predict --areas missing", PRED + ["--out", "o", "--areas", "nope.csv"], "nope.csv"),
    C("predict --areas empty", PRED + ["--out", "o", "--areas", "a.csv"], "a.csv", "empty", setup=write("a.csv", "")),
    C("predict --areas no block column", PRED + ["--out", "o", "--areas", "a.csv"], "a.csv", "'block'", setup=write("a.csv", "x,y\n1,2\n")),
    C("predict --areas unknown block", PRED + ["--out", "o", "--areas", "a.csv"], "a.csv", "'999'", setup=write("a.csv", "block,area\n999,1\n")),
    C("predict --areas is the spec", PRED + ["--out", "o", "--areas", "predspec.toml"], "predspec.toml"),
    C("predict --area-list missing", PRED + ["--out", "o", "--areas", "a.csv", "--area-list", "nope.csv"], "nope.csv", setup=write("a.csv", AREAS)),
    R("predict --out the spec", PRED + ["--out", "predspec.toml"], "is the input 'predspec.toml'"),
    R("predict --out .", PRED + ["--out", "."], "--out '.'"),
    R("predict --out foreign dir", PRED + ["--out", "other"], "'keep.txt'"),
    C("predict --out ''", PRED + ["--out", ""], "--out", "empty"),
    # -- run: more spec values ---------------------------------------------------------------
    C("spec [run] seed a string", RUN + ["--out", "o"], "run.seed", "a string", setup=spec("[estimators]", '[run]\nseed = "7"\n[estimators]')),
    C("spec [run] scheduler empty", RUN + ["--out", "o"], "run.scheduler", setup=spec("[estimators]", '[run]\nscheduler = ""\n[estimators]')),
    C("spec [run] address http", RUN + ["--out", "o"], "run.address", setup=spec("[estimators]", '[run]\nscheduler = "distributed"\naddress = "http://x"\n[estimators]')),
    C("spec [run] address off loopback", RUN + ["--out", "o"], "run.address", "plaintext", setup=spec("[estimators]", '[run]\nscheduler = "distributed"\naddress = "tcp://10.1.2.3:8786"\n[estimators]')),
    C("spec epsilon a string", RUN + ["--out", "o"], "privacy.epsilon", "a string", setup=spec("epsilon = 1.0", 'epsilon = "1.0"')),
    C("spec epsilon a boolean", RUN + ["--out", "o"], "privacy.epsilon", "a boolean", setup=spec("epsilon = 1.0", "epsilon = true")),
    C("spec epsilon inf", RUN + ["--out", "o"], "privacy.epsilon", "finite", setup=spec("epsilon = 1.0", "epsilon = inf")),
    C("spec levels empty", RUN + ["--out", "o"], "hierarchy.levels", setup=spec('levels = ["nation", "state", "county"]', "levels = []")),
    C("spec levels twice", RUN + ["--out", "o"], "hierarchy.levels", "twice", setup=spec('levels = ["nation", "state", "county"]', 'levels = ["nation", "state", "state"]')),
    C("spec cells empty", RUN + ["--out", "o"], "data.cells", setup=spec('cells = ["pop"]', "cells = []")),
    C("spec cells twice", RUN + ["--out", "o"], "data.cells", "twice", setup=spec('cells = ["pop"]', 'cells = ["pop", "pop"]')),
    C("spec code prefix 0", RUN + ["--out", "o"], "hierarchy.codes.state", setup=spec('state = "fips:2"', 'state = "fips:0"')),
    C("spec code prefix -1", RUN + ["--out", "o"], "hierarchy.codes.state", setup=spec('state = "fips:2"', 'state = "fips:-1"')),
    C("spec code prefix 99", RUN + ["--out", "o"], "data.csv", "'state'", setup=spec('state = "fips:2"', 'state = "fips:99"')),
    C("spec data path a directory", RUN + ["--out", "o"], "other", "[data] path", setup=spec('path = "data.csv"', 'path = "other"')),
    C("spec data path missing", RUN + ["--out", "o"], "gone.csv", setup=spec('path = "data.csv"', 'path = "gone.csv"')),
    C("spec data path dangling link", RUN + ["--out", "o"], "dl.csv", setup=both(symlink("dl.csv", "nowhere.csv"), spec('path = "data.csv"', 'path = "dl.csv"'))),
    C("--data /dev/null", RUN + ["--out", "o", "--data", "/dev/null"], "/dev/null"),
    C("spec source unknown", RUN + ["--out", "o"], "data.source", "'excel'", setup=spec('source = "csv"', 'source = "excel"')),
    C("spec key twice", RUN + ["--out", "o"], "spec.toml", "TOML", setup=spec("epsilon = 1.0", "epsilon = 1.0\nepsilon = 2.0")),
    C("spec NUL byte", RUN + ["--out", "o"], "spec.toml", "TOML", setup=spec("epsilon = 1.0", "epsilon = 1.0\x00")),
    C("spec latin-1", RUN + ["--out", "o"], "spec.toml", "UTF-8", setup=write("spec.toml", SPEC.replace("[data]", "# caf\xe9\n[data]").encode("latin-1"))),
    C("spec UTF-16", RUN + ["--out", "o"], "spec.toml", "UTF-8", setup=write("spec.toml", SPEC.encode("utf-16"))),
    C("spec queries unknown level", RUN + ["--out", "o"], "queries.moon", setup=spec('county = ["detailed"]\n[mechanism]', 'county = ["detailed"]\nmoon = ["detailed"]\n[mechanism]')),
    C("spec shares unknown level", RUN + ["--out", "o"], "level_shares.moon", setup=spec("county = 0.5 }", "moon = 0.5 }")),
    C("spec shares negative", RUN + ["--out", "o"], "level_shares.county", "positive", setup=spec("state = 0.5, county = 0.5", "state = 1.5, county = -0.5")),
    C("spec noise of another accounting", RUN + ["--out", "o"], "mechanism.noise", "zcdp", setup=spec('"discrete_laplace"', '"discrete_gaussian"')),
    C("spec no estimator", RUN + ["--out", "o"], "estimators.run", setup=spec('["gls"]', "[]")),
    # -- run: more data files ----------------------------------------------------------------
    C("data UTF-16", RUN + ["--out", "o"], "data.csv", "encoding", setup=write("data.csv", DATA.encode("utf-16"))),
    C("data latin-1 code", RUN + ["--out", "o"], "data.csv", "encoding", setup=write("data.csv", DATA.replace("01001", "0100\xe9").encode("latin-1"))),
    C("data count 10^30", RUN + ["--out", "o"], "row 2", "'pop'", "int64", setup=write("data.csv", DATA.replace("01003,20", "01003,1" + "0" * 30))),
    C("data count 2^63", RUN + ["--out", "o"], "row 2", "'pop'", "int64", setup=write("data.csv", DATA.replace("01003,20", "01003,9223372036854775808"))),
    C("data count nan", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,nan"))),
    C("data count NaN", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,NaN"))),
    C("data count -inf", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,-inf"))),
    C("data count 0x14", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,0x14"))),
    C("data count with a NUL", RUN + ["--out", "o"], "row 2", "'pop'", setup=write("data.csv", DATA.replace("01003,20", "01003,2\x000"))),
    C("data code too long", RUN + ["--out", "o"], "row 2", "'fips'", setup=write("data.csv", DATA.replace("01003,20", "0100399,20"))),
    C("data code blank", RUN + ["--out", "o"], "row 2", "'fips'", setup=write("data.csv", DATA.replace("01003,20", ",20"))),
    C("data code a formula", RUN + ["--out", "o"], "row 2", "'fips'", setup=write("data.csv", DATA.replace("01003,20", "=1+1,20"))),
    C("data header twice the same", RUN + ["--out", "o"], "'fips' occurs twice", setup=write("data.csv", DATA.replace("fips,pop", "fips,fips"))),
    C("data quote never closed", RUN + ["--out", "o"], "data.csv", "quoting", setup=write("data.csv", DATA.replace("01003,20", '"01003,20'))),
    # -- privatize (NHGIS): more ---------------------------------------------------------------
    C("nhgis count nan", PRIV + ["-o", "p.csv"], "row 2", "'H78003_sf'", setup=write("nhgis.csv", NHGIS.replace("B,Alabama,6,2,7,1", "B,Alabama,6,2,nan,1"))),
    C("nhgis count 10^30", PRIV + ["-o", "p.csv"], "row 2", "int64", setup=write("nhgis.csv", NHGIS.replace("B,Alabama,6,2,7,1", "B,Alabama,6,2,1" + "0" * 30 + ",1"))),
    C("nhgis GISJOIN malformed", PRIV + ["-o", "p.csv"], "row 2", "'gisjoin'", setup=write("nhgis.csv", NHGIS.replace("G0100030", "X0100030"))),
    C("nhgis GISJOIN a formula", PRIV + ["-o", "p.csv"], "row 2", "'gisjoin'", setup=write("nhgis.csv", NHGIS.replace("G0100030", "=G0100030"))),
    C("codebook unknown", ["privatize", "nhgis.csv", "--codebook", "nope", "--rho", "1", "-o", "p.csv"], "'nope'"),
    C("codebook --rho x", ["privatize", "nhgis.csv", "--codebook", "ppdd", "--rho", "x", "-o", "p.csv"], "--rho"),
    C("codebook without --rho", ["privatize", "nhgis.csv", "--codebook", "ppdd", "-o", "p.csv"], "--rho"),
    # -- accepted: hostile-looking but valid; outputs checked --------------------------------
    A("spec with a UTF-8 BOM", RUN + ["--out", "o"], released("o"), setup=bom("spec.toml")),
    A("data with a UTF-8 BOM", RUN + ["--out", "o"], released("o"), setup=bom("data.csv")),
    A("data with CRLF line ends", RUN + ["--out", "o"], released("o"), setup=crlf("data.csv")),
    A("data with blank lines", RUN + ["--out", "o"], released("o"), setup=write("data.csv", DATA.replace("\n", "\n\n"))),
    A("data count 20.0", RUN + ["--out", "o"], released("o"), setup=write("data.csv", DATA.replace("01003,20", "01003,20.0"))),
    A("nhgis with a UTF-8 BOM", PRIV + ["-o", "p.csv"], names_kept("p.csv", {}), setup=bom("nhgis.csv")),
    A("nhgis names that are formulas", PRIV + ["-o", "p.csv"], names_kept("p.csv", FORMULA_NAMES), setup=write("nhgis.csv", formula_names(NHGIS))),
    A("predict spec with a UTF-8 BOM", PRED + ["--out", "o"], predicted("o"), setup=bom("predspec.toml")),
    A("predict --areas with a UTF-8 BOM", PRED + ["--out", "o", "--areas", "a.csv"], predicted("o", AREA_CODES), setup=both(write("a.csv", AREAS), bom("a.csv"))),
    A("predict area codes that are formulas", PRED + ["--out", "o", "--areas", "a.csv"], predicted("o", FORMULA_AREAS), setup=write("a.csv", formula_areas(AREAS))),
    # -- issue 33: every reproduction of the audit, through the CLI --------------------------
    A("nhgis counties and places of one state: rho composed", ["privatize", "il.csv", "--codebook", "ppdd", "--rho", "0.2048", "-o", "rel.csv"], composed("rel.csv", 0.2048, 2), setup=ppdd_rows("il.csv", IL_COUNTIES_AND_PLACES, PLACEA=IL_PLACEA)),
    A("nhgis states and counties: rho composed", ["privatize", "sc.csv", "--codebook", "ppdd", "--rho", "1", "-o", "rel.csv"], composed("rel.csv", 1.0, 2), setup=ppdd_rows("sc.csv", ["G170", "G060", "G1700310", "G1700430"])),
    C("nhgis counties and places, levels untold", ["privatize", "il.csv", "--codebook", "ppdd", "--rho", "0.5", "-o", "rel.csv"], "il.csv", "data row 4", "'gisjoin'", "cannot be told", "level_column", setup=ppdd_rows("il.csv", IL_COUNTIES_AND_PLACES)),
    C("nhgis spec route: a place among counties", PRIV + ["-o", "p.csv"], "nhgis.csv", "data row 5", "'gisjoin'", "one row of each", setup=write("nhgis.csv", NHGIS + "G01014000,E,Alabama,2,1,2,1\n")),
    C("--compose-with a manifest edited to rho = 1e-9", UPRIV + ["-o", "u", "--compose-with", "po"], "manifest.json' changed since censusdp wrote it", secret=SECRET, setup=both(write("units.csv", UNITS), own("persons", "po"), tamper("po/manifest.json", rho=1e-9, note=SECRET))),
    C("--compose-with a units release as the persons one", UPRIV + ["-o", "u", "--compose-with", "uo"], "needs a persons release", "route ppmf_units", setup=both(write("units.csv", UNITS), own("units", "uo"))),
    C("--compose-with a run output", UPRIV + ["-o", "u", "--compose-with", "prev"], "needs a persons release", setup=both(write("units.csv", UNITS), own("run", "prev"))),
    C("--compose-with a bare manifest", UPRIV + ["-o", "u", "--compose-with", "fake"], "fake", f"no {MARKER}", secret=SECRET, setup=both(write("units.csv", UNITS), write("fake/manifest.json", json.dumps({"privacy": {"rho": 1e-9, "note": SECRET}})))),
    R("--compose-with po -o po --overwrite", UPRIV + ["-o", "po", "--overwrite", "--compose-with", "po"], "--compose-with 'po'", "an input is never written", setup=both(write("units.csv", UNITS), own("persons", "po"))),
    R("--compose-with po -o po/sub", UPRIV + ["-o", "po/sub", "--compose-with", "po"], "inside the folder", setup=both(write("units.csv", UNITS), own("persons", "po"))),
    A("ppmf --evaluate: unit, relation, exact counties, one wording", PPRIV + ["-o", "po", "--evaluate"], persons_release("po")),
    A("run beside a user's lookalike temporaries", RUN + ["--out", "o"], released("o"), secret=SECRET, setup=both(write("o.censusdp-partial-99999-abcdef/thesis.tex", f"\\begin{{document}}{SECRET}\n"), write(".o.backup01.tmp", "backup\n"))),
    A("run sigma^2 = 39/1024 ends", RUN + ["--out", "o"], small_sigma("o"), setup=both(spec('accounting = "pure"\nepsilon = 1.0', 'accounting = "zcdp"\nrho = 26.425806451612903'), spec('"discrete_laplace"', '"discrete_gaussian"'))),
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
    """One real ``run`` output, one ``privatize`` output and a PPMF persons and units release,
    copied into cases that need an earlier censusdp output."""
    d = tmp_path_factory.mktemp("built")
    _workspace(d / "ws")
    cwd = os.getcwd()
    os.chdir(d / "ws")
    try:
        assert main(["run", "spec.toml", "--out", str(d / "run"), "--seed", "1"]) == 0
        assert main(PRIV + ["-o", str(d / "p.csv"), "--seed", "1"]) == 0
        assert main(PPRIV + ["-o", str(d / "persons"), "--seed", "1"]) == 0
        (d / "ws" / "units.csv").write_text(UNITS)
        assert main(UPRIV + ["-o", str(d / "units"), "--seed", "1"]) == 0
    finally:
        os.chdir(cwd)
    BUILT.update(run=d / "run", privatize=d / "p.csv", persons=d / "persons", units=d / "units")
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


#: What each stopping signal must give: exit status and the one line on stderr.
STOPPED = {
    "SIGINT": (130, "censusdp: interrupted; nothing was written"),
    "SIGTERM": (143, "censusdp: terminated (SIGTERM); nothing was written"),  # kill, timeout
}


@pytest.mark.parametrize(
    "stage, scheduler, sig",
    [
        ("write", "sync", "SIGINT"),
        ("write", "sync", "SIGTERM"),  # issue 33: a half-written output and no message
        pytest.param("compute", "threads", "SIGINT", marks=pytest.mark.slow),
        pytest.param("compute", "threads", "SIGTERM", marks=pytest.mark.slow),
        pytest.param("compute", "distributed", "SIGINT", marks=pytest.mark.slow),  # ~30 s
    ],
)
def test_ctrl_c_one_line_exit_130_nothing_left(stage, scheduler, sig, tmp_path):
    """Ctrl-C (SIGINT to the foreground group) and SIGTERM (``kill``, ``timeout``, a batch
    scheduler) at a stage: one line, exit 130 / 143, no traceback, the workspace as it was,
    no output, no temporary, no worker left."""
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
        # what Ctrl-C (or kill -TERM -PGID) does: the whole foreground group
        os.killpg(proc.pid, getattr(signal, sig))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ready.unlink()
    code, line = STOPPED[sig]
    assert proc.returncode == code, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [line], err
    assert "Traceback" not in out + err
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
            "ppmf.csv",
            "blocks.csv",
            "places.txt",
            "pspec.toml",
            "predspec.toml",
            "prev",
            "p.csv",
            "p.csv.censusdp.json",
        ]
    )


@pytest.mark.slow  # about 35 s: each of the three tries waits for fresh worker processes
def test_a_worker_killed_while_computing_is_one_line(tmp_path, monkeypatch, capsys):
    """Every measurement task ends its worker process (as ``kill -9`` or the OOM killer
    would): after the last resubmission the run is one exit-2 line saying a worker died and
    how to retry, distributed's own error log stays off stderr, and nothing is written."""
    import dask

    import censusdp.pipelines.measure as measure

    ws = tmp_path / "ws"
    _workspace(ws)
    (tmp_path / "killer").mkdir()
    (tmp_path / "killer" / "hostile_killer.py").write_text(
        "import os\n\n\ndef measure_task(*args, **kwargs):\n    os._exit(9)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "killer"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "killer"))  # the workers import it too
    import hostile_killer

    monkeypatch.setattr(measure, "_measure_task", hostile_killer.measure_task)
    monkeypatch.chdir(ws)
    before = tree(tmp_path)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        code = main(RUN + ["--out", "o", "--scheduler", "distributed"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "worker process died while computing" in lines[0], err
    assert "--scheduler threads" in lines[0]
    assert tree(tmp_path) == before
