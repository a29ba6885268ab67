"""The PPMF units reader and the H1 release (occupancy status; block totals invariant)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
from scipy import stats

from censusdp.app.cli import main
from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.integer.capped_simplex import project_capped_simplex
from censusdp.mechanisms.queries import Query, measure
from censusdp.pipelines.io.outputs import lattice_moe
from censusdp.pipelines.io.ppmf import read_ppmf, read_ppmf_units
from censusdp.pipelines.products.ppmf_units import (
    CELLS,
    H1_COLUMNS,
    compose_statements,
    load_units_spec,
    nonnegative_occupied,
    release_h1,
)
from censusdp.rng import KeyedRNG

#: (state, county, tract, block group, block) of the synthetic blocks: two counties, three
#: tracts, five block groups, nine blocks.
BLOCKS = [
    ("44", "001", "030100", "1", "1001"),
    ("44", "001", "030100", "1", "1002"),
    ("44", "001", "030100", "2", "2001"),
    ("44", "001", "030200", "1", "1001"),
    ("44", "001", "030200", "1", "1003"),
    ("44", "003", "040100", "1", "1001"),
    ("44", "003", "040100", "2", "2000"),
    ("44", "003", "040100", "2", "2002"),
    ("44", "003", "040100", "3", "3001"),
]
MDF_HEADER = (
    "SCHEMA_TYPE_CODE",
    "SCHEMA_BUILD_ID",
    "TABBLKST",
    "TABBLKCOU",
    "TABTRACTCE",
    "TABBLKGRPCE",
    "TABBLK",
    "RTYPE",
    "HH_STATUS",
)


def units_frame(gen: np.random.Generator, n: int, facilities: int) -> pd.DataFrame:
    """``n`` housing units (occupied with probability 0.7) and ``facilities`` group-quarters
    facility rows over :data:`BLOCKS`, in the DAS MDF unit layout, shuffled."""
    b = gen.integers(0, len(BLOCKS), n + facilities)
    rtype = np.r_[np.full(n, "2"), np.full(facilities, "4")]
    status = np.r_[np.where(gen.random(n) < 0.7, "1", "2"), np.full(facilities, "0")]
    frame = pd.DataFrame(
        {
            "SCHEMA_TYPE_CODE": "MUD",
            "SCHEMA_BUILD_ID": "1.1.0",
            **{col: [BLOCKS[i][j] for i in b] for j, col in enumerate(MDF_HEADER[2:7])},
            "RTYPE": rtype,
            "HH_STATUS": status,
        }
    )
    return frame.iloc[gen.permutation(len(frame))].reset_index(drop=True)


def write(frame: pd.DataFrame, path: Path, sep: str = "|") -> Path:
    frame.to_csv(path, sep=sep, index=False)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    gen = np.random.default_rng(16)
    return write(units_frame(gen, 400, 7), tmp_path_factory.mktemp("units") / "units.csv")


# -- the reader ---------------------------------------------------------------------------------
@pytest.mark.parametrize("block_bytes", [97, 1 << 20])
def test_reader_matches_a_pandas_group_by(tmp_path: Path, block_bytes: int) -> None:
    frame = units_frame(np.random.default_rng(3), 700, 11)
    path = write(frame, tmp_path / "units.csv")
    hist = read_ppmf_units(path, block_bytes=block_bytes)  # 97 bytes: one row a chunk
    hu = frame[frame.RTYPE == "2"]
    geoid = hu.TABBLKST + hu.TABBLKCOU + hu.TABTRACTCE + hu.TABBLK
    want = pd.crosstab(geoid, hu.HH_STATUS).reindex(columns=["1", "2"], fill_value=0).sort_index()
    codes = [str(c) for c in hist.hierarchy.levels[-1].codes]
    assert codes == want.index.tolist()
    assert (hist.dense() == want.to_numpy()).all()  # cell 0 occupied, 1 vacant
    assert hist.persons == 700 and hist.facilities == 11 and hist.layout == "units"
    assert hist.schema.name == "h1"
    bg = hist.hierarchy.levels[hist.hierarchy.level_index("block_group")].codes
    assert sorted(set(bg)) == sorted({"".join(b[:4]) for b in BLOCKS})


def _bad(tmp_path: Path, column: str, value: str, row: int = 5) -> Path:
    frame = units_frame(np.random.default_rng(4), 30, 3)
    frame.loc[row - 1, ["RTYPE", "HH_STATUS"]] = ["2", "1"]  # a housing unit, then the fault
    frame.loc[row - 1, column] = value
    return write(frame, tmp_path / "bad.csv")


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("TABBLK", "101", "has 3 characters"),
        ("TABBLKCOU", "0a1", "not all digits"),
        ("RTYPE", "3", "outside the units layout"),
        ("HH_STATUS", "7", "outside the units layout"),
        ("HH_STATUS", "0", "does not agree with RTYPE"),
        ("RTYPE", "4", "does not agree with RTYPE"),
    ],
)
def test_a_bad_row_names_file_row_and_column(tmp_path, column, value, why) -> None:
    path = _bad(tmp_path, column, value)
    col = "HH_STATUS" if why == "does not agree with RTYPE" else column
    with pytest.raises(DataError, match=rf"bad\.csv, data row 5, column '{col}'.*{why}"):
        read_ppmf_units(path)


def test_the_persons_and_units_readers_refuse_each_others_files(small: Path, tmp_path) -> None:
    with pytest.raises(DataError, match="housing units .* a PPMF was expected"):
        read_ppmf(small)
    persons = tmp_path / "p.csv"
    persons.write_text(
        "TABBLKST,TABBLKCOU,TABTRACT,TABBLKGRP,TABBLK,GQTYPE_PL,VOTING_AGE,CENHISP,CENRACE\n"
        "44,001,030100,1,1001,0,2,1,01\n"
    )
    with pytest.raises(DataError, match="persons, but a PPMF units file was expected"):
        read_ppmf_units(persons)


# -- the release -----------------------------------------------------------------------------------
def test_h1_identities_hold_exactly_at_every_level(small: Path) -> None:
    hist = read_ppmf_units(small)
    h = hist.hierarchy
    rel = release_h1(hist, KeyedRNG.reproducible(5, warn=False))
    truth = h.aggregate(hist.dense())
    leaf = rel.counts[-1]
    for k, (c, t) in enumerate(zip(rel.counts, truth, strict=True)):
        assert c.dtype == np.int64
        assert (c[:, 0] == c[:, 1] + c[:, 2]).all()
        assert (c[:, 0] == t.sum(axis=1)).all()  # the invariant, at every level
        assert (c == h.aggregate(leaf)[k]).all()  # children sum to their parent
        est = rel.estimates[k]
        assert np.allclose(est.sum(axis=1), t.sum(axis=1), rtol=0, atol=1e-8)
        occ = est[:, 0]
        assert ((c[:, 1] == np.floor(occ)) | (c[:, 1] == np.ceil(occ))).all()
        vac = t.sum(axis=1) - occ
        assert ((c[:, 2] == np.floor(vac)) | (c[:, 2] == np.ceil(vac))).all()
        se = rel.standard_errors[k]
        assert (se[:, 0] == 0).all() and (se[:, 1] == se[:, 2]).all() and (se[:, 1] > 0).all()
    assert rel.privacy.invariants == ("block: total",)
    # derived from the discrete Gaussian laws: the production ρ up to their σ² representation
    assert 11417641 / 152349649 * (1 - 1e-4) < rel.privacy.rho <= 11417641 / 152349649


def test_the_nonnegative_product_is_non_negative_consistent_and_exact(small: Path) -> None:
    hist = read_ppmf_units(small)
    h = hist.hierarchy
    truth = h.aggregate(hist.dense())
    # ρ 1000 times smaller than production's: estimates fall outside [0, housing units]
    rel = release_h1(hist, KeyedRNG.reproducible(5, warn=False), rho=Fraction(1, 13000))
    occ = np.concatenate([e[:, 0] for e in rel.estimates])
    tot = np.concatenate([t.sum(axis=1) for t in truth])
    assert (occ < 0).any() and (occ > tot).any()  # the box binds on both sides
    unb = np.concatenate([c for c in rel.counts])
    assert (unb[:, 1:] < 0).any()  # the unbiased product shows negative counts here
    leaf = rel.nonnegative[-1]
    for k, (c, t) in enumerate(zip(rel.nonnegative, truth, strict=True)):
        assert c.dtype == np.int64 and (c >= 0).all()
        assert (c[:, 0] == t.sum(axis=1)).all()  # the invariant, at every node
        assert (c[:, 0] == c[:, 1] + c[:, 2]).all()
        assert (c == h.aggregate(leaf)[k]).all()  # children sum to their parent


def test_nonnegative_occupied_rounds_the_projection_given_the_parent() -> None:
    from censusdp.hierarchy import Hierarchy

    gen = np.random.default_rng(2)
    parents = np.repeat(np.arange(30), gen.integers(1, 7, 30))
    h = Hierarchy.from_parents(
        ["root", "mid", "leaf"],
        [np.array(["r"]), np.array([f"m{i:02d}" for i in range(30)]),
         np.array([f"l{i:03d}" for i in range(parents.size)])],
        [np.zeros(1, np.int64), np.zeros(30, np.int64), parents],
    )  # fmt: skip
    cap = gen.integers(0, 6, parents.size)
    totals = [t[:, 0] for t in h.aggregate(cap[:, None])]
    est = [gen.normal(t * 0.6, 3.0) for t in totals]
    est[0] = np.array([float(totals[0][0]) * 0.6 // 1])  # an integer root: fixed
    R = 300
    first = np.empty((R, 30))
    for r in range(R):
        out = nonnegative_occupied(h, est, totals, KeyedRNG.reproducible(r, warn=False))
        assert out[0][0] == est[0][0]
        for j in (1, 2):
            count = h.levels[j - 1].child_count
            proj = project_capped_simplex(est[j], totals[j], out[j - 1], count)
            assert ((out[j] == np.floor(proj)) | (out[j] == np.ceil(proj))).all()
            assert ((out[j] >= 0) & (out[j] <= totals[j])).all()
        first[r] = out[1]
    # given the root, level 1 is the projection rounded without bias: within 4 SE of it,
    # and the same check rejects a value 0.3 away wherever the rounding is random
    proj = project_capped_simplex(est[1], totals[1], est[0], h.levels[0].child_count)
    sem = first.std(axis=0, ddof=1) / np.sqrt(R)
    rand = sem > 0
    assert (first[:, ~rand] == proj[~rand]).all()
    z = (first.mean(axis=0) - proj)[rand] / sem[rand]
    assert np.abs(z).max() < 4
    assert np.abs(z + 0.3 / sem[rand]).min() > 4


def _dense_gls(h, level_counts, meas, variances):
    """The GLS of the two-cell problem as one dense constrained least-squares: every node's
    detailed measurement, every block total held; returns per level the estimates and the
    standard error of occupied."""
    n_leaf, K = level_counts[-1].shape
    blocks = []
    for k in range(h.depth):
        anc = h.ancestor_index(h.names[-1], h.names[k]) if k < h.depth - 1 else np.arange(n_leaf)
        A = np.zeros((h.sizes[k], n_leaf))
        A[anc, np.arange(n_leaf)] = 1.0
        blocks.append(np.kron(A, np.eye(K)))
    M = np.vstack([blocks[m.level] for m in meas])
    y = np.concatenate([m.values.ravel().astype(float) for m in meas])
    w = np.concatenate(
        [np.full(m.values.size, 1 / v) for m, v in zip(meas, variances, strict=True)]
    )
    C = np.kron(np.eye(n_leaf), np.ones((1, K)))
    t = level_counts[-1].sum(axis=1).astype(float)
    x0 = np.linalg.lstsq(C, t, rcond=None)[0]
    Z = scipy.linalg.null_space(C)
    F = Z.T @ (M.T * w) @ M @ Z
    u = np.linalg.solve(F, Z.T @ M.T @ (w * (y - M @ x0)))
    x = x0 + Z @ u
    cov = Z @ np.linalg.solve(F, Z.T)
    out = []
    for B in blocks:
        est = (B @ x).reshape(-1, K)
        se = np.sqrt(np.diag(B @ cov @ B.T).reshape(-1, K)[:, 0])
        out.append((est, se))
    return out


def test_estimates_and_standard_errors_equal_a_dense_gls(small: Path) -> None:
    hist = read_ppmf_units(small)
    h = hist.hierarchy
    rel = release_h1(hist, KeyedRNG.reproducible(8, warn=False))
    level_counts = h.aggregate(hist.dense())
    plan = allocation_plan(hist.schema, levels=h.names)
    # the same keyed streams as release_h1's measurements
    meas = measure(
        h.names,
        level_counts,
        [(h.level_index(lvl), Query.detailed(CELLS), law) for lvl, _, law in plan],
        KeyedRNG.reproducible(8, warn=False),
    )
    dense = _dense_gls(h, level_counts, meas, [law.variance for _, _, law in plan])
    for k, (est, se) in enumerate(dense):
        assert np.allclose(rel.estimates[k], est, rtol=0, atol=1e-9)
        assert np.allclose(rel.gls_standard_errors[k], se, rtol=1e-9, atol=0)


def _replicates(path: Path, R: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Truth, GLS and rounded occupied over ``R`` fixed-seed releases, and the GLS SE (every
    node of every level, concatenated)."""
    hist = read_ppmf_units(path)
    truth = np.concatenate([c[:, 0] for c in hist.hierarchy.aggregate(hist.dense())])
    est = np.empty((R, truth.size))
    rounded = np.empty((R, truth.size))
    for r in range(R):
        rel = release_h1(hist, KeyedRNG.reproducible(1000 + r, warn=False))
        est[r] = np.concatenate([e[:, 0] for e in rel.estimates])
        rounded[r] = np.concatenate([c[:, 1] for c in rel.counts])
    se = np.concatenate(rel.gls_standard_errors)
    return truth, est, rounded, se


