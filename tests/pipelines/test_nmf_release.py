"""The NMF release: spine levels equal the structured GLS bit for bit; state totals held
across the two parts; area SEs and the districts' covariance equal a dense covariance;
90% intervals cover 90% over simulated releases; ``censusdp nmf`` end to end."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
from stream_fixtures import assert_same

from censusdp.app.cli import main
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.sparse import level_aggregator
from censusdp.estimation.gls.structured import add_adjoint, gather_block, structured_gls
from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.io.nmf import collect_nmf, read_nmf
from censusdp.pipelines.io.nmf_writer import simulate_nmf, write_nmf, write_state_totals
from censusdp.pipelines.io.outputs import real_moe, significant
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.products.nmf_release import (
    TABULATION_PREFIX,
    NMFReleaseOptions,
    add_areas,
    census_block_geoids,
    estimate_state,
    nation_tables,
    national_top,
    pl94_columns,
    release_nmf,
    release_statement,
    state_upward,
    stream_state,
)
from censusdp.pipelines.products.pl94_tables import pl94_codebook, pl94_column_values
from censusdp.pipelines.structured_stream import StreamOptions
from censusdp.rng import KeyedRNG

COLUMNS = list(pl94_codebook().columns)


def _state(seed=3, blocks=30):
    """One synthetic state with an AIAN part (its second county) and only children."""
    st = synthetic_us(seed, states=1, counties=3, tracts=5, block_groups=8, blocks=blocks,
                      population=1500)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=seed)
    aian = np.zeros(h["county"].size, bool)
    aian[1] = True
    return h, block, cell, count, aian


def _census_block_ids(h):
    """The 15-character Census GEOID of each synthetic block: synthetic block codes are
    state 2, county 3, tract 6, block group 1 and block 3 digits, i.e. the Census layout
    (the 4-digit block number starts with its block group's digit)."""
    return h["block"].codes.tolist()


def _truth_blocks(h, block, cell, count):
    leaves = np.zeros((h["block"].size, 2016), np.int64)
    np.add.at(leaves, (block, cell), count)
    return leaves


@pytest.fixture(scope="module")
def one_state(tmp_path_factory):
    d = tmp_path_factory.mktemp("nmf_state")
    h, block, cell, count, aian = _state()
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian, with_us=False,
                             evaluation_rng=KeyedRNG.reproducible(7, warn=False)))  # fmt: skip
    root = write_nmf(d / "nmf", subs)
    totals = {"01": int(count.sum())}
    write_state_totals(d / "p1.csv", totals)
    # districts: 4 areas of blocks in a scattered pattern, two blocks in no district
    ids = _census_block_ids(h)
    district = [str(1 + (i * 7) % 4) for i in range(len(ids))]
    district[3] = district[11] = ""
    pd.DataFrame({"BLOCKID": ids, "DISTRICT": district}).to_csv(d / "baf.csv", index=False)
    got = []
    opts = NMFReleaseOptions(areas=d / "baf.csv", skip_blank_areas=True)
    res = release_nmf(root, d / "p1.csv", d / "out", on_state=got.append, options=opts)
    return d, h, (block, cell, count), totals, res, got[0]


def _read(path, code):
    """A written table, its code and its ancestors' codes as text."""
    head = pd.read_csv(path, nrows=0).columns
    codes = [c for c in head if c == code or c.endswith(("_GEOID", "_geocode"))]
    return pd.read_csv(path, dtype=dict.fromkeys(codes, str))


def test_synthetic_block_codes_are_census_geoids(one_state):
    d, h, _, _, _, r = one_state
    # the writer's tabulation GEOID repeats the block group digit; the Census GEOID drops it
    geo = r.tabulation_geoids.tolist()
    assert sorted(census_block_geoids(r.tabulation_geoids).tolist()) == sorted(
        h["block"].codes.tolist()
    )
    assert census_block_geoids(["0100100010011234"]).tolist() == ["010010001001234"]
    assert all(len(g) == 16 for g in geo)


def test_spine_levels_equal_the_structured_gls_bit_for_bit(one_state):
    d, h, _, totals, res, r = one_state
    m = collect_nmf(read_nmf(d / "nmf", subtrees=["001", "101"]), totals)
    meas = m.measurements()
    assert any(not np.isfinite(x.node_variance).all() for x in meas)  # only children present
    ref = structured_gls(m.spine.hierarchy, meas[0].query.schema, meas, m.invariants(),
                         zeros=m.zeros())  # fmt: skip
    for k in range(ref.hierarchy.depth):
        assert np.array_equal(ref.estimates[k], r.release.estimates[k])
    sh = ref.hierarchy
    book = pl94_codebook()
    for level in ("state_part", "county", "tract", "block_group", "block"):
        name = f"pl94_spine_{level}.csv" if level != "block" else "pl94_block.csv"
        f = _read(d / "out" / name, "geocode")
        assert f["geocode"].tolist() == sh[level].codes.tolist()
        want = book.rows.apply(ref.level(level))
        assert np.array_equal(f[COLUMNS].to_numpy(), want)  # CSV floats round-trip exactly
        _, se = pl94_columns(ref, level)
        # written to 6 significant digits, the 90% MOE 1.645·SE beside (real-valued release)
        assert np.array_equal(f[[c + "_se" for c in COLUMNS]].to_numpy(), significant(se))
        assert np.array_equal(f[[c + "_moe" for c in COLUMNS]].to_numpy(), real_moe(se))
        assert np.isfinite(se).all() and (se > 0).any()
        # the ancestors' spine geocodes on every spine row (blocks: tabulation GEOIDs)
        for up in (
            ("state", "state_part", "county", "tract")[
                : ("state_part", "county", "tract", "block_group", "block").index(level) + 1
            ]
            if level != "block"
            else ()
        ):
            anc = sh[up].codes[sh.ancestor_index(level, up)]
            assert f[f"{up}_geocode"].tolist() == anc.tolist(), (level, up)
    # the Bureau's identities hold between the real-valued columns
    f = _read(d / "out" / "pl94_block.csv", "GEOID")
    assert np.array_equal(f["P1_001N"], f["P2_001N"])
    close = np.abs(f["P2_001N"] - f["P2_002N"] - f["P2_003N"]) <= 1e-9 * (1 + np.abs(f["P2_001N"]))
    assert close.all()


