"""The NMF reader on a file built by hand with pyarrow from the format's description (not with
the writer): two state parts, a few blocks, only-child nodes without rows, float32 and float64
variances, int32 and int64 values in different partitions, two part files in one folder, the
US level; and malformed variants that must raise one-line DataErrors naming folder, file, row
and geocode (never a value)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy.nmf_spine import SPINE_LEVELS, nmf_spine
from censusdp.pipelines.io.nmf import (
    QUERY_NAMES,
    US_QUERY_NAMES,
    collect_nmf,
    nmf_queries,
    nmf_subtree_ids,
    read_nmf,
    read_state_totals,
)

# Query shapes written from the description (hhgq 8, votingage 2, hispanic 2, cenrace 63;
# 1 = summed out; hhinstlevels is [3, 1, 1, 1]), independent of the schema code.
SHAPES = {
    "total_dpq": [1, 1, 1, 1],
    "cenrace_dpq": [1, 1, 1, 63],
    "hispanic_dpq": [1, 1, 2, 1],
    "votingage_dpq": [1, 2, 1, 1],
    "hhinstlevels_dpq": [3, 1, 1, 1],
    "hhgq_dpq": [8, 1, 1, 1],
    "hispanic * cenrace_dpq": [1, 1, 2, 63],
    "votingage * cenrace_dpq": [1, 2, 1, 63],
    "votingage * hispanic_dpq": [1, 2, 2, 1],
    "votingage * hispanic * cenrace_dpq": [1, 2, 2, 63],
    "detailed_dpq": [8, 2, 2, 63],
}

# The tree. Part 001: two counties; county 1 has two tracts, tract 1 one block group (an only
# child, no rows) with two blocks, tract 2 one block group (only child) with one block (only
# child: no rows); county 2 one tract (only child, measured anyway) → one BG → two blocks.
# Part 101: one county (only child of the part: no rows) → tract → BG → two blocks.
C1, C2, C3 = "001000001", "001000002", "101000003"
T1, T2, T3, T4 = C1 + "0001", C1 + "0002", C2 + "0001", C3 + "0007"
B1, B2, B3, B4 = T1 + "01", T2 + "01", T3 + "01", T4 + "02"
GEOID = {  # tabulation block GEOIDs (state 2, county 3, tract 6, block group 1, block 4)
    "a": "0100100000111001",
    "b": "0100100000111002",
    "c": "0100100000221001",
    "d": "0100200000131001",
    "e": "0100200000131002",
    "f": "0100300000741001",
    "g": "0100300000741002",
}
NODES = {
    ("001", "State"): ["001"],
    ("001", "County"): [C1, C2],
    ("001", "Tract"): [T1, T2, T3],
    ("001", "Block_Group"): [B1, B2, B3],
    ("001", "Block"): [
        B1 + GEOID["a"],
        B1 + GEOID["b"],
        B2 + GEOID["c"],
        B3 + GEOID["d"],
        B3 + GEOID["e"],
    ],  # fmt: skip
    ("101", "State"): ["101"],
    ("101", "County"): [C3],
    ("101", "Tract"): [T4],
    ("101", "Block_Group"): [B4],
    ("101", "Block"): [B4 + GEOID["f"], B4 + GEOID["g"]],
}
UNMEASURED = {B1, B2, B2 + GEOID["c"], C3}
US_GEOCODE = "US"


def _values(gen, shape):
    return gen.integers(-30, 400, int(np.prod(shape))).tolist()


def _table(rows, value_type, var_type, con=False):
    if con:
        return pa.table({
            "geocode": pa.array([r[0] for r in rows], pa.string()),
            "query_name": pa.array([r[1] for r in rows], pa.string()),
            "value": pa.array([r[2] for r in rows], pa.list_(value_type)),
            "sign": pa.array([r[3] for r in rows], pa.string()),
        })  # fmt: skip
    return pa.table({
        "geocode": pa.array([r[0] for r in rows], pa.string()),
        "query_name": pa.array([r[1] for r in rows], pa.string()),
        "query_shape": pa.array([r[2] for r in rows], pa.list_(pa.int64())),
        "value": pa.array([r[3] for r in rows], pa.list_(value_type)),
        "variance": pa.array([r[4] for r in rows], var_type),
        "plb": pa.array(["0.5"] * len(rows), pa.string()),  # an extra column, ignored
    })  # fmt: skip


def build_nmf(root: Path, *, with_us: bool = True) -> dict:
    """Write the NMF by hand; return the expected contents."""
    gen = np.random.default_rng(5)
    expect = {"values": {}, "variance": {}, "lb": {}, "ub": {}}
    folders = [("US", None)] if with_us else []
    folders += [(s, lvl) for s in ("001", "101")
                for lvl in ("State", "County", "Tract", "Block_Group", "Block")]  # fmt: skip
    for k, (sub, lvl) in enumerate(folders):
        level = "US" if sub == "US" else lvl
        nodes = [US_GEOCODE] if sub == "US" else NODES[(sub, lvl)]
        names = US_QUERY_NAMES if sub == "US" else QUERY_NAMES
        # int32 values and float32 variances in part 101, int64 / float64 elsewhere
        vt, ft = (pa.int32(), pa.float32()) if sub == "101" else (pa.int64(), pa.float64())
        rows, con = [], []
        for g in nodes:
            if g not in UNMEASURED:
                for nm in names:
                    v = _values(gen, SHAPES[nm])
                    var = float(np.float32(gen.uniform(0.5, 50.0)))
                    rows.append((g, nm, SHAPES[nm], v, var))
                    expect["values"][(g, nm)] = v
                    expect["variance"][(g, nm)] = var
            ub = gen.integers(1, 500, 8)
            ub[gen.random(8) < 0.3] = 0
            lb = np.minimum(gen.integers(0, 5, 8), ub)
            con.append((g, "hhgq_total_lb_con", lb.tolist(), "ge" if k % 2 else ">="))
            con.append((g, "hhgq_total_ub_con", ub.tolist(), "le" if k % 2 else "<="))
            if level != "Block":
                con.append((g, "nurse_nva_0_con", [0], "=" if k % 2 else "le"))
            expect["lb"][g], expect["ub"][g] = lb, ub
        sub_dir = () if sub == "US" else (f"State={sub}",)
        dpq_dir = root.joinpath(f"{level}.parquet", "DPQuery", *sub_dir)
        con_dir = root.joinpath(f"{level}.parquet", "Constraint", *sub_dir)
        dpq_dir.mkdir(parents=True, exist_ok=True)
        con_dir.mkdir(parents=True, exist_ok=True)
        if rows:
            t = _table(rows, vt, ft)
            if (sub, lvl) == ("001", "Block"):  # two part files in one folder
                half = len(rows) // 2 + 3
                pq.write_table(t.slice(0, half), dpq_dir / "part-00000-a.snappy.parquet")
                pq.write_table(t.slice(half), dpq_dir / "part-00001-b.snappy.parquet")
            else:
                pq.write_table(t, dpq_dir / "part-00000.snappy.parquet")
            (dpq_dir / "_SUCCESS").write_bytes(b"")
        pq.write_table(_table(con, vt, ft, con=True), con_dir / "part-00000.parquet")
    return expect


@pytest.fixture
def nmf_root(tmp_path):
    root = tmp_path / "nmf"
    expect = build_nmf(root)
    return root, expect


def test_reader_gives_the_spine_queries_variances_zeros_and_ties(nmf_root, tmp_path):
    root, expect = nmf_root
    assert nmf_subtree_ids(root) == ["001", "101"]
    subs = list(read_nmf(root))
    assert [s.subtree for s in subs] == ["US", "001", "101"]
    totals_csv = tmp_path / "p1.csv"
    totals_csv.write_text("state,total\n01,4321\n02,99\n")
    m = collect_nmf(subs, read_state_totals(totals_csv))
    h = m.spine.hierarchy
    assert h.names == SPINE_LEVELS
    assert h.sizes == (1, 1, 2, 3, 4, 4, 7)
    assert h["state"].codes.tolist() == ["01"]
    assert h["state_part"].codes.tolist() == ["001", "101"]
    assert h["county"].codes.tolist() == [C1, C2, C3]
    assert h["block_group"].codes.tolist() == [B1, B2, B3, B4]
    assert h["block"].parent.tolist() == [0, 0, 1, 2, 2, 3, 3]
    assert h["county"].parent.tolist() == [0, 0, 1]
    assert m.spine.tabulation_geoids.tolist() == [GEOID[k] for k in "abcdefg"]
    # every value and variance where the file put it; unmeasured nodes carry inf and 0
    n_checked = 0
    for lvl in m.levels.values():
        codes = [US_GEOCODE] if lvl.name == "US" else lvl.geocodes.tolist()
        for nm, q in lvl.queries.items():
            for i, g in enumerate(codes):
                if (g, nm) in expect["values"]:
                    assert q.values[i].tolist() == expect["values"][(g, nm)]
                    assert q.variance[i] == expect["variance"][(g, nm)]
                    assert q.measured[i]
                    n_checked += 1
                else:
                    assert g in UNMEASURED and q.variance[i] == np.inf and not q.measured[i]
                    assert not q.values[i].any()
            assert q.values.dtype == np.int64 and q.variance.dtype == np.float64
        assert (lvl.measured == [g not in UNMEASURED for g in codes]).all()
    assert n_checked == len(expect["values"])
    # bounds and the structural zeros they imply (ub == 0; nursing × under 18 everywhere)
    for lvl in m.levels.values():
        codes = [US_GEOCODE] if lvl.name == "US" else lvl.geocodes.tolist()
        z = lvl.structural_zeros
        assert z.shape == (len(codes), 8, 2, 2)
        for i, g in enumerate(codes):
            assert (lvl.upper[i] == expect["ub"][g]).all() and (
                lvl.lower[i] == expect["lb"][g]
            ).all()
            for t in range(8):
                for a in range(2):
                    want = expect["ub"][g][t] == 0 or (t == 3 and a == 0)
                    assert (z[i, t, a] == want).all()
    # the state-part tie: one invariant on the virtual state, total of both parts
    (inv,) = m.invariants()
    assert inv.level == "state" and inv.query.name == "total"
    assert inv.values.tolist() == [[4321]]
    # measurements for the structured GLS: spine level names, node variances
    meas = m.measurements()
    assert len(meas) == 10 + 5 * 11
    block_detailed = next(x for x in meas if x.level == "block" and x.query.name == "detailed")
    assert block_detailed.values.shape == (7, 2016)
    assert np.isinf(block_detailed.node_variance[2])  # block c: an only child, unmeasured


def test_a_single_state_part_without_the_us_is_a_valid_input(tmp_path):
    root = tmp_path / "nmf"
    build_nmf(root, with_us=False)
    (sub,) = read_nmf(root, subtrees=["101"])
    assert sub.subtree == "101" and sub.state == "01"
    m = collect_nmf([sub])
    assert m.spine.hierarchy.sizes == (1, 1, 1, 1, 1, 1, 2)
    assert "US" not in m.levels and m.invariants() == []
    # ρ derived from the file's variances: Σ over levels and queries of 1 / (2 min σ²)
    want = sum(1.0 / (2.0 * q.variance[q.measured].min())
               for lvl in m.levels.values() for q in lvl.queries.values()
               if lvl.name != "County")  # fmt: skip
    assert not m.levels["County"].measured.any()  # the county is an only child: no query
    assert m.derived_rho() == pytest.approx(want, rel=1e-15)
    # the statement accounts each σ² rounded down onto the sampler's grid: never below ρ
    assert want <= m.privacy().rho <= want * (1 + 2.0**-10 / 0.5)


def _rewrite(path: Path, fn) -> None:
    t = pq.read_table(path)
    pq.write_table(fn(t), path)


def _set(t: pa.Table, column: str, row: int, value) -> pa.Table:
    vals = t.column(column).to_pylist()
    vals[row] = value
    return t.set_column(t.schema.get_field_index(column), column,
                        pa.array(vals, t.schema.field(column).type))  # fmt: skip


def _assert_names(err: pytest.ExceptionInfo, folder: Path, file: str, row: int, geocode: str):
    msg = str(err.value)
    assert "\n" not in msg
    assert str(folder) in msg and file in msg and f"row {row}" in msg and geocode in msg, msg


def test_missing_level_folder(nmf_root):
    root, _ = nmf_root
    shutil.rmtree(root / "Tract.parquet")
    with pytest.raises(DataError, match=r"missing level folder Tract\.parquet") as e:
        list(read_nmf(root))
    assert str(root) in str(e.value)


def test_query_shape_that_does_not_match_value(nmf_root):
    root, _ = nmf_root
    folder = root / "County.parquet" / "DPQuery" / "State=001"
    f = folder / "part-00000.snappy.parquet"
    t = pq.read_table(f)
    row = t.column("query_name").to_pylist().index("hispanic * cenrace_dpq")
    g = t.column("geocode")[row].as_py()
    _rewrite(f, lambda t: _set(t, "query_shape", row, [1, 2, 2, 63]))
    with pytest.raises(DataError, match="query_shape does not match") as e:
        list(read_nmf(root))
    _assert_names(e, folder, f.name, row + 1, g)


@pytest.mark.parametrize("batch_rows", [3, 4096])
def test_value_length_that_does_not_match_query_shape(nmf_root, batch_rows):
    root, _ = nmf_root
    folder = root / "Block.parquet" / "DPQuery" / "State=001"
    f = folder / "part-00001-b.snappy.parquet"
    t = pq.read_table(f)
    row = 4
    g, nm = t.column("geocode")[row].as_py(), t.column("query_name")[row].as_py()
    n = int(np.prod(SHAPES[nm]))
    _rewrite(f, lambda t: _set(t, "value", row, [987654] * (n + 1)))
    with pytest.raises(DataError, match="length of value does not match") as e:
        list(read_nmf(root, batch_rows=batch_rows))
    _assert_names(e, folder, f.name, row + 1, g)
    assert "987654" not in str(e.value)


def test_block_whose_geocode_has_no_parent(nmf_root):
    root, _ = nmf_root
    folder = root / "Block.parquet" / "Constraint" / "State=101"
    f = folder / "part-00000.parquet"
    orphan = "101000003000799" + GEOID["g"]  # block group 99 does not exist
    _rewrite(f, lambda t: _set(t, "geocode", 0, orphan))
    with pytest.raises(DataError, match="no Block_Group node has this geocode's prefix") as e:
        list(read_nmf(root, subtrees=["101"]))
    _assert_names(e, folder, f.name, 1, orphan)


@pytest.mark.parametrize("bad", [-2.5, float("nan"), float("inf"), 0.0])
def test_negative_or_non_finite_variance(nmf_root, bad):
    root, _ = nmf_root
    folder = root / "Tract.parquet" / "DPQuery" / "State=101"
    f = folder / "part-00000.snappy.parquet"
    g = pq.read_table(f).column("geocode")[3].as_py()
    _rewrite(f, lambda t: _set(t, "variance", 3, bad))
    with pytest.raises(DataError, match="variance must be a finite positive number") as e:
        list(read_nmf(root))
    _assert_names(e, folder, f.name, 4, g)


def test_unknown_query_name_and_total_at_the_us(nmf_root):
    root, _ = nmf_root
    folder = root / "US.parquet" / "DPQuery"
    f = folder / "part-00000.snappy.parquet"
    _rewrite(f, lambda t: _set(t, "query_name", 2, "total_dpq"))
    with pytest.raises(DataError, match="unknown query_name at level US") as e:
        list(read_nmf(root, subtrees=["US"]))
    _assert_names(e, folder, f.name, 3, US_GEOCODE)


def test_duplicate_rows_name_both(nmf_root):
    root, _ = nmf_root
    folder = root / "Block.parquet" / "DPQuery" / "State=001"
    a = pq.read_table(folder / "part-00000-a.snappy.parquet")
    pq.write_table(a.slice(2, 1), folder / "part-00002-c.snappy.parquet")
    g = a.column("geocode")[2].as_py()
    with pytest.raises(DataError, match="duplicate query row") as e:
        list(read_nmf(root))
    _assert_names(e, folder, "part-00002-c.snappy.parquet", 1, g)
    assert "part-00000-a.snappy.parquet, row 3" in str(e.value)


def test_block_with_constraints_but_no_measurements(nmf_root):
    root, _ = nmf_root
    folder = root / "Block.parquet" / "DPQuery" / "State=101"
    f = folder / "part-00000.snappy.parquet"
    victim = NODES[("101", "Block")][1]
    _rewrite(f, lambda t: t.filter(pa.compute.not_equal(t.column("geocode"), victim)))
    with pytest.raises(DataError, match="constraints but no measurements") as e:
        list(read_nmf(root))
    con = root / "Block.parquet" / "Constraint" / "State=101"
    _assert_names(e, con, "part-00000.parquet", 3, victim)


def test_wrong_geocode_length_and_wrong_subtree(nmf_root):
    root, _ = nmf_root
    folder = root / "County.parquet" / "Constraint" / "State=001"
    f = folder / "part-00000.parquet"
    _rewrite(f, lambda t: _set(t, "geocode", 1, C1 + "9"))
    with pytest.raises(DataError, match="a County geocode has 9 characters") as e:
        list(read_nmf(root))
    _assert_names(e, folder, f.name, 2, C1 + "9")
    _rewrite(f, lambda t: _set(t, "geocode", 1, C3))
    with pytest.raises(DataError, match="does not start with its folder's subtree '001'"):
        list(read_nmf(root))


def test_crossed_bounds_and_bad_sign(nmf_root):
    root, _ = nmf_root
    folder = root / "Tract.parquet" / "Constraint" / "State=001"
    f = folder / "part-00000.parquet"
    t0 = pq.read_table(f)
    _rewrite(f, lambda t: _set(t, "sign", 0, "<="))
    with pytest.raises(DataError, match="must have sign '>='") as e:
        list(read_nmf(root))
    _assert_names(e, folder, f.name, 1, T1)
    pq.write_table(t0, f)
    _rewrite(f, lambda t: _set(t, "value", 0, [10**6] * 8))
    with pytest.raises(DataError, match="lower bound exceeds its upper bound") as e:
        list(read_nmf(root))
    _assert_names(e, folder, f.name, 1, T1)
    assert str(10**6) not in str(e.value)


def test_state_totals_errors(tmp_path):
    p = tmp_path / "p1.csv"
    p.write_text("state,total\n01,5\n1,7\n")
    with pytest.raises(DataError, match=r"p1\.csv, row 2, column 'state'"):
        read_state_totals(p)
    p.write_text("state,total\n01,5\n02,-7654321\n")
    with pytest.raises(DataError, match=r"row 2, column 'total' \(state 02\)") as e:
        read_state_totals(p)
    assert "7654321" not in str(e.value)
    root = tmp_path / "nmf"
    build_nmf(root, with_us=False)
    with pytest.raises(DataError, match="no total for state 01"):
        collect_nmf(read_nmf(root), {"02": 3})


def test_spine_rejects_non_nesting_codes():
    ok = {"state_part": ["001"], "county": [C1], "tract": [T1], "block_group": [B1],
          "block": [B1 + GEOID["a"]]}  # fmt: skip
    assert nmf_spine(ok).hierarchy.sizes == (1, 1, 1, 1, 1, 1, 1)
    with pytest.raises(HierarchyError, match="has no parent in level 'tract'"):
        nmf_spine({**ok, "block_group": [T2 + "01"], "block": [T2 + "01" + GEOID["c"]]})
    with pytest.raises(HierarchyError, match="wrong length"):
        nmf_spine({**ok, "block": [B1 + GEOID["a"][:-1]]})


# -- the reader against a slow reference on random small files ------------------------------


@st.composite
def random_nmf(draw):
    """A random spine (1–2 states, parts 0/1, 1–3 children per node), every row in shuffled
    order over 1–3 part files per folder, random integer and float widths, and a batch size
    for the reader's second pass."""
    tree = {}
    states = draw(
        st.lists(st.sampled_from(["01", "02", "56"]), min_size=1, max_size=2, unique=True)
    )
    for ss in states:
        for p in draw(st.lists(st.sampled_from("01"), min_size=1, max_size=2, unique=True)):
            tree[(p + ss, "State")] = [p + ss]
    widths = {"County": 6, "Tract": 4, "Block_Group": 2, "Block": 16}
    levels = ["State", "County", "Tract", "Block_Group", "Block"]
    for up, lvl in zip(levels[:-1], levels[1:], strict=True):
        for sub in {s for s, _ in tree}:
            kids = []
            for g in tree[(sub, up)]:
                n = draw(st.integers(1, 3))
                kids += [g + str(j + 1).zfill(widths[lvl]) for j in range(n)]
            tree[(sub, lvl)] = kids
    return tree, draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from([2, 7, 4096]))