def _check_unbiased(truth: np.ndarray, x: np.ndarray, bias: float) -> None:
    """Mean within 4 SE at every node; the same check rejects, at every node, an estimate
    biased by ``bias`` of its per-release standard deviation (power)."""
    R = x.shape[0]
    sem = x.std(axis=0, ddof=1) / np.sqrt(R)
    z = (x.mean(axis=0) - truth) / sem
    assert np.abs(z).max() < 4
    assert np.abs(z + bias * np.sqrt(R)).min() > 4


def test_occupied_is_unbiased(small: Path) -> None:
    truth, est, rounded, _ = _replicates(small, 30)
    for x in (est, rounded):
        _check_unbiased(truth, x, bias=1.5)


@pytest.mark.slow
def test_occupied_is_unbiased_and_its_standard_error_is_calibrated(small: Path) -> None:
    R = 800
    truth, est, rounded, se = _replicates(small, R)
    for x in (est, rounded):
        _check_unbiased(truth, x, bias=0.3)
    # the GLS variance is exact: (R - 1) s²/σ² ~ χ²(R - 1) at every node (α = 1e-6 over the
    # nodes, Bonferroni), and a 30% wrong σ is rejected at every node
    stat = (R - 1) * est.var(axis=0, ddof=1)
    lo, hi = stats.chi2.ppf([0.5e-6 / truth.size, 1 - 0.5e-6 / truth.size], R - 1)
    assert ((stat / se**2 > lo) & (stat / se**2 < hi)).all()
    wrong = stat / (1.3 * se) ** 2
    assert ((wrong < lo) | (wrong > hi)).all()