def _keep_piece(pieces: dict, piece) -> None:
    pieces[piece.partition] = piece


def test_a_state_streamed_county_by_county_is_its_release_bit_for_bit(one_state):
    """The streamed structured GLS on a state's NMF (zeros and only children's +inf
    variances at every level), one partition per spine county or two runs of counties, on
    two threads, cached or recomputed: estimates and covariance blocks of every level equal
    the state's release bit for bit, and the masked cells are == 0."""
    d, h, _, totals, res, r = one_state
    m = collect_nmf(read_nmf(d / "nmf", subtrees=["001", "101"]), totals)
    sh = m.spine.hierarchy
    cut = sh.level_index("county")
    assert sh.sizes[cut] >= 3
    for n, opts in ((None, StreamOptions(cache_bytes=0)),
                    (2, StreamOptions(workers=2, cache_bytes=1 << 30))):  # fmt: skip
        pieces: dict = {}
        got = stream_state(m, functools.partial(_keep_piece, pieces), partitions=n,
                           options=opts)  # fmt: skip
        parts = partition_units(sh, cut, n or sh.sizes[cut])
        assert len(parts) == (n or sh.sizes[cut])
        assert_same(sh, r.release, got, pieces, parts, cut)
    blocks = np.concatenate([pieces[p.index].estimates[-1] for p in parts])
    z = m.zeros()["block"]
    assert z.any() and np.all(blocks[z] == 0)


def test_state_total_is_held_across_the_two_parts(one_state):
    d, _, _, totals, _, r = one_state
    total = totals["01"]
    st = _read(d / "out" / "pl94_state.csv", "GEOID")
    assert st["GEOID"].tolist() == ["01"]
    assert np.rint(st["P1_001N"][0]) == total and abs(st["P1_001N"][0] - total) < 1e-6
    assert st["P1_001N_se"][0] < 1e-6  # invariant: no error (floating point only)
    parts = _read(d / "out" / "pl94_spine_state_part.csv", "geocode")
    assert parts["geocode"].tolist() == ["001", "101"]
    s = parts["P1_001N"].sum()
    assert np.rint(s) == total and abs(s - total) < 1e-6
    for level in ("county", "tract", "block_group", "block"):
        f = _read(d / "out" / f"pl94_{level}.csv", "GEOID")
        assert np.rint(f["P1_001N"].sum()) == total
        assert abs(f["P1_001N"].sum() - total) < 1e-6
    # a part's total is estimated, not held: its SE is positive
    assert (parts["P1_001N_se"] > 0.1).all()


def test_structural_zeros_are_released_as_exact_zeros(one_state):
    """Every held cell (hhgq upper bound 0; nursing × under 18) is == 0 at every spine node,
    and the P5 column of a group-quarters type a block cannot hold is == 0 with SE == 0 in
    the written table; the synthetic file has both kinds (power: some type is held at some
    block and not at others)."""
    d, h, _, totals, _, r = one_state
    m = r.measurements
    zeros = m.zeros()
    assert set(zeros) == {"state_part", "county", "tract", "block_group", "block"}
    for level, z in zeros.items():
        est = r.release.level(level)
        held = np.broadcast_to(z[..., None], est.shape)
        assert np.all(est[held] == 0)
        assert np.all(est[:, 3, 0] == 0)  # nursing facilities: no one under 18, every node
        assert (est[~held] != 0).mean() > 0.5  # the others are estimated
    ub0 = m.levels["Block"].hhgq_zero  # (n_blocks, 8), spine order
    assert ub0[:, 1:].any() and (~ub0[:, 1:]).any()
    f = _read(d / "out" / "pl94_block.csv", "geocode")
    assert f["geocode"].tolist() == h_codes(r)
    # P5_003N … P5_006N: hhgq 1–4 (institutional), P5_008N … P5_010N: hhgq 5–7
    for t, col in zip(range(1, 8), ["P5_003N", "P5_004N", "P5_005N", "P5_006N", "P5_008N",
                                   "P5_009N", "P5_010N"], strict=True):  # fmt: skip
        assert np.all(f[col].to_numpy()[ub0[:, t]] == 0)
        assert np.all(f[col + "_se"].to_numpy()[ub0[:, t]] == 0)
        assert np.all(f[col + "_se"].to_numpy()[~ub0[:, t]] > 0)
    none = ub0[:, 1:].all(axis=1)
    assert none.any() and np.all(f["P5_001N"].to_numpy()[none] == 0)


def h_codes(r) -> list:
    return r.hierarchy["block"].codes.tolist()


def _total_block(basis, schema):
    """The block of the marginal basis that carries the total (hhgq × votingage split, the
    group parts of hispanic and cenrace: 16 coordinates, one copy) and the total's row in
    it (the adjoint of the total query: its sign fixed, unlike an eigenvector's)."""
    total = ProductQuery.parse(schema, "total")
    g = basis.gram(total).blocks
    (mask,) = [k for k, b in g.items() if np.abs(b).max() > 0]
    assert basis.multiplicity(mask) == 1 and basis.block_size(mask) == 16
    out = np.zeros((1, *basis.shape))
    add_adjoint(basis, total, np.ones((1, 1)), out)
    return mask, gather_block(basis, out, mask)[0, 0]


