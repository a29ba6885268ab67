"""``censusdp predict`` and ``allocate`` read every spec family (issue 34, item 5).

Every shipped run spec (enumerated from the repository), the PPMF persons and units specs and
the codebook spec that the route tests build, go through ``predict`` (exit 0, ``summary.csv``)
and ``allocate`` (exit 0, the written spec loads with its family's own loader and its shares
sum to the budget, ρ unchanged), or are refused with one clear line (exit 2). A run spec's
prediction is checked against the flat GLS of the run pipeline itself (``tree_gls`` on the
plan ``run`` calibrates), marginals that partition the cells, pick single cells, or pick
groups of cells alike.
"""

from __future__ import annotations

import json
import math
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from censusdp.app.cli import main
from censusdp.config import read_spec_toml
from censusdp.errors import SpecError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.mechanisms.queries import invariant, measure
from censusdp.pipelines.data import load_data
from censusdp.pipelines.predict import load_any_spec, predict_spec, spec_family
from censusdp.pipelines.runner import make_plan
from censusdp.pipelines.specs import load_spec
from censusdp.rng import KeyedRNG

ROOT = Path(__file__).parents[2]


def _shipped_specs() -> list[Path]:
    """Every TOML in the repository that is a spec (has ``[data]`` or ``[predict]``)."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "*.toml"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        files = [ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):  # an exported tree: no git
        files = [p for p in ROOT.rglob("*.toml") if ".venv" not in p.parts]
    out = []
    for f in sorted(files):
        doc = read_spec_toml(f)
        if "data" in doc or "predict" in doc:
            out.append(f)
    return out


SHIPPED = _shipped_specs()
#: Shipped specs that ``run`` itself refuses, and the refusal predict repeats (file named).
REFUSED = {
    "county.toml": "fixed by the level's invariants",  # a parser fixture: state total twice
}
#: Shipped pure-DP specs: predicted, but not allocated (the optimiser works in zCDP).
PURE = {"midwest.toml"}


def test_the_shipped_specs_are_enumerated():
    names = {p.name for p in SHIPPED}
    assert {"midwest_demo.toml", "nhgis_under1.toml", "midwest.toml"} <= names
    assert {"county.toml", "joined_codes.toml"} <= names
    assert all(spec_family(p) == "run" for p in SHIPPED)


def _data_for(spec: Path, tmp: Path) -> Path | None:
    """A small synthetic data file for a shipped spec whose data is not shipped (codes and
    cells as the spec names them; the counts are never read)."""
    run = load_spec(spec)
    if run.data.source in ("midwest", "synthetic"):
        return None
    if run.data.source == "nhgis":
        codes = ["G0100010", "G0100030", "G0100050", "G0200130", "G0200160"]
        df = pd.DataFrame({"gisjoin": codes, "name": list("ABCDE"), "state": ["1"] * 3 + ["2"] * 2})
        for cell in run.data.cells:
            df[f"{cell}_dp"] = 7
            df[f"{cell}_sf"] = 5
    elif spec.name == "joined_codes.toml":
        df = pd.DataFrame(
            {"state_fips": ["1", "1", "2", "2"], "county_fips": ["1", "3", "5", "7"]}
            | {c: [3, 4, 5, 6] for c in run.data.cells}
        )
    else:  # county.toml: a long file, county FIPS, sex × age cells
        rows = [
            {"fips": f, "version": v} | {f"{s}_{a}": 1 for s in "MF" for a in ("0-4", "85+")}
            for f in ("01001", "01003", "02013")
            for v in ("sf2010", "dp")
        ]
        df = pd.DataFrame(rows)
    path = tmp / "data.csv"
    df.to_csv(path, index=False)
    return path


TARGETS = """
[objective]
tolerance = {tolerance}
[population]
{level} = {population}
[[target]]
level = "{level}"
table = "{table}"
"""


def _targets(
    tmp: Path, level: str, table: str, population: int = 5000, tolerance: float = 0.01
) -> Path:
    path = tmp / "targets.toml"
    text = TARGETS.format(level=level, table=table, population=population, tolerance=tolerance)
    path.write_text(text)
    return path


def _predict(spec: Path, out: Path, data: Path | None, capsys) -> tuple[int, str, str]:
    argv = [
        "predict",
        str(spec),
        "--out",
        str(out),
        *([] if data is None else ["--data", str(data)]),
    ]
    code = main(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.mark.parametrize("spec", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_run_spec_predicts_and_allocates(spec, tmp_path, capsys):
    data = _data_for(spec, tmp_path)
    code, out, err = _predict(spec, tmp_path / "pred", data, capsys)
    if spec.name in REFUSED:
        assert code == 2 and REFUSED[spec.name] in err and str(spec) in err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "pred").exists()
        return
    assert code == 0, err
    assert (tmp_path / "pred" / "summary.csv").is_file()
    info = json.loads((tmp_path / "pred" / "summary.json").read_text())
    assert info["family"] == "run" and "no counts" in out
    assert out.startswith("ignored (") and "[data]" in out.splitlines()[0]
    summary = pd.read_csv(tmp_path / "pred" / "summary.csv")
    model = load_any_spec(spec, data=data)
    assert set(summary.level) == set(model.hierarchy.names)
    leaf = model.hierarchy.names[-1]
    table = model.schema.strategy[-1]
    new = tmp_path / "new.toml"
    argv = ["allocate", str(spec), "--target", str(_targets(tmp_path, leaf, table)), "-o", str(new)]
    argv += [] if data is None else ["--data", str(data)]
    code = main(argv)
    got = capsys.readouterr()
    if spec.name in PURE:
        assert code == 2 and "pure" in got.err and "zcdp" in got.err and not new.exists()
        return
    assert code == 0, got.err
    written = load_spec(new)  # the run family's own loader
    original = load_spec(spec)
    assert written.privacy.total == original.privacy.total  # the same ρ
    assert written.queries == original.queries and written.invariants == original.invariants
    assert math.fsum(written.privacy.level_shares.values()) == 1.0
    for shares in written.privacy.query_shares.values():
        assert math.fsum(shares.values()) == 1.0
    # the written shares are the optimised allocation exactly, and predict the printed optimum
    again = load_any_spec(new, data=data)
    assert again.allocation.levels == {
        lvl: Fraction(s) for lvl, s in written.privacy.level_shares.items()
    }
    assert f"optimised {_objective(again, tmp_path / 'targets.toml'):.6g}" in got.out


def _objective(model, targets: Path) -> float:
    from censusdp.estimation.gls.allocate import evaluate_allocation
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.pipelines.allocate import load_targets

    objective = load_targets(targets, model).objective
    inv = [(lvl, ProductQuery.parse(model.schema, t)) for lvl, t in model.invariants]
    return evaluate_allocation(model.hierarchy, model.schema, model.allocation, objective, inv)[0]


def test_a_spec_whose_data_file_is_missing_is_one_clear_line(tmp_path, capsys):
    nhgis = ROOT / "experiments" / "nhgis_under1.toml"  # no [data] path: the CLI gives it
    code, _, err = _predict(nhgis, tmp_path / "a", None, capsys)
    assert code == 2 and "data.path" in err and "--data" in err and "never its counts" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "a").exists()
    spec = tmp_path / "spec.toml"
    spec.write_text(
        (ROOT / "tests" / "core" / "specs" / "joined_codes.toml").read_text()
    )  # its labour_force.csv is not there
    code, _, err = _predict(spec, tmp_path / "b", None, capsys)
    assert code == 2 and "labour_force.csv: no such file" in err and "--data" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()
    code, _, err = _predict(spec, tmp_path / "c", tmp_path / "nope.csv", capsys)
    assert code == 2 and "nope.csv: no such file" in err
    target = _targets(tmp_path, "county", "detailed")
    argv = ["allocate", str(spec), "--target", str(target), "-o", str(tmp_path / "n.toml")]
    assert main(argv) == 2 and "labour_force.csv: no such file" in capsys.readouterr().err
    assert not (tmp_path / "n.toml").exists()


# -- the PPMF persons and units specs and the codebook spec of the route tests ------------------
def _blocks() -> list[str]:
    return [
        f"{st}{cou}{tract}{bg}{b:03d}"
        for st, counties in (("01", ("001", "003")), ("02", ("005",)))
        for cou in counties
        for tract in ("000100", "000200")
        for bg in "12"
        for b in range(3)
    ]


PPMF_SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
delta = 1e-10
[hierarchy]
blocks = "geo/blocks.csv"
[areas]
file = "geo/places.txt"
level = "place"
block_column = "BLOCKID"
area_column = "PLACEFP"
skip_blank = true
[report]
repetitions = 2
"""