def _write_random(root: Path, tree: dict, seed: int) -> dict:
    gen = np.random.default_rng(seed)

    def up(g: str) -> str:  # the parent's geocode: a prefix
        return g[: {3: 0, 9: 3, 13: 9, 15: 13, 31: 15}[len(g)]]

    n_children: dict[str, int] = {}
    for codes in tree.values():
        for g in codes:
            n_children[up(g)] = n_children.get(up(g), 0) + 1
    ref = {}
    for (sub, lvl), codes in tree.items():
        rows, con = [], []
        for g in codes:
            only = lvl != "State" and n_children[up(g)] == 1
            if not only or gen.random() < 0.3:  # an only child may be measured anyway
                for nm in QUERY_NAMES:
                    v = gen.integers(-9, 99, int(np.prod(SHAPES[nm]))).tolist()
                    var = float(gen.choice([0.5, 2.25, 7.0, 1234.5]))
                    rows.append((g, nm, SHAPES[nm], v, var))
                    ref[(g, nm)] = (v, var)
            ub = gen.integers(0, 3, 8)
            con += [
                (g, "hhgq_total_lb_con", [0] * 8, "ge"),
                (g, "hhgq_total_ub_con", ub.tolist(), "le"),
            ]
            ref[(g, "ub")] = ub.tolist()
        for kind, items in (("DPQuery", rows), ("Constraint", con)):
            folder = root / f"{lvl}.parquet" / kind / f"State={sub}"
            folder.mkdir(parents=True, exist_ok=True)
            items = [items[i] for i in gen.permutation(len(items))]
            cuts = np.sort(gen.integers(0, len(items) + 1, gen.integers(0, 3)))
            for k, chunk in enumerate(np.split(np.arange(len(items)), cuts)):
                vt = pa.int32() if gen.random() < 0.5 else pa.int64()
                ft = pa.float32() if gen.random() < 0.5 else pa.float64()
                t = _table([items[i] for i in chunk], vt, ft, con=kind == "Constraint")
                pq.write_table(t, folder / f"part-{k:05d}.parquet")
    return ref


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(random_nmf())
def test_reader_matches_a_slow_reference(tmp_path_factory, case):
    tree, seed, batch_rows = case
    root = tmp_path_factory.mktemp("nmf")
    ref = _write_random(root, tree, seed)
    m = collect_nmf(read_nmf(root, batch_rows=batch_rows))  # batches across rows and files
    h = m.spine.hierarchy
    for nmf_level, spine_level in (("State", "state_part"), ("County", "county"), ("Tract", "tract"),
                                   ("Block_Group", "block_group"), ("Block", "block")):  # fmt: skip
        codes = h[spine_level].codes.tolist()
        want = sorted((g for (_, lvl), gs in tree.items() if lvl == nmf_level for g in gs),
                      key=lambda g: (g[1:3], g[0], g))  # fmt: skip
        assert codes == want  # states, then parts, then geocodes
        up = h[h.names[h.level_index(spine_level) - 1]].codes.tolist()
        for g, p in zip(codes, h[spine_level].parent.tolist(), strict=True):
            assert up[p] == (g[1:3] if spine_level == "state_part" else g[: len(up[p])])
            assert g.startswith(up[p]) or spine_level == "state_part"
        lvl = m.levels[nmf_level]
        for nm, q in lvl.queries.items():
            for i, g in enumerate(codes):
                if (g, nm) in ref:
                    v, var = ref[(g, nm)]
                    assert q.values[i].tolist() == v and q.variance[i] == var
                else:
                    assert q.variance[i] == np.inf
        for i, g in enumerate(codes):
            assert lvl.upper[i].tolist() == ref[(g, "ub")]
            assert lvl.hhgq_zero[i].tolist() == [u == 0 for u in ref[(g, "ub")]]


def test_query_rows_follow_the_files_conventions():
    """value is C order over the query_shape axes; hhinstlevels is household / institutional
    (hhgq 1–4) / non-institutional (5–7) — checked against sums written out by hand."""
    x = np.random.default_rng(1).integers(0, 9, (3, 8, 2, 2, 63))
    q = nmf_queries()
    for nm, shape in SHAPES.items():
        assert list(q[nm].row_shape) == shape
    hh = x.sum(axis=(2, 3, 4))
    want = np.stack([hh[:, 0], hh[:, 1:5].sum(axis=1), hh[:, 5:].sum(axis=1)], axis=1)
    assert (q["hhinstlevels_dpq"].apply(x) == want).all()
    assert (q["votingage * hispanic_dpq"].apply(x) == x.sum(axis=(1, 4)).reshape(3, 4)).all()
    assert (q["votingage * cenrace_dpq"].apply(x) == x.sum(axis=(1, 3)).reshape(3, 126)).all()
    assert (q["detailed_dpq"].apply(x) == x.reshape(3, 2016)).all()
    assert (q["total_dpq"].apply(x)[:, 0] == x.reshape(3, -1).sum(axis=1)).all()
