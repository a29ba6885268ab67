"""The product contract matrix (issue 34): every registered product × every capability.

Parametrised over :data:`censusdp.pipelines.products.registry.PRODUCTS` and
:data:`~censusdp.pipelines.products.registry.CAPABILITIES`, so a product registered later (here or by
another package's entry point) enters the matrix by itself, and fails it until this file has
a fixture for it (:data:`FIXTURES`). Each cell is either

* ✔ — the product, run once on a tiny fixture through the registry's dispatch
  (:func:`~censusdp.pipelines.products.registry.privatize`), keeps the capability's promise: levels
  built from the file's codes; invariants ``==``; standard errors of the unbiased product;
  no negative cell in the non-negative product; ``release/`` and ``evaluation/`` written
  apart; ``censusdp predict`` runs on the product's spec; or
* a refusal — an exit-2 :class:`~censusdp.errors.SpecError`, one line naming the product, the
  capability and why the combination does not exist (through ``censusdp privatize`` where a
  request can ask for the capability: ``--evaluate``).

Also: the dispatch refuses a file no product claims, or several do, in one line naming every
product and why.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import run_specs
from ppmf_fixtures import ppmf_persons

from censusdp.app.cli import main
from censusdp.errors import SpecError
from censusdp.pipelines.products.registry import (
    CAPABILITIES,
    PRODUCTS,
    PrivatizeOptions,
    Written,
    choose_product,
    privatize,
    require,
)
from censusdp.pipelines.runner import EVALUATION_DIR, RELEASE_DIR


@dataclass
class Run:
    """One product run on its fixture: what was written, the inputs, and the truth the
    checks compare with."""

    written: Written
    path: Path
    spec: Path | None
    truth: dict = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)  # privatize's CLI arguments (refusals)


def _quiet(fn: Callable, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def _predicts(spec: Path, out: Path, *extra: str) -> None:
    """``censusdp predict SPEC`` exits 0 and writes its summary (no counts read)."""
    assert _quiet(main, ["predict", str(spec), "--out", str(out), *extra]) == 0
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) > 0 and (summary["se_rms"] >= 0).all()


def _evaluated(run: Run) -> None:
    """``release/`` and ``evaluation/`` side by side, the evaluation never inside the release,
    the confidential notice only in the evaluation."""
    out = run.written.out
    assert run.written.evaluation
    assert (out / RELEASE_DIR).is_dir() and (out / EVALUATION_DIR).is_dir()
    assert not (out / RELEASE_DIR / EVALUATION_DIR).exists()
    assert (out / EVALUATION_DIR / "CONFIDENTIAL.txt").is_file()
    assert not list((out / RELEASE_DIR).rglob("CONFIDENTIAL.txt"))


def _standard_errors(frame: pd.DataFrame) -> None:
    """The unbiased product's ``_se`` columns: present, finite, ≥ 0, somewhere > 0."""
    se = frame[[c for c in frame.columns if c.endswith("_se")]].to_numpy(float)
    assert se.size and np.isfinite(se).all() and (se >= 0).all() and (se > 0).any()


def _no_negative(folder: Path) -> None:
    files = sorted(folder.glob("*.csv"))
    assert files
    for f in files:
        head = pd.read_csv(f, nrows=0).columns
        codes = [c for c in head if c.lower().endswith(("geoid", "gisjoin"))]
        frame = pd.read_csv(f, dtype=dict.fromkeys(codes, str))
        values = frame.select_dtypes("number").drop(
            columns=[c for c in frame.columns if c in ("se", "moe") or c.endswith(("_se", "_moe"))],
            errors="ignore",
        )
        assert (values.to_numpy() >= 0).all(), f.name


# -- cells: an NHGIS file of disjoint cells with a run spec ------------------------------------
def _cells(tmp: Path, estimator: str = "gls") -> Run:
    path, spec = tmp / "counties.csv", tmp / "spec.toml"
    path.write_text(run_specs.SMALL_NHGIS)
    spec.write_text(run_specs.SMALL_NHGIS_SPEC.replace('["gls"]', f'["{estimator}"]'))
    written = privatize(path, spec, tmp / "out.csv", PrivatizeOptions(seed=3))
    truth = pd.read_csv(path, dtype={"gisjoin": str})
    return Run(written, path, spec, {"frame": truth}, ["--spec", str(spec)])


