"""Schemas: shipped TOML (pl94, ppdd, sex_age5), generated CENRACE, validation messages."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from schema_strategies import schemas

from censusdp.errors import SpecError
from censusdp.schema import Schema, available_schemas, omb_race_combinations

RACES = [
    "White",
    "Black or African American",
    "American Indian and Alaska Native",
    "Asian",
    "Native Hawaiian and Other Pacific Islander",
    "Some Other Race",
]


def test_shipped_schemas_load():
    assert {"pl94", "ppdd", "sex_age5"} <= set(available_schemas())
    assert Schema.load("pl94").shape == (8, 2, 2, 63)
    assert Schema.load("pl94").n_cells == 2016
    assert Schema.load("ppdd").shape == (8, 2, 23, 2, 63)
    assert Schema.load("sex_age5").shape == (2, 18)


def test_omb_combinations_in_census_order():
    combos = omb_race_combinations(RACES)
    assert len(combos) == 63
    assert [sum(len(c) == m for c in combos) for m in range(1, 7)] == [
        comb(6, m) for m in range(1, 7)
    ]
    # CENRACE 01-06 single races, 07 White+Black, 21 Asian+NHPI... 22 first triple, 63 all six
    assert combos[:6] == [(i,) for i in range(6)]
    assert combos[6] == (0, 1) and combos[20] == (4, 5) and combos[21] == (0, 1, 2)
    assert combos[62] == tuple(range(6))
    assert len(set(combos)) == 63


def test_pl94_recodes():
    s = Schema.load("pl94")
    hh = s.attribute("hhgq")
    assert hh.elements["hhinstlevels"].matrix.sum(axis=1).tolist() == [1, 4, 3]
    assert hh.elements["gqlevels"].matrix.tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 1, 1, 1],
    ]
    cr = s.attribute("cenrace")
    assert cr.labels[0] == "White alone"
    assert cr.labels[6] == "White; Black or African American"
    assert cr.labels[62] == "; ".join(RACES)
    assert cr.elements["race7"].matrix.sum(axis=1).tolist() == [1] * 6 + [57]
    assert cr.elements["numraces"].matrix.sum(axis=1).tolist() == [6, 15, 20, 15, 6, 1]
    for e in (cr.elements["race7"], cr.elements["numraces"], hh.elements["hhinstlevels"]):
        assert (e.matrix.sum(axis=0) == 1).all()  # partitions
    adult = s.attribute("votingage").elements["adult"]
    assert adult.kind == "slice" and adult.matrix.tolist() == [[0, 1]]


def test_ppdd_attributes():
    s = Schema.load("ppdd")
    age = s.attribute("age")
    assert age.labels[0] == "Under 5 years" and age.labels[-1] == "85 years and over"
    assert age.elements["votingage"].matrix.sum(axis=1).tolist() == [4, 19]
    assert age.elements["adult"].matrix.tolist() == [[0] * 4 + [1] * 19]
    assert s.n_cells == 46368


def test_sex_age5_cells_are_the_csv_columns():
    s = Schema.load("sex_age5")
    cells = s.cells
    assert (
        len(cells) == 36 and cells[0] == "M_0-4" and cells[17] == "M_85+" and cells[18] == "F_0-4"
    )


@pytest.mark.shared
def test_sex_age5_matches_shared_header(shared_file):
    import pandas as pd

    cols = pd.read_csv(shared_file("county_sex_age5_2010.csv"), nrows=0).columns[3:]
    assert tuple(cols) == Schema.load("sex_age5").cells


def test_flat_schema_and_resolve():
    s = Schema.flat(["a", "b", "c"])
    assert s.shape == (3,) and s.cells == ("a", "b", "c")
    assert s.resolve("detailed")[0].is_detailed and s.resolve("total")[0].is_all
    assert s.resolve("cell")[0].is_detailed
    pl = Schema.load("pl94")
    f = pl.resolve("cenrace * votingage")
    assert [e.name for e in f] == ["all", "votingage", "all", "cenrace"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("race", "unknown query element 'race'"),
        ("cenrace * race7", "two elements of attribute 'cenrace'"),
        ("votingage * ", "term ''"),
        ("total * hhgq", "term 'total'"),
    ],
)
def test_resolve_errors(text, needle):
    with pytest.raises(SpecError, match=needle.replace("*", r"\*")):
        Schema.load("pl94").resolve(text)


BAD = {
    "overlap": ('[attributes.recodes.groups]\n"A" = ["x", "y"]\n"B" = ["y", "z"]\n', "two groups"),
    "missing": ('[attributes.recodes.groups]\n"A" = ["x", "y"]\n', "in no group"),
    "unknown_member": (
        '[attributes.recodes.groups]\n"A" = ["x", "q"]\n"B" = ["y", "z"]\n',
        "'q' is not a row",
    ),
    "not_coarser": (
        '[attributes.recodes.groups]\n"A" = ["x"]\n"B" = ["y"]\n"C" = ["z"]\n',
        "not coarser",
    ),
    "bad_of": (
        'of = "nothing"\n[attributes.recodes.groups]\n"A" = ["x", "y", "z"]\n',
        "'of' = 'nothing'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_validation_errors_name_file_attribute_recode(tmp_path, case):
    body, needle = BAD[case]
    p = tmp_path / "mine.toml"
    p.write_text(
        'name = "mine"\n[[attributes]]\nname = "colour"\nlabels = ["x", "y", "z"]\n'
        f'[[attributes.recodes]]\nname = "shade"\n{body}'
    )
    with pytest.raises(SpecError) as e:
        Schema.load(p)
    msg = str(e.value)
    assert (
        str(p) in msg and "attribute 'colour'" in msg and "recode 'shade'" in msg and needle in msg
    )


def test_validation_other_errors(tmp_path):
    base = {"name": "s", "attributes": [{"name": "a", "labels": ["x", "y"]}]}
    with pytest.raises(SpecError, match="reserved"):
        Schema.from_dict({"name": "s", "attributes": [{"name": "total", "labels": ["x"]}]})
    with pytest.raises(SpecError, match="already used by attribute 'a'"):
        Schema.from_dict(
            {
                "name": "s",
                "attributes": [
                    *base["attributes"],
                    {"name": "b", "labels": ["u", "v"], "slices": [{"name": "a", "groups": ["u"]}]},
                ],
            }
        )
    with pytest.raises(SpecError, match="duplicate labels"):
        Schema.from_dict({"name": "s", "attributes": [{"name": "a", "labels": ["x", "x"]}]})
    with pytest.raises(SpecError, match="slice 'y2'.*keeps every row"):
        Schema.from_dict(
            {
                "name": "s",
                "attributes": [
                    {
                        "name": "a",
                        "labels": ["x", "y"],
                        "slices": [{"name": "y2", "groups": ["x", "y"]}],
                    }
                ],
            }
        )
    with pytest.raises(SpecError, match="unknown key 'colour'"):
        Schema.from_dict({**base, "colour": 1})
    with pytest.raises(SpecError, match="not a shipped schema"):
        Schema.load("no_such_schema")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(SpecError, match="bad.toml: not valid TOML"):
        Schema.load(bad)


@settings(max_examples=100, deadline=None)
@given(schemas())
def test_random_recodes_nest_and_partition(s):
    for a in s.attributes:
        for e in a.elements.values():
            m = e.matrix
            assert m.shape == (e.n_rows, a.size)
            assert set(np.unique(m)) <= {0, 1}
            if e.kind in ("detailed", "recode", "all"):
                assert (m.sum(axis=0) == 1).all()
            else:
                assert (m.sum(axis=0) <= 1).all() and m.any(axis=1).all()
            if e.parent is not None:  # every row is a union of the parent's rows
                p = a.elements[e.parent].matrix
                overlap = m @ p.T
                assert ((overlap == 0) | (overlap == p.sum(axis=1)[None, :])).all()
