"""Acceptance on the real 2010 county and Massachusetts county-subdivision files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.hierarchy import Table, add_level, from_gisjoin, validate

pytestmark = pytest.mark.shared

VERSIONS = ["pop_sf2010", "pop_ddp_20191029", "pop_ppdd_20200527"]


def test_cli_describe_counties(shared_file, capsys):
    path = shared_file("county_totalpop_2010.csv")
    argv = ["hierarchy", "describe", str(path), "--level", "state=state_fips"]
    assert main([*argv, "--level", "county=fips", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [lv["nodes"] for lv in d["levels"]] == [1, 52, 3221]
    assert d["levels"][1]["fanout"]["max"] == 254  # Texas


def test_state_and_illinois_sums(shared_file):
    path = shared_file("county_totalpop_2010.csv")
    df = pd.read_csv(path, dtype={"fips": str, "state_fips": str, "county_fips": str})
    t = Table.from_frame(
        df, [("state", "state_fips"), ("county", "fips")], VERSIONS, source=path.name
    )
    validate(t.hierarchy, nesting="prefix")
    h = t.hierarchy
    states = t.level_counts("state")
    not_pr = h["state"].codes != "72"
    assert int(not_pr.sum()) == 51
    assert states[not_pr].sum(axis=0).tolist() == [308_745_538] * 3
    assert (states == states[:, :1]).all()  # state totals invariant across versions
    il = int(np.flatnonzero(h["state"].codes == "17")[0])
    lo, hi = h.descendant_range("state", il, "county")
    assert hi - lo == 102
    assert states[il].tolist() == [12_830_632] * 3
    assert t.leaf_counts[lo:hi, 0].sum() == 12_830_632
    cook = int(np.flatnonzero(h["county"].codes == "17031")[0])
    assert t.leaf_counts[cook, 0] == 5_194_675


def test_ma_county_subdivisions_as_fourth_level(shared_file):
    counties = pd.read_csv(shared_file("county_sex_age5_2010.csv"), dtype={"fips": str})
    cousubs = pd.read_csv(shared_file("ma_cousub_sex_age5_2010.csv"))
    counties = counties[(counties["version"] == "sf2010") & counties["fips"].str.startswith("25")]
    cousubs = cousubs[cousubs["version"] == "sf2010"].reset_index(drop=True)
    cells = [c for c in counties.columns if c[:2] in ("M_", "F_")]
    assert len(cells) == 36

    # nation → state → county from the county table's GISJOIN codes
    h3, county_row = from_gisjoin(counties["gisjoin"], ("state", "county"))
    county_counts = counties[cells].to_numpy(np.int64)[county_row]
    t3 = Table(h3, tuple(cells), county_counts)
    assert h3.sizes == (1, 1, 14)
    before = t3.all_levels()

    # county subdivisions become a fourth level under the counties
    added = add_level(h3, "cousub", cousubs["county_gisjoin"], cousubs["gisjoin"])
    h4 = added.hierarchy
    assert h4.names == ("nation", "state", "county", "cousub")
    assert h4.sizes == (1, 1, 14, len(cousubs))
    validate(h4, nesting="prefix")
    for k in range(3):
        assert np.array_equal(added.order[k], np.arange(h3.levels[k].size))
    t4 = Table(h4, tuple(cells), cousubs[cells].to_numpy(np.int64)[added.order[-1]])

    # the subdivisions add up to the county table, cell by cell, and nothing above changes
    after = t4.all_levels()
    for k in range(3):
        assert np.array_equal(after[k], before[k])
    assert np.array_equal(t4.level_counts("county"), county_counts)

    # the same tree straight from the subdivision GISJOIN codes
    direct, _ = from_gisjoin(cousubs["gisjoin"], ("state", "county", "cousub"))
    assert direct == h4