def _cells_state_sums(run: Run, column: str) -> tuple[pd.Series, pd.Series]:
    out = pd.read_csv(run.written.out, dtype={"gisjoin": str})
    truth = run.truth["frame"]
    assert list(out["gisjoin"]) == list(truth["gisjoin"])  # the file's rows, in its layout
    state = out["gisjoin"].str[1:3]  # the GISJOIN's state code: the hierarchy's state level
    return out.groupby(state)[f"{column}_dp"].sum(), truth.groupby(state)[f"{column}_sf"].sum()


def _cells_checks(run: Run, capability: str, tmp: Path) -> None:
    if capability == "hierarchy_from_codes":  # no code columns named: levels from GISJOIN
        assert "codes" not in run.spec.read_text()
        got, want = _cells_state_sums(run, "H78003")
        assert list(got.index) == ["01", "02"] and (got == want).all()
    elif capability == "invariants":  # [invariants] state = "detailed": every cell ==
        for column in ("H78003", "H78024"):
            got, want = _cells_state_sums(run, column)
            assert (got == want).all()
        assert "state: detailed" in run.written.statement
    elif capability == "unbiased":
        _standard_errors(pd.read_csv(run.written.out))
        side = json.loads(Path(f"{run.written.out}.censusdp.json").read_text())
        assert side["estimator"] == "gls"
    elif capability == "nonnegative":  # the TopDown-style estimator: non-negative integers
        topdown = _cells(tmp, "topdown")
        out = pd.read_csv(topdown.written.out)
        values = out[["H78003_dp", "H78024_dp"]].to_numpy()
        assert (values >= 0).all() and values.dtype.kind == "i"
    elif capability == "predict":
        _predicts(run.spec, tmp / "predict", "--data", str(run.path))
    else:
        raise AssertionError(f"cells: no check of the promise of {capability!r}")


# -- codebook: overlapping PPDD tables of counties over [hierarchy] ----------------------------
def _codebook(tmp: Path) -> Run:
    from censusdp.pipelines.io.codebook import Codebook
    from tests.pipelines.test_codebook_hierarchy import SPEC, county_codes, write_county_file
    from tests.pipelines.test_privatize_codebook import synthetic_truth

    cb = Codebook.load("ppdd")
    truth = synthetic_truth(cb, n=6, seed=3)
    codes = county_codes(6)
    path = write_county_file(tmp / "counties.csv", cb, truth, codes)
    spec = tmp / "spec.toml"
    spec.write_text(SPEC.format(codebook="ppdd", rho=1.0) + "[evaluate]\nrepetitions = 2\n")
    written = privatize(path, spec, tmp / "out", PrivatizeOptions(seed=3))
    total = truth[:, cb.columns.index("H7V001")]  # P1: total persons
    states = pd.Series(total).groupby([c[1:3] for c in codes]).sum()
    return Run(written, path, spec, {"states": states}, ["--spec", str(spec)])


def _codebook_checks(run: Run, capability: str, tmp: Path) -> None:
    rel = run.written.out / RELEASE_DIR
    if capability == "hierarchy_from_codes":
        assert sorted(p.name for p in (rel / "unbiased").glob("*.csv")) == [
            "county.csv",
            "data_dictionary.csv",
            "nation.csv",
            "state.csv",
        ]
        states = pd.read_csv(rel / "unbiased" / "state.csv", dtype={"gisjoin": str})
        assert sorted(states["gisjoin"].str[1:3]) == ["17", "18"]
    elif capability == "invariants":  # [invariants] state = "total", both products
        for product in ("unbiased", "nonnegative"):
            states = pd.read_csv(rel / product / "state.csv", dtype={"gisjoin": str})
            got = states.set_index(states["gisjoin"].str[1:3])["H7V001_dp"].sort_index()
            assert (got == run.truth["states"].sort_index()).all()
    elif capability == "unbiased":
        _standard_errors(pd.read_csv(rel / "unbiased" / "county.csv"))
    elif capability == "nonnegative":
        _no_negative(rel / "nonnegative")
    elif capability == "evaluate":
        _evaluated(run)
    elif capability == "predict":
        _predicts(run.spec, tmp / "predict")
    else:
        raise AssertionError(f"codebook: no check of the promise of {capability!r}")


