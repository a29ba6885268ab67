"""The synthetic NMF writer: writer → reader round trip is exact; the truth, the bounds, the
only-child rule and the production variances are what the description says; the evaluation
noise has the discrete Gaussian law (α = 1e-6, with power against a wrong σ²)."""

from __future__ import annotations

import numpy as np
import pytest
from stattests import chi2_pvalue

from censusdp.errors import SpecError
from censusdp.estimation.gls.structured import structured_gls
from censusdp.hierarchy.core import Hierarchy
from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.io.nmf import (
    PRODUCTION_RHO,
    collect_nmf,
    nmf_queries,
    read_nmf,
    read_state_totals,
)
from censusdp.pipelines.io.nmf_writer import (
    TABULATION_LEVELS,
    nmf_geocodes,
    production_laws,
    simulate_nmf,
    write_nmf,
    write_state_totals,
)
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

TAB = {"County": "county", "Tract": "tract", "Block_Group": "block_group", "Block": "block"}


@pytest.fixture(scope="module")
def synthetic():
    st = synthetic_us(
        3, states=2, counties=5, tracts=9, block_groups=14, blocks=80, population=3000
    )
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=3)
    aian = np.zeros(h["county"].size, bool)
    aian[[1, 2]] = True  # state 01's second county and state 02's first are AIAN parts
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian,
                             evaluation_rng=KeyedRNG.reproducible(11, warn=False)))  # fmt: skip
    leaves = np.zeros((h["block"].size, 2016), np.int64)
    np.add.at(leaves, (block, cell), count)
    truth = {
        name: c.reshape(-1, 8, 2, 2, 63)
        for name, c in zip(h.names, h.aggregate(leaves), strict=True)
    }
    return h, aian, subs, truth


def _same_subtrees(a, b):
    assert [s.subtree for s in a] == [s.subtree for s in b]
    for sa, sb in zip(a, b, strict=True):
        assert [x.name for x in sa.levels] == [x.name for x in sb.levels]
        for la, lb in zip(sa.levels, sb.levels, strict=True):
            assert la.geocodes.tolist() == lb.geocodes.tolist()
            assert np.array_equal(la.parent, lb.parent) and np.array_equal(la.measured, lb.measured)
            assert np.array_equal(la.lower, lb.lower) and np.array_equal(la.upper, lb.upper)
            assert np.array_equal(la.has_bounds, lb.has_bounds)
            assert list(la.queries) == list(lb.queries)
            for nm in la.queries:
                qa, qb = la.queries[nm], lb.queries[nm]
                assert qa.values.dtype == qb.values.dtype == np.int64
                assert np.array_equal(qa.values, qb.values)
                assert np.array_equal(qa.variance, qb.variance)  # inf at unmeasured nodes too


def test_writer_reader_round_trip_is_exact(synthetic, tmp_path):
    h, _, subs, _ = synthetic
    root = write_nmf(tmp_path / "nmf", subs)
    back = list(read_nmf(root))
    assert [s.subtree for s in back] == ["US", "001", "101", "002", "102"]
    _same_subtrees(subs, back)
    # a single subtree alone reads the same
    _same_subtrees([subs[2]], list(read_nmf(root, subtrees=["101"])))


def test_spine_geocodes_and_tabulation_geoids(synthetic):
    h, aian, subs, _ = synthetic
    m = collect_nmf(subs)
    sh = m.spine.hierarchy
    assert sh.sizes == (1, 2, 4, 5, 9, 14, 80)
    assert sh["state_part"].codes.tolist() == ["001", "101", "002", "102"]
    # every spine block's GEOID is its synthetic block code with the block-group digit
    # repeated as the block number's first digit (state 2, county 3, tract 6, bg 1, block 4)
    code = h["block"].codes.tolist()
    want = sorted(c[:12] + c[11] + c[12:] for c in code)
    assert sorted(m.spine.tabulation_geoids.tolist()) == want
    geo = nmf_geocodes(h, aian)
    assert geo.part.tolist() == ["001", "101", "102", "002", "002"]
    for lvl, tab in TAB.items():
        assert sorted(geo.levels[lvl].tolist()) == sorted(sh[tab].codes.tolist())
    assert all(len(g) == 31 for g in geo.levels["Block"].tolist())


