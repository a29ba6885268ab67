"""Privacy from the geography of the rows (issue 33, item 1).

An NHGIS file may hold rows of several summary levels (counties *and* the places in them):
a person is then counted in one row of each, and the per-person privacy loss is the
composition over those levels, not the loss of one row. Each row's level is told from its
GISJOIN (and, where lengths are shared, from GEO_ID or the NHGIS identifier columns or a
declared level); a file whose levels cannot be told is refused.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ppdd_fixtures import IL_COUNTIES_AND_PLACES, IL_PLACEA, SHARES, hand_rho, ppdd_file

from censusdp.app.cli import main
from censusdp.budget import ZCDP, PureDP
from censusdp.errors import DataError
from censusdp.hierarchy import gisjoin
from censusdp.hierarchy.gisjoin import LAYOUTS, RowLevels, row_levels
from censusdp.pipelines.io.codebook import Codebook
from censusdp.pipelines.io.nhgis import read_batch, row_geography
from censusdp.pipelines.products.codebook_tables import compose_over_levels


# ------------------------------------------------------------------------- the layouts
def test_code_lengths_are_nhgis_s():
    """Place 9 characters (G + state + pad + 5-digit place: Chicago is G17014000 in NHGIS
    place files), county 8, state 4; a place shares its length with the three school district
    levels and nothing else, an upper with a lower legislative district."""
    length = {lay.level: lay.length for lay in LAYOUTS}
    assert length["state"] == 4 and length["county"] == 8 and length["place"] == 9
    assert length["tract"] == 14 and length["cousub"] == 13 and length["aianhh"] == 5
    got = gisjoin.parse(["G17014000"], "place")
    assert got["state"].tolist() == ["17"] and got["place"].tolist() == ["14000"]
    assert {lay.level for lay in gisjoin.identify("G17014000")} == {
        "place",
        "sdelm",
        "sdsec",
        "sduni",
    }
    assert [lay.level for lay in gisjoin.identify("G1700310")] == ["county"]
    assert {lay.level for lay in gisjoin.identify("G17001A")} == {"sldu", "sldl"}
    shared = {}
    for lay in LAYOUTS:
        shared.setdefault(lay.length, []).append(lay.level)
    assert {n: v for n, v in shared.items() if len(v) > 1} == {
        9: ["place", "sdelm", "sdsec", "sduni"],
        7: ["sldu", "sldl"],
    }
    # every SUMLEV code names one level, and the Bureau's usual codes are there
    assert gisjoin.declared_layout("160").level == "place"
    assert gisjoin.declared_layout(50).level == "county"
    assert gisjoin.declared_layout("040").level == "state"
    assert gisjoin.declared_layout("BLCK_GRP").level == "block_group"
    assert gisjoin.declared_layout("310") is None and gisjoin.declared_layout("zip") is None


EXAMPLES = {
    "state": "G170",
    "county": "G1700310",
    "cousub": "G170031014000",
    "tract": "G1700310010100",
    "block_group": "G17003100101001",
    "block": "G17003100101001000",
    "aianhh": "G0010",
    "cd": "G06034",
}


def test_levels_told_by_length_alone():
    got = row_levels(list(EXAMPLES.values()))
    assert got.level.tolist() == list(EXAMPLES)
    assert got.state.tolist() == ["17"] * 6 + [None, "06"]
    assert got.basis == "GISJOIN layout"
    assert got.counts() == dict.fromkeys(EXAMPLES, 1)


def test_shared_lengths_told_by_identifier_columns():
    codes = ["G1700310", "G17014000", "G17099999", "G17088888", "G17001A", "G17002B"]
    ids = {
        "placea": ("PLACEA", ["", "14000", None, "", "", ""]),
        "sdunia": ("SDUNIA", [None, "", "99999", "", "", ""]),
        "sdelma": ("SDELMA", ["", "", "", "88888", "", ""]),
        "sldua": ("SLDUA", ["", "", "", "", "1A", ""]),  # leading zeros lost: padded back
        "sldla": ("SLDLA", ["", "", "", "", "", "02B"]),
    }
    got = row_levels(codes, identifiers=ids)
    assert got.level.tolist() == ["county", "place", "sduni", "sdelm", "sldu", "sldl"]
    assert got.basis == "GISJOIN layout and NHGIS identifier columns"
    # an identifier holding another area's code does not claim the row
    ids["placea"] = ("PLACEA", ["", "14001", None, "", "", ""])
    with pytest.raises(DataError, match=r"data row 2, column 'gisjoin': .*'G17014000'"):
        row_levels(codes, identifiers=ids)


def test_geo_id_summary_levels():
    codes = ["G1700310", "G17014000", "G170"]
    got = row_levels(codes, geoid=("GEO_ID", ["0500000US17031", "1600000US1714000", "0400000US17"]))
    assert got.level.tolist() == ["county", "place", "state"]
    assert got.basis == "GEO_ID summary levels"
    acs = row_levels(codes, geoid=("GEOID", ["05000US17031", "16000US1714000", "04000US17"]))
    assert acs.level.tolist() == ["county", "place", "state"]
    # a bare FIPS GEOID says nothing of the level: lengths decide, and a 9-character code
    # stays unknown
    with pytest.raises(DataError, match="'G17014000' cannot be told"):
        row_levels(codes, geoid=("GEOID", ["17031", "1714000", "17"]))
    with pytest.raises(DataError, match=r"data row 2, column 'gisjoin': 'G17014000' is not a "):
        row_levels(codes, geoid=("GEO_ID", ["0500000US17031", "0500000US17014", "0400000US17"]))
    with pytest.raises(DataError, match=r"column 'GEO_ID': summary level 310 .* none of"):
        row_levels(codes, geoid=("GEO_ID", ["0500000US17031", "3100000US16980", "0400000US17"]))


def test_declared_levels():
    codes = ["G1700310", "G17014000"]
    got = row_levels(codes, declared=["050", "place"], declared_column="SUMLEV")
    assert got.level.tolist() == ["county", "place"]
    assert got.basis == "declared in column 'SUMLEV'"
    assert row_levels(["G17014000"], declared="160").level.tolist() == ["place"]
    assert row_levels(["G17014000"], declared="sduni").level.tolist() == ["sduni"]
    with pytest.raises(
        DataError, match=r"data row 1, column 'gisjoin': 'G1700310' is not .*'place'"
    ):
        row_levels(codes, declared="place")
    with pytest.raises(DataError, match=r"data row 2: column 'SUMLEV' holds '999', which is no"):
        row_levels(codes, declared=["050", "999"], declared_column="SUMLEV")


def test_refusals_are_one_line_and_say_how_to_declare():
    for codes in (["G1700310", "G17014000"], ["G1700310", "county 31"]):
        with pytest.raises(DataError) as info:
            row_levels(codes, source="f.csv", rows=np.array([3, 7]))
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith("f.csv, data row 8, column 'gisjoin':")
        assert "other rows include county" in msg and "level_column" in msg


# ------------------------------------------- fast vs slow reference (hypothesis): levels
def _random_code(draw, lay) -> str:
    out = "G"
    for p in lay.parts:
        if p.name == "pad":
            out += "0"
        else:
            alphabet = "0123456789ABZ" if p.letters else "0123456789"
            out += "".join(
                draw(st.lists(st.sampled_from(alphabet), min_size=p.width, max_size=p.width))
            )
    return out


@st.composite
def files(draw):
    n = draw(st.integers(1, 8))
    lays = draw(st.lists(st.sampled_from(LAYOUTS), min_size=n, max_size=n))
    codes = [_random_code(draw, lay) for lay in lays]
    if draw(st.integers(0, 3)) == 0:
        codes[0] = draw(st.sampled_from(["", "X", "G1", "G17014000Z"]))
    every = [lay.identifier for lay in LAYOUTS]
    present = set(every) if draw(st.booleans()) else draw(st.sets(st.sampled_from(every)))
    ids = {}
    for ident in sorted(present):
        vals = []
        for lay, code in zip(lays, codes, strict=True):
            mode = draw(st.sampled_from(["own", "own", "own", "empty", "other"]))
            own = (
                code[len(code) - _own_width(lay) - (1 if lay.parts[-1].name == "pad" else 0) :][
                    : _own_width(lay)
                ]
                if lay.identifier == ident
                else None
            )
            if mode == "own" and own is not None:
                vals.append(own.lstrip("0") if draw(st.booleans()) else own)
            elif mode == "other":
                vals.append("7")
            else:
                vals.append(draw(st.sampled_from(["", None])))
        ids[ident] = (ident.upper(), vals)
    return codes, ids


def _own_width(lay) -> int:
    return [p for p in lay.parts if p.name != "pad"][-1].width


def _reference(codes, ids) -> list[str | None]:
    """Row by row, obviously: the layouts whose regular expression the code matches; one
    → that level; several → the one whose identifier column holds the code's own field."""
    out = []
    for i, code in enumerate(codes):
        fits = [lay for lay in LAYOUTS if re.fullmatch(lay.pattern[1:-1], code or "")]
        if len(fits) == 1:
            out.append(fits[0].level)
            continue
        claims = []
        for lay in fits:
            if lay.identifier not in ids:
                continue
            v = ids[lay.identifier][1][i]
            w = _own_width(lay)
            fields = [p for p in lay.parts if p.name != "pad"]
            start = 1
            for p in lay.parts:
                if p is fields[-1]:
                    break
                start += p.width
            if v not in (None, "") and str(v).strip().zfill(w) == code[start : start + w]:
                claims.append(lay.level)
        out.append(claims[0] if len(claims) == 1 and len(fits) > 1 else None)
    return out


