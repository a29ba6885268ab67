"""Malformed specs and data files: exit status 2, a message naming what and where, and no
output left behind. Also the privatize command on the NHGIS under-1 file."""

from __future__ import annotations

import re
import textwrap

import pandas as pd
import pytest

from censusdp.app.cli import main

GOOD_DATA = "fips,pop\n01001,10\n01003,20\n02001,5\n02002,7\n"
GOOD = """
[data]
source = "csv"
path = "{data}"
cells = ["pop"]
[hierarchy]
levels = ["nation", "state", "county"]
codes = {{ state = "fips:2", county = "fips" }}
[privacy]
accounting = "pure"
epsilon = 1.0
level_shares = {{ state = 0.5, county = 0.5 }}
[queries]
state = ["detailed"]
county = ["detailed"]
[mechanism]
noise = "laplace"
allow_floating_point = true
[estimators]
run = ["gls"]
"""


def _case(spec_edit=None, data=GOOD_DATA, encoding="utf-8"):
    return (spec_edit or (lambda s: s), data, encoding)


CASES = {
    "unknown key": (
        _case(lambda s: s.replace("level_shares", "level_share")),
        ["privacy.level_share"],
    ),
    "unknown section": (_case(lambda s: s + "[extras]\nx = 1\n"), ["'extras'"]),
    "shares not summing to 1": (
        _case(lambda s: s.replace("county = 0.5 }", "county = 0.4 }")),
        ["privacy", "sum"],
    ),
    "negative epsilon": (
        _case(lambda s: s.replace("epsilon = 1.0", "epsilon = -1.0")),
        ["privacy.epsilon"],
    ),
    "unknown noise": (
        _case(lambda s: s.replace('"laplace"', '"cauchy"')),
        ["mechanism.noise", "cauchy"],
    ),
    "accounting mismatch": (_case(lambda s: s.replace('"laplace"', '"gaussian"')), ["gaussian"]),
    "invariant at unknown level": (
        _case(lambda s: s + '[invariants]\ntract = "total"\n'),
        ["tract"],
    ),
    "unknown estimator": (
        _case(lambda s: s.replace('["gls"]', '["magic"]')),
        ["estimators.run", "magic"],
    ),
    "lattice integers from a continuous law": (
        _case(lambda s: s.replace('run = ["gls"]', 'run = ["gls"]\ninteger = "lattice"')),
        ["estimators.integer", "laplace", "discrete_laplace"],
    ),
    "seed not an integer": (_case(lambda s: s + '[run]\nseed = "abc"\n'), ["run.seed"]),
    "unknown scheduler": (
        _case(lambda s: s + '[run]\nscheduler = "spark"\n'),
        ["run.scheduler", "spark"],
    ),
    "toml syntax error": (_case(lambda s: s.replace("[mechanism]", "[mechanism")), ["spec.toml"]),
    "query fixed by an invariant": (
        _case(lambda s: s + '[invariants]\nstate = "total"\n'),
        ["level 'state'", "fixed by the level's invariants"],
    ),
    "topdown without the root measured": (
        _case(lambda s: s.replace('["gls"]', '["topdown"]')),
        ["level 'nation'", "detailed"],
    ),
    "missing data file": (
        _case(lambda s: re.sub(r'path = ".*"', 'path = "nope.csv"', s)),
        ["nope.csv"],
    ),
    "missing cell column": (
        _case(lambda s: s.replace('cells = ["pop"]', 'cells = ["people"]')),
        ["people"],
    ),
    "missing code column": (
        _case(lambda s: s.replace('county = "fips"', 'county = "geoid"')),
        ["geoid"],
    ),
    "negative count": (_case(data=GOOD_DATA.replace("01003,20", "01003,-20")), ["row 2", "'pop'"]),
    "non-integer count": (
        _case(data=GOOD_DATA.replace("01003,20", "01003,2.5")),
        ["row 2", "'pop'"],
    ),
    "missing count": (_case(data=GOOD_DATA.replace("01003,20", "01003,")), ["row 2", "'pop'"]),
    "duplicate leaf": (_case(data=GOOD_DATA.replace("02002,7", "01001,7")), ["01001"]),
    "level that does not nest": (
        _case(
            lambda s: s.replace(
                'levels = ["nation", "state", "county"]',
                'levels = ["nation", "state", "county", "tract"]',
            ).replace(
                'codes = { state = "fips:2", county = "fips" }',
                'codes = { state = "st", county = "cty", tract = "tr" }',
            ),
            data="tr,cty,st,pop\nT1,C1,01,1\nT2,C1,02,2\n",
        ),
        ["'C1'", "county"],
    ),
    "wrong encoding": (
        _case(
            lambda s: s.replace('cells = ["pop"]', 'cells = ["pop"]\nencoding = "utf-8"'),
            data="fips,name,pop\n01001,Doña,10\n",
            encoding="latin-1",
        ),
        ["cannot decode", "latin-1"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_input_exits_2_names_the_problem_and_writes_nothing(name, tmp_path, capsys):
    (edit, data, encoding), expected = CASES[name]
    data_path = tmp_path / "data.csv"
    data_path.write_bytes(data.encode(encoding))
    spec = tmp_path / "spec.toml"
    spec.write_text(edit(textwrap.dedent(GOOD.format(data=data_path))), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["run", str(spec), "--out", str(out), "--seed", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("censusdp: error: ") or "censusdp: error: " in err
    for fragment in expected:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert not out.exists()
    assert not list(tmp_path.glob("out.censusdp-*")), "a temporary output was left behind"


def test_the_good_spec_runs(tmp_path, capsys):
    data_path = tmp_path / "data.csv"
    data_path.write_text(GOOD_DATA)
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(GOOD.format(data=data_path)))
    assert main(["run", str(spec), "--out", str(tmp_path / "out"), "--seed", "1"]) == 0
    assert (tmp_path / "out" / "evaluation" / "report.md").is_file()


def test_missing_spec_file_and_unknown_experiment_exit_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none.toml")]) == 2
    assert "none.toml" in capsys.readouterr().err
    assert main(["experiment", "no-such-study", "--out", str(tmp_path / "x")]) == 2
    assert "unknown experiment 'no-such-study'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_privatize_duplicate_gisjoin_exits_2(tmp_path, capsys):
    f = tmp_path / "in.csv"
    f.write_text(
        "gisjoin,H78003_dp,H78024_dp,H78003_sf,H78024_sf\nG0100010,1,1,1,1\nG0100010,2,2,2,2\n"
    )
    out = tmp_path / "o.csv"
    assert (
        main(["privatize", str(f), "--spec", "experiments/nhgis_under1.toml", "-o", str(out)]) == 2
    )
    assert "duplicate gisjoin 'G0100010'" in capsys.readouterr().err
    assert not out.exists()


def test_privatize_under1_file_keeps_rows_keys_and_state_sums(shared_file, tmp_path):
    src = shared_file("nhgis_ppdd_20200527_county_under1.csv")
    out = tmp_path / "OUT.csv"
    assert (
        main(
            [
                "privatize",
                str(src),
                "--spec",
                "experiments/nhgis_under1.toml",
                "-o",
                str(out),
                "--seed",
                "3",
            ]
        )
        == 0
    )
    got = pd.read_csv(out, dtype={"gisjoin": str})
    raw = pd.read_csv(src, dtype={"gisjoin": str})
    assert len(got) == 3221
    assert got[["gisjoin", "name", "state"]].equals(raw[["gisjoin", "name", "state"]])
    assert list(got.columns) == [
        "gisjoin",
        "name",
        "state",
        "H78003_dp",
        "H78003_se",
        "H78003_moe",
        "H78024_dp",
        "H78024_se",
        "H78024_moe",
    ]
    assert not got["H78003_dp"].equals(raw["H78003_dp"])  # our release replaced the Bureau's
    for code in ("H78003", "H78024"):
        ours = got.groupby("state")[f"{code}_dp"].sum()
        truth = raw.groupby("state")[f"{code}_sf"].sum()
        assert ours.equals(truth)  # state invariant, exactly
        # a county alone in its state is pinned by the state invariant: its SE is exactly 0
        alone = got.groupby("state")["state"].transform("size") == 1
        assert (got.loc[~alone, f"{code}_se"] > 0).all()
        assert (got.loc[alone, f"{code}_se"] == 0).all()
