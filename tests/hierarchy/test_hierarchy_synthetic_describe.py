"""synthetic_us (small sizes) and describe / `censusdp hierarchy describe`."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.hierarchy import Hierarchy, describe, from_columns, synthetic_us, validate

SMALL = dict(states=6, counties=40, tracts=400, blocks=40_000, population=2_000_000)


@pytest.fixture(scope="module")
def small():
    return synthetic_us(11, **SMALL)


def test_synthetic_shape_codes_and_nesting(small):
    h = small.hierarchy
    assert h.names == ("nation", "state", "county", "tract", "block")
    assert h.sizes == (1, 6, 40, 400, 40_000)
    assert small.cells == ("population",)
    for name, width in [("state", 2), ("county", 5), ("tract", 11), ("block", 15)]:
        assert set(np.strings.str_len(h[name].codes).tolist()) == {width}
    validate(h, nesting="prefix")
    assert (small.leaf_counts >= 0).all()


def test_synthetic_populations_are_heavy_tailed(small):
    pop = small.leaf_counts[:, 0]
    total = int(pop.sum())
    # Poisson total: within 6 standard deviations of the expected population.
    assert abs(total - SMALL["population"]) < 6 * np.sqrt(SMALL["population"])
    zero_share = float((pop == 0).mean())
    assert 0.25 < zero_share < 0.45
    county = small.level_counts("county")[:, 0]
    assert county.max() > 5 * np.median(county)  # heavy upper tail


def test_synthetic_deterministic_per_seed(small):
    again = synthetic_us(11, **SMALL)
    assert again.hierarchy == small.hierarchy
    assert np.array_equal(again.leaf_counts, small.leaf_counts)
    other = synthetic_us(12, **SMALL)
    assert not np.array_equal(other.leaf_counts, small.leaf_counts[: other.n_leaves])


def test_synthetic_rebuilds_from_block_codes(small):
    df = pd.DataFrame({"b": pd.Series(small.hierarchy.leaves.codes.tolist(), dtype="str")})
    h, leaf_row = from_columns(
        df.iloc[::-1].reset_index(drop=True),
        [("state", "b", 2), ("county", "b", 5), ("tract", "b", 11), ("block", "b")],
    )
    assert h == small.hierarchy
    assert leaf_row[:3].tolist() == [39_999, 39_998, 39_997]


def test_describe_fanout():
    h = Hierarchy.from_parents(
        ["n", "s", "c"],
        [["US"], ["a", "b", "c"], list("pqrstu")],
        [None, [0, 0, 0], [0, 0, 0, 1, 2, 2]],
    )
    d = describe(h)
    assert d == {
        "levels": [
            {"name": "n", "nodes": 1, "fanout": {"min": 3, "median": 3, "max": 3}},
            {"name": "s", "nodes": 3, "fanout": {"min": 1, "median": 2, "max": 3}},
            {"name": "c", "nodes": 6, "fanout": None},
        ]
    }


def test_cli_describe_keeps_leading_zeros(tmp_path, capsys):
    f = tmp_path / "c.csv"
    f.write_text("fips,pop\n01001,5\n01003,6\n02013,7\n")
    assert (
        main(
            [
                "hierarchy",
                "describe",
                str(f),
                "--level",
                "state=fips:2",
                "--level",
                "county=fips",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert [lv["nodes"] for lv in d["levels"]] == [1, 2, 3]
    assert (
        main(["hierarchy", "describe", str(f), "--level", "state=fips:2", "--level", "county=fips"])
        == 0
    )
    out = capsys.readouterr().out
    assert "state" in out and "county" in out and "fanout" in out
    h, _ = from_columns(pd.read_csv(f, dtype=str), [("state", "fips", 2), ("county", "fips")])
    assert h["state"].codes.tolist() == ["01", "02"]


def test_cli_describe_parquet(tmp_path, capsys):
    f = tmp_path / "c.parquet"
    pd.DataFrame({"fips": ["01001", "01003", "02013"]}).to_parquet(f)
    assert (
        main(
            [
                "hierarchy",
                "describe",
                str(f),
                "--level",
                "state=fips:2",
                "--level",
                "county=fips",
                "--json",
            ]
        )
        == 0
    )
    assert [lv["nodes"] for lv in json.loads(capsys.readouterr().out)["levels"]] == [1, 2, 3]


@pytest.mark.parametrize(
    ("level", "fragment"),
    [
        ("state=nope", "'nope'"),
        ("state", "bad level specification 'state'"),
        ("state=fips:0", "'state=fips:0'"),
    ],
)
def test_cli_describe_errors_exit_2(tmp_path, capsys, level, fragment):
    f = tmp_path / "c.csv"
    f.write_text("fips,pop\n01001,5\n")
    assert main(["hierarchy", "describe", str(f), "--level", level]) == 2
    assert fragment in capsys.readouterr().err


def test_cli_describe_duplicates(tmp_path, capsys):
    f = tmp_path / "c.csv"
    f.write_text("fips,version\n01001,a\n01001,b\n")
    assert main(["hierarchy", "describe", str(f), "--level", "county=fips"]) == 2
    assert "'01001'" in capsys.readouterr().err
    assert (
        main(
            [
                "hierarchy",
                "describe",
                str(f),
                "--level",
                "county=fips",
                "--allow-duplicates",
                "--json",
            ]
        )
        == 0
    )
