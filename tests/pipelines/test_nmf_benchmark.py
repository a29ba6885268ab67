"""The national NMF benchmark (``benchmarks/nmf_national.py``) end to end on a tiny
geography: the district tables add up to the invariant state totals, every NMF folder read
is removed (and only folders it proves it wrote), the apportionment and the districts are
checked against slow references."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from censusdp.errors import SpecError
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.paths import repo_root


def _module():
    path = repo_root() / "benchmarks" / "nmf_national.py"
    spec = importlib.util.spec_from_file_location("nmf_national_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _module()


def test_main_tiny_national_run(tmp_path):
    out = tmp_path / "run"
    argv = ["--fraction", "1/8192", "--states", "1", "--districts", "5", "--out", str(out)]
    r = bench.main(argv)
    assert r["states"] == 1 and r["districts"] == 5 == r["districts_released (non-empty)"]
    assert r["blocks"] == r["nodes_per_level"]["block"] > 0
    assert r["state_parts"] == 1  # one county: no AIAN part (see the flags' test)
    assert set(r["seconds_per_stage"]) == {
        "read", "up", "top", "gls", "districts", "tables", "integers"
    }  # fmt: skip
    assert not r["national_pass"] and r["seconds_per_stage"]["up"] == 0  # one state
    assert r["bytes_read"] == r["bytes_written"]["nmf"] > 0
    assert "national_gls_pass" in r["not_run"] and "non_negative_product" not in r["not_run"]
    ints = pd.read_csv(out / "release" / "nonnegative" / "pl94_state.csv", dtype={"GEOID": str})
    totals_int = pd.read_csv(out / "inputs" / "state_totals.csv", dtype={"state": str})
    assert ints["P1_001N"].tolist() == totals_int["total"].tolist()  # == the invariant
    assert 0 < r["privacy"]["rho_derived"] < 2.6
    assert "induced subspace" in r["privacy"]["statement"]
    assert json.loads((out / "result.json").read_text())["blocks"] == r["blocks"]
    # each state's NMF folder was removed once read; the US level and the BAFs stay
    assert sorted(p.name for p in (out / "nmf").iterdir()) == ["US"]
    rel = out / "release"
    totals = pd.read_csv(out / "inputs" / "state_totals.csv", dtype={"state": str})
    assert int(totals["total"].sum()) == r["persons"]
    state = pd.read_csv(rel / "pl94_state.csv", dtype={"GEOID": str})
    assert np.allclose(state["P1_001N"], totals["total"], rtol=0, atol=1e-6)  # invariant
    assert (state["P1_001N_se"].abs() < 1e-6).all()
    d = pd.read_csv(rel / "pl94_area_district.csv", dtype={"area": str})
    assert len(d) == 5 and int(d["blocks"].sum()) == r["blocks"]
    # whole states in districts: their estimates add up to the invariant totals
    assert abs(d["P1_001N"].sum() - r["persons"]) < 1e-6
    assert (d["P1_001N_se"] > 0).all()
    cov = pd.read_csv(rel / "area_district_P1_001N_covariance.csv", dtype={"area": str})
    assert len(cov) == 5
    blocks = pd.read_csv(rel / "pl94_block.csv", usecols=["GEOID"], dtype=str)
    assert len(blocks) == r["blocks"]


def test_two_states_run_the_national_pass(tmp_path):
    """With two states the benchmark runs the national pass: each state's upward pass, the
    root with the US level, then each state smoothed from it; the nation's table is written
    with the sum of the state totals held."""
    out = tmp_path / "run"
    r = bench.main(["--fraction", "1/16384", "--states", "2", "--districts", "3",
                    "--out", str(out)])  # fmt: skip
    assert r["national_pass"] and r["not_run"] == {}
    assert r["cpu_seconds_per_stage"]["up"] > 0 and r["seconds_per_stage"]["top"] > 0
    assert "US level estimated on" in r["privacy"]["statement"]
    # both upward passes kept between the halves: each state read once
    assert r["upward_states_kept (read once; within --cache-mb)"] == 2
    assert r["bytes_read"] == r["bytes_written"]["nmf"] and r["seconds_per_stage"]["read"] > 0
    nation = pd.read_csv(out / "release" / "pl94_nation.csv", dtype={"GEOID": str})
    assert nation["GEOID"].tolist() == ["US"] and nation["P1_001N"][0] == r["persons"]
    assert sorted(p.name for p in (out / "nmf").iterdir()) == ["US"]
    # no memory for them: each state read twice, the same tables
    again = tmp_path / "again"
    r0 = bench.main(["--fraction", "1/16384", "--states", "2", "--districts", "3",
                     "--cache-mb", "0", "--out", str(again)])  # fmt: skip
    assert r0["upward_states_kept (read once; within --cache-mb)"] == 0
    assert r0["bytes_read"] > r0["bytes_written"]["nmf"] == r["bytes_written"]["nmf"]
    for f in ("pl94_block.csv", "pl94_nation.csv", "area_district_P1_001N_covariance.csv"):
        assert (again / "release" / f).read_bytes() == (out / "release" / f).read_bytes()


def test_keep_leaves_the_nmf(tmp_path):
    out = tmp_path / "run"
    r = bench.main(["--fraction", "1/65536", "--states", "1", "--districts", "1", "--keep",
                    "--out", str(out)])  # fmt: skip
    assert r["nmf_removed_once_read"] is False
    assert sorted(p.name for p in (out / "nmf").iterdir()) == ["US", "state_01"]


def test_remove_refuses_a_folder_it_did_not_write(tmp_path):
    foreign = tmp_path / "state_01"
    foreign.mkdir()
    (foreign / "data.parquet").write_bytes(b"user data")
    with pytest.raises(SpecError, match="not a censusdp output"):
        bench._remove_own(foreign)
    assert (foreign / "data.parquet").read_bytes() == b"user data"


def _apportion_slow(pop, seats):
    """Largest remainders by hand, one seat at a time, after one seat each."""
    n = len(pop)
    weights = pop if sum(pop) > 0 else [1] * n  # no people anywhere: equal shares
    quota = [(seats - n) * w / sum(weights) for w in weights]
    got = [int(np.floor(q)) for q in quota]
    left = seats - n - sum(got)
    order = sorted(range(n), key=lambda i: (-(quota[i] - got[i]), i))
    for i in order[:left]:
        got[i] += 1
    return [g + 1 for g in got]


@settings(max_examples=60, deadline=None)
@example(pop=[0], extra=2)  # every seat given when no state has people (hypothesis found it)
@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    st.integers(0, 40),
)
def test_apportion_matches_largest_remainders(pop, extra):
    seats = len(pop) + extra
    got = bench.apportion(np.array(pop, np.int64), seats)
    assert got.sum() == seats and got.min() >= 1
    assert got.tolist() == _apportion_slow(pop, seats)


def test_apportion_refuses_fewer_seats_than_states():
    with pytest.raises(SpecError, match="at least one per state"):
        bench.apportion(np.array([5, 6, 7]), 2)


@pytest.mark.parametrize("k", [1, 3, 7, 40])
def test_districts_are_whole_units_of_near_equal_population(k):
    t = synthetic_us(4, states=1, counties=5, tracts=30, block_groups=60, blocks=400,
                     population=20_000)  # fmt: skip
    h0 = t.hierarchy
    pop = t.leaf_counts[:, 0].astype(np.int64)
    h, lo = bench.state_hierarchy(h0, 0)
    assert lo == 0 and h == type(h).from_parents(
        list(h.names), [lv.codes for lv in h.levels], [lv.parent for lv in h.levels]
    )
    d = bench.district_assignment(h, pop, lo, k)
    level = next(lv for lv in ("county", "tract", "block_group", "block") if h[lv].size >= k)
    unit = h.ancestor_index("block", level)
    # whole units: every block of a unit is in the unit's district
    first = np.full(h[level].size, -1)
    first[unit[::-1]] = d[::-1]
    assert np.array_equal(first[unit], d)
    # each district's population is within one unit of an equal share (slow reference)
    upop = np.bincount(unit, weights=pop, minlength=h[level].size)
    share = pop.sum() / k
    for j in range(k):
        dp = pop[d == j].sum()
        assert abs(dp - share) <= upop.max() + 1e-9
    assert d.min() >= 0 and d.max() < k
    # the AIAN flags: the last county of a state with two or more counties
    flags = bench.aian_flags(h0)
    assert flags.tolist() == [False] * (h0["county"].size - 1) + [True]


def test_add_areas_equals_estimate_state_with_areas(tmp_path):
    """The public step the benchmark times apart is the one estimate_state runs (it now
    calls it): this guards the two entry points from drifting apart, bit for bit; the
    districts' values themselves are checked against the state total elsewhere here."""
    from censusdp.hierarchy.synthetic import pl94_histogram
    from censusdp.pipelines.io.nmf import collect_nmf
    from censusdp.pipelines.io.nmf_writer import simulate_nmf
    from censusdp.pipelines.products.nmf_release import FileNoise, add_areas, estimate_state
    from censusdp.rng import KeyedRNG

    t = synthetic_us(2, states=1, counties=3, tracts=5, block_groups=8, blocks=40,
                     population=2000)  # fmt: skip
    h = t.hierarchy
    block, cell, count = pl94_histogram(t, seed=2)
    aian = bench.aian_flags(h)
    subs = list(simulate_nmf(h, block, cell, count, evaluation_rng=KeyedRNG.reproducible(
        7, warn=False), aian_counties=aian, with_us=False))  # fmt: skip
    assert [s.subtree for s in subs] == ["001", "101"]
    m = collect_nmf(subs, {"01": int(count.sum())})
    d = bench.district_assignment(h, t.leaf_counts[:, 0], 0, 3)
    baf = tmp_path / "baf.csv"
    pd.DataFrame({"BLOCKID": np.asarray(h["block"].codes, dtype=object),
                  "DISTRICT": (d + 1).astype(str)}).to_csv(baf, index=False)  # fmt: skip
    one = estimate_state(m, areas=baf, area_column="DISTRICT", area_name="district")
    two = add_areas(estimate_state(m), baf, area_name="district")
    assert one.areas.codes.tolist() == two.areas.codes.tolist()
    for q in ("total", "hhgq"):
        assert np.array_equal(one.areas.query_estimates("district", q),
                              two.areas.query_estimates("district", q))  # fmt: skip
        assert np.array_equal(one.areas.query_variances("district", q),
                              two.areas.query_variances("district", q))  # fmt: skip
    assert np.array_equal(one.area_covariance, two.area_covariance)
    noise = FileNoise()
    noise.add(m.levels.values())
    assert noise.rho() == m.derived_rho() and noise.levels() == len(m.levels)
