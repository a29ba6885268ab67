"""The registries: noise laws, estimators and schedulers are listed once, looked up by name
(unknown names are errors everywhere), and adding one touches one file."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.mechanisms.discrete import DiscreteLaplace
from censusdp.mechanisms.laws import FLOATING_POINT_NOTE, Laplace, NoiseLaw, floating_point_note
from censusdp.mechanisms.queries import Query
from censusdp.mechanisms.registry import (
    CAPABILITIES,
    NOISE_LAWS,
    gaussian_conditionable,
    law_info,
    noise_names,
    register_law,
)
from censusdp.pipelines.estimators import ESTIMATORS, Estimator, register_estimator, run_estimator
from censusdp.pipelines.execute import SCHEDULERS, open_executor
from censusdp.pipelines.plan import make_law
from censusdp.pipelines.spec import EstimatorSpec
from censusdp.pipelines.specs import parse_spec

ROOT = Path(__file__).resolve().parents[2]
CELLS = ["a", "b", "c"]


def _doc(noise="discrete_gaussian", accounting="zcdp", run=("gls",), scheduler="sync", **mech):
    unit = "rho" if accounting == "zcdp" else "epsilon"
    return {
        "data": {"source": "midwest"},
        "hierarchy": {"levels": ["nation", "state", "county"]},
        "privacy": {"accounting": accounting, unit: 1.0},
        "queries": {"county": ["detailed"]},
        "mechanism": {"noise": noise, **mech},
        "estimators": {"run": list(run)},
        "run": {"scheduler": scheduler},
    }


# ------------------------------------------------------------------------------- noise laws


def test_the_four_laws_register_themselves_with_their_accounting_and_capabilities():
    assert set(NOISE_LAWS.names()) >= {
        "laplace",
        "gaussian",
        "discrete_laplace",
        "discrete_gaussian",
    }
    for name in NOISE_LAWS:
        info = law_info(name)
        law = info.calibrate(0.5, 1.0)
        assert type(law) is info.law and law.name == name
        assert info.integer == law.is_integer and info.accounting == law.accounting
        for cap in CAPABILITIES:  # the registry's capability = the instance provides it
            assert info.has(cap) == (getattr(law, cap) is not None)
        assert law_info(law) is info
    assert noise_names(integer=True) == ("discrete_laplace", "discrete_gaussian")
    assert noise_names(accounting="pure") == ("laplace", "discrete_laplace")


@pytest.mark.parametrize("name", ["laplace", "gaussian", "discrete_laplace", "discrete_gaussian"])
@pytest.mark.parametrize("budget", [0.01, 0.5, 3.0])
@pytest.mark.parametrize("sens", [1.0, 2.0, 7.0])
def test_calibration_round_trip_spends_the_budget_never_more(name, budget, sens):
    info = law_info(name)
    law = info.calibrate(budget, sens)
    spent = law.privacy(sens)
    assert spent <= budget * (1 + 1e-12)
    assert spent >= budget * (1 - 1e-6)  # rounding up onto the sampler's grid costs < 1e-6


def test_a_pure_law_reads_the_budget_as_epsilon_at_l1_sensitivity_never_as_rho():
    q = Query.marginal("pairs", CELLS, {"ab": ["a", "b"], "bc": ["b", "c"]})  # Δ₁ = 2, Δ₂ = √2
    lap = make_law("discrete_laplace", 0.5, q)
    assert float(lap.scale_fraction) == 2 / 0.5  # t = Δ₁/ε, not Δ₂/√(2ρ)
    assert lap.privacy(2.0) == 0.5
    gau = make_law("gaussian", 0.5, q)
    assert math.isclose(gau.privacy(math.sqrt(2.0)), 0.5, rel_tol=1e-12)


@pytest.mark.parametrize("where", ["make_law", "law_info", "spec", "derive"])
def test_unknown_noise_names_are_errors_listing_the_registered_laws(where):
    with pytest.raises(SpecError) as err:
        if where == "make_law":
            make_law("discrete_gausian", 1.0, Query.total(CELLS))
        elif where == "law_info":
            law_info("cauchy")
        elif where == "spec":
            parse_spec(_doc("discrete_gausian"), "s.toml")
        else:

            class Stray(Laplace):  # a law nobody registered
                name = "stray"

            from censusdp.mechanisms.privacy import derive_statement
            from censusdp.mechanisms.queries import Measurement

            derive_statement(
                ["n"], [Measurement(0, Query.total(CELLS), np.zeros((1, 1)), Stray(1))]
            )
    msg = str(err.value)
    assert "unknown noise law" in msg
    assert all(repr(n) in msg for n in NOISE_LAWS)


def test_registration_refuses_a_law_that_cannot_be_calibrated_or_accounted():
    class NoCalibration(NoiseLaw):  # pure, but no from_epsilon
        name, accounting = "no_calibration", "pure"
        sample = log_density = privacy = None  # type: ignore[assignment]
        variance = 1.0  # type: ignore[assignment]

    with pytest.raises(SpecError, match="needs a from_epsilon"):
        register_law(NoCalibration)

    class Approx(Laplace):
        name, accounting = "approx_law", "approx"

    with pytest.raises(SpecError, match="accounting 'approx'"):
        register_law(Approx)

    class Again(Laplace):
        name = "laplace"

    with pytest.raises(SpecError, match="registered twice"):
        register_law(Again)
    assert "no_calibration" not in NOISE_LAWS and "approx_law" not in NOISE_LAWS


def test_adding_a_noise_law_is_one_class():
    """A law defined and registered in one place is known to plans, specs, statements and the
    floating-point note without touching any other file."""

    @register_law
    class Geometric(DiscreteLaplace):  # the two-sided geometric under another name
        name = "test_geometric"

    try:
        law = make_law("test_geometric", 0.25, Query.total(CELLS))
        assert type(law) is Geometric and law.privacy(1.0) == 0.25
        spec = parse_spec(_doc("test_geometric", "pure"), "s.toml")
        assert spec.mechanism.noise == "test_geometric"
        with pytest.raises(SpecError, match="accounted under 'pure'"):
            parse_spec(_doc("test_geometric", "zcdp"), "s.toml")
        with pytest.raises(SpecError, match="integer law with no floating-point"):
            parse_spec(_doc("test_geometric", "pure", allow_floating_point=True), "s.toml")
        assert "test_geometric" in noise_names(integer=True)
    finally:
        NOISE_LAWS.remove("test_geometric")
    with pytest.raises(SpecError):
        make_law("test_geometric", 0.25, Query.total(CELLS))


def test_floating_point_note_and_exact_gaussian_conditioning_ask_capabilities():
    for name in NOISE_LAWS:
        info = law_info(name)
        st = floating_point_note(PrivacyStatement("zcdp", rho=1.0, mechanism=name))
        assert (FLOATING_POINT_NOTE in st.notes) == (not info.integer)
        assert gaussian_conditionable(info.calibrate(1.0, 1.0)) == (
            info.has("l2_precision") and not info.integer
        )
    mixed = PrivacyStatement("zcdp", rho=1.0, mechanism="discrete_gaussian, laplace")
    assert FLOATING_POINT_NOTE in floating_point_note(mixed).notes


# ------------------------------------------------------------------- estimators, schedulers


def test_registered_estimators_follow_the_protocol():
    assert set(ESTIMATORS.names()) == {"gls", "conditioning", "topdown"}
    for name in ESTIMATORS:
        est = ESTIMATORS.get(name)
        assert isinstance(est, Estimator) and est.name == name
        assert all(est.accepts(law_info(n)) is None for n in NOISE_LAWS)
    assert ESTIMATORS.get("gls").unbiased and ESTIMATORS.get("gls").standard_errors
    assert ESTIMATORS.get("topdown").integer and not ESTIMATORS.get("topdown").unbiased


def test_unknown_estimators_schedulers_and_sources_are_errors_everywhere():
    with pytest.raises(SpecError, match=r"s.toml: estimators.run\[1\]: unknown estimator 'mcmc'"):
        parse_spec(_doc(run=("gls", "mcmc")), "s.toml")
    with pytest.raises(SpecError, match="did you mean 'topdown'"):
        parse_spec(_doc(run=("top_down",)), "s.toml")
    with pytest.raises(SpecError, match="unknown estimator 'mcmc'"):
        run_estimator("mcmc", None, CELLS, [], [], None, None, EstimatorSpec())
    with pytest.raises(SpecError, match="run.scheduler: unknown scheduler 'spark'"):
        parse_spec(_doc(scheduler="spark"), "s.toml")
    with pytest.raises(SpecError, match=r"unknown scheduler 'spark'.*tcp://HOST:PORT"):
        with open_executor("spark"):
            pass
    assert SCHEDULERS.names() == ("sync", "threads", "distributed")
    doc = _doc()
    doc["data"] = {"source": "xlsx"}
    with pytest.raises(SpecError, match=r"data.source: unknown data source 'xlsx'.*'csv'"):
        parse_spec(doc, "s.toml")
    doc["data"] = {"source": "csv", "path": "d.csv"}
    with pytest.raises(SpecError, match=r"hierarchy.codes: no code column for level\(s\)"):
        parse_spec(doc, "s.toml")
    doc["hierarchy"]["codes"] = {"state": "fips:2", "county": "fips"}
    with pytest.raises(SpecError, match="data.cells: missing; source 'csv' needs its cell"):
        parse_spec(doc, "s.toml")
    doc["data"]["cells"] = ["a", "b"]
    assert parse_spec(doc, "s.toml").data.source == "csv"


def test_adding_an_estimator_is_one_class(rng):
    """A registered estimator is accepted by specs and dispatched by run_estimator, with the
    derived statement and the invariant check of every other estimator."""
    from censusdp.estimation.gls.tree import tree_gls
    from censusdp.hierarchy import Table
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import invariant, measure

    @register_estimator
    class Identity:
        name, unbiased, standard_errors, integer = "test_identity", True, True, False

        def accepts(self, law):
            return None if law.integer else "needs integer noise"

        def run(self, problem, rng, options, executor, partitions):
            p = problem
            return tree_gls(p.hierarchy, p.cells, p.measurements, p.invariants, p.privacy)

    try:
        assert parse_spec(_doc(run=("test_identity",)), "s.toml").estimators.run == (
            "test_identity",
        )
        with pytest.raises(SpecError, match=r"'test_identity' needs integer noise"):
            parse_spec(_doc("gaussian", run=("test_identity",), allow_floating_point=True), "s")
        table = Table.from_midwest()
        h, counts = table.hierarchy, table.all_levels()
        plan = [(2, Query.detailed(table.cells), DiscreteGaussian(20))]
        meas = measure(h.names, counts, plan, rng.child("m"))
        inv = [invariant(counts, 1, Query.total(table.cells))]
        opts = EstimatorSpec(run=("test_identity",), integer="none")
        rel = run_estimator("test_identity", h, table.cells, meas, inv, None, rng, opts)
        assert rel.privacy.rho == 1 / 800 and rel.privacy.invariants == ("state: total",)
        assert rel.diagnostics["invariants_exact"] is not None
    finally:
        ESTIMATORS.remove("test_identity")


# ------------------------------------------------------------------ lists live in registries

#: Where a family's names may be listed: its registry (and docs, tests, the README).
FAMILIES = {
    "noise": {"laplace", "gaussian", "discrete_laplace", "discrete_gaussian"},
    "estimator": {"gls", "conditioning", "topdown"},
    "scheduler": {"sync", "threads", "distributed"},
    "source": {"csv", "parquet", "nhgis", "midwest", "synthetic"},
}
PACKAGES = ("censusdp", "hierarchy", "mechanisms", "estimation", "pipelines")


def _name_lists(path: Path) -> list[tuple[str, int]]:
    """(family, line) of every list, tuple, set or dict literal naming two members of a
    family as string constants, outside docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = {
            e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
        for family, names in FAMILIES.items():
            if len(strings & names) >= 2:
                out.append((family, node.lineno))
    return out


def test_no_list_of_noise_estimator_or_scheduler_names_outside_the_registries():
    found = [
        f"{p.relative_to(ROOT)}:{line} lists {family} names"
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        for family, line in _name_lists(p)
    ]
    assert found == []


def test_the_name_scan_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('KNOWN = ("gls", "topdown")\nLAWS = {"laplace": "pure", "gaussian": "zcdp"}\n')
    assert _name_lists(bad) == [("estimator", 1), ("noise", 2)]


#: Layers, bottom first; a module may import its own layer and those below.
LAYERS = ("censusdp", "hierarchy", "mechanisms", "estimation", "pipelines", "experiments", "app")
MODULES = {layer: "censusdp" if layer == "censusdp" else f"censusdp.{layer}" for layer in LAYERS}
#: The front door lives in the core folder (to be ``censusdp.prelude``) but re-exports every
#: layer, so it sits in the application layer; no library module imports it (test_prelude).
APPLICATION_MODULES = {"censusdp/prelude.py"}


def _layer(module: str) -> int | None:
    best = None
    for i, layer in enumerate(LAYERS):
        prefix = MODULES[layer]
        if module == prefix or module.startswith(prefix + "."):
            best = i  # the longest matching prefix wins (censusdp.* is core otherwise)
    if module == "censusdp.prelude":
        best = LAYERS.index("app")
    return best


def _upward_imports(file: Path, own: int) -> list[str]:
    upward = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            layer = _layer(name)
            if layer is not None and layer > own:
                upward.append(f"{file.name} line {node.lineno}: {name}")
    return upward


def _library_files() -> list[tuple[Path, int]]:
    files = []
    for i, layer in enumerate(LAYERS):
        for file in sorted((ROOT / layer).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            files.append((file, LAYERS.index("app") if rel in APPLICATION_MODULES else i))
    return files


def test_every_module_imports_only_downwards():
    """core ← hierarchy ← mechanisms ← estimation ← pipelines ← experiments ← app, over every
    module of every layer, function-level imports included."""
    files = _library_files()
    assert len(files) > 90
    upward = [line for file, own in files for line in _upward_imports(file, own)]
    assert upward == []


def test_the_import_scan_can_fail(tmp_path):
    """A function-level upward import in a core module is found, a downward one is not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import numpy\nfrom censusdp.errors import SpecError\n"
        "def f():\n    from censusdp.pipelines.runner import run_spec\n"
    )
    assert _upward_imports(bad, LAYERS.index("censusdp")) == [
        "bad.py line 4: censusdp.pipelines.runner"
    ]
    assert _upward_imports(bad, LAYERS.index("pipelines")) == []
