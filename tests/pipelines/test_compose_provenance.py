"""What a statement is composed with, and what every release's statement names.

``privatize UNITS --compose-with PERSONS``: the persons folder is verified (checksums, kind,
schema) before any work and is never an output; refusals exit 2 with one line and write
nothing. A real persons release (a small synthetic PPMF with a state of one county, as DC)
names its privacy unit and neighbour relation, the county released exactly through the state
invariant (its total's standard error is 0), the spend beside the allocation's target, and
says one thing about each product in privacy.md and README.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.app.cli import main
from censusdp.atomic import MARKER, output_dir
from censusdp.budget import PrivacyStatement
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.schema import Schema

#: Two states; state 02 has one county (05), as DC is the only county of its state.
BLOCKS = [
    (st, cou, tract, "1", f"1{b:03d}")
    for st, counties in (("01", ("001", "003")), ("02", ("005",)))
    for cou in counties
    for tract in ("000100", "000200")
    for b in range(2)
]
PERSONS_SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
delta = 1e-10
[report]
repetitions = 2
"""


def _units(path: Path, gen: np.random.Generator, n: int = 120) -> Path:
    b = gen.integers(0, len(BLOCKS), n)
    cols = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE", "TABBLK")
    frame = pd.DataFrame(
        {
            "SCHEMA_TYPE_CODE": "MUD",
            "SCHEMA_BUILD_ID": "1.1.0",
            **{c: [BLOCKS[i][j] for i in b] for j, c in enumerate(cols)},
            "RTYPE": "2",
            "HH_STATUS": np.where(gen.random(n) < 0.7, "1", "2"),
        }
    )
    frame.to_csv(path, sep="|", index=False)
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A persons release ``persons/`` and a units file, in one folder."""
    tmp = tmp_path_factory.mktemp("compose")
    data = tmp / "ppmf.csv"
    ppmf_persons(np.random.default_rng(5), 250, BLOCKS, household_share=0.9).to_csv(
        data, index=False
    )
    spec = tmp / "spec.toml"
    spec.write_text(PERSONS_SPEC)
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(tmp / "persons")]
    assert main([*argv, "--seed", "3", "--blocks-from-data"]) == 0
    units = _units(tmp / "units.csv", np.random.default_rng(6))
    return tmp, tmp / "persons", units


def _units_argv(units: Path, out: Path, *more: str) -> list[str]:
    return ["privatize", str(units), "-o", str(out), "--blocks-from-data", "--seed", "2",
            "--repetitions", "2", *more]  # fmt: skip


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _refused(argv, capsys, *needles: str) -> str:
    assert main(argv) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "warning: reproducible" not in x]
    assert len(lines) == 1 and lines[0].startswith("censusdp: error: "), lines
    err = lines[0]
    for needle in needles:
        assert needle in err, err
    return err


def test_composed_statement_adds_rho_and_names_both_parts(inputs, capsys):
    tmp, persons, units = inputs
    out = tmp / "both"
    assert main(_units_argv(units, out, "--compose-with", str(persons))) == 0
    capsys.readouterr()
    m = json.loads((out / "manifest.json").read_text())
    p = json.loads((persons / "manifest.json").read_text())["privacy"]
    alone = m["privacy_units_alone"]
    assert m["privacy"]["rho"] == p["rho"] + alone["rho"]  # the same float sum compose makes
    assert m["composed_with"]["folder"] == "persons"
    sha = hashlib.sha256((persons / "manifest.json").read_bytes()).hexdigest()
    assert m["composed_with"]["manifest_sha256"] == sha
    parts = m["privacy"]["parts"]
    assert len(parts) == 2 and "persons release 'persons'" in parts[0] and sha[:16] in parts[0]
    assert "housing-unit release" in parts[1]
    assert "persons county 02005 (the only child of state 02): total" in m["privacy"]["exact"]
    assert m["privacy"]["unit"] == "respondent" and "one record in each" in m["privacy"]["text"]
    assert parts[0].endswith(f"…): ρ = {p['rho']:g} (zCDP)")
    assert "composed of: persons release 'persons'" in (out / "privacy.md").read_text()


def test_an_evaluated_persons_release_is_composed_from_its_release_folder(inputs, capsys):
    """``privatize --evaluate`` writes ``release/`` beside the confidential ``evaluation/``:
    the folder it wrote is accepted as it stands, its statement read from ``release/``."""
    tmp, _, units = inputs
    data, spec = tmp / "ppmf.csv", tmp / "spec.toml"
    evaluated = tmp / "persons_evaluated"
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(evaluated), "--evaluate"]
    assert main([*argv, "--seed", "3", "--blocks-from-data"]) == 0
    assert (evaluated / "release" / "manifest.json").is_file()
    out = tmp / "both_evaluated"
    assert main(_units_argv(units, out, "--compose-with", str(evaluated))) == 0
    capsys.readouterr()
    m = json.loads((out / "manifest.json").read_text())
    p = json.loads((evaluated / "release" / "manifest.json").read_text())["privacy"]
    assert m["privacy"]["rho"] == p["rho"] + m["privacy_units_alone"]["rho"]
    sha = hashlib.sha256((evaluated / "release" / "manifest.json").read_bytes()).hexdigest()
    assert m["composed_with"]["manifest_sha256"] == sha


def test_a_tampered_persons_manifest_is_refused(inputs, capsys):
    """The audit's case: rho = 1e-9 written into the persons manifest: exit 2, nothing written."""
    tmp, persons, units = inputs
    bad = tmp / "tampered"
    shutil.copytree(persons, bad)
    doc = json.loads((bad / "manifest.json").read_text())
    doc["privacy"]["rho"] = 1e-9
    (bad / "manifest.json").write_text(json.dumps(doc, indent=2))
    out = tmp / "o_tampered"
    _refused(_units_argv(units, out, "--compose-with", str(bad)), capsys,
             "manifest.json' changed since censusdp wrote it", "checksums do not verify")  # fmt: skip
    assert not out.exists()
    # an added file, a removed file, a folder without the ownership manifest
    for edit in ("add", "remove", "no_marker"):
        shutil.rmtree(bad)
        shutil.copytree(persons, bad)
        if edit == "add":
            (bad / "extra.txt").write_text("x")
        elif edit == "remove":
            (bad / "README.md").unlink()
        else:
            (bad / MARKER).unlink()
        _refused(_units_argv(units, out, "--compose-with", str(bad)), capsys, "tampered")
        assert not out.exists()