def test_truth_bounds_only_children_and_production_variances(synthetic):
    h, aian, subs, truth = synthetic
    geo = nmf_geocodes(h, aian)
    laws = production_laws()
    queries = nmf_queries()
    by_code = {}
    for lvl, tab in TAB.items():
        for i, g in enumerate(geo.levels[lvl].tolist()):
            by_code[g] = (tab, i)
    n_unmeasured = 0
    for s in subs:
        for lvl in s.levels:
            for i, g in enumerate(lvl.geocodes.tolist()):
                if lvl.name == "US":
                    x = truth["nation"][0]
                    only = False
                elif lvl.name == "State":
                    members = np.flatnonzero(geo.part == g)
                    x = truth["county"][members].sum(axis=0)
                    only = False
                else:
                    tab, j = by_code[g]
                    x = truth[tab][j]
                    parent = h[tab].parent[j]
                    if tab == "county":  # its parent is its state part
                        only = int((geo.part == geo.part[j]).sum()) == 1
                    else:
                        only = int(h[h.names[h.level_index(tab) - 1]].child_count[parent]) == 1
                assert x[3, 0].sum() == 0  # nursing facilities hold no one under 18
                hhgq = x.reshape(8, -1).sum(axis=1)
                assert (lvl.upper[i] == np.where(hhgq > 0, x.sum(), 0)).all()
                assert (lvl.lower[i] == (hhgq > 0)).all() and lvl.has_bounds[i]
                assert lvl.hhgq_zero[i].tolist() == (hhgq == 0).tolist()
                assert lvl.measured[i] == (not only)
                n_unmeasured += only
                for nm, q in lvl.queries.items():
                    if only:
                        assert q.variance[i] == np.inf and not q.values[i].any()
                        continue
                    assert q.variance[i] == float(laws[(lvl.name, nm)].sigma2)
                    # the noise is bounded far inside 12σ: values carry the truth
                    err = q.values[i] - queries[nm].apply(x[None])[0]
                    assert np.abs(err).max() <= 12 * np.sqrt(q.variance[i]) + 1
            if lvl.name == "US":
                assert "total_dpq" not in lvl.queries
    assert n_unmeasured > 0  # the fixture has only children at several levels


def test_production_variances_give_the_production_rho(synthetic):
    _, _, subs, _ = synthetic
    m = collect_nmf(subs)
    # σ² = 1/(2ρ_{ℓ,q}) rounded up onto the sampler's grid: the file's ρ is the production ρ
    # less that rounding (relative ≤ 2⁻¹⁰ / smallest σ², the state total's ≈ 0.60)
    rho, prod = m.derived_rho(), float(PRODUCTION_RHO)
    smallest = min(float(law.sigma2) for law in production_laws().values())
    assert rho <= prod and prod / rho - 1 <= 2.0**-10 / smallest
    assert float(m.privacy().rho) == pytest.approx(rho, rel=1e-12)
    exact = sum(float(1 / (2 * law.sigma2)) for law in production_laws().values())
    assert rho == pytest.approx(exact, rel=1e-12)
    note = m.release_note()
    assert "Post-processing of the Census Bureau's published measurements" in note
    assert f"ρ = {rho:.6g}" in note and "zero-concentrated" in note and "\n" not in note
    with_totals = collect_nmf(subs, {"01": 1, "02": 2}).release_note()
    assert "induced subspace differential privacy" in with_totals


def test_evaluation_noise_has_the_discrete_gaussian_law(synthetic):
    h, aian, subs, truth = synthetic
    geo = nmf_geocodes(h, aian)
    order = {g: i for i, g in enumerate(geo.levels["Block"].tolist())}
    q = nmf_queries()["detailed_dpq"]
    draws = []
    for s in subs[1:]:
        lvl = s.level("Block")
        idx = np.array([order[g] for g in lvl.geocodes.tolist()])
        m = lvl.queries["detailed_dpq"]
        draws.append((m.values - q.apply(truth["block"][idx]))[m.measured].ravel())
    draws = np.concatenate(draws)
    assert draws.size == 80 * 2016
    law = production_laws()[("Block", "detailed_dpq")]
    xs = np.arange(-40, 41)
    assert chi2_pvalue(draws, law.log_density(xs), xs) > 1e-6
    wrong = DiscreteGaussian.from_sigma2(law.sigma2 * 5 / 4)  # power: 25% more variance
    assert chi2_pvalue(draws, wrong.log_density(xs), xs) < 1e-6