def _dense_total_gls(h, m, basis):
    """A dense GLS of the total's block over the whole hierarchy ``h``: every measurement of
    ``m`` (the US level too, when read) weighted by its file variance, the state totals and
    the structural zeros as equality rows; no tree pass, no area sweep. Returns the total's
    row ``t``, the block's mask, the leaves' estimated block coordinates ``(L, 16)`` and
    their covariance ``(16 L, 16 L)``."""
    schema = next(iter(m.measurements())).query.schema
    mask, t = _total_block(basis, schema)
    n_s, L = 16, h.leaves.size
    F = np.zeros((L * n_s, L * n_s))
    b = np.zeros(L * n_s)
    for x in m.measurements():
        k = h.level_index(x.level)
        Ak = np.kron(level_aggregator(h, k).toarray(), np.eye(n_s))
        G = basis.gram(x.query).blocks[mask]
        w = np.where(np.isfinite(x.variance), 1.0 / x.variance, 0.0)
        F += Ak.T @ np.kron(np.diag(w), G) @ Ak
        hk = np.zeros((w.size, *basis.shape))
        add_adjoint(basis, x.query, np.asarray(x.values, float) * w[:, None], hk)
        b += Ak.T @ gather_block(basis, hk, mask)[:, 0].reshape(-1)
    A_state = level_aggregator(h, h.level_index("state")).toarray()
    rows = [np.kron(A_state, t[None, :])]
    d = [np.array([m.state_totals[str(c)] for c in h["state"].codes], float)]
    # structural zeros as equality rows: in this block coordinate hhgq·2 + votingage of
    # every node with a zero
    for level, z in m.zeros().items():
        A = level_aggregator(h, h.level_index(level)).toarray()
        node, coord = np.nonzero(z[:, :, :, 0].reshape(z.shape[0], 16))
        e = np.eye(n_s)[coord]
        rows.append((A[node][:, :, None] * e[:, None, :]).reshape(node.size, L * n_s))
        d.append(np.zeros(node.size))
    C, d = np.vstack(rows), np.concatenate(d)
    z0 = np.linalg.lstsq(C, d, rcond=None)[0]
    N = scipy.linalg.null_space(C)
    NFN = N.T @ F @ N
    z = z0 + N @ np.linalg.solve(NFN, N.T @ (b - F @ z0))
    cov = N @ np.linalg.solve(NFN, N.T)
    return t, mask, z.reshape(L, n_s), cov


def _dense_total_covariance(r):
    """Covariance (leaves × leaves) of the blocks' total populations by the dense
    constrained GLS of the total's block (:func:`_dense_total_gls`) of one state."""
    rel = r.release
    t, _, _, cov = _dense_total_gls(rel.hierarchy, r.measurements, rel.basis)
    T = np.kron(np.eye(rel.hierarchy.leaves.size), t[None, :])  # leaf totals
    return T @ cov @ T.T


def test_area_ses_and_district_covariance_equal_the_dense_covariance(one_state):
    d, h, _, _, _, r = one_state
    cov = _dense_total_covariance(r)
    geo = r.tabulation_geoids
    scale = float(np.abs(cov).max())
    for level, width in (("county", 5), ("tract", 11), ("block_group", 12)):
        f = _read(d / "out" / f"pl94_{level}.csv", "GEOID")
        prefix = np.asarray(geo, dtype=object).astype(str)
        inc = np.array([[p[:width] == c for p in prefix] for c in f["GEOID"]], float)
        ref = np.sqrt(np.einsum("al,lm,am->a", inc, cov, inc))
        # the release's SE to 1e-9; the file holds it to 6 significant digits
        assert f["GEOID"].tolist() == r.tabulation[level].codes.tolist()
        mem = pl94_columns(r.tabulation[level], level)[1][:, 0]
        assert np.abs(mem - ref).max() <= 1e-9 * max(1.0, ref.max())
        assert np.array_equal(f["P1_001N_se"].to_numpy(), significant(mem))
        # the ancestors' GEOIDs are the GEOID's prefixes
        for up, w in (("state", 2), ("county", 5), ("tract", 11)):
            if w < width:
                assert (f[f"{up}_GEOID"] == f["GEOID"].str[:w]).all()
    baf = pd.read_csv(d / "baf.csv", dtype=str, keep_default_na=False)
    spine_of = {g: i for i, g in enumerate(census_block_geoids(geo).tolist())}
    areas = _read(d / "out" / "pl94_area_district.csv", "area")
    assert areas["area"].tolist() == ["1", "2", "3", "4"]
    inc = np.zeros((4, h.leaves.size))
    for b, a in zip(baf["BLOCKID"], baf["DISTRICT"], strict=True):
        if a:
            inc[int(a) - 1, spine_of[b]] = 1.0
    assert areas["blocks"].tolist() == inc.sum(axis=1).astype(int).tolist()
    ref = inc @ cov @ inc.T
    got = _read(d / "out" / "area_district_P1_001N_covariance.csv", "area")
    assert got["area"].tolist() == ["1", "2", "3", "4"] and list(got.columns[1:]) == [
        "1",
        "2",
        "3",
        "4",
    ]
    got = got[["1", "2", "3", "4"]].to_numpy()
    assert np.abs(got - ref).max() <= 1e-9 * scale
    assert np.array_equal(got, got.T)
    se = pl94_columns(r.areas, r.areas.name)[1][:, 0]
    assert np.abs(se - np.sqrt(np.diag(ref))).max() <= 1e-9 * max(1.0, se.max())
    assert np.array_equal(areas["P1_001N_se"].to_numpy(), significant(se))
    # a data dictionary of every column of every table written
    dic = pd.read_csv(d / "out" / "data_dictionary.csv", keep_default_na=False)
    cols = set().union(*(pd.read_csv(x, nrows=0).columns for x in (d / "out").glob("*.csv")
                         if x.name != "data_dictionary.csv"))  # fmt: skip
    assert set(dic["column"]) == cols and dic["column"].is_unique
    assert dic.set_index("column").loc["P1_001N", "type"] == "float"
    # the districts' estimates are the sums of their blocks' estimates
    blk = _read(d / "out" / "pl94_block.csv", "GEOID")
    for up, w in (("state", 2), ("county", 5), ("tract", 11), ("block_group", 12)):
        assert (blk[f"{up}_GEOID"] == blk["GEOID"].str[:w]).all()
    sums = inc[:, [spine_of[g] for g in blk["GEOID"]]] @ blk[COLUMNS].to_numpy()
    assert np.abs(areas[COLUMNS].to_numpy() - sums).max() <= 1e-9 * max(1.0, np.abs(sums).max())