def test_a_units_release_given_as_the_persons_one_is_refused(inputs, capsys):
    tmp, persons, units = inputs
    first = tmp / "units_release"
    assert main(_units_argv(units, first)) == 0
    capsys.readouterr()
    out = tmp / "o_units"
    _refused(_units_argv(units, out, "--compose-with", str(first)), capsys,
             "needs a persons release", "housing-unit (H1) release (route ppmf_units)")  # fmt: skip
    assert not out.exists()


def test_a_verified_folder_without_a_statement_is_refused(inputs, capsys):
    """Checksums that verify are not enough: the manifest must hold a persons statement, and
    privacy.md must carry it (a manifest edited and re-checksummed is caught there)."""
    tmp, persons, units = inputs
    out = tmp / "o_schema"
    for name, edit in (
        ("nostatement", lambda d: d.pop("privacy")),
        ("badrho", lambda d: d["privacy"].update(rho=-1.0)),
        ("rehashed", lambda d: d["privacy"].update(rho=1e-9)),
    ):
        doc = json.loads((persons / "manifest.json").read_text())
        edit(doc)
        with output_dir(tmp / name, command="privatize", info={"route": "ppmf"}) as t:
            (t / "manifest.json").write_text(json.dumps(doc))
            shutil.copy(persons / "privacy.md", t / "privacy.md")
        if name == "rehashed":  # the text still says the real rho: privacy.md disagrees
            doc["privacy"]["text"] = PrivacyStatement.from_dict(doc["privacy"]).text()
            shutil.rmtree(tmp / name)
            with output_dir(tmp / name, command="privatize", info={"route": "ppmf"}) as t:
                (t / "manifest.json").write_text(json.dumps(doc))
                shutil.copy(persons / "privacy.md", t / "privacy.md")
        _refused(_units_argv(units, out, "--compose-with", str(tmp / name)), capsys, name)
        assert not out.exists()