def test_same_evaluation_key_same_file_other_key_other_noise(synthetic):
    h, aian, subs, _ = synthetic
    st_block = [s.level("Block").queries["total_dpq"].values for s in subs[1:]]
    # re-simulate with the same key: identical; with another key: different noise
    table = synthetic_us(
        3, states=2, counties=5, tracts=9, block_groups=14, blocks=80, population=3000
    )
    b, c, n = pl94_histogram(table, seed=3)
    for seed, same in ((11, True), (12, False)):
        again = list(simulate_nmf(h, b, c, n, aian_counties=aian, with_us=False,
                                  evaluation_rng=KeyedRNG.reproducible(seed, warn=False)))  # fmt: skip
        vals = [s.level("Block").queries["total_dpq"].values for s in again]
        assert all(np.array_equal(x, y) for x, y in zip(vals, st_block, strict=True)) == same


def test_state_totals_tie_the_two_parts(synthetic, tmp_path):
    h, _, subs, truth = synthetic
    totals = {str(s): int(t.sum()) for s, t in zip(h["state"].codes, truth["state"], strict=True)}
    path = write_state_totals(tmp_path / "p1.csv", totals)
    m = collect_nmf(subs, read_state_totals(path))
    (inv,) = m.invariants()
    assert inv.values[:, 0].tolist() == [totals["01"], totals["02"]]
    parts = m.spine.hierarchy["state_part"]
    assert parts.parent.tolist() == [0, 0, 1, 1]  # 001, 101 → 01; 002, 102 → 02


def test_writer_refuses_a_folder_it_did_not_write(synthetic, tmp_path):
    _, _, subs, _ = synthetic
    root = tmp_path / "nmf"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    with pytest.raises(SpecError):
        write_nmf(root, subs)
    assert (root / "notes.txt").read_text() == "mine" and len(list(root.iterdir())) == 1
    write_nmf(tmp_path / "ours", subs[:2])
    with pytest.raises(SpecError):
        write_nmf(tmp_path / "ours", subs)  # ours, but overwrite not asked
    write_nmf(tmp_path / "ours", subs, overwrite=True)
    assert [s.subtree for s in read_nmf(tmp_path / "ours")] == ["US", "001", "101", "002", "102"]


def test_writer_needs_the_production_allocation():
    flat = Schema.load("sex_age5")
    with pytest.raises(SpecError, match="pl94 strategy"):
        production_laws(flat)


def _regular_state(fan=(4, 2, 2, 3)) -> Hierarchy:
    """One state, every parent with ≥ 2 children (so no node lacks measurements), in the
    code layout of synthetic_us (county 3, tract 6, block group 1, block 3 digits)."""
    names = list(TABULATION_LEVELS)
    codes, parents, prev = [["US"], ["01"]], [None, [0]], ["01"]
    for f, width in zip(fan, (3, 6, 1, 3), strict=True):
        level = [(pc + str(j + 1).zfill(width), i) for i, pc in enumerate(prev) for j in range(f)]
        codes.append([c for c, _ in level])
        parents.append([p for _, p in level])
        prev = codes[-1]
    return Hierarchy.from_parents(names, codes, parents)


def test_gls_from_a_written_nmf_equals_the_in_memory_structured_gls(tmp_path):
    h = _regular_state()
    pop = np.random.default_rng(0).poisson(30, h["block"].size)
    block, cell, count = pl94_histogram(pop, seed=5)
    aian = np.array([False, False, True, True])
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian,
                             evaluation_rng=KeyedRNG.reproducible(2, warn=False)))  # fmt: skip
    totals = {"01": int(count.sum())}
    mem = collect_nmf(subs, totals)
    disk = collect_nmf(read_nmf(write_nmf(tmp_path / "nmf", subs)), totals)
    assert all(lvl.measured.all() for lvl in mem.levels.values())
    releases = []
    for m in (mem, disk):
        meas = m.measurements()
        releases.append(
            structured_gls(m.spine.hierarchy, meas[0].query.schema, meas, m.invariants())
        )
    a, b = releases
    for k in range(len(h.names) + 1):
        assert np.array_equal(a.estimates[k], b.estimates[k])
    total = ProductQuery.parse(releases[0].schema, "total")
    est = b.query_estimates("state", total)
    assert np.rint(est[0, 0]) == totals["01"] and abs(est[0, 0] - totals["01"]) < 1e-6
    assert b.privacy.rho == pytest.approx(disk.derived_rho(), rel=1e-12)
    assert "induced subspace" in b.privacy.text()
