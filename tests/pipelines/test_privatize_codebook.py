"""``censusdp privatize --codebook``: overlapping tables released from one estimate.

Fast tests run on a small synthetic PPDD-layout file (random person histograms tabulated by
the shipped codebook); the real AIANHH file (``../shared``) has its own tests, skipped
without it.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from censusdp.app.cli import main
from censusdp.errors import DataError, SpecError
from censusdp.pipelines.io.codebook import Codebook
from censusdp.pipelines.io.outputs import lattice_moe, significant
from censusdp.pipelines.products.codebook_tables import TablePlan, release_tables
from censusdp.rng import KeyedRNG

ALPHA = 1e-6
SHARES = [0.1, 0.1, 0.2, 0.3, 0.2, 0.1]  # the ppdd codebook's default strategy
N_AREAS = 6


@pytest.fixture(scope="module")
def ppdd() -> Codebook:
    return Codebook.load("ppdd")


@pytest.fixture(scope="module")
def plan(ppdd) -> TablePlan:
    return TablePlan.build(ppdd, 1.0)


def synthetic_truth(cb: Codebook, n: int = N_AREAS, seed: int = 11) -> np.ndarray:
    """Columns (n × 376) of ``n`` random person histograms, some areas large, some small."""
    rng = np.random.default_rng(seed)
    scale = rng.choice([0.002, 0.02, 0.2], size=n)
    x = rng.poisson(scale[:, None] * np.ones(cb.schema.n_cells)).reshape(n, *cb.schema.shape)
    return cb.rows.apply(x)


def write_ppdd_file(path: Path, cb: Codebook, truth: np.ndarray) -> Path:
    """A file in the PPDD layout: gisjoin, name, ``_dp`` then ``_sf`` columns, a blank row."""
    n = truth.shape[0]
    cols = {"gisjoin": [f"G{i:04d}" for i in range(n)], "name": [f"Area {i}" for i in range(n)]}
    for j, c in enumerate(cb.columns):
        cols[f"{c}_dp"] = truth[:, j]
    for j, c in enumerate(cb.columns):
        cols[f"{c}_sf"] = truth[:, j]
    df = pd.DataFrame(cols)
    text = df.to_csv(index=False)
    header, body = text.split("\n", 1)
    path.write_text(header + "\n" + "," * (len(df.columns) - 1) + "\n" + body, encoding="latin-1")
    return path


def read_release(path: Path, cb: Codebook) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    df = pd.read_csv(path, dtype={"gisjoin": str})
    values = df[[f"{c}_dp" for c in cb.columns]].to_numpy()
    se = df[[f"{c}_se" for c in cb.columns]].to_numpy()
    return df, values, se


def hand_rho(shares: list[float], rho: float) -> tuple[float, list[float]]:
    """Composition by hand: each default query partitions every attribute, so a person is in
    one row of each (Δ₂² = 1); σ² = 1/(2·share·ρ) rounded up onto the sampler's grid (never
    down), and the per-person ρ is Σ_q 1/(2σ_q²)."""
    from censusdp.mechanisms.discrete import rational_up

    sigma2 = [float(rational_up(1 / (2 * s * rho))) for s in shares]
    return sum(1 / (2 * s2) for s2 in sigma2), sigma2


# ------------------------------------------------------------------------------ the plan
def test_strategy_spans_the_columns_and_rounds_in_a_chain(plan, ppdd):
    """The default strategy's span is the columns' (every column is a sum of cells of one
    query, every query a combination of columns) and its shared margins nest."""
    names = [q.name for q in plan.queries]
    assert names == [
        "total",
        "votingage * hispanic",
        "votingage * hispanic * race7",
        "votingage * hispanic * cenrace",
        "sex * age",
        "hhgq",
    ]
    assert (plan.column_query >= 0).all()
    # each column from the first query that refines it: P4 from voting age × Hispanic, P3
    # from × race 7, P8's details from × CENRACE, P12 from sex × age, P42 (group quarters) from hhgq
    by_table = {t: set(plan.column_query[ppdd.columns_of(t)]) for t in ppdd.tables}
    assert by_table["P1"] == {0} and by_table["P4"] == {0, 1} and by_table["P3"] == {0, 2}
    assert by_table["P8"] == {0, 2, 3} and by_table["P12"] == {0, 4} and by_table["P42"] == {5}
    # the shared margins nest: total ⊂ voting age ⊂ × Hispanic ⊂ × race 7
    assert [tuple(int(x.max()) + 1 for x in c) for c in plan.chain] == [
        (1, 1, 1, 1, 1),
        (1, 1, 2, 1, 1),
        (1, 1, 2, 2, 1),
        (1, 1, 2, 2, 7),
    ]
    assert plan.identities.shape == (73, 376)
    # A_q M = Q_q: the measured answers of a tabulated histogram are its exact marginals
    x = np.random.default_rng(3).poisson(0.05, (2, *ppdd.schema.shape))
    cols = ppdd.rows.apply(x)
    for q, a in zip(plan.queries, plan.measure_from_columns, strict=True):
        assert np.array_equal(np.rint(cols @ a.T).astype(np.int64), q.apply(x))


def test_privacy_statement_is_the_hand_composition(plan):
    rho, sigma2 = hand_rho(SHARES, 1.0)
    assert [float(w.sigma2) for w in plan.laws] == sigma2
    assert plan.sensitivities == (1.0,) * 6
    assert math.isclose(plan.rho, rho, rel_tol=1e-12) and plan.rho <= 1.0
    st = plan.statement(1e-10)
    assert st.rho == plan.rho and st.accounting == "zcdp" and not st.invariants
    assert f"ρ = {rho:g}" in st.text()
    assert st.unit == "person" and "privacy unit: one person" in st.text()  # from the universes


def test_a_subtotal_query_is_refused_as_a_strategy(ppdd):
    """Strategy queries must partition every attribute: a slice (18 and over) is not one."""
    with pytest.raises(SpecError, match="does not partition"):
        TablePlan.build(ppdd, 1.0, [("adult * cenrace", 0.5), ("sex * age", 0.5)])
    with pytest.raises(SpecError, match="is not a sum of cells of any strategy query"):
        TablePlan.build(ppdd, 1.0, [("votingage * hispanic * cenrace", 0.5), ("sex", 0.5)])
    with pytest.raises(SpecError, match="not determined by the columns"):
        TablePlan.build(ppdd, 1.0, [("hhgq * sex", 1.0)])  # P42 is not split by sex


# ------------------------------------------------------------------- release (in-process)
def test_identities_hold_exactly_in_every_row(plan, ppdd):
    truth = synthetic_truth(ppdd)
    rel = release_tables(plan, truth, KeyedRNG.reproducible(5))
    assert rel.values.dtype == np.int64
    assert not (plan.identities @ rel.values.T).any()  # all 73, every row, exactly
    for t in ppdd.tables:  # and table by table: details sum to the total, totals agree
        st = ppdd.structure(t)
        assert (rel.values[:, list(st.details)].sum(axis=1) == rel.values[:, st.total]).all()
    p1 = rel.values[:, ppdd.columns.index("H7V001")]
    for code in ("H7X001", "H7Y001", "H7Z001", "H72001", "H73001", "H76001"):
        assert (rel.values[:, ppdd.columns.index(code)] == p1).all()
    # rounding moves no column far from the real-valued estimate
    assert np.abs(rel.values - rel.estimate).max() < 8


def test_identities_broken_in_the_input_are_refused(plan, ppdd):
    truth = synthetic_truth(ppdd)
    truth[2, ppdd.columns.index("H7X003")] += 1
    with pytest.raises(DataError, match=r"area 'G2'.*break the identity") as err:
        release_tables(plan, truth, KeyedRNG.reproducible(1), areas=["G0", "G1", "G2"] * 2)
    assert str(truth[2, ppdd.columns.index("H7X003")]) not in str(err.value).split("identity")[0]


def test_unbiased_and_standard_errors_exact(plan, ppdd):
    """Over repeated releases: every checked column's mean error is within 4 SE of 0 (integer
    release), and the real-valued estimate's error variance matches the GLS variance (χ² at
    α = 1e-6), a test that rejects a 30% wrong noise scale."""
    truth = synthetic_truth(ppdd, n=20, seed=2)
    cols = [ppdd.columns.index(c) for c in ("H7V001", "H7X002", "H72010", "H76010", "H80004")]
    reps = 20  # × 20 areas: 400 errors per column (same law in every area)
    err_int, err_real = [], []
    root = KeyedRNG.reproducible(2024)
    for r in range(reps):
        rel = release_tables(plan, truth, root.child(f"rep{r}"))
        err_int.append(rel.values[:, cols] - truth[:, cols])
        err_real.append(rel.estimate[:, cols] - truth[:, cols])
    ei = np.concatenate(err_int).astype(float)
    er = np.concatenate(err_real)
    n = ei.shape[0]
    se_mean = ei.std(axis=0, ddof=1) / np.sqrt(n)
    assert (np.abs(ei.mean(axis=0)) < 4 * se_mean).all()
    var = plan.column_se[cols] ** 2
    for scale in (1.0, 1.3):  # the right variance passes, a 30% wrong scale fails, per column
        s = (er**2).sum(axis=0) / (var * scale**2)  # mean known (0): χ²(n)
        p = 2 * np.minimum(stats.chi2.cdf(s, n), stats.chi2.sf(s, n))
        assert (p > ALPHA).all() if scale == 1.0 else (p < ALPHA).all(), (scale, p)


# ------------------------------------------------------------------------------ the CLI
def test_cli_codebook_route_writes_exact_tables_and_statement(tmp_path, ppdd, capsys):
    truth = synthetic_truth(ppdd)
    src = write_ppdd_file(tmp_path / "ppdd.csv", ppdd, truth)
    before = src.read_bytes()
    out = tmp_path / "rel.csv"
    argv = ["privatize", str(src), "--codebook", "ppdd", "--rho", "0.5", "-o", str(out)]
    assert main([*argv, "--seed", "9"]) == 0
    printed = capsys.readouterr().out
    rho, sigma2 = hand_rho(SHARES, 0.5)
    assert f"ρ = {rho:g} (zCDP)" in printed
    df, values, se = read_release(out, ppdd)
    assert len(df) == N_AREAS and list(df["gisjoin"]) == [f"G{i:04d}" for i in range(N_AREAS)]
    assert values.dtype.kind == "i" and not (ppdd.identities() @ values.T).any()
    assert not any(c.endswith("_sf") for c in df.columns)  # the confidential input stays out
    assert (se > 0).all() and np.isfinite(se).all()
    # each _se followed by its integer (lattice) 90% MOE; SEs to 6 significant digits
    cols = list(df.columns)
    assert cols[cols.index("H7V001_se") + 1] == "H7V001_moe"
    moe = df[[f"{c}_moe" for c in ppdd.columns]]
    assert (moe.dtypes == np.int64).all() and np.array_equal(moe.to_numpy(), lattice_moe(se))
    assert np.array_equal(se, significant(se))
    text = out.read_text(encoding="latin-1")
    assert "ρ" not in text  # (nothing Greek in the table itself)
    side_text = (tmp_path / "rel.csv.censusdp.json").read_text(encoding="utf-8")
    assert "ρ" in side_text and "\\u03c1" not in side_text  # ensure_ascii=False
    side = json.loads(side_text)
    dic = {e["column"]: e for e in side["data_dictionary"]}
    assert set(dic) == set(df.columns)
    assert dic["H7V001_dp"] == {
        "column": "H7V001_dp", "table": "P1 (H7V)", "label": "Total (Total population)",
        "type": "integer", "unit": "persons",
    }  # fmt: skip
    assert side["route"] == "codebook" and side["schema"] == "ppdd"
    assert math.isclose(side["rho_derived"], rho, rel_tol=1e-12)
    assert [q["sigma2"] for q in side["strategy"]] == sigma2
    assert math.isclose(sum(q["rho"] for q in side["strategy"]), rho, rel_tol=1e-12)
    assert side["identities"] == 73 and str(src) in side["inputs_sha256"]
    assert {"censusdp.pipelines/codebooks/ppdd.toml", "censusdp/schemas/ppdd.toml"} <= set(
        side["inputs_sha256"]
    )
    # output policy: input untouched, nothing but the output and its sidecar left behind
    assert src.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ppdd.csv",
        "rel.csv",
        "rel.csv.censusdp.json",
    ]
    # an own earlier output is replaced only with --overwrite; the input never
    assert main([*argv, "--seed", "9"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    bad = ["privatize", str(src), "--codebook", "ppdd", "--rho", "0.5", "-o", str(src)]
    assert main(bad) == 2 and "input" in capsys.readouterr().err
    assert src.read_bytes() == before


def test_file_not_matching_the_codebook_exit_2(tmp_path, ppdd, capsys):
    truth = synthetic_truth(ppdd, n=2)
    src = write_ppdd_file(tmp_path / "ppdd.csv", ppdd, truth)
    df = pd.read_csv(src, dtype=str, keep_default_na=False).drop(columns=["H80010_sf"])
    df.to_csv(src, index=False)
    argv = [
        "privatize",
        str(src),
        "--codebook",
        "ppdd",
        "--rho",
        "1",
        "-o",
        str(tmp_path / "o.csv"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "lacks 1 of its columns" in err and "H80010" in err
    assert not (tmp_path / "o.csv").exists()


def test_cli_spec_route(tmp_path, ppdd, capsys):
    truth = synthetic_truth(ppdd, n=3)
    src = write_ppdd_file(tmp_path / "ppdd.csv", ppdd, truth)
    spec = tmp_path / "tables.toml"
    spec.write_text(
        textwrap.dedent(
            """
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
        )
    )
    out = tmp_path / "rel.parquet"
    assert main(["privatize", str(src), "--spec", str(spec), "-o", str(out)]) == 0
    rho, _ = hand_rho([0.5, 0.25, 0.25], 2.0)
    assert f"ρ = {rho:g}" in capsys.readouterr().out
    values = pd.read_parquet(out)[[f"{c}_dp" for c in ppdd.columns]].to_numpy()
    assert not (ppdd.identities() @ values.T).any()
    # Parquet: int64 releases, the statement and schema in the file's metadata
    import pyarrow.parquet as pq

    pf = pq.read_schema(out)
    assert pf.field("H7V001_dp").type == "int64" and pf.field("H7V001_moe").type == "int64"
    meta = {k.decode(): v.decode("utf-8") for k, v in pf.metadata.items()}
    assert meta["censusdp.schema"] == "ppdd" and f"ρ = {rho:g}" in meta["censusdp.privacy"]
    assert len(json.loads(meta["censusdp.data_dictionary"])) == len(pf.names)
    # a --rho that contradicts the spec is refused, not silently preferred
    assert (
        main(
            [
                "privatize",
                str(src),
                "--spec",
                str(spec),
                "--rho",
                "1",
                "-o",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    assert "contradicts" in capsys.readouterr().err
    cells = tmp_path / "cells.toml"
    cells.write_text(NSPEC.format(cells='["H*"]'))
    argv = ["privatize", str(src), "--spec", str(cells), "--codebook", "ppdd", "-o", "z.csv"]
    assert main(argv) == 2 and "describes disjoint cells" in capsys.readouterr().err
    spec.write_text(spec.read_text().replace('schema = "ppdd"', 'schema = "pl94"'))
    assert main(["privatize", str(src), "--spec", str(spec), "-o", str(tmp_path / "y.csv")]) == 2
    assert "data.schema" in capsys.readouterr().err


NSPEC = """
[data]
source = "nhgis"
cells = {cells}
[hierarchy]
levels = ["nation", "state", "county"]
[privacy]
accounting = "zcdp"
rho = 0.5
[queries]
county = ["detailed"]
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = ["gls"]
"""


def _county_file(path: Path, columns: dict[str, list[int]]) -> Path:
    codes = ["G0100010", "G0100030", "G0200010", "G0200020", "G0200030", "G0200040"]
    df = pd.DataFrame({"gisjoin": codes, "name": list("ABCDEF")})
    for c, v in columns.items():
        df[f"{c}_sf"] = v
    df.to_csv(path, index=False)
    return path


def test_overlapping_codebook_columns_without_codebook_exit_2(tmp_path, capsys):
    # P12's total and two of its rows: a person is in the total and in one row
    src = _county_file(
        tmp_path / "c.csv",
        {"H76001": [5, 9, 4, 7, 3, 8], "H76003": [2, 4, 1, 3, 1, 5], "H76004": [3, 5, 3, 4, 2, 3]},
    )
    (tmp_path / "s.toml").write_text(NSPEC.format(cells='["H76*"]'))
    code = main(
        ["privatize", str(src), "--spec", str(tmp_path / "s.toml"), "-o", str(tmp_path / "o.csv")]
    )
    err = capsys.readouterr().err
    assert code == 2
    for fragment in ("overlap", "understate the privacy loss", "--codebook ppdd", "ppdd.toml"):
        assert fragment in err, fragment
    assert not (tmp_path / "o.csv").exists()


def test_overlap_found_in_the_data_without_codebook_exit_2(tmp_path, capsys):
    """Unknown codes: a column equal to the sum of two others in every row is refused."""
    a, b = [2, 4, 1, 3, 1, 5], [3, 5, 3, 4, 2, 3]
    src = _county_file(
        tmp_path / "c.csv", {"X01": a, "X02": b, "X03": [x + y for x, y in zip(a, b, strict=True)]}
    )
    (tmp_path / "s.toml").write_text(NSPEC.format(cells='["X*"]'))
    code = main(
        ["privatize", str(src), "--spec", str(tmp_path / "s.toml"), "-o", str(tmp_path / "o.csv")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "X03 = X01 + X02" in err and "codebook TOML" in err
    for v in ("9", "12", "7"):  # never a count
        assert f" {v} " not in err and f"={v}" not in err


def test_disjoint_cells_route_still_works(tmp_path, capsys):
    src = _county_file(
        tmp_path / "c.csv", {"H76003": [2, 4, 1, 3, 1, 5], "H76027": [3, 5, 3, 4, 2, 3]}
    )
    (tmp_path / "s.toml").write_text(NSPEC.format(cells='["H76003", "H76027"]'))
    out = tmp_path / "o.csv"
    assert (
        main(
            [
                "privatize",
                str(src),
                "--spec",
                str(tmp_path / "s.toml"),
                "-o",
                str(out),
                "--seed",
                "1",
            ]
        )
        == 0
    )
    assert "privacy:" in capsys.readouterr().out
    assert {"H76003_dp", "H76027_dp", "H76003_se"} <= set(pd.read_csv(out).columns)


# ---------------------------------------------------------------------- the real AIANHH file
@pytest.mark.shared
@pytest.mark.slow
def test_real_aianhh_file(tmp_path, shared_file, ppdd, capsys):
    """Acceptance: every identity among the 376 columns holds exactly in all 692 rows of the
    release, and the printed ρ is the composition computed by hand."""
    src = shared_file("nhgis_ppdd_20200527_aianhh.csv")
    sf = pd.read_csv(src, encoding="latin-1", skiprows=[1])
    w = ppdd.identities()
    truth = sf[[f"{c}_sf" for c in ppdd.columns]].to_numpy()
    assert not (w @ truth.T).any()  # they hold in the input first
    out = tmp_path / "aianhh.csv"
    assert main(["privatize", str(src), "--codebook", "ppdd", "--rho", "1", "-o", str(out)]) == 0
    rho, _ = hand_rho(SHARES, 1.0)
    assert f"ρ = {rho:g} (zCDP)" in capsys.readouterr().out
    df, values, _ = read_release(out, ppdd)
    assert len(df) == 692 and list(df["gisjoin"]) == list(sf["gisjoin"])
    assert not (w @ values.T).any()


@pytest.mark.shared
def test_real_aianhh_file_without_codebook_exit_2(tmp_path, shared_file, capsys):
    src = shared_file("nhgis_ppdd_20200527_aianhh.csv")
    (tmp_path / "s.toml").write_text(NSPEC.format(cells='["H*"]').replace('"state", ', ""))
    code = main(
        ["privatize", str(src), "--spec", str(tmp_path / "s.toml"), "-o", str(tmp_path / "o.csv")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "up to 32 of these 376 columns" in err and "--codebook ppdd" in err


# ------------------------------------------- dense references on a small codebook (sex_age5)
def small_codebook() -> Codebook:
    """Overlapping tables over the shipped 36-cell ``sex_age5`` schema: a total, sex, age
    bands with their total, sex × age band, under/over 65 and the 65+ slice."""
    bands = ["0-19", "20-44", "45-64", "65+"]
    cols: dict[str, dict] = {"T1": {"table": "A", "query": "total", "row": []}}
    cols |= {f"S{i}": {"table": "B", "query": "sex", "row": [s]} for i, s in enumerate("MF")}
    cols |= {"B0": {"table": "C", "query": "total", "row": []}}
    cols |= {
        f"B{i + 1}": {"table": "C", "query": "ageband", "row": [b]} for i, b in enumerate(bands)
    }
    cols |= {
        f"X{i}{j}": {"table": "D", "query": "sex * ageband", "row": [s, b]}
        for i, s in enumerate("MF")
        for j, b in enumerate(bands)
    }
    cols |= {
        f"O{i}": {"table": "E", "query": "age65", "row": [g]} for i, g in enumerate(["0-64", "65+"])
    }
    cols |= {"P1": {"table": "E", "query": "seniors", "row": ["65+"]}}
    tables = {t: {"nhgis": t, "title": t, "universe": "persons"} for t in "ABCDE"}
    return Codebook.from_dict({"schema": "sex_age5", "tables": tables, "columns": cols}, "small")


SMALL_STRATEGY = [("total", 0.2), ("age65", 0.3), ("sex * ageband", 0.5)]


@settings(max_examples=25, deadline=None)
@given(
    shares=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
    rho=st.floats(0.01, 10.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_gls_equals_the_dense_reference(shares, rho, seed):
    """Single-node GLS in the marginal basis = the dense weighted least squares (minimum-norm,
    36 × 36), columns and their variances to 1e-9 relative; the within-band contrasts are
    unidentified and stay zero."""
    cb = small_codebook()
    total = sum(shares)
    strategy = [(q, s / total) for (q, _), s in zip(SMALL_STRATEGY, shares, strict=True)]
    strategy[-1] = (strategy[-1][0], 1.0 - sum(s for _, s in strategy[:-1]))
    plan = TablePlan.build(cb, rho, strategy)
    rng = np.random.default_rng(seed)
    answers = [rng.normal(50, 20, size=(3, q.n_rows)) for q in plan.queries]
    strat, _ = plan.estimate(answers)
    dense_q = [q.dense().astype(float) for q in plan.queries]
    w = [1 / float(law.sigma2) for law in plan.laws]
    info = sum(wq * d.T @ d for wq, d in zip(w, dense_q, strict=True))
    cov = np.linalg.pinv(info, rcond=1e-10, hermitian=True)
    h = sum(wq * y @ d for wq, y, d in zip(w, answers, dense_q, strict=True))
    x = h @ cov
    m = cb.rows.dense().astype(float)
    np.testing.assert_allclose(plan.columns(strat), x @ m.T, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(plan.column_se**2, np.diag(m @ cov @ m.T), rtol=1e-9)


def test_small_codebook_release_keeps_its_identities():
    cb = small_codebook()
    plan = TablePlan.build(cb, 0.5, SMALL_STRATEGY)
    w = cb.identities()
    assert w.shape[0] == len(cb.columns) - 8  # rank: the 8 sex × band cells
    x = np.random.default_rng(1).poisson(3.0, (40, *cb.schema.shape))
    truth = cb.rows.apply(x)
    rel = release_tables(plan, truth, KeyedRNG.reproducible(8))
    assert not (w @ rel.values.T).any()
    assert (np.abs(rel.values - rel.estimate) < 4).all()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 4),
    parent=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_conditional_rounding_keeps_the_coarse_integers(n, parent, seed):
    """Against the obvious reference: the rounded values sum to the coarse integers exactly,
    and each is the floor or ceiling of its value shifted by its group's rounding error."""
    from censusdp.pipelines.products.codebook_tables import round_given

    rng = np.random.default_rng(seed)
    par = np.unique(parent, return_inverse=True)[1].astype(np.int64)
    rc = int(par.max()) + 1
    values = rng.normal(0, 30, size=(n, par.size))
    sums = np.zeros((n, rc))
    np.add.at(sums, (slice(None), par), values)
    target = np.floor(sums).astype(np.int64) + (rng.random((n, rc)) < 0.5)
    out, _ = round_given(values, par, target, rng)
    got = np.zeros((n, rc), dtype=np.int64)
    np.add.at(got, (slice(None), par), out)
    assert np.array_equal(got, target)
    shifted = values + ((target - sums) / np.bincount(par, minlength=rc))[:, par]
    assert (out >= np.floor(shifted - 1e-9)).all() and (out <= np.ceil(shifted + 1e-9)).all()


def test_conditional_rounding_is_unbiased():
    """Mean over draws (coarse targets themselves unbiased roundings) within 4 SE."""
    from censusdp.pipelines.products.codebook_tables import round_given

    rng = np.random.default_rng(5)
    values = np.array([[0.3, 1.7, 2.25, -0.6, 4.9]])
    par = np.array([0, 0, 1, 1, 1])
    sums = np.array([[2.0, 6.55]])
    reps = 4000  # one area per draw: every area is rounded independently
    target = np.floor(sums).astype(np.int64) + (rng.random((reps, 2)) < sums % 1)
    draws = round_given(np.repeat(values, reps, axis=0), par, target, rng)[0].astype(float)
    se = draws.std(axis=0, ddof=1) / np.sqrt(reps)
    assert (np.abs(draws.mean(axis=0) - values[0]) < 4 * se + 1e-12).all()


@pytest.mark.shared
@pytest.mark.parametrize(
    "name",
    [
        "county_sex_age5_2010.csv",
        "ma_cousub_sex_age5_2010.csv",
        "nhgis_ppdd_20200527_county_under1.csv",
    ],
)
def test_disjoint_real_files_are_not_refused(name, shared_file):
    """No false alarm on the project's disjoint-cell files (sex × age, under 1)."""
    from censusdp.pipelines.io.nhgis import read_batch
    from censusdp.pipelines.products.codebook_tables import refuse_overlapping_columns

    batch = read_batch(shared_file(name))
    refuse_overlapping_columns(batch.cells, batch.truth, name)