def test_refusal_messages_name_the_folder(inputs, capsys):
    tmp, persons, units = inputs
    out = tmp / "o_msg"
    (tmp / "fake").mkdir(exist_ok=True)
    (tmp / "fake" / "manifest.json").write_text(json.dumps({"privacy": {"rho": 1e-9}}))
    _refused(_units_argv(units, out, "--compose-with", str(tmp / "fake")), capsys,
             "fake", f"no {MARKER}")  # fmt: skip
    assert not out.exists()


@pytest.mark.parametrize("where", ["same", "inside"])
def test_the_compose_folder_is_never_the_output(inputs, capsys, where):
    """``--compose-with po -o po --overwrite`` (or -o po/sub) is refused before any work and
    leaves the persons release byte for byte as it was."""
    tmp, persons, units = inputs
    before = _digest(persons)
    out = persons if where == "same" else persons / "sub"
    _refused(_units_argv(units, out, "--compose-with", str(persons), "--overwrite"), capsys,
             "an input is never written", "--compose-with")  # fmt: skip
    assert _digest(persons) == before
    # the folder holding the persons release is refused as an output too
    _refused(_units_argv(units, tmp, "--compose-with", str(persons), "--overwrite"), capsys)
    assert _digest(persons) == before


def test_the_persons_statement_names_unit_relation_exact_areas_and_spend(inputs):
    tmp, persons, _ = inputs
    m = json.loads((persons / "manifest.json").read_text())
    priv = m["privacy"]
    assert priv["unit"] == "person" and priv["neighbour"] == "add/remove"
    text = priv["text"]
    assert "privacy unit: one person" in text and "adding or removing one person's record" in text
    assert "changing one person's record" in text and "at most 2ρ" in text
    exact = "county 02005 (the only child of state 02): total"
    assert priv["exact"] == [exact] and m["exact_through_invariants"] == [exact]
    assert exact in (persons / "privacy.md").read_text()
    county = pd.read_csv(persons / "unbiased" / "pl94_county.csv", dtype={"GEOID": str})
    se = county.set_index("GEOID")["P1_001N_se"]
    assert se["02005"] == 0 and (se.drop("02005") > 0).all()  # exact, and only it
    # spent ρ == Σ Δ²/(2σ²) of the σ² actually used; the target beside it
    schema = Schema.load("pl94")
    alloc = dataclasses.replace(schema.allocation, rho=Fraction(2))  # the spec's rho = 2.0
    plan = allocation_plan(schema, alloc)
    scaled = sum(Fraction(q.l1_sensitivity) / (2 * law.sigma2) for _, q, law in plan)
    assert abs(priv["rho"] - float(scaled)) <= 1e-15 * float(scaled)
    assert priv["target"] == 2.0 and priv["rho"] < 2.0
    assert f"target was ρ = {2:.7g}" in text and f"exactly ρ = {priv['rho']:.7g}" in text


def test_each_product_is_described_once_the_same_way_everywhere(inputs):
    """--blocks-from-data read the rows: every product says so, in privacy.md and README.md,
    from one wording; the statement is data-dependent and names what is revealed."""
    _, persons, _ = inputs
    m = json.loads((persons / "manifest.json").read_text())
    steps = m["product_steps"]
    assert [p["name"] for p in steps] == [
        "unbiased/", "nonnegative/ (tables and microdata.csv)", "size_classes.*"
    ]  # fmt: skip
    privacy_md = (persons / "privacy.md").read_text()
    readme = (persons / "README.md").read_text()
    for p in steps:
        assert not p["post_processing"]  # the hierarchy came from the rows
        assert p["wording"] in privacy_md and p["wording"] in readme
    assert steps[-1]["wording"] in (persons / "size_classes.md").read_text()
    assert m["privacy"]["data_dependent"] is True
    assert "set of blocks with at least one person" in m["privacy"]["text"]
    assert "post-processing, same privacy statement" not in readme + privacy_md