@settings(max_examples=150, deadline=None)
@given(files())
def test_row_levels_equal_the_row_by_row_reference(case):
    codes, ids = case
    ref = _reference(codes, ids)
    if None in ref:
        first = ref.index(None)
        with pytest.raises(DataError, match=rf"data row {first + 1}, column 'gisjoin'"):
            row_levels(codes, identifiers=ids)
        return
    got = row_levels(codes, identifiers=ids)
    assert got.level.tolist() == ref
    states = [
        c[1:3] if "state" in gisjoin.layout(lv).fields else None
        for c, lv in zip(codes, ref, strict=True)
    ]
    assert got.state.tolist() == states


# ------------------------------------------------------------------------ composition
def _levels(pairs: list[tuple[str, str | None]]) -> RowLevels:
    level = np.array([lv for lv, _ in pairs], dtype=object)
    state = np.array([s for _, s in pairs], dtype=object)
    return RowLevels(level, state, "test")


def test_composition_by_hand():
    rho = 0.25
    z = {lv: ZCDP(rho) for lv in ("state", "county", "place", "aianhh")}
    # counties and the places of one state: a person in a place is in two rows
    loss, state, worst = compose_over_levels(
        _levels([("county", "17"), ("county", "17"), ("place", "17")]), z
    )
    assert loss == ZCDP(rho + rho) and state == "17" and worst == ("county", "place")
    # a state and its counties; a county of another state adds nothing to the worst person
    loss, state, worst = compose_over_levels(
        _levels([("state", "17"), ("county", "17"), ("county", "06")]), z
    )
    assert loss == ZCDP(2 * rho) and state == "17" and worst == ("state", "county")
    # counties of one state, places of another: no person is in both
    loss, _, worst = compose_over_levels(_levels([("county", "17"), ("place", "06")]), z)
    assert loss == ZCDP(rho) and len(worst) == 1
    # AIAN areas cross states: they may share a person with any level
    loss, _, worst = compose_over_levels(
        _levels([("county", "17"), ("place", "06"), ("aianhh", None)]), z
    )
    assert loss == ZCDP(2 * rho) and "aianhh" in worst
    loss, state, worst = compose_over_levels(_levels([("aianhh", None)] * 3), z)
    assert loss == ZCDP(rho) and state is None and worst == ("aianhh",)
    # pure DP: ε adds; pure with zCDP: ε²/2 + ρ (Bun & Steinke 2016, Prop. 1.4, Lemma 2.3)
    pure = {"county": PureDP(0.5), "place": PureDP(0.25)}
    loss, _, _ = compose_over_levels(_levels([("county", "17"), ("place", "17")]), pure)
    assert loss == PureDP(0.75)
    mixed = {"county": PureDP(0.5), "place": ZCDP(0.1)}
    loss, _, _ = compose_over_levels(_levels([("county", "17"), ("place", "17")]), mixed)
    assert isinstance(loss, ZCDP) and math.isclose(loss.rho, 0.5**2 / 2 + 0.1)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["state", "county", "place", "sduni", "aianhh"]),
            st.sampled_from(["01", "06", "17"]),
        ),
        min_size=1,
        max_size=10,
    ),
    st.lists(st.floats(0.01, 2.0), min_size=5, max_size=5),
)
def test_composition_equals_the_worst_person(rows, amounts):
    """Reference: a person living in state s is in at most one row per level, and can be in
    a row of level L exactly when L has a row in s or a row that crosses states; their loss
    is the sum over those levels; the statement is the worst such person."""
    pairs = [(lv, None if lv == "aianhh" else s) for lv, s in rows]
    per = dict(zip(["state", "county", "place", "sduni", "aianhh"], amounts, strict=True))
    worst = 0.0
    for s in ["01", "06", "17", "99"]:
        levels_in = {lv for lv, st_ in pairs if st_ in (s, None)}
        worst = max(worst, math.fsum(per[lv] for lv in levels_in))
    loss, _, _ = compose_over_levels(_levels(pairs), {k: ZCDP(v) for k, v in per.items()})
    assert math.isclose(loss.rho, worst, rel_tol=1e-12)