def test_column_ses_equal_the_query_ses_column_by_column(one_state):
    """The 298 columns' SEs at once (:func:`pl94_columns`) equal each query's
    ``query_standard_errors`` taken column by column (the slow, plain route) to 1e-12 of the
    node's largest, with the same held zeros and NaNs, at every spine level and tabulation
    area; a covariance off by 1% in one block is caught."""
    r = one_state[-1]
    pairs = [(r.release, lv) for lv in r.release.level_names]
    pairs += [(a, a.name) for a in r.tabulation.values()] + [(r.areas, r.areas.name)]
    for est, lv in pairs:
        ref = pl94_column_values(lambda q, e=est, v=lv: e.query_standard_errors(v, q))
        got = pl94_columns(est, lv)[1]
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got == 0, ref == 0)
        scale = np.maximum(np.nanmax(ref, axis=1, keepdims=True), 1e-300)  # all held: 0
        assert np.nanmax(np.abs(got - ref) / scale) <= 1e-12, lv
    a = r.areas
    mask = next(iter(a.covariances[0].blocks))
    blocks = dict(a.covariances[0].blocks)
    blocks[mask] = blocks[mask] * 1.01
    off = dataclasses.replace(a, covariances=(type(a.covariances[0])(a.basis, blocks),))
    ref = pl94_column_values(lambda q: a.query_standard_errors(a.name, q))
    assert np.nanmax(np.abs(pl94_columns(off, a.name)[1] - ref) / ref.max()) > 1e-4


def test_manifest_states_the_derived_privacy(one_state):
    d, _, _, totals, res, _ = one_state
    man = json.loads((d / "out" / "manifest.json").read_text(encoding="utf-8"))
    m = collect_nmf(read_nmf(d / "nmf"), totals)
    assert man["statement"] == m.release_note() == res.statement
    assert man["privacy"]["rho_derived"] == m.derived_rho() == res.rho
    assert man["privacy"]["rho_production"] == "293764/114921"
    assert (
        "post-processing of the Census Bureau's published measurements" in man["privacy"]["basis"]
    )
    assert "induced subspace" in man["statement"] and "US level" in man["not_imposed"]
    assert "structural zeros held exactly" in man["structural_zeros"]
    assert man["states"] == ["01"] and man["state_parts"] == {"01": ["001", "101"]}
    assert sorted(man["files"]) == sorted(f for f in res.files if f != "manifest.json")


# ----------------------------------------------------------------------------- coverage
COVERAGE_COLUMNS = ("P1_001N", "P3_001N", "P5_001N")


def _z_scores(args) -> np.ndarray:
    """Per simulated release (one evaluation seed each), the standardised errors
    (estimate − truth) / SE of P1_001N, P3_001N and P5_001N of every district, tabulation
    county, tract and block group and every block: ``(n_seeds, n_units, 3)``."""
    seeds, baf = args
    h, block, cell, count, aian = _state()
    leaves = _truth_blocks(h, block, cell, count)
    cols = [COLUMNS.index(c) for c in COVERAGE_COLUMNS]
    out = []
    for seed in seeds:
        subs = simulate_nmf(h, block, cell, count, aian_counties=aian, with_us=False,
                            evaluation_rng=KeyedRNG.reproducible(int(seed), warn=False))  # fmt: skip
        r = estimate_state(collect_nmf(subs, {"01": int(count.sum())}), areas=baf,
                           skip_blank_areas=True)  # fmt: skip
        pos = {g: i for i, g in enumerate(h["block"].codes.tolist())}
        idx = [pos[g] for g in census_block_geoids(r.tabulation_geoids).tolist()]
        truth = pl94_codebook().rows.apply(leaves[idx].reshape(-1, 8, 2, 2, 63))[:, cols]
        z = [_z(_columns(r.release, "block"), truth, _columns(r.release, "block", se=True))]
        for name, est in [*r.tabulation.items(), ("district", r.areas)]:
            t = r.equivalencies[name].sum_leaves(truth)
            z.append(_z(_columns(est, name), t, _columns(est, name, se=True)))
        out.append(np.concatenate(z))
    return np.stack(out)


def _z(est: np.ndarray, truth: np.ndarray, se: np.ndarray) -> np.ndarray:
    """(est − truth) / se; NaN where the value is held exactly (a structural zero: SE 0,
    checked to be exact — within floating point for sums of blocks — and not an interval)."""
    held = se <= 1e-9
    assert np.all(np.abs(est[held] - truth[held]) <= 1e-9)
    return np.where(held, np.nan, (est - truth) / np.where(held, 1.0, se))


def _columns(est, level, se=False) -> np.ndarray:
    """The coverage columns alone (what :func:`pl94_columns` gives for them, cheaper)."""
    rows = pl94_codebook().rows
    out = []
    for c in COVERAGE_COLUMNS:
        j = COLUMNS.index(c)
        q, i = rows.queries[rows.query_of_row[j]], rows.row_of_row[j]
        f = est.query_standard_errors if se else est.query_estimates
        out.append(f(level, q)[:, i])
    return np.stack(out, axis=1)


def _coverage(z: np.ndarray, factor: float = 1.0) -> float:
    """Share of 90% normal intervals (estimate ± 1.645 · factor · SE) covering the truth
    (values held exactly, NaN in ``z``, are not intervals)."""
    z = z[np.isfinite(z)]
    return float((np.abs(z) <= 1.6448536269514722 * factor).mean())


def _without_timings(out):
    """Every file of a release folder, the manifest's timings (and so its checksum) left out."""
    got = {}
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        text = f.read_text(encoding="utf-8")
        if f.name in ("manifest.json", "censusdp-output.json"):
            m = json.loads(text)
            if f.name == "manifest.json":
                del m["seconds"]
            else:  # the ownership record: the manifest's checksum covers its timings
                del m["files"]["manifest.json"]
            text = json.dumps(m, sort_keys=True)
        got[f.relative_to(out).as_posix()] = text
    return got


def test_old_keywords_write_the_same_release_and_unknown_ones_are_refused(one_state):
    """``NMFReleaseOptions`` fields passed one by one (the signature before it; accepted for
    one release) write the same bytes as the options object; a misspelt one is refused by
    name; each state's timings are wall seconds of the steps only (no ``cpu_`` key)."""
    d, _, _, _, res, _ = one_state
    root = d / "nmf"
    again = release_nmf(root, d / "p1.csv", d / "legacy", areas=d / "baf.csv",
                        skip_blank_areas=True)  # fmt: skip
    assert again.files == res.files and again.rho == res.rho
    assert _without_timings(d / "legacy") == _without_timings(d / "out")
    assert set(res.seconds["01"]) == {"read", "gls", "tabulation", "areas", "write"}
    with pytest.raises(TypeError, match=r"'skip_blank_area'.*NMFReleaseOptions"):
        release_nmf(root, d / "p1.csv", d / "bad", skip_blank_area=True)
    assert not (d / "bad").exists()