def test_compose_statements_adds_rho_and_names_both_invariants() -> None:
    p = PrivacyStatement("zcdp", rho=2.5, invariants=("state: total",), mechanism="dg")
    u = PrivacyStatement("zcdp", rho=0.07, invariants=("block: total",), mechanism="dg")
    both = compose_statements(p, u)
    assert both.rho == pytest.approx(2.57, rel=1e-15)
    assert both.invariants == ("persons state: total", "housing units block: total")
    with pytest.raises(SpecError, match="not rho-zCDP"):
        compose_statements(PrivacyStatement("pure", epsilon=1.0), u)


def test_a_units_spec_refuses_what_is_not_exact(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[data]\nsource = "ppmf_units"\n[privacy]\naccounting = "zcdp"\n'
        '[mechanism]\nnoise = "laplace"\n'
    )
    with pytest.raises(SpecError, match="mechanism.noise"):
        load_units_spec(spec)
    spec.write_text('[privacy]\naccounting = "zcdp"\n[invariants]\nlevels = ["state"]\n')
    with pytest.raises(SpecError, match="invariants"):
        load_units_spec(spec)


# -- the command ---------------------------------------------------------------------------------
def test_privatize_writes_h1_for_every_level(small: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "h1"
    # (--compose-with a verified persons release: tests/pipelines/test_compose_provenance.py)
    argv = ["privatize", str(small), "-o", str(out), "--blocks-from-data", "--seed", "2"]
    assert main([*argv, "--repetitions", "2"]) == 0
    assert "H1 tables" in capsys.readouterr().out
    hist = read_ppmf_units(small)
    h = hist.hierarchy
    truth = h.aggregate(hist.dense())
    for k, name in enumerate(h.names):
        t = pd.read_csv(out / f"h1_{name}.csv", dtype={"GEOID": str})
        assert t.GEOID.tolist() == list(h.levels[k].codes)
        assert (t.H1_001N == t.H1_002N + t.H1_003N).all()
        assert (t.H1_001N.to_numpy() == truth[k].sum(axis=1)).all()
        assert (t.H1_001N_se == 0).all() and (t.H1_002N_se > 0).all()
        # the integer MOE (0 where the total is exact), the ancestors' codes on every row
        assert (t.H1_001N_moe == 0).all() and t.H1_002N_moe.dtype == np.int64
        assert np.array_equal(t.H1_003N_moe.to_numpy(), lattice_moe(t.H1_003N_se.to_numpy()))
        parents = [f"{lv}_GEOID" for lv in h.names[1:k]]
        for p in parents:
            up = h.level_index(p[:-6])
            assert t[p].astype(str).tolist() == list(h.levels[up].codes[h.ancestor_index(k, up)])
        nn = pd.read_csv(out / "nonnegative" / f"h1_{name}.csv", dtype={"GEOID": str})
        assert nn.columns.tolist() == ["GEOID", *parents, *H1_COLUMNS]  # biased: no SEs
        assert (nn.GEOID == t.GEOID).all() and (nn.H1_001N == t.H1_001N).all()
        assert (nn.H1_002N >= 0).all() and (nn.H1_003N >= 0).all()
        assert (nn.H1_001N == nn.H1_002N + nn.H1_003N).all()
    for folder in (out, out / "nonnegative"):  # a dictionary of every table column
        dic = pd.read_csv(folder / "data_dictionary.csv", keep_default_na=False)
        cols = set().union(*(pd.read_csv(f, nrows=0).columns for f in folder.glob("h1_*.csv")))
        assert set(dic["column"]) == cols and dic["column"].is_unique
    # the size-class report: both products, by housing units, every report level
    sim = pd.read_csv(out / "size_classes.csv")
    assert set(sim["product"]) == {"unbiased", "nonnegative"}
    assert set(sim["level"]) == {"block", "block_group", "tract"}
    cols = {"size_class", "n", "mae", "rmse", "mean_error", "mape", "over_10pct", "bias_se"}
    assert cols <= set(sim.columns)
    for level in ("block", "block_group", "tract"):  # classed by the exact housing units
        sizes = truth[h.level_index(level)].sum(axis=1)
        d = sim[(sim["level"] == level) & (sim["product"] == "nonnegative")]
        assert d["n"].sum() == sizes.size
        assert d.set_index("size_class").loc["10–99", "n"] == ((sizes >= 10) & (sizes <= 99)).sum()
    report = (out / "size_classes.md").read_text()
    assert "Non-negative product (biased" in report and "housing units" in report
    manifest = json.loads((out / "manifest.json").read_text())
    assert "BIASED" in manifest["products"]["nonnegative"]
    assert "seed" not in json.dumps(manifest["spec"])
    assert manifest["privacy"]["rho"] == pytest.approx(11417641 / 152349649, rel=1e-4)
    assert manifest["privacy"]["invariants"] == ["block: total"]
    assert manifest["privacy"]["unit"] == "housing unit"


def test_a_bad_units_row_exits_2_naming_file_row_and_column(tmp_path: Path, capsys) -> None:
    path = _bad(tmp_path, "HH_STATUS", "9", row=7)
    out = tmp_path / "o"
    assert main(["privatize", str(path), "-o", str(out), "--blocks-from-data"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv, data row 7, column 'HH_STATUS'" in err
    assert not out.exists()
    assert main(["privatize", str(path), "-o", str(out), "--rho", "1"]) == 2
    assert "--rho" in capsys.readouterr().err