UNITS_SPEC = """
[data]
source = "ppmf_units"
[privacy]
accounting = "zcdp"
[hierarchy]
blocks = "geo/blocks.csv"
"""

CODEBOOK_SPEC = """
[data]
source = "nhgis"
codebook = "ppdd"
schema = "ppdd"
[privacy]
accounting = "zcdp"
rho = 2.0
[strategy]
queries = ["votingage * hispanic * cenrace", "sex * age", "hhgq"]
shares = [0.5, 0.25, 0.25]
[run]
seed = 4
"""


@pytest.fixture
def route_specs(tmp_path):
    geo = tmp_path / "geo"
    geo.mkdir()
    blocks = _blocks()
    pd.DataFrame({"GEOID20": blocks}).to_csv(geo / "blocks.csv", index=False)
    lines = [
        "BLOCKID|PLACEFP",
        *(f"{b}|{'00100' if b.startswith('01001') else ''}" for b in blocks),
    ]
    (geo / "places.txt").write_text("\n".join(lines) + "\n")
    specs = tmp_path / "specs"
    specs.mkdir()
    out = {}
    for name, text in (("ppmf", PPMF_SPEC), ("units", UNITS_SPEC), ("codebook", CODEBOOK_SPEC)):
        (specs / f"{name}.toml").write_text(text.replace('"geo/', '"../geo/'))
        out[name] = specs / f"{name}.toml"
    return tmp_path, out