# ------------------------------------------------------------------- the codebook route
@pytest.fixture(scope="module")
def ppdd() -> Codebook:
    return Codebook.load("ppdd")


def _privatize(src: Path, out: Path, rho: float, *extra: str) -> int:
    argv = ["privatize", str(src), "--codebook", "ppdd", "--rho", str(rho), "-o", str(out)]
    return main([*argv, *extra, "--seed", "3"])


def test_counties_and_places_of_one_state_compose(tmp_path, ppdd, capsys):
    """Acceptance: the audit's file — counties of Illinois and places in them, PLACEA filled
    for the places. A person in a place is in two rows: the statement's ρ is twice one
    row's, computed here from the shares by hand (the audit's 0.204795 → 0.40959)."""
    src = ppdd_file(tmp_path / "il.csv", ppdd, IL_COUNTIES_AND_PLACES, PLACEA=IL_PLACEA)
    out = tmp_path / "rel.csv"
    assert _privatize(src, out, 0.2048) == 0
    printed = capsys.readouterr().out
    one = hand_rho(SHARES, 0.2048)
    assert f"{one:.6g}" == "0.204795"
    assert f"differential privacy, ρ = {one + one:g} (zCDP)" in printed
    assert f"ρ = {one:.6g} + {one:.6g} = {one + one:.6g}" in printed
    side = json.loads((tmp_path / "rel.csv.censusdp.json").read_text())
    assert math.isclose(side["rho_derived"], one + one, rel_tol=1e-12)
    assert math.isclose(side["rho_per_row"], one, rel_tol=1e-12)
    assert side["privacy_statement"]["rho"] == side["rho_derived"]
    assert side["geography"]["levels"] == {"county": 3, "place": 2}
    assert side["geography"]["person_groups"] == [{"state": "17", "levels": ["county", "place"]}]
    assert list(pd.read_csv(out, dtype=str)["gisjoin"]) == IL_COUNTIES_AND_PLACES


