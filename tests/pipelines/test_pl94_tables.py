"""P1–P5 of the 2020 redistricting file from pl94 histograms: the Bureau's table shells, every
column against a slow cell-by-cell reference, every table identity exact, atomic writing."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from ppmf_fixtures import ppmf_persons

from censusdp.errors import DataError, SpecError
from censusdp.pipelines.io.outputs import lattice_moe
from censusdp.pipelines.products.pl94_tables import (
    LevelTables,
    pl94_codebook,
    pl94_labels,
    tabulate,
    write_pl94_tables,
)
from censusdp.schema import Schema

SHAPE = (8, 2, 2, 63)
BOOK = pl94_codebook()
COLUMNS = list(BOOK.columns)
LABELS = pl94_labels()
COL = {c: i for i, c in enumerate(COLUMNS)}


def _v(values: np.ndarray, name: str) -> np.ndarray:
    return values[:, COL[name]]


def _sum(values: np.ndarray, table: str, numbers: range | list[int]) -> np.ndarray:
    return sum(_v(values, f"{table}_{n:03d}N") for n in numbers)


def test_the_bureau_table_shells() -> None:
    counts = pd.Series(BOOK.table_of).value_counts().to_dict()
    assert counts == {"P1": 71, "P2": 73, "P3": 71, "P4": 73, "P5": 10}
    assert COLUMNS[0] == "P1_001N" and COLUMNS[-1] == "P5_010N"
    shell = {
        "P1_001N": "Total",
        "P1_002N": "Population of one race",
        "P1_003N": "White alone",
        "P1_008N": "Some Other Race alone",
        "P1_009N": "Population of two or more races",
        "P1_010N": "Population of two races",
        "P1_011N": "White; Black or African American",
        "P1_026N": "Population of three races",
        "P1_047N": "Population of four races",
        "P1_063N": "Population of five races",
        "P1_070N": "Population of six races",
        "P2_002N": "Hispanic or Latino",
        "P2_003N": "Not Hispanic or Latino",
        "P2_004N": "Population of one race",
        "P2_011N": "Population of two or more races",
        "P5_001N": "Total",
        "P5_002N": "Institutionalized population",
        "P5_003N": "Correctional facilities for adults",
        "P5_007N": "Noninstitutionalized population",
        "P5_010N": "Other noninstitutional facilities",
    }
    assert {c: LABELS[COL[c]] for c in shell} == shell
    assert BOOK.rows.l1_sensitivity == 21  # a person is counted once per column that holds them


def _reference(x: np.ndarray) -> np.ndarray:
    """The slow obvious reference: every column as a sum of the cells its label describes,
    one cell at a time."""
    races = Schema.load("pl94").attribute("cenrace").labels
    nraces = [r.count(";") + 1 for r in races]

    def race_test(label: str):  # P1's row label → predicate on the cenrace index
        if label == "Total":
            return lambda r: True
        if label == "Population of one race":
            return lambda r: nraces[r] == 1
        if label == "Population of two or more races":
            return lambda r: nraces[r] >= 2
        if label.startswith("Population of "):
            k = ["two", "three", "four", "five", "six"].index(label.split()[2]) + 2
            return lambda r: nraces[r] == k
        return lambda r: races[r] == label

    tests = []
    for table, label in zip(BOOK.table_of, LABELS, strict=True):
        adult = table in ("P3", "P4")
        if table == "P5":
            gq = {
                "Total": range(1, 8),
                "Institutionalized population": range(1, 5),
                "Noninstitutionalized population": range(5, 8),
            }
            types = Schema.load("pl94").attribute("hhgq").labels
            allowed = gq.get(label) or [types.index(label)]
            tests.append(lambda h, v, s, r, a=allowed: h in a)
            continue
        if table in ("P2", "P4") and label in ("Hispanic or Latino",):
            tests.append(lambda h, v, s, r, ad=adult: s == 1 and (v == 1 or not ad))
            continue
        if table in ("P2", "P4") and label == "Not Hispanic or Latino":
            tests.append(lambda h, v, s, r, ad=adult: s == 0 and (v == 1 or not ad))
            continue
        below_total = table in ("P2", "P4") and COLUMNS[len(tests)] not in ("P2_001N", "P4_001N")
        rt = race_test(label)
        tests.append(
            lambda h, v, s, r, rt=rt, ad=adult, nh=below_total: (
                rt(r) and (v == 1 or not ad) and (s == 0 or not nh)
            )
        )
    out = np.zeros((x.shape[0], len(COLUMNS)), dtype=np.int64)
    for h, v, s, r in itertools.product(*map(range, SHAPE)):
        hit = [j for j, t in enumerate(tests) if t(h, v, s, r)]
        out[:, hit] += x[:, h, v, s, r][:, None]
    return out


def test_every_column_equals_the_cell_by_cell_reference() -> None:
    gen = np.random.default_rng(3)
    x = gen.poisson(0.7, (3, *SHAPE)).astype(np.int64)
    x[2] = 0
    x[2, 3, 1, 0, 62] = 5  # a single cell: nursing, adult, not Hispanic, six races
    got = tabulate(x)
    assert got.dtype == np.int64
    assert (got == _reference(x)).all()
    assert _v(got, "P1_071N")[2] == 5 and _v(got, "P5_005N")[2] == 5 and _v(got, "P2_002N")[2] == 0


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(0, 60),
    st.integers(0, 2**32 - 1),
)
def test_block_like_histograms_tabulate_as_the_cell_by_cell_reference(
    n_nodes: int, per_node: int, seed: int
) -> None:
    """Block-like histograms (a few nonzero cells, some negative, some nodes empty): every
    column is the reference's and each query's own per-axis sums, exactly."""
    gen = np.random.default_rng(seed)
    flat = np.zeros((n_nodes, BOOK.schema.n_cells), np.int64)
    rows = np.repeat(np.arange(n_nodes), per_node)
    np.add.at(
        flat, (rows, gen.integers(0, flat.shape[1], rows.size)), gen.integers(-3, 40, rows.size)
    )
    flat[gen.random(n_nodes) < 0.2] = 0
    x = flat.reshape(n_nodes, *SHAPE)
    got = tabulate(x)
    assert got.dtype == np.int64 and got.shape == (n_nodes, len(COLUMNS))
    assert (got == _reference(x)).all()
    per_query = np.empty_like(got)
    for i, (q, r) in enumerate(zip(BOOK.rows.query_of_row, BOOK.rows.row_of_row, strict=True)):
        per_query[:, i] = BOOK.rows.queries[q].apply(x)[:, r]
    assert (got == per_query).all()
    assert (tabulate(x.astype(np.int32)) == got).all()


def _identities(values: np.ndarray) -> None:
    """The identities of P1–P5, asserted exactly."""
    for table, off in (("P1", 0), ("P3", 0), ("P2", 2), ("P4", 2)):
        n = lambda k, o=off: k + o  # noqa: E731 - P2/P4 rows are P1/P3 rows shifted by two
        t = table
        assert (_v(values, f"{t}_{n(2):03d}N") == _sum(values, t, range(n(3), n(9)))).all()
        starts = [10, 26, 47, 63, 70, 72]  # subtotals of two … six races, then the end
        assert (
            _v(values, f"{t}_{n(9):03d}N") == _sum(values, t, [n(k) for k in starts[:-1]])
        ).all()
        for a, b in itertools.pairwise(starts):
            assert (_v(values, f"{t}_{n(a):03d}N") == _sum(values, t, range(n(a) + 1, n(b)))).all()
        whole = _v(values, f"{t}_001N") if off == 0 else _v(values, f"{t}_003N")
        assert (whole == _v(values, f"{t}_{n(2):03d}N") + _v(values, f"{t}_{n(9):03d}N")).all()
    for t in ("P2", "P4"):
        assert (_v(values, f"{t}_001N") == _v(values, f"{t}_002N") + _v(values, f"{t}_003N")).all()
    assert (_v(values, "P1_001N") == _v(values, "P2_001N")).all()
    assert (_v(values, "P3_001N") == _v(values, "P4_001N")).all()
    assert (_v(values, "P5_001N") == _v(values, "P5_002N") + _v(values, "P5_007N")).all()
    assert (_v(values, "P5_002N") == _sum(values, "P5", range(3, 7))).all()
    assert (_v(values, "P5_007N") == _sum(values, "P5", range(8, 11))).all()


def test_table_identities_hold_exactly_and_match_the_codebook_basis() -> None:
    x = np.random.default_rng(8).poisson(2.0, (4, *SHAPE)).astype(np.int64)
    values = tabulate(x)
    _identities(values)
    w = BOOK.identities()  # every linear identity among the 298 columns
    rank = np.linalg.matrix_rank(BOOK.rows.dense().astype(float))
    assert w.shape[0] == len(COLUMNS) - rank  # a complete basis of the identities
    assert not (values @ w.T).any()


@settings(max_examples=25, deadline=None)
@given(arrays(np.int64, (2, *SHAPE), elements=st.integers(-50, 1000)))
def test_identities_hold_for_any_integer_histogram(x: np.ndarray) -> None:
    """Unbiased integer releases have negative cells: the identities still hold exactly."""
    _identities(tabulate(x))


def test_bad_histograms_are_refused() -> None:
    with pytest.raises(DataError, match=r"shape \(2, 8, 2, 2\); expected \(n_nodes, 8, 2, 2, 63\)"):
        tabulate(np.zeros((2, 8, 2, 2), np.int64))
    with pytest.raises(DataError, match="integer histograms"):
        tabulate(np.zeros((1, *SHAPE)))


def _levels(se: bool = True) -> dict[str, LevelTables]:
    gen = np.random.default_rng(1)
    blocks = gen.poisson(0.3, (3, *SHAPE)).astype(np.int64)
    county = blocks.sum(axis=0, keepdims=True)
    ses = (lambda n: gen.uniform(0, 2, (n, len(COLUMNS)))) if se else (lambda n: None)
    return {
        "county": LevelTables(["01001"], county, ses(1)),
        "block": LevelTables(
            ["010010201001001", "010010201001002", "010010201002001"], blocks, ses(3)
        ),
    }


def test_written_wide_and_long_tables(tmp_path: Path) -> None:
    levels = _levels()
    out = write_pl94_tables(tmp_path / "tables", levels)
    county = pd.read_csv(out / "pl94_county.csv", dtype={"GEOID": str})
    block = pd.read_csv(out / "pl94_block.csv", dtype={"GEOID": str})
    assert list(county.columns[:4]) == ["GEOID", "P1_001N", "P1_001N_se", "P1_001N_moe"]
    assert len(county.columns) == 1 + 3 * len(COLUMNS)
    # integers as integers (no ".0"), the integer lattice MOE of the written SE
    assert (county[COLUMNS].dtypes == np.int64).all()
    assert (county[[f"{c}_moe" for c in COLUMNS]].dtypes == np.int64).all()
    se_written = county[[f"{c}_se" for c in COLUMNS]].to_numpy()
    assert np.array_equal(
        county[[f"{c}_moe" for c in COLUMNS]].to_numpy(),
        lattice_moe(levels["county"].standard_errors),
    )
    text = (out / "pl94_county.csv").read_text().splitlines()[1].split(",")
    assert all("." not in v for v in text[1:2]) and len(text[2].replace(".", "")) <= 7
    assert np.allclose(se_written, levels["county"].standard_errors, rtol=5e-6, atol=0)
    assert county[COLUMNS].to_numpy().tolist() == tabulate(levels["county"].histograms).tolist()
    # the county row is the sum of its blocks' rows, column by column
    assert county[COLUMNS].to_numpy()[0].tolist() == block[COLUMNS].to_numpy().sum(axis=0).tolist()
    assert np.allclose(county["P5_010N_se"], levels["county"].standard_errors[:, -1])
    long = pd.read_csv(out / "pl94_long.csv", dtype={"GEOID": str})
    assert len(long) == 4 * len(COLUMNS)
    row = long[(long.GEOID == "01001") & (long.column == "P2_003N")].iloc[0]
    assert (row.table, row.label, row.level) == ("P2", "Not Hispanic or Latino", "county")
    assert row.value == county.loc[0, "P2_003N"]
    assert row.moe == county.loc[0, "P2_003N_moe"] and long["value"].dtype == np.int64
    assert (out / "censusdp-output.json").exists()
    # the data dictionary names every column of every file once, with its table and label
    dic = pd.read_csv(out / "data_dictionary.csv", keep_default_na=False)
    assert list(dic.columns) == ["column", "table", "label", "type", "unit"]
    assert dic["column"].is_unique
    assert set(county.columns) | set(long.columns) == set(dic["column"])
    p2 = dic.set_index("column").loc["P2_003N"]
    assert (p2.table, p2.label, p2.type, p2.unit) == (
        "P2", "Not Hispanic or Latino", "integer", "persons",
    )  # fmt: skip
    assert dic.set_index("column").loc["P2_003N_moe", "type"] == "integer"


def test_without_standard_errors_no_se_columns(tmp_path: Path) -> None:
    out = write_pl94_tables(tmp_path / "t", _levels(se=False))
    cols = pd.read_csv(out / "pl94_block.csv").columns
    assert not any(c.endswith(("_se", "_moe")) for c in cols)
    dic = pd.read_csv(out / "data_dictionary.csv")
    assert set(dic["column"]) == set(cols) | set(pd.read_csv(out / "pl94_long.csv").columns)


def test_nothing_is_written_on_bad_input_or_a_foreign_directory(tmp_path: Path) -> None:
    levels = _levels()
    bad = dict(levels, block=LevelTables(["a"], levels["block"].histograms))
    with pytest.raises(DataError, match="1 codes for 3 histograms"):
        write_pl94_tables(tmp_path / "t", bad)
    assert not (tmp_path / "t").exists()
    neg = np.array(levels["county"].standard_errors)
    neg[0, 5] = -1.0
    with pytest.raises(DataError, match="P1_006N: standard errors must be finite"):
        write_pl94_tables(
            tmp_path / "t",
            dict(levels, county=LevelTables(["01001"], levels["county"].histograms, neg)),
        )
    assert not (tmp_path / "t").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not censusdp's")
    with pytest.raises(SpecError):
        write_pl94_tables(foreign, levels)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_tables_of_every_level_from_a_ppmf_agree_with_a_group_by(tmp_path: Path) -> None:
    """Microdata in, tables out: P1_001N and P5_001N of every level equal pandas counts of
    the persons, and every level's tables keep the identities."""
    from censusdp.pipelines.io.ppmf import read_ppmf
    from censusdp.pipelines.products.pl94_tables import level_tables

    gen = np.random.default_rng(21)
    n = 500
    blocks = [("01", "001", "020100", "1", "1001"), ("01", "001", "020200", "1", "1002"),
              ("01", "003", "010100", "2", "2000"), ("02", "013", "000100", "1", "1000")]  # fmt: skip
    frame = ppmf_persons(gen, n, blocks, household_share=0.7)
    frame.to_csv(tmp_path / "p.csv", index=False)
    got = read_ppmf(tmp_path / "p.csv")
    tables = level_tables(got.hierarchy, got.block, got.cell, got.count)
    county = frame.TABBLKST + frame.TABBLKCOU
    for level, key in (("nation", pd.Series("US", index=frame.index)), ("state", frame.TABBLKST),
                       ("county", county)):  # fmt: skip
        values = tabulate(tables[level].histograms)
        codes = tables[level].codes.tolist()
        assert _v(values, "P1_001N").tolist() == key.value_counts()[codes].tolist()
        gq_pop = key[frame.GQTYPE_PL != "0"].value_counts().reindex(codes, fill_value=0)
        assert _v(values, "P5_001N").tolist() == gq_pop.tolist()
        adults = key[frame.VOTING_AGE == "2"].value_counts().reindex(codes, fill_value=0)
        assert _v(values, "P3_001N").tolist() == adults.tolist()
        _identities(values)
    # each level's P1 is the sum of the level below's
    h = got.hierarchy
    for upper, lower in itertools.pairwise(h.names):
        low = tabulate(tables[lower].histograms)
        parent = h.ancestor_index(lower, upper)
        summed = np.zeros((h[upper].size, low.shape[1]), np.int64)
        np.add.at(summed, parent, low)
        assert (summed == tabulate(tables[upper].histograms)).all()


def test_pl94_column_values_takes_each_column_from_its_query_row():
    """Column j is row ``row_of_row[j]`` of query ``query_of_row[j]``: values made to name
    their (query, row, node) come back in exactly that place."""
    from censusdp.pipelines.products.pl94_tables import pl94_codebook, pl94_column_values

    rows = pl94_codebook().rows
    index = {id(q): i for i, q in enumerate(rows.queries)}
    nodes = np.arange(3)[:, None]

    def value_of(q):
        return 1e6 * index[id(q)] + 1e3 * np.arange(q.n_rows)[None, :] + nodes

    out = pl94_column_values(value_of)
    want = 1e6 * rows.query_of_row[None, :] + 1e3 * rows.row_of_row[None, :] + nodes
    assert out.shape == (3, len(pl94_codebook().columns))
    assert np.array_equal(out, want)