def _allocate(spec: Path, targets: Path, new: Path, capsys) -> str:
    assert main(["allocate", str(spec), "--target", str(targets), "-o", str(new)]) == 0
    return capsys.readouterr().out


def test_the_ppmf_persons_spec_predicts_and_allocates(route_specs, capsys):
    from censusdp.pipelines.products.ppmf_persons import load_ppmf_spec

    tmp, specs = route_specs
    code, out, err = _predict(specs["ppmf"], tmp / "pred", None, capsys)
    assert code == 0, err
    assert "the persons of [data]" in out and "[areas]" in out and "[report]" in out
    summary = pd.read_csv(tmp / "pred" / "summary.csv")
    assert (
        summary.loc[summary.level.isin(["nation", "state"]) & (summary.table == "total"), "se_max"]
        == 0
    ).all()
    assert (summary.loc[summary.level == "block", "nodes"] == len(_blocks())).all()
    (tmp / "out").mkdir()
    new = tmp / "out" / "new.toml"  # another folder: the block list is re-pointed
    _allocate(specs["ppmf"], _targets(tmp, "block_group", "hispanic * cenrace", 1500), new, capsys)
    old, written = load_ppmf_spec(specs["ppmf"]), load_ppmf_spec(new)
    assert old.allocation is None and written.allocation is not None
    assert (
        written.rho == old.rho == Fraction(2) and written.blocks.resolve() == old.blocks.resolve()
    )
    assert written.areas.file.resolve() == old.areas.file.resolve()
    assert written.allocation.rho == Fraction(2)
    assert sum(written.allocation.levels.values()) == 1
    assert all(sum(v) == 1 for v in written.allocation.queries.values())
    production = load_any_spec(specs["ppmf"]).allocation
    assert written.allocation.levels != production.levels
    # the written spec predicts as a spec of its family, with its own shares
    model = load_any_spec(new)
    assert model.family == "ppmf" and model.allocation.levels == written.allocation.levels
    # and the persons route runs it with those shares
    from ppmf_fixtures import ppmf_persons

    occupied = [(b[:2], b[2:5], b[5:11], b[11], b[11:]) for b in _blocks()[::2]]
    ppmf_persons(np.random.default_rng(2), 300, occupied, 0.9).to_csv(tmp / "p.csv", index=False)
    argv = ["privatize", str(tmp / "p.csv"), "--spec", str(new), "-o", str(tmp / "rel")]
    assert main([*argv, "--seed", "3"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    manifest = json.loads((tmp / "rel" / "manifest.json").read_text())
    assert "the spec's [allocation]" in manifest["strategy"]
    shares = manifest["spec"]["allocation"]["levels"]
    assert {k: Fraction(v) for k, v in shares.items()} == written.allocation.levels


def test_the_ppmf_units_spec_predicts_and_allocates(route_specs, capsys):
    from censusdp.pipelines.products.ppmf_units import load_units_spec

    tmp, specs = route_specs
    code, out, err = _predict(specs["units"], tmp / "pred", None, capsys)
    assert code == 0, err
    summary = pd.read_csv(tmp / "pred" / "summary.csv")
    assert set(summary.level) == {"nation", "state", "county", "tract", "block_group", "block"}
    new = tmp / "new.toml"
    _allocate(specs["units"], _targets(tmp, "tract", "detailed", 1500), new, capsys)
    written = load_units_spec(new)
    assert written.rho is None and written.allocation is not None
    assert written.allocation.rho == Fraction(11417641, 152349649)  # the production ρ, kept
    assert sum(written.allocation.levels.values()) == 1
    assert written.allocation.levels != load_any_spec(specs["units"]).allocation.levels


def test_the_codebook_spec_predicts_and_allocates(route_specs, capsys):
    """One area's SEs: the single-node GLS of the route's own calibrated laws, against the
    marginal-basis information ``Σ_q Q_qᵀQ_q / Var_q`` inverted directly."""
    from censusdp.estimation.gls.marginal_basis import MarginalBasis
    from censusdp.pipelines.products.codebook_tables import load_table_spec

    tmp, specs = route_specs
    code, out, err = _predict(specs["codebook"], tmp / "pred", None, capsys)
    assert code == 0, err
    assert "one is predicted" in out and "[run]" in out
    summary = pd.read_csv(tmp / "pred" / "summary.csv")
    spec = load_table_spec(specs["codebook"])
    model = load_any_spec(specs["codebook"])
    assert set(summary.table) == {t for t, _ in spec.strategy} and set(summary.level) == {"area"}
    pred, _ = predict_spec(model)
    queries = [q for _, q, _ in model.plan]
    laws = [law for _, _, law in model.plan]
    basis = MarginalBasis.for_queries(model.schema, queries)
    cov = sum(
        basis.gram(q, 1.0 / law.variance) for q, law in zip(queries, laws, strict=True)
    ).pinv()
    for q in queries:
        got = pred.query_variances("area", q.name)[0]
        np.testing.assert_allclose(got, cov.query_variances(q), rtol=1e-9)
    # the laws are the route's: ρ_q = share × ρ at each query's sensitivity, rounded up
    for (_, share), q, law in zip(spec.strategy, queries, laws, strict=True):
        assert law.privacy(q.l2_sensitivity) <= share * spec.rho * (1 + 1e-12)
        assert law.privacy(q.l2_sensitivity) > share * spec.rho * (1 - 1e-3)
    new = tmp / "new.toml"
    _allocate(specs["codebook"], _targets(tmp, "area", "sex * age", tolerance=0.05), new, capsys)
    written = load_table_spec(new)  # the codebook family's own loader
    assert written.rho == spec.rho and written.codebook == spec.codebook
    assert [t for t, _ in written.strategy] == [t for t, _ in spec.strategy]
    assert math.isclose(math.fsum(s for _, s in written.strategy), 1.0, rel_tol=1e-12)
    assert dict(written.strategy)["sex * age"] > 0.25  # the target's query gained budget


def test_a_ppmf_spec_without_a_public_block_list_is_refused(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(UNITS_SPEC.split("[hierarchy]")[0])
    code, _, err = _predict(spec, tmp_path / "o", None, capsys)
    assert code == 2 and "hierarchy.blocks" in err and "public" in err
    assert not (tmp_path / "o").exists()


def test_a_spec_of_no_family_is_refused(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[hierarchy]\nsynthetic = "state"\n')
    with pytest.raises(SpecError, match=r"neither \[predict\] nor \[data\]"):
        load_any_spec(spec)


# -- the run family against the run pipeline's own GLS ----------------------------------------
MARGINALS_SPEC = """
[data]
source = "csv"
path = "data.csv"
cells = ["a_1", "a_2", "a_3", "b_1", "b_2", "b_3"]
[hierarchy]
levels = ["nation", "state", "county"]
codes = {{ state = "fips:2", county = "fips" }}
[privacy]
accounting = "zcdp"
rho = 1.5
level_shares = {{ state = 0.3, county = 0.7 }}
query_shares = {{ state = {{ sex = 0.5, young = 0.5 }}, county = {{ total = 0.2, pair = 0.3, detailed = 0.5 }} }}
[queries]
state = ["sex", "young"]
county = ["total", "pair", "detailed"]
[marginals.sex]
groups = {{ a = "a_*", b = "b_*" }}
[marginals.young]
groups = {{ a1 = ["a_1"], b1 = ["b_1"] }}
[marginals.pair]
groups = {{ first = ["a_1", "b_1"], second = ["a_2", "b_2"] }}
[invariants]
nation = "total"
[mechanism]
noise = "{noise}"
"""


@pytest.mark.parametrize("noise", ["discrete_gaussian", "discrete_laplace"])
def test_a_run_spec_predicts_the_run_pipelines_gls_variances(tmp_path, noise):
    """Partition (sex), single-cell slice (young) and multi-cell slice (pair) marginals: the
    prediction equals, node by node, the variances of the flat GLS that ``run`` computes on
    the plan it calibrates (a different code path: dense per-node matrices)."""
    accounting = "zcdp" if noise == "discrete_gaussian" else "pure"
    text = MARGINALS_SPEC.format(noise=noise)
    if accounting == "pure":
        text = text.replace('accounting = "zcdp"\nrho', 'accounting = "pure"\nepsilon')
    fips = ["01001", "01003", "01005", "02001", "02003", "04001", "04003", "04005", "04007"]
    rows = np.random.default_rng(5).integers(0, 50, (len(fips), 6))
    df = pd.DataFrame(rows, columns=["a_1", "a_2", "a_3", "b_1", "b_2", "b_3"])
    df.insert(0, "fips", fips)
    df.to_csv(tmp_path / "data.csv", index=False)
    path = tmp_path / "spec.toml"
    path.write_text(text)
    model = load_any_spec(path)
    pred, summary = predict_spec(model)
    spec = load_spec(path)
    table = load_data(spec).table
    plan = make_plan(spec, table)
    h = table.hierarchy
    assert h == model.hierarchy
    truth = table.all_levels()
    meas = measure(h.names, truth, plan.as_tuples(), KeyedRNG.reproducible(1))
    inv = [invariant(truth, k, q) for k, q in plan.invariants]
    release = tree_gls(h, table.cells, meas, inv, covariance=True)
    queries = {m.query.name: m.query for m in plan.measured}
    for k, level in enumerate(h.names):
        for name, q in queries.items():
            want = release.sum_variances(k, q)
            got = pred.query_variances(level, name)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert pred.privacy.accounting == accounting
    assert pred.privacy.text() == release.privacy.text()
    # a deliberately wrong model (the budget of another spec) is told apart
    other = load_any_spec(path)
    wrong = other.plan[:-1] + ((other.plan[-1][0], other.plan[-1][1], other.plan[0][2]),)
    import dataclasses

    bad, _ = predict_spec(dataclasses.replace(other, plan=wrong))
    assert not np.allclose(
        bad.query_variances("county", "detailed"), release.sum_variances(2, queries["detailed"])
    )


UNITS_BLOCKS = ["440010301001001", "440010301001002", "440010301002001", "440030401001001"]


def test_the_units_spec_allocate_writes_runs_and_publishes_the_predicted_errors(tmp_path, capsys):
    """The units route runs the spec allocate wrote, and its published ``H1_002N_se`` (the
    occupied count's GLS standard error plus the rounding's exact ψ(1 − ψ) ≤ 1/4, written to six
    significant digits) matches the prediction from that spec, node by node."""
    pd.DataFrame({"GEOID20": UNITS_BLOCKS}).to_csv(tmp_path / "blocks.csv", index=False)
    gen = np.random.default_rng(7)
    b = gen.integers(0, len(UNITS_BLOCKS), 120)
    frame = pd.DataFrame(
        {
            "SCHEMA_TYPE_CODE": "MUD",
            "SCHEMA_BUILD_ID": "1.1.0",
            "TABBLKST": [UNITS_BLOCKS[i][:2] for i in b],
            "TABBLKCOU": [UNITS_BLOCKS[i][2:5] for i in b],
            "TABTRACTCE": [UNITS_BLOCKS[i][5:11] for i in b],
            "TABBLKGRPCE": [UNITS_BLOCKS[i][11] for i in b],
            "TABBLK": [UNITS_BLOCKS[i][11:] for i in b],
            "RTYPE": "2",
            "HH_STATUS": np.where(gen.random(b.size) < 0.7, "1", "2"),
        }
    )
    frame.to_csv(tmp_path / "units.csv", sep="|", index=False)
    spec = tmp_path / "units.toml"
    spec.write_text(UNITS_SPEC.replace("geo/", "") + "[report]\nrepetitions = 2\n")
    new = tmp_path / "new.toml"
    _allocate(spec, _targets(tmp_path, "block", "detailed", 30), new, capsys)
    out = tmp_path / "h1"
    argv = ["privatize", str(tmp_path / "units.csv"), "--spec", str(new), "-o", str(out)]
    assert main([*argv, "--seed", "3"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "the spec's [allocation]" in manifest["strategy"]
    model = load_any_spec(new)
    pred, _ = predict_spec(model)
    for k, level in enumerate(model.hierarchy.names):
        t = pd.read_csv(out / f"h1_{level}.csv", dtype={"GEOID": str})
        assert t.GEOID.tolist() == [str(c) for c in model.hierarchy.levels[k].codes]
        want = pred.query_standard_errors(level, "detailed")[:, 0]
        se2, want2 = t.H1_002N_se.to_numpy() ** 2, want**2
        rounding = se2 - want2  # the rounding's variance, up to the six written digits
        assert np.all(rounding >= -2e-5 * want2), (level, rounding)
        assert np.all(rounding <= 0.25 + 2e-5 * want2), (level, rounding)
    # the production allocation predicts other errors: the written shares were used
    base, _ = predict_spec(load_any_spec(spec))
    assert not np.allclose(
        base.query_standard_errors("block", "detailed"),
        pred.query_standard_errors("block", "detailed"),
    )


@st.composite
def _marginal_groups(draw):
    """Cells and one marginal of disjoint groups: a partition, a part of the cells, single
    cells — every shape a run spec's marginal can take."""
    n = draw(st.integers(2, 7))
    cells = [f"c{i}" for i in range(n)]
    label = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))  # -1: in no group
    groups: dict[str, list[str]] = {}
    for c, g in zip(cells, label, strict=True):
        if g >= 0:
            groups.setdefault(f"g{g}", []).append(c)
    return cells, groups


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=_marginal_groups())
def test_every_disjoint_marginal_is_modelled_as_the_run_query(tmp_path, case):
    """Against the run's own query (:meth:`Query.marginal`): the model's product query has the
    same matrix, or the model refuses with the marginal named (the one marginal a recode
    cannot hold: a relabelling of every cell, which is ``detailed``)."""
    from censusdp.mechanisms.queries import Query

    cells, groups = case
    assume(groups)
    pd.DataFrame({"fips": ["01001", "01003"]} | {c: [1, 2] for c in cells}).to_csv(
        tmp_path / "data.csv", index=False
    )
    inline = ", ".join(f"{g} = {json.dumps(m)}" for g, m in groups.items())
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[data]\nsource = "csv"\npath = "data.csv"\n'
        f"cells = {json.dumps(cells)}\n"
        '[hierarchy]\nlevels = ["nation", "state", "county"]\n'
        'codes = { state = "fips:2", county = "fips" }\n'
        '[privacy]\naccounting = "zcdp"\nrho = 1.0\n'
        '[queries]\ncounty = ["m"]\n'
        f"[marginals.m]\ngroups = {{ {inline} }}\n"
        '[mechanism]\nnoise = "discrete_gaussian"\n'
    )
    want = Query.marginal("m", cells, groups).matrix
    every_cell_alone = all(len(m) == 1 for m in groups.values()) and len(groups) == len(cells)
    if every_cell_alone:
        with pytest.raises(SpecError, match="marginals"):
            load_any_spec(spec)
        return
    model = load_any_spec(spec)
    ((level, query, _),) = model.plan
    assert level == "county" and np.array_equal(query.dense(), want)


def test_a_ppmf_spec_measuring_its_areas_keeps_the_total_rho(route_specs, capsys):
    """With ``[areas] share`` the tree gets ρ·(1 − share): the prediction and the optimiser
    work on that part, and the written ``[allocation]`` states the spec's total again."""
    from censusdp.pipelines.products.ppmf_persons import load_ppmf_spec

    tmp, specs = route_specs
    spec = specs["ppmf"]
    spec.write_text(spec.read_text().replace("skip_blank = true", "skip_blank = true\nshare = 0.1"))
    model = load_any_spec(spec)
    assert model.allocation.rho == Fraction(2) * Fraction(9, 10)
    new = tmp / "new.toml"
    _allocate(spec, _targets(tmp, "tract", "total", 4000), new, capsys)
    written = load_ppmf_spec(new)
    assert written.allocation.rho == Fraction(2) and written.areas.share == Fraction(1, 10)
    assert load_any_spec(new).allocation.rho == Fraction(9, 5)