# -- ppmf: PPMF persons ------------------------------------------------------------------------
PPMF_BLOCKS = [
    (st, cou, tract, bg, f"{bg}{b:03d}")
    for st, counties in (("01", ("001", "003")), ("02", ("005",)))
    for cou in counties
    for tract in ("000100", "000200")
    for bg in ("1", "2")
    for b in range(2)
]
PPMF_SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
[hierarchy]
blocks = "blocks.csv"
[report]
repetitions = 2
"""


def _ppmf(tmp: Path) -> Run:
    persons = ppmf_persons(np.random.default_rng(5), 300, PPMF_BLOCKS, household_share=0.9)
    path, spec = tmp / "ppmf.csv", tmp / "spec.toml"
    persons.to_csv(path, index=False)
    blocks = ["".join((st, cou, tr, blk)) for st, cou, tr, _, blk in PPMF_BLOCKS]
    pd.DataFrame({"GEOID20": blocks}).to_csv(tmp / "blocks.csv", index=False)
    spec.write_text(PPMF_SPEC)
    written = privatize(path, spec, tmp / "out", PrivatizeOptions(seed=3, evaluate=True))
    states = persons.groupby("TABBLKST").size()
    counties = sorted(set(persons["TABBLKST"] + persons["TABBLKCOU"]))
    truth = {"states": states, "n": len(persons), "counties": counties}
    return Run(written, path, spec, truth, ["--spec", str(spec)])


def _ppmf_checks(run: Run, capability: str, tmp: Path) -> None:
    rel = run.written.out / RELEASE_DIR

    def table(product: str, level: str) -> pd.DataFrame:
        return pd.read_csv(rel / product / f"pl94_{level}.csv", dtype={"GEOID": str})

    if capability == "hierarchy_from_codes":  # TABBLKST ... TABBLK: every level
        for level in ("nation", "state", "county", "tract", "block_group", "block"):
            assert (rel / "unbiased" / f"pl94_{level}.csv").is_file()
        assert sorted(table("unbiased", "county")["GEOID"]) == run.truth["counties"]
    elif capability == "invariants":  # the nation and state totals, both products
        for product in ("unbiased", "nonnegative"):
            assert (table(product, "nation")["P1_001N"] == run.truth["n"]).all()
            states = table(product, "state").set_index("GEOID")["P1_001N"].sort_index()
            assert (states == run.truth["states"].sort_index()).all()
    elif capability == "unbiased":
        _standard_errors(table("unbiased", "block"))
    elif capability == "nonnegative":
        _no_negative(rel / "nonnegative")
    elif capability == "evaluate":
        _evaluated(run)
    elif capability == "predict":
        _predicts(run.spec, tmp / "predict")
    else:
        raise AssertionError(f"ppmf: no check of the promise of {capability!r}")


# -- ppmf_units: PPMF housing units ------------------------------------------------------------
UNITS_SPEC = """
[data]
source = "ppmf_units"
[privacy]
accounting = "zcdp"
rho = 1.0
[hierarchy]
blocks = "blocks.csv"
[report]
repetitions = 2
"""


def _units(tmp: Path) -> Run:
    from tests.pipelines.test_units_h1 import BLOCKS, units_frame, write

    frame = units_frame(np.random.default_rng(16), 300, 5)
    path, spec = write(frame, tmp / "units.csv"), tmp / "spec.toml"
    blocks = ["".join((st, cou, tr, blk)) for st, cou, tr, _, blk in BLOCKS]
    pd.DataFrame({"GEOID20": blocks}).to_csv(tmp / "blocks.csv", index=False)
    spec.write_text(UNITS_SPEC)
    written = privatize(path, spec, tmp / "out", PrivatizeOptions(seed=3, evaluate=True))
    geoid = frame["TABBLKST"] + frame["TABBLKCOU"] + frame["TABTRACTCE"] + frame["TABBLK"]
    units = geoid[frame["RTYPE"] == "2"].value_counts()
    return Run(written, path, spec, {"units": units}, ["--spec", str(spec)])


def _units_checks(run: Run, capability: str, tmp: Path) -> None:
    rel = run.written.out / RELEASE_DIR

    def table(level: str, product: str = "") -> pd.DataFrame:
        return pd.read_csv(rel / product / f"h1_{level}.csv", dtype={"GEOID": str})

    if capability == "hierarchy_from_codes":
        assert sorted(table("county")["GEOID"]) == ["44001", "44003"]
        assert len(table("block")) == 9
    elif capability == "invariants":  # H1_001N (housing units) of every block, both products
        for product in ("", "nonnegative"):
            got = table("block", product).set_index("GEOID")["H1_001N"]
            want = run.truth["units"].reindex(got.index, fill_value=0)
            assert (got == want).all()
            assert (got == table("block", product)[["H1_002N", "H1_003N"]].sum(axis=1).values).all()
    elif capability == "unbiased":
        _standard_errors(table("block"))
    elif capability == "nonnegative":
        _no_negative(rel / "nonnegative")
    elif capability == "evaluate":
        _evaluated(run)
    elif capability == "predict":
        _predicts(run.spec, tmp / "predict")
    else:
        raise AssertionError(f"units: no check of the promise of {capability!r}")


# -- nmf: a Noisy Measurement File folder --------------------------------------------------------
def _nmf(tmp: Path) -> Run:
    from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
    from censusdp.pipelines.io.nmf_writer import simulate_nmf, write_nmf, write_state_totals
    from censusdp.rng import KeyedRNG

    st = synthetic_us(3, states=1, counties=2, tracts=3, block_groups=4, blocks=12,
                      population=300)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=3)
    subs = simulate_nmf(h, block, cell, count, aian_counties=np.zeros(h["county"].size, bool),
                        with_us=False, evaluation_rng=KeyedRNG.reproducible(7, warn=False))  # fmt: skip
    root = write_nmf(tmp / "nmf", list(subs))
    totals = {"01": int(count.sum())}
    write_state_totals(tmp / "p1.csv", totals)
    written = privatize(root, None, tmp / "out", PrivatizeOptions(state_totals=tmp / "p1.csv"))
    return Run(written, root, None, {"totals": totals})


def _nmf_checks(run: Run, capability: str, tmp: Path) -> None:
    out = run.written.out

    def table(level: str) -> pd.DataFrame:
        return pd.read_csv(out / f"pl94_{level}.csv", dtype={"GEOID": str})

    if capability == "hierarchy_from_codes":  # the measurements' GEOCODEs
        for level in ("state", "county", "tract", "block_group", "block"):
            assert (out / f"pl94_{level}.csv").is_file()
        assert all(g.startswith("01") and len(g) == 5 for g in table("county")["GEOID"])
    elif capability == "invariants":  # the published state total, in a real-valued release
        total = run.truth["totals"]["01"]
        got = float(table("state").set_index("GEOID").loc["01", "P1_001N"])
        assert round(got) == total and abs(got - total) <= 1e-9 * total
    elif capability == "unbiased":
        _standard_errors(table("block"))
    else:
        raise AssertionError(f"nmf: no check of the promise of {capability!r}")


#: Every product's fixture (its run) and the checks of its capabilities' promises.
FIXTURES: dict[str, tuple[Callable[[Path], Run], Callable[[Run, str, Path], None]]] = {
    "cells": (_cells, _cells_checks),
    "codebook": (_codebook, _codebook_checks),
    "ppmf": (_ppmf, _ppmf_checks),
    "ppmf_units": (_units, _units_checks),
    "nmf": (_nmf, _nmf_checks),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Callable[[str], Run]:
    """Each product run once, on first use, for every cell of its row."""
    done: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in done:
            done[name] = FIXTURES[name][0](tmp_path_factory.mktemp(name))
            assert done[name].written.product == name  # the dispatch chose this product
        return done[name]

    return get


def test_every_registered_product_has_a_fixture_and_a_full_capability_table():
    assert set(PRODUCTS.names()) >= {"cells", "codebook", "ppmf", "ppmf_units", "nmf"}
    for name in PRODUCTS:
        assert name in FIXTURES, f"product {name!r} has no fixture in the contract matrix"
        assert set(PRODUCTS.get(name).capabilities) == set(CAPABILITIES)


@pytest.mark.parametrize("capability", list(CAPABILITIES))
@pytest.mark.parametrize("name", PRODUCTS.names())
def test_product_capability(name, capability, runs, tmp_path, capsys):
    product = PRODUCTS.get(name)
    offered = product.capabilities[capability]
    if offered is True:
        run = runs(name)
        FIXTURES[name][1](run, capability, tmp_path)
        return
    # a refusal: one line naming the product, the combination and why
    with pytest.raises(SpecError) as err:
        require(product, capability, "input")
    message = str(err.value)
    assert name in message and capability in message and offered in message
    assert "\n" not in message
    if capability == "evaluate":  # through the command line: exit 2, nothing written
        run = runs(name)
        out = tmp_path / "refused"
        argv = ["privatize", str(run.path), *run.argv, "-o", str(out), "--evaluate"]
        assert main(argv) == 2
        line = capsys.readouterr().err.strip()
        assert "\n" not in line and f"the {name} product" in line and "has no evaluate" in line
        assert not out.exists()


def test_a_file_no_product_claims_is_one_line_naming_every_product(tmp_path):
    path = tmp_path / "counties.csv"
    path.write_text(run_specs.SMALL_NHGIS)
    with pytest.raises(SpecError) as err:
        choose_product(path, None, PrivatizeOptions())
    message = str(err.value)
    assert message.startswith("counties.csv: no product of privatize reads it")
    for name in PRODUCTS:
        assert f"{name}: " in message
    assert "\n" not in message


def test_a_file_two_products_claim_is_refused_naming_both(tmp_path, capsys):
    path, spec = tmp_path / "counties.csv", tmp_path / "spec.toml"
    path.write_text(run_specs.SMALL_NHGIS)
    spec.write_text(PPMF_SPEC)  # a PPMF spec and --codebook: the ppmf and codebook products
    argv = ["privatize", str(path), "--spec", str(spec), "--codebook", "ppdd", "-o", "x.csv"]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert "more than one product claims it (codebook, ppmf)" in line and "\n" not in line


def test_each_product_claims_its_own_fixture_only(runs):
    for name in ("cells", "ppmf_units"):
        run = runs(name)
        answers = {
            other: PRODUCTS.get(other).claims(run.path, run.spec, PrivatizeOptions())
            for other in PRODUCTS
        }
        assert [n for n, a in answers.items() if a is True] == [name]
        assert all(isinstance(a, str) and a for n, a in answers.items() if n != name)


TOY_PRODUCT = """
from pathlib import Path