def test_90_percent_intervals_cover_about_90_percent(one_state):
    """20 simulated releases × 50 units × 3 columns: coverage within 0.86–0.94 (about 7
    binomial SEs of 3,000 intervals, fewer effective ones as a release's units share
    noise); power: intervals 20% too narrow (81% nominal) or too wide (96%) fall outside."""
    d = one_state[0]
    z = _z_scores((np.arange(100, 120), d / "baf.csv"))
    # P5_001N is held (== 0, SE 0) at every block without group quarters: not an interval
    assert z.shape == (20, 30 + 3 + 5 + 8 + 4, 3) and np.isfinite(z).mean() > 0.7
    assert 0.86 <= _coverage(z) <= 0.94, _coverage(z)
    assert _coverage(z, 0.8) < 0.86 and _coverage(z, 1.25) > 0.94
    _unbiased(z)


def _unbiased(z: np.ndarray) -> None:
    """Per column, the mean standardised error over releases and units is within 4 SEs of 0
    (the SE from the spread of the releases' means: units of one release share noise)."""
    per_release = np.nanmean(z, axis=1)  # (n_releases, n_columns)
    se = per_release.std(axis=0, ddof=1) / np.sqrt(z.shape[0])
    assert (np.abs(per_release.mean(axis=0)) <= 4 * se).all(), (per_release.mean(axis=0), se)


@pytest.mark.slow
def test_90_percent_intervals_cover_89_to_91_percent_over_2000_releases(one_state):
    """The acceptance figure: 2,000 simulated releases (one evaluation seed each) of the
    synthetic state, 90% intervals of districts, tabulation units and blocks cover 89–91%."""
    d = one_state[0]
    seeds = np.arange(10_000, 12_000)
    workers = int(os.environ.get("CENSUSDP_TEST_WORKERS", min(16, os.cpu_count() or 1)))
    chunks = [(c, d / "baf.csv") for c in np.array_split(seeds, workers * 4)]
    with ProcessPoolExecutor(workers) as pool:
        z = np.concatenate(list(pool.map(_z_scores, chunks)))
    assert z.shape[0] == 2000
    cov = _coverage(z)
    per_col = [_coverage(z[..., j : j + 1]) for j in range(z.shape[2])]
    print(f"coverage over {z.shape[0]} releases x {z.shape[1]} units: {cov:.4f}; by column "
          f"{dict(zip(COVERAGE_COLUMNS, np.round(per_col, 4).tolist(), strict=True))}")  # fmt: skip
    assert 0.89 <= cov <= 0.91
    assert all(0.89 <= c <= 0.91 for c in per_col)
    assert _coverage(z, 0.9) < 0.89 and _coverage(z, 1.1) > 0.91  # power: ±10% SE
    _unbiased(z)


# ----------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def two_states(tmp_path_factory):
    """Two states with the US level; state 02 has no AIAN part (a single part)."""
    d = tmp_path_factory.mktemp("nmf_two")
    st = synthetic_us(5, states=2, counties=5, tracts=9, block_groups=14, blocks=50,
                      population=2000)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=5)
    aian = np.zeros(h["county"].size, bool)
    aian[1] = True  # state 01's second county
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian,
                             evaluation_rng=KeyedRNG.reproducible(8, warn=False)))  # fmt: skip
    root = write_nmf(d / "nmf", subs)
    state = h.ancestor_index("block", "state")[block]
    totals = {str(s): int(count[state == i].sum()) for i, s in enumerate(h["state"].codes)}
    write_state_totals(d / "p1.csv", totals)
    return d, root, totals, subs


