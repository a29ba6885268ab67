"""The pieces the file products share: one spec core (:class:`~censusdp.pipelines.spec.SpecCore`,
:class:`~censusdp.pipelines.spec.ProductSpec`, :func:`~censusdp.pipelines.spec.load_product_spec`,
:func:`~censusdp.pipelines.spec.open_spec`), one writer of a release folder's texts
(:func:`~censusdp.pipelines.io.outputs.write_release_texts`) and of a long table's dictionary
rows (:func:`~censusdp.pipelines.io.outputs.long_entries`), and the codebook plan's strategy
rows. The routes' own tests check what each writes; these pin the shared layout (the bytes
the routes wrote before they shared it) and the refusals."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import pytest

from censusdp.budget import Accounting, statement_for
from censusdp.errors import SpecError
from censusdp.pipelines.io.outputs import long_entries, write_release_texts
from censusdp.pipelines.products.codebook_tables import TablePlan, TableSpec, load_table_spec
from censusdp.pipelines.products.ppmf_persons import PPMFSpec, load_ppmf_spec, ppmf_products
from censusdp.pipelines.products.ppmf_units import load_units_spec
from censusdp.pipelines.spec import MAX_REPETITIONS, ProductSpec
from tests.pipelines.test_privatize_codebook import SMALL_STRATEGY, small_codebook

SHARED = """
[privacy]
accounting = "zcdp"
rho = 0.5
delta = 1e-10
[hierarchy]
blocks = "blocks.csv"
block_column = "GEOID20"
[report]
repetitions = 3
[run]
seed = 11
"""


def _write(tmp_path: Path, source: str, extra: str = "") -> Path:
    path = tmp_path / f"{source}.toml"
    path.write_text(f'[data]\nsource = "{source}"\n' + SHARED + extra, encoding="utf-8")
    return path


def test_both_ppmf_routes_read_the_shared_keys_alike(tmp_path):
    persons = load_ppmf_spec(_write(tmp_path, "ppmf"))
    units = load_units_spec(_write(tmp_path, "ppmf_units"))
    assert type(units) is ProductSpec and isinstance(persons, ProductSpec)
    for spec in (persons, units):
        assert spec.rho == Fraction(1, 2) and spec.delta == 1e-10 and spec.seed == 11
        assert spec.repetitions == 3 and spec.block_column == "GEOID20"
        assert spec.blocks == tmp_path / "blocks.csv"  # relative to the spec's folder
    shared = [f.name for f in dataclasses.fields(ProductSpec)]
    assert [getattr(persons, n) for n in shared if n != "source"] == [
        getattr(units, n) for n in shared if n != "source"
    ]


def test_the_manifest_spec_keeps_its_keys_in_order_and_never_the_seed(tmp_path):
    persons = load_ppmf_spec(_write(tmp_path, "ppmf"))
    units = load_units_spec(_write(tmp_path, "ppmf_units"))
    keys = ["source", "rho", "delta", "repetitions", "reproducible_mode", "blocks"]
    assert list(units.to_dict()) == [*keys, "allocation"]
    assert list(persons.to_dict()) == [*keys, "areas", "allocation"]
    for spec in (persons, units, TableSpec(codebook="ppdd", rho=1.0, seed=11)):
        assert "11" not in repr(spec)  # the seed is in no repr
    for spec in (persons, units):
        d = spec.to_dict()
        assert d["reproducible_mode"] is True and "11" not in json.dumps(d)
        assert d["rho"] == "1/2" and d["blocks"] == "blocks.csv"


def test_each_route_refuses_the_others_source_and_its_tables(tmp_path):
    with pytest.raises(SpecError, match=r"data\.source.*a PPMF units file.*ppmf_units"):
        load_units_spec(_write(tmp_path, "ppmf"))
    with pytest.raises(SpecError, match=r"data\.source.*a PPMF \(persons"):
        load_ppmf_spec(_write(tmp_path, "ppmf_units"))
    areas = '[areas]\nfile = "places.txt"\n'
    assert load_ppmf_spec(_write(tmp_path, "ppmf", areas)).areas.file == tmp_path / "places.txt"
    with pytest.raises(SpecError, match="areas"):  # the persons route's own table only
        load_units_spec(_write(tmp_path, "ppmf_units", areas))


def test_the_command_line_overrides_the_spec(tmp_path):
    spec = load_units_spec(_write(tmp_path, "ppmf_units"))
    got = spec.with_cli(seed=5, repetitions=4, blocks="other.csv")
    assert (got.seed, got.repetitions, got.blocks) == (5, 4, Path("other.csv"))
    assert spec.with_cli(seed=None, repetitions=None, blocks=None) == spec
    persons = PPMFSpec().with_cli(seed=1, repetitions=None, blocks=None)
    assert type(persons) is PPMFSpec and persons.seed == 1
    for bad in (1, MAX_REPETITIONS + 1):
        with pytest.raises(SpecError, match=rf"^--repetitions: give 2 to {MAX_REPETITIONS}"):
            spec.with_cli(seed=None, repetitions=bad, blocks=None)


def test_the_codebook_spec_shares_the_core_and_adds_its_own(tmp_path):
    path = tmp_path / "tables.toml"
    path.write_text(
        '[data]\nsource = "nhgis"\ncodebook = "ppdd"\n[privacy]\naccounting = "zcdp"\n'
        'rho = 2.0\n[run]\nseed = 4\n[hierarchy]\nlevels = ["nation", "state", "county"]\n'
        "[evaluate]\nrepetitions = 3\n",
        encoding="utf-8",
    )
    spec = load_table_spec(path)
    assert (spec.rho, spec.seed, spec.repetitions, spec.source) == (2.0, 4, 3, str(path))
    assert spec.codebook == "ppdd" and spec.levels == ("nation", "state", "county")
    path.write_text(path.read_text().replace("[run]", "[report]\n[run]"), encoding="utf-8")
    with pytest.raises(SpecError, match=r"tables\.toml.*report"):  # not a codebook table
        load_table_spec(path)


def test_write_release_texts_lays_out_the_three_files(tmp_path):
    privacy = statement_for(Accounting.ZCDP, 0.5, 1e-10, mechanism="discrete_gaussian")
    products = ppmf_products(True)
    manifest = {"command": "privatize", "ρ": 0.5}
    write_release_texts(tmp_path, manifest, privacy, products, title="T", notes=["a", "b"],
                        scope="It covers two releases.")  # fmt: skip
    assert json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8")) == manifest
    assert "ρ" in (tmp_path / "manifest.json").read_text(encoding="utf-8")  # not escaped
    wording = [f"- {p.wording()}" for p in products]
    assert (tmp_path / "privacy.md").read_text(encoding="utf-8") == (
        f"# Privacy\n\n{privacy.text()}\n\nIt covers two releases. What each product is:\n\n"
        + "\n".join(wording)
        + "\n"
    )
    readme = (tmp_path / "README.md").read_text(encoding="utf-8").split("\n")
    assert readme[:6] == ["# censusdp release (T)", "", f"Privacy: {privacy.text()}", "",
                          "- a", "- b"]  # fmt: skip
    assert readme[6:] == ["", "Privacy of each product (privacy.md says the same):", "",
                          *wording, ""]  # fmt: skip
    write_release_texts(tmp_path, manifest, privacy, products, title="T", notes=[])
    assert "\n\nWhat each product is:" in (tmp_path / "privacy.md").read_text(encoding="utf-8")


def test_long_entries_name_the_file_and_the_error_columns_only_when_given():
    rows = long_entries("x_long.csv", "persons", "X1", "X1_001N", ("its se", "its moe"))
    assert [e.column for e in rows] == ["level", "table", "column", "label", "value", "se", "moe"]
    assert rows[1].label == "x_long.csv: the table (X1)"
    assert rows[2].label == "x_long.csv: the column (X1_001N ...)"
    assert [e.type for e in rows[4:]] == ["integer", "float", "integer"]
    assert rows[5].label == "x_long.csv: its se" and rows[6].unit == "persons"
    bare = long_entries("x_long.csv", "units", "X1", "X1_001N", None)
    assert [e.column for e in bare] == ["level", "table", "column", "label", "value"]


def test_strategy_rows_list_every_query_of_the_plan():
    plan = TablePlan.build(small_codebook(), 1.0, SMALL_STRATEGY)
    rows = plan.strategy_rows()
    assert [r["query"] for r in rows] == [q for q, _ in SMALL_STRATEGY]
    assert sum(r["rho"] for r in rows) == pytest.approx(sum(plan.rho_per_query))
    assert all(r["sigma2"] == float(w.sigma2) for r, w in zip(rows, plan.laws, strict=True))
