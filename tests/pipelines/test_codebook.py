"""The PPDD codebook: its linear structure over the `ppdd` schema and the identities it implies."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import SpecError
from censusdp.pipelines.io.codebook import Codebook, available_codebooks

# rows of the published tables: (details, subtotals) besides the total (P1's total is its
# only row, and its detail)
LAYOUT = {
    "P1": (1, 0),
    "P3": (7, 0),
    "P4": (2, 0),
    "P5": (14, 2),
    "P8": (63, 7),
    "P9": (64, 8),
    "P10": (63, 7),
    "P11": (64, 8),
    "P12": (46, 2),
    "P42": (7, 2),
}


@pytest.fixture(scope="module")
def ppdd():
    cb = Codebook.load("ppdd")
    return cb, cb.rows.gram()


def test_codebook_covers_the_ten_tables(ppdd):
    cb, _ = ppdd
    assert "ppdd" in available_codebooks()
    assert len(cb.columns) == 376 and len(set(cb.columns)) == 376
    assert set(cb.tables) == set(LAYOUT)
    for code, table in zip(cb.columns, cb.table_of, strict=True):
        assert code.startswith(cb.tables[table].nhgis)
    assert sum(1 + d + s for d, s in LAYOUT.values()) - 1 == 376


def test_detail_rows_sum_to_totals_and_subtotals(ppdd):
    """As vectors over the 46,368 cells, exactly: Σ details = total; a subtotal = its details."""
    cb, g = ppdd
    for table, (n_det, n_sub) in LAYOUT.items():
        st = cb.structure(table, g)
        assert (len(st.details), len(st.subtotals)) == (n_det, n_sub), table
        w = np.zeros(len(cb.columns), dtype=np.int64)
        w[list(st.details)] += 1
        w[st.total] -= 1
        assert not cb.rows.weighted_adjoint(w).any(), table
        assert len({st.total, *st.details, *st.subtotals}) == cb.columns_of(table).size
        det = np.array(st.details)
        for s in st.subtotals:
            inside = det[g[s, det] == g[det, det]]
            w = np.zeros(len(cb.columns), dtype=np.int64)
            w[inside] = 1
            w[s] = -1
            assert not cb.rows.weighted_adjoint(w).any(), (table, cb.columns[s])
    # the details of a table never overlap
    for table in LAYOUT:
        det = list(cb.structure(table, g).details)
        off = g[np.ix_(det, det)] - np.diag(g[det, det])
        assert not off.any(), table


def test_cross_table_totals(ppdd):
    cb, _ = ppdd
    col = {c: i for i, c in enumerate(cb.columns)}

    def same(a, b):
        w = np.zeros(len(cb.columns), dtype=np.int64)
        w[col[a]], w[col[b]] = 1, -1
        return not cb.rows.weighted_adjoint(w).any()

    for total in ("H7X001", "H7Y001", "H7Z001", "H72001", "H73001", "H76001"):
        assert same(total, "H7V001")
    assert same("H74001", "H75001")  # P10 and P11: population 18 and over
    assert not same("H74001", "H7V001") and not same("H80001", "H7V001")
    assert same("H72070", "H72071")  # six races: one combination


def test_identities_from_the_codebook(ppdd):
    cb, g = ppdd
    w = cb.identities()
    rank = np.linalg.matrix_rank(g.astype(float))
    assert w.shape == (376 - rank, 376) and rank == 303
    assert not (w @ g).any()
    # every exact tabulation satisfies them; a change to a tied column breaks one
    x = np.random.default_rng(7).integers(0, 4, size=(2, *cb.schema.shape))
    tab = cb.rows.apply(x)
    assert not (w @ tab.T).any()
    bumped = tab.copy()
    bumped[:, cb.columns.index("H7Z010")] += 1
    assert (w @ bumped.T).any()


def test_codebook_workload_refinements(ppdd):
    """docs/design.md § Census histograms: hhgq 3 (hhinstlevels), age 2 (voting age), cenrace 11 (race7 ∧ numraces)."""
    from censusdp.estimation.gls.marginal_basis import MarginalBasis

    cb, _ = ppdd
    mb = MarginalBasis.for_queries(cb.schema, [cb.rows])
    assert mb.ranks == (3, 1, 2, 1, 11)
    assert max(mb.block_size(m) for m in mb.subsets) == 3 * 2 * 11


def test_sensitivity_is_computed_from_the_columns(ppdd):
    """A person is counted in 16 to 32 of the 376 columns (adult, non-Hispanic, multiracial
    in group quarters: 32)."""
    cb, _ = ppdd
    c = cb.rows.column_counts()
    assert (c.min(), c.max()) == (16, 32)
    s = cb.schema
    adult_gq_multi = c[1, :, s.attribute("age").labels.index("30 to 34 years"), 0, 6:]
    assert (adult_gq_multi == 32).all()
    assert cb.rows.l1_sensitivity == 32


def test_codebook_errors_name_file_and_column(tmp_path):
    p = tmp_path / "cb.toml"
    p.write_text(
        'schema = "ppdd"\n[tables.T]\nnhgis = "X"\ntitle = "t"\nuniverse = "u"\n'
        '[columns]\nX001 = { table = "T", query = "sex", row = ["Other"] }\n'
    )
    with pytest.raises(SpecError, match=r"cb.toml: row 'X001': .*no row 'Other'"):
        Codebook.load(p)
    p.write_text(
        'schema = "ppdd"\n[tables.T]\nnhgis = "X"\ntitle = "t"\nuniverse = "u"\n'
        '[columns]\nX001 = { table = "U", query = "sex", row = ["Male"] }\n'
    )
    with pytest.raises(SpecError, match=r"column 'X001': table 'U' is not in"):
        Codebook.load(p)


def read_ppdd(path) -> pd.DataFrame:
    # Latin-1; one row of empty fields follows the header, as in real NHGIS extracts
    return pd.read_csv(path, encoding="latin-1", skiprows=[1])


@pytest.mark.shared
def test_codebook_identities_hold_in_the_sf_data(ppdd, shared_file):
    cb, g = ppdd
    df = read_ppdd(shared_file("nhgis_ppdd_20200527_aianhh.csv"))
    assert len(df) == 692
    sf = df[[f"{c}_sf" for c in cb.columns]].to_numpy()
    assert sf.dtype.kind == "i"
    w = cb.identities()
    assert not (w @ sf.T).any()  # all 73 identities, all 692 areas
    p1 = sf[:, cb.columns.index("H7V001")]
    for table in LAYOUT:
        st = cb.structure(table, g)
        assert (sf[:, list(st.details)].sum(axis=1) == sf[:, st.total]).all(), table
        if cb.tables[table].universe == "Total population":
            assert (sf[:, st.total] == p1).all(), table
    # the Bureau's TopDown tabulations are one histogram's marginals too
    dp = df[[f"{c}_dp" for c in cb.columns]].to_numpy()
    assert not (w @ dp.T).any()


@pytest.mark.shared
def test_codebook_matches_the_nhgis_codebook_text(ppdd, shared_file):
    """Every column code of the NHGIS codebook is in the shipped codebook, in order."""
    import re

    cb, _ = ppdd
    text = shared_file("nhgis_ppdd_20200527_codebook.txt").read_text(encoding="latin-1")
    codes = re.findall(r"^\s+(H[0-9A-Z]{2}\d{3}):", text, flags=re.M)
    assert tuple(codes) == cb.columns