def test_counties_and_places_without_identifiers_refused(tmp_path, ppdd, capsys):
    """Without PLACEA nothing tells a 9-character place from a school district: refused
    before any noise, exit 2, nothing written, one line saying how to declare the level;
    a spec's level column then makes it run, with the same composition."""
    src = ppdd_file(tmp_path / "il.csv", ppdd, IL_COUNTIES_AND_PLACES)
    out = tmp_path / "rel.csv"
    assert _privatize(src, out, 0.5) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data row 4, column 'gisjoin': the summary level of 'G17014000' cannot be told" in err
    assert "other rows include county" in err and 'level_column = "COLUMN"' in err
    assert not out.exists() and not (tmp_path / "rel.csv.censusdp.json").exists()
    src = ppdd_file(
        tmp_path / "il2.csv", ppdd, IL_COUNTIES_AND_PLACES, SUMLEV=["050"] * 3 + ["160"] * 2
    )
    spec = tmp_path / "s.toml"
    spec.write_text(
        textwrap.dedent(
            """
            [data]
            source = "nhgis"
            codebook = "ppdd"
            level_column = "SUMLEV"
            [privacy]
            accounting = "zcdp"
            rho = 0.5
            """
        )
    )
    argv = ["privatize", str(src), "--spec", str(spec), "-o", str(out), "--seed", "2"]
    assert main(argv) == 0
    one = hand_rho(SHARES, 0.5)
    assert f"ρ = {2 * one:g} (zCDP)" in capsys.readouterr().out
    side = json.loads((tmp_path / "rel.csv.censusdp.json").read_text())
    assert side["geography"]["told_from"] == "declared in column 'SUMLEV'"