def test_the_command_releases_every_state_of_a_file(two_states, capsys):
    d, root, totals, subs = two_states
    out = d / "out"
    assert main(["nmf", str(root), "--state-totals", str(d / "p1.csv"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "states: 01, 02" in text and "Post-processing of the Census Bureau's" in text
    st = _read(out / "pl94_state.csv", "GEOID")
    assert st["GEOID"].tolist() == ["01", "02"]
    assert np.rint(st["P1_001N"]).astype(int).tolist() == [totals["01"], totals["02"]]
    parts = _read(out / "pl94_spine_state_part.csv", "geocode")
    assert parts["geocode"].tolist() == ["001", "101", "002"]
    man = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    m = collect_nmf(subs, totals)  # the US level too: the file's ρ
    assert man["us_level_read"] and man["privacy"]["rho_derived"] == m.derived_rho()
    # the US level and every state: the national pass (the same ρ; the US level estimated on)
    assert man["us_level_estimated"]
    assert man["statement"] == release_statement(
        m.derived_rho(), invariant_totals=True, levels=len(m.levels), us_used=True
    )
    assert (out / "pl94_nation.csv").is_file()
    # state 02 alone is its own GLS (no US level): other numbers than the national pass
    alone = d / "alone"
    args = ["nmf", str(root), "--state-totals", str(d / "p1.csv"), "--out", str(alone)]
    assert main([*args, "--state", "02"]) == 0
    a = _read(alone / "pl94_block.csv", "GEOID")
    b = _read(out / "pl94_block.csv", "GEOID")
    b = b[b["GEOID"].str.startswith("02")].reset_index(drop=True)
    assert a["GEOID"].equals(b["GEOID"]) and not a.equals(b)


def _refused(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(two_states, tmp_path, capsys):
    d, root, totals, _ = two_states
    base = ["nmf", str(root), "--out", str(tmp_path / "o")]
    p1 = tmp_path / "p1.csv"
    write_state_totals(p1, {"01": totals["01"]})
    _refused(capsys, [*base, "--state-totals", str(p1)], "no total for state 02")
    ok = str(d / "p1.csv")
    _refused(capsys, [*base, "--state-totals", ok, "--state", "07"], "state '07'")
    baf = tmp_path / "baf.csv"
    pd.DataFrame({"BLOCKID": ["010010001001001"], "DISTRICT": ["1"]}).to_csv(baf, index=False)
    _refused(capsys, [*base, "--state-totals", ok, "--areas", str(baf)], "--state SS")
    pd.DataFrame({"BLOCKID": ["019990001001001"], "DISTRICT": ["1"]}).to_csv(baf, index=False)
    _refused(capsys, [*base, "--state-totals", ok, "--state", "01", "--areas", str(baf)],
             "baf.csv", "data row 1", "'BLOCKID'", "019990001001001")  # fmt: skip
    _refused(capsys, [*base, "--state-totals", ok, "--state", "01", "--areas", str(baf),
                      "--area-column", "NOPE"], "NOPE")  # fmt: skip
    _refused(capsys, [*base, "--state-totals", ok, "--state", "01", "--areas", str(baf),
                      "--area-name", "../x"], "area name")  # fmt: skip
    assert not (tmp_path / "o").exists()  # nothing half-written
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _refused(capsys, ["nmf", str(root), "--out", str(mine), "--state-totals", ok], str(mine))
    assert (mine / "notes.txt").read_text() == "keep" and len(list(mine.iterdir())) == 1
    _refused(capsys, ["nmf", str(tmp_path), "--out", str(tmp_path / "o"), "--state-totals", ok],
             "Block.parquet")  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_estimate_state_refuses_two_states_or_no_total(two_states):
    _, _, totals, subs = two_states
    with pytest.raises(SpecError, match="one state"):
        estimate_state(collect_nmf(subs[1:], totals))
    with pytest.raises(DataError, match="no published total"):
        estimate_state(collect_nmf(subs[1:3]))


# ----------------------------------------------------------------------------- national pass
def _national(root, totals, subtrees):
    """The national pass by its steps: each state's upward pass, the root with the US
    level, each state smoothed from it."""
    ups = [
        state_upward(collect_nmf(read_nmf(root, subtrees=parts), {s: totals[s]}))
        for s, parts in subtrees.items()
    ]
    (us,) = read_nmf(root, subtrees=["US"])
    top = national_top(us.levels[0], ups)
    return top, [top.estimate_state(u) for u in ups]


@pytest.fixture(scope="module")
def nation(two_states):
    """The national pass of ``two_states`` (state 01 in two parts, 02 in one, a US level)
    and, for reference, everything in memory: the national spine and its measurements."""
    d, root, totals, subs = two_states
    top, states = _national(root, totals, {"01": ["001", "101"], "02": ["002"]})
    m = collect_nmf(subs, totals)  # the US level too
    return d, root, totals, top, states, m


def _block_cov(est, level, mask):
    """The (n, 16, 16) covariance blocks of the total's block at every node of ``level``."""
    return est.covariances[est._index(level)].blocks[mask]


def test_national_pass_equals_a_dense_gls_over_the_nation(nation):
    """Estimates, node covariances (every spine level, the nation and the states) and the
    tabulation areas' covariances of the national pass equal a dense GLS over the whole
    nation with the US measurements, the structural zeros and the state totals as equality
    rows (1e-9), in the block that carries the total, hhgq, voting age and P5's types."""
    d, root, totals, top, states, m = nation
    h = m.spine.hierarchy
    t, mask, z, cov = _dense_total_gls(h, m, top.release.basis)
    L = h.leaves.size
    # 1e-9 of the largest figure (the nation's): the tree passes and this dense solve
    # differ by ~4e-8 persons at blocks, as for one state's structured GLS alone
    scale_z = float(np.abs(z.sum(axis=0)).max())
    scale_c = float(np.abs(cov).max())

    def dense(level):
        A = np.kron(level_aggregator(h, h.level_index(level)).toarray(), np.eye(16))
        n = A.shape[0] // 16
        zz = (A @ z.reshape(-1)).reshape(n, 16)
        cc = (A @ cov @ A.T).reshape(n, 16, n, 16)
        return zz, cc[np.arange(n), :, np.arange(n), :]

    def block_of(est, level):
        coef = est.basis.to_basis(est.level(level))
        return gather_block(est.basis, coef, mask)[:, 0]

    for level in ("nation", "state"):
        zz, cc = dense(level)
        assert np.abs(block_of(top.release, level) - zz).max() <= 1e-9 * scale_z
        assert np.abs(_block_cov(top.release, level, mask) - cc).max() <= 1e-9 * scale_c
    for level in ("state", "state_part", "county", "tract", "block_group", "block"):
        zz, cc = dense(level)
        got_z = np.concatenate([block_of(r.release, level) for r in states])
        got_c = np.concatenate([_block_cov(r.release, level, mask) for r in states])
        assert np.abs(got_z - zz).max() <= 1e-9 * scale_z, level
        assert np.abs(got_c - cc).max() <= 1e-9 * scale_c, level
    # tabulation areas (sums of blocks by GEOID prefix, within a state)
    geo = np.concatenate([np.asarray(r.tabulation_geoids, dtype=object) for r in states])
    blocks = np.concatenate([r.hierarchy["block"].codes for r in states])
    assert blocks.tolist() == h["block"].codes.tolist()  # the states tile the nation's blocks
    for level, width in TABULATION_PREFIX.items():
        codes = np.concatenate([r.tabulation[level].codes for r in states])
        inc = np.array([[g[:width] == c for g in geo] for c in codes], float)
        A = np.kron(inc, np.eye(16))
        cc = (A @ cov @ A.T).reshape(len(codes), 16, len(codes), 16)
        cc = cc[np.arange(len(codes)), :, np.arange(len(codes)), :]
        got = np.concatenate([r.tabulation[level].covariances[0].blocks[mask] for r in states])
        assert np.abs(got - cc).max() <= 1e-9 * scale_c, level
    assert L == h["block"].size


def test_national_pass_equals_the_structured_gls_of_the_whole_nation(nation):
    """Every block of the marginal basis: the national pass's estimates and the variances of
    every P1–P5 column at every spine node equal the in-memory structured GLS over the whole
    nation with the US level (1e-9), so the figures beyond the total's block are right too;
    the nation's table holds the sum of the state totals with SE 0."""
    d, root, totals, top, states, m = nation
    meas = m.measurements()
    ref = structured_gls(m.spine.hierarchy, meas[0].query.schema, meas, m.invariants(),
                         zeros=m.zeros())  # fmt: skip
    book = pl94_codebook()

    def check(got_est, got_var, level):
        want = book.rows.apply(ref.level(level))
        want_var = pl94_column_values(lambda q: ref.query_variances(level, q))
        assert np.abs(got_est - want).max() <= 1e-9 * max(1.0, np.abs(want).max()), level
        assert np.abs(got_var - want_var).max() <= 1e-9 * want_var.max(), level

    for level in ("nation", "state"):
        est = book.rows.apply(top.release.level(level))
        check(
            est, pl94_column_values(lambda q, lv=level: top.release.query_variances(lv, q)), level
        )
    for level in ("state", "state_part", "county", "tract", "block_group", "block"):
        est = np.concatenate([book.rows.apply(r.release.level(level)) for r in states])
        var = np.concatenate([
            pl94_column_values(lambda q, r=r, lv=level: r.release.query_variances(lv, q))
            for r in states
        ])  # fmt: skip
        check(est, var, level)
    nat = nation_tables(top)
    assert nat["GEOID"].tolist() == ["US"]
    assert nat["P1_001N"][0] == sum(totals.values()) and nat["P1_001N_se"][0] == 0
    assert nat["P3_001N_se"][0] > 0


def test_the_us_level_makes_the_release_more_precise(nation):
    """Power: the national pass is not the per-state release — it moves the estimates and
    its SEs are at most the per-state ones, strictly smaller for the states' figures that
    the US level measures (voting age), and a state's error covariance with the other
    state is no longer 0 (the US level ties them)."""
    d, root, totals, top, states, m = nation
    for r in states:
        own = estimate_state(r.measurements)
        for level in ("state", "county", "block"):
            _, se_n = pl94_columns(r.release, level)
            _, se_s = pl94_columns(own.release, level)
            assert np.all(se_n <= se_s * (1 + 1e-9) + 1e-12), level
        _, se_n = pl94_columns(r.release, "state")
        _, se_s = pl94_columns(own.release, "state")
        j = COLUMNS.index("P3_001N")
        assert se_n[0, j] < 0.99 * se_s[0, j]
        assert not np.allclose(r.release.level("block"), own.release.level("block"))
    # Var(state 01 + state 02) = Var(nation) ≠ Var 01 + Var 02 for a column not held
    q = "votingage"
    var_states = top.release.query_variances("state", q).sum(axis=0)
    var_nation = top.release.query_variances("nation", q)[0]
    assert np.all(np.abs(var_nation - var_states) > 1e-3 * var_states)


def test_release_nmf_runs_the_national_pass_and_writes_the_nation(nation):
    """``release_nmf`` on a file with the US level and two states: its tables are the
    national pass's (bit for bit), ``pl94_nation.csv`` holds the nation, the manifest and
    the statement say the US level was estimated on."""
    d, root, totals, top, states, m = nation
    got = []
    opts = NMFReleaseOptions(integers=True, seed=3)
    res = release_nmf(root, d / "p1.csv", d / "out_nat", on_state=got.append, options=opts)
    assert [r.state for r in got] == ["01", "02"]
    # the integer product from the national estimate: state totals exact
    ints = _read(d / "out_nat" / "nonnegative" / "pl94_state.csv", "GEOID")
    assert ints["P1_001N"].tolist() == [totals["01"], totals["02"]]
    for r, want in zip(got, states, strict=True):
        for k in range(want.release.hierarchy.depth):
            assert np.array_equal(r.release.estimates[k], want.release.estimates[k])
    nat = _read(d / "out_nat" / "pl94_nation.csv", "GEOID")
    want = nation_tables(top)
    assert np.array_equal(nat[COLUMNS].to_numpy(), want[COLUMNS].to_numpy().astype(float))
    man = json.loads((d / "out_nat" / "manifest.json").read_text(encoding="utf-8"))
    assert man["us_level_estimated"] and "whole nation" in man["estimator"]
    assert "US level" not in man["not_imposed"]
    assert "US level estimated on together with the states" in res.statement
    assert man["privacy"]["rho_derived"] == m.derived_rho()
    assert "pl94_nation.csv" in res.files


def test_kept_upward_states_write_the_release_of_states_read_twice(two_states, tmp_path):
    """The national pass keeps the states' upward passes between its halves while they fit
    in ``cache_bytes``: every state kept (default budget), only the first (a budget of its
    size) or none (0, each state read twice) write the same bytes; a kept state is read
    and passed upward once (its second ``read`` and ``up`` are 0 s)."""
    d, root, totals, subs = two_states
    first = state_upward(collect_nmf(read_nmf(root, subtrees=["001", "101"]),
                                     {"01": totals["01"]})).nbytes()  # fmt: skip
    assert first > 1 << 20  # measurements, weights and upward pass: more than a MB
    outs = {}
    for name, budget, kept in (("all", 1 << 30, [True, True]), ("one", first, [True, False]),
                               ("none", 0, [False, False])):  # fmt: skip
        res = release_nmf(root, totals, tmp_path / name,
                          options=NMFReleaseOptions(cache_bytes=budget))  # fmt: skip
        assert [res.seconds[s]["kept"] for s in ("01", "02")] == kept
        for s, k in zip(("01", "02"), kept, strict=True):
            assert (res.seconds[s]["read"] == 0.0) == k and (res.seconds[s]["up"] == 0.0) == k
        outs[name] = _without_timings(tmp_path / name)
    assert "pl94_nation.csv" in outs["all"]
    assert outs["all"] == outs["one"] == outs["none"]


def test_one_state_or_no_us_level_is_the_per_state_release_bit_for_bit(two_states, tmp_path):
    """Without the US level, or with it and one state, the release is today's per-state
    one bit for bit (the national pass runs only with the US level and every state)."""
    d, root, totals, subs = two_states
    no_us = write_nmf(tmp_path / "no_us", subs[1:])
    one = write_nmf(tmp_path / "one", [subs[0], *[s for s in subs if s.subtree == "002"]])
    got = []
    release_nmf(no_us, totals, tmp_path / "a", on_state=got.append)
    release_nmf(one, {"02": totals["02"]}, tmp_path / "b", on_state=got.append)
    release_nmf(root, totals, tmp_path / "c", on_state=got.append,
                options=NMFReleaseOptions(states=["02"]))  # fmt: skip
    assert [r.state for r in got] == ["01", "02", "02", "02"]
    for r in got:
        own = estimate_state(r.measurements)
        for k in range(own.release.hierarchy.depth):
            assert np.array_equal(r.release.estimates[k], own.release.estimates[k])
        for level in ("county", "tract", "block_group"):
            a, b = r.tabulation[level], own.tabulation[level]
            assert all(np.array_equal(a.covariances[0].blocks[k], b.covariances[0].blocks[k])
                       for k in a.covariances[0].blocks)  # fmt: skip
    for out in ("a", "b", "c"):
        assert not (tmp_path / out / "pl94_nation.csv").exists()
        man = json.loads((tmp_path / out / "manifest.json").read_text(encoding="utf-8"))
        assert not man["us_level_estimated"] and "US level" in man["not_imposed"]
    b = _read(tmp_path / "b" / "pl94_block.csv", "GEOID")
    c = _read(tmp_path / "c" / "pl94_block.csv", "GEOID")
    assert b.equals(c)


def test_districts_under_the_national_pass_equal_the_dense_covariance(nation, tmp_path):
    """A state's districts (BAF) under the national pass: their total populations' SEs and
    covariance matrix equal the dense national GLS's (1e-9), and differ from the state's
    own GLS (the US level is used)."""
    d, root, totals, top, states, m = nation
    h = m.spine.hierarchy
    r = states[0]
    ids = census_block_geoids(r.tabulation_geoids).tolist()
    district = [str(1 + (i * 7) % 3) for i in range(len(ids))]
    pd.DataFrame({"BLOCKID": ids, "DISTRICT": district}).to_csv(tmp_path / "baf.csv", index=False)
    got = add_areas(r, tmp_path / "baf.csv")
    t, _, _, cov = _dense_total_gls(h, m, top.release.basis)
    n_r = r.hierarchy.leaves.size  # state 01's blocks come first in the nation's order
    inc = np.zeros((3, h.leaves.size))
    inc[np.array(district, int) - 1, np.arange(n_r)] = 1.0
    T = np.kron(np.eye(h.leaves.size), t[None, :])
    ref = inc @ T @ cov @ T.T @ inc.T
    scale = float(np.abs(ref).max())
    assert np.abs(got.area_covariance - ref).max() <= 1e-9 * scale
    se = pl94_columns(got.areas, got.areas.name)[1][:, 0]
    assert np.abs(se - np.sqrt(np.diag(ref))).max() <= 1e-9 * np.sqrt(scale)
    own = add_areas(estimate_state(r.measurements), tmp_path / "baf.csv")
    assert np.all(np.abs(own.area_covariance - ref) > 1e-6 * scale)


@pytest.mark.parametrize("seed", [11, 12])
def test_national_pass_equals_the_whole_nation_gls_on_other_files(seed, tmp_path):
    """More small files (three states, AIAN parts in some, other noise): the national pass's
    estimates and variances at every spine level equal the structured GLS of the whole
    nation held in memory, for every block of the basis.

    The tolerance is 1e-9 of the query's largest figure and variance. On seed 11 (state 02:
    two spine counties, each an only-child chain down to its blocks) the kernel once missed
    by 7e-7 relative, from LAPACK's eigensolver; the fixed-order Jacobi ``eigh`` of the block
    kernels gets the small eigenvalues to high relative accuracy and the two agree to 1e-13
    (measured 2.5e-9 with numpy's eigh put back). Power: each state's own GLS (no US level)
    is far outside the tolerance."""
    st = synthetic_us(seed, states=3, counties=5, tracts=7, block_groups=9, blocks=24,
                      population=1800)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=seed)
    aian = np.zeros(h["county"].size, bool)
    aian[h["county"].size - 1] = True
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian,
                             evaluation_rng=KeyedRNG.reproducible(seed, warn=False)))  # fmt: skip
    root = write_nmf(tmp_path / "nmf", subs)
    state = h.ancestor_index("block", "state")[block]
    totals = {str(s): int(count[state == i].sum()) for i, s in enumerate(h["state"].codes)}
    parts: dict[str, list[str]] = {}
    for s in subs[1:]:
        parts.setdefault(s.subtree[1:], []).append(s.subtree)
    top, states = _national(root, totals, parts)
    m = collect_nmf(subs, totals)
    meas = m.measurements()
    ref = structured_gls(m.spine.hierarchy, meas[0].query.schema, meas, m.invariants(),
                         zeros=m.zeros())  # fmt: skip
    levels = ("nation", "state", "state_part", "county", "tract", "block_group", "block")
    queries = ("total", "votingage * hispanic", "hhgq", "detailed")
    est_scale = {q: max(np.abs(ref.query_estimates(lv, q)).max() for lv in levels) for q in queries}
    var_scale = {q: max(ref.query_variances(lv, q).max() for lv in levels) for q in queries}
    for level in levels:
        for q in queries:
            if level in ("nation", "state"):
                est = top.release.query_estimates(level, q)
                var = top.release.query_variances(level, q)
            else:
                est = np.concatenate([r.release.query_estimates(level, q) for r in states])
                var = np.concatenate([r.release.query_variances(level, q) for r in states])
            want, want_var = ref.query_estimates(level, q), ref.query_variances(level, q)
            assert np.abs(est - want).max() <= 1e-9 * est_scale[q], (level, q)
            assert np.abs(var - want_var).max() <= 1e-9 * var_scale[q], (level, q)
    # power: without the US level (each state's own GLS) the county variances move by
    # ~2.3e-5 persons² on seed 11, far over the tolerance: the comparison sees the US level
    own = np.concatenate(
        [estimate_state(r.measurements).release.query_variances("county", "total") for r in states]
    )
    var = np.concatenate([r.release.query_variances("county", "total") for r in states])
    assert np.abs(own - var).max() > 1e-8 * var_scale["total"]