from censusdp.pipelines.products.registry import CAPABILITIES, Written

NO = "a toy: it copies the file's line count"


class LineCount:
    name = "toy_lines"
    reads = "a .lines file"
    capabilities = {c: NO for c in CAPABILITIES}

    def claims(self, path, spec, options):
        return True if path.suffix == ".lines" else "not a .lines file"

    def load_spec(self, spec, options):
        return None

    def run(self, path, spec, out, options):
        out.write_text(str(len(path.read_text().splitlines())))
        return Written(self.name, out, "no privacy: a toy (nothing is released)")
"""


def test_a_product_of_another_package_is_dispatched_to_through_its_entry_point(tmp_path):
    """A toy product (``censusdp.products`` entry point) on a fresh interpreter's path: it
    joins the registry on the first lookup, claims its own files, and the contract matrix
    would list it (and fail until it has a fixture)."""
    import subprocess
    import sys
    import textwrap

    site = tmp_path / "site"
    site.mkdir()
    (site / "toy_censusdp_product.py").write_text(TOY_PRODUCT)
    info = site / "toy_censusdp_product-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy_censusdp_product\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[censusdp.products]\ntoy_lines = toy_censusdp_product:LineCount\n"
    )
    (tmp_path / "a.lines").write_text("x\ny\nz\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        from pathlib import Path
        from censusdp.pipelines.products.registry import PRODUCTS, PrivatizeOptions, privatize
        assert "toy_lines" in PRODUCTS.names(), PRODUCTS.names()
        w = privatize(Path("a.lines"), None, Path("a.out"), PrivatizeOptions())
        print(w.product, Path("a.out").read_text())
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["toy_lines", "3"]


def test_evaluate_on_a_codebook_file_without_a_hierarchy_is_refused_before_any_work(
    tmp_path, capsys
):
    path = tmp_path / "areas.csv"
    path.write_text(run_specs.SMALL_NHGIS)
    out = tmp_path / "o.csv"
    argv = [
        "privatize",
        str(path),
        "--codebook",
        "ppdd",
        "--rho",
        "1",
        "--evaluate",
        "-o",
        str(out),
    ]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert "--evaluate and --repetitions need a codebook spec with [hierarchy] levels" in line
    assert "\n" not in line and not out.exists()