def test_states_and_counties_compose(tmp_path, ppdd, capsys):
    """Acceptance: Illinois and California state rows with Illinois counties. A person in
    Illinois is in its state row and in one county row: twice one row's ρ; Californians
    are in one row only, so the worst person is an Illinoisan."""
    codes = ["G170", "G060", "G1700310", "G1700430"]
    src = ppdd_file(tmp_path / "sc.csv", ppdd, codes)
    out = tmp_path / "rel.csv"
    assert _privatize(src, out, 1.0) == 0
    one = hand_rho(SHARES, 1.0)
    assert f"differential privacy, ρ = {2 * one:g} (zCDP)" in capsys.readouterr().out
    side = json.loads((tmp_path / "rel.csv.censusdp.json").read_text())
    assert math.isclose(side["rho_derived"], 2 * one, rel_tol=1e-12)
    assert side["geography"]["person_groups"] == [
        {"state": "06", "levels": ["state"]},
        {"state": "17", "levels": ["state", "county"]},
    ]


def test_one_level_keeps_one_rows_rho(tmp_path, ppdd):
    """Power of the checks above: a file of counties only (two states) is one row per
    person, and the derived ρ is one row's — the composition is not a blanket multiplier."""
    src = ppdd_file(tmp_path / "c.csv", ppdd, ["G1700310", "G1700430", "G0600010"])
    levels = row_geography(read_batch(src))
    assert levels.levels == ("county",)
    loss, _, worst = compose_over_levels(levels, {"county": ZCDP(0.3)})
    assert loss == ZCDP(0.3) and worst == ("county",)


def test_declared_level_in_spec_is_checked(tmp_path):
    from censusdp.errors import SpecError
    from censusdp.pipelines.products.codebook_tables import load_table_spec

    spec = tmp_path / "s.toml"
    body = '[data]\nsource = "nhgis"\ncodebook = "ppdd"\n{extra}\n[privacy]\naccounting = "zcdp"\nrho = 1\n'
    spec.write_text(body.format(extra='level = "zip"'))
    with pytest.raises(SpecError, match=r"data.level.*'zip' is no summary level"):
        load_table_spec(spec)
    spec.write_text(body.format(extra='level = "160"\nlevel_column = "SUMLEV"'))
    with pytest.raises(SpecError, match="not both"):
        load_table_spec(spec)
    spec.write_text(body.format(extra='level = "place"'))
    assert load_table_spec(spec).level == "place"


# ------------------------------------------------------------------ the spec (cells) route
CELLS_SPEC = """
[data]
source = "nhgis"
cells = ["H78003", "H78024"]
[hierarchy]
levels = ["nation", "state", "county"]
[privacy]
accounting = "zcdp"
rho = 0.5
[queries]
state = ["total"]
county = ["total", "detailed"]
[privacy.level_shares]
state = 0.25
county = 0.75
[privacy.query_shares]
state = { total = 1.0 }
county = { total = 0.5, detailed = 0.5 }
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = ["gls"]
integer = "round"
"""


def _cells_file(path: Path, codes: list[str], male: list[int], female: list[int]) -> Path:
    df = pd.DataFrame({"gisjoin": codes, "name": [f"Area {i}" for i in range(len(codes))]})
    df["H78003_sf"], df["H78024_sf"] = male, female
    df.to_csv(path, index=False)
    return path


def test_spec_route_nested_rows_are_hierarchy_nodes(tmp_path, capsys):
    """The hierarchy route: state rows beside their county rows are the hierarchy's state
    nodes, released from its state level (one measurement set per level, composed by the
    spec's budget: the statement's ρ is the spec's); each released state row is the sum of
    its released counties, exactly. A state row that is not the sum of its counties in the
    file, or a place among counties, is refused before any noise."""
    spec = tmp_path / "s.toml"
    spec.write_text(CELLS_SPEC)
    codes = ["G1700310", "G170", "G1700430", "G0600010", "G060", "G0600030"]
    male, female = [10, 30, 20, 5, 12, 7], [1, 3, 2, 4, 4, 0]
    src = _cells_file(tmp_path / "sc.csv", codes, male, female)
    out = tmp_path / "o.csv"
    assert main(["privatize", str(src), "--spec", str(spec), "-o", str(out), "--seed", "4"]) == 0
    # by hand: each person is in one state and one county node; the levels' ρ add
    hand = 0.5 * 0.25 * 1.0 + 0.5 * 0.75 * (0.5 + 0.5)
    assert f"differential privacy, ρ = {hand:g} (zCDP)" in capsys.readouterr().out
    rel = pd.read_csv(out, dtype={"gisjoin": str}).set_index("gisjoin")
    assert list(rel.index) == codes
    for state, counties in (("G170", ["G1700310", "G1700430"]), ("G060", ["G0600010", "G0600030"])):
        for c in ("H78003_dp", "H78024_dp"):
            assert rel.loc[state, c] == rel.loc[counties, c].sum()
    assert (rel["H78003_se"] > 0).all()
    # Illinois' row counts one more boy than its counties: not the hierarchy's node
    bad = _cells_file(tmp_path / "bad.csv", codes, [10, 31, 20, 5, 12, 7], female)
    out2 = tmp_path / "o2.csv"
    assert main(["privatize", str(bad), "--spec", str(spec), "-o", str(out2)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data row 2: the state row 'G170' is not the sum of the county rows under it" in err
    assert not out2.exists()
    # a place among counties is no node of state → county
    place = _cells_file(tmp_path / "pl.csv", [*codes, "G17014000"], [*male, 1], [*female, 1])
    assert main(["privatize", str(place), "--spec", str(spec), "-o", str(out2)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data row 7" in err and "'G17014000'" in err and "mixes summary levels" in err
    assert not out2.exists()


# ---------------------------------------------------------------------------- real data
@pytest.mark.shared
def test_real_files_are_of_one_level(shared_file):
    """The real AIANHH file: 692 AIAN areas (5-character codes), one group crossing states;
    the real under-1 county file: 3,221 counties, one group per state — one row per person
    in both, so their ρ is one row's."""
    aian = row_geography(read_batch(shared_file("nhgis_ppdd_20200527_aianhh.csv")))
    assert aian.counts() == {"aianhh": 692} and aian.person_groups() == [(None, ("aianhh",))]
    county = row_geography(read_batch(shared_file("nhgis_ppdd_20200527_county_under1.csv")))
    groups = county.person_groups()
    assert county.counts() == {"county": 3221} and len(groups) == 52
    assert {lv for _, lv in groups} == {("county",)}


@pytest.mark.shared
def test_real_counties_with_their_states(tmp_path, shared_file, capsys):
    """The real under-1 county file with the 52 state rows added (each the sum of its
    counties, code G + state + 0): every person is in two rows. Composed as separate row
    sets, ρ doubles; through the hierarchy route the state rows are its state nodes — held
    invariant by the spec, released exactly and equal to the sum of their released
    counties — and a state row that is not its counties' sum is refused."""
    src = shared_file("nhgis_ppdd_20200527_county_under1.csv")
    df = pd.read_csv(src, dtype=str, encoding="latin-1")
    sf = df[["H78003_sf", "H78024_sf"]].astype(np.int64)
    st_code = df["gisjoin"].str[1:3]
    states = sf.groupby(st_code).sum()
    states_df = pd.DataFrame(
        {
            "gisjoin": "G" + states.index + "0",
            "name": "state " + states.index,
            "state": "",
            "H78003_dp": states["H78003_sf"].to_numpy(),
            "H78024_dp": states["H78024_sf"].to_numpy(),
            "H78003_sf": states["H78003_sf"].to_numpy(),
            "H78024_sf": states["H78024_sf"].to_numpy(),
        }
    )
    mixed = pd.concat([states_df, df], ignore_index=True)
    path = tmp_path / "mixed.csv"
    mixed.to_csv(path, index=False)
    levels = row_geography(read_batch(path))
    assert levels.counts() == {"state": 52, "county": 3221}
    assert {lv for _, lv in levels.person_groups()} == {("state", "county")}
    loss, _, _ = compose_over_levels(levels, {"state": ZCDP(0.25), "county": ZCDP(0.25)})
    assert loss == ZCDP(0.5)
    spec = Path(__file__).parents[2] / "experiments" / "nhgis_under1.toml"
    out = tmp_path / "o.csv"
    assert main(["privatize", str(path), "--spec", str(spec), "-o", str(out)]) == 0
    assert "state: detailed" in capsys.readouterr().out
    rel = pd.read_csv(out, dtype={"gisjoin": str})
    assert len(rel) == 52 + 3221 and list(rel["gisjoin"]) == list(mixed["gisjoin"])
    is_state = rel["gisjoin"].str.len() == 4
    for c in ("H78003", "H78024"):
        assert (rel.loc[is_state, f"{c}_dp"].to_numpy() == states[f"{c}_sf"].to_numpy()).all()
        by_state = rel.loc[~is_state].groupby(rel.loc[~is_state, "gisjoin"].str[1:3])[f"{c}_dp"]
        assert (by_state.sum().to_numpy() == rel.loc[is_state, f"{c}_dp"].to_numpy()).all()
    mixed.loc[13, "H78024_sf"] = str(int(mixed.loc[13, "H78024_sf"]) + 1)  # Illinois
    mixed.to_csv(path, index=False)
    out2 = tmp_path / "o2.csv"
    assert main(["privatize", str(path), "--spec", str(spec), "-o", str(out2)]) == 2
    assert "the state row 'G170' is not the sum" in capsys.readouterr().err
    assert not out2.exists()
