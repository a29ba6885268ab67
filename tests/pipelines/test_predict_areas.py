"""``censusdp predict SPEC --areas FILE``: place SEs before any noise, and malformed
equivalency files refused with exit 2 naming the file, row and column, nothing written."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.errors import DataError
from censusdp.hierarchy.equivalency import read_equivalency
from censusdp.hierarchy.synthetic import synthetic_state

SPEC = """
[predict]
schema = "pl94"
invariants = { nation = ["total"], state = ["total"] }
tables = ["total", "votingage * hispanic"]

[hierarchy]
synthetic = "state"
blocks = 300
seed = 2
"""


def _codes():
    return np.asarray(synthetic_state(2, blocks=300).hierarchy.leaves.codes, dtype=object)


def _write(tmp_path, rows, header="BLOCKID,PLACEFP", name="baf.csv"):
    p = tmp_path / name
    p.write_text(header + "\n" + "".join(f"{b},{a}\n" for b, a in rows), encoding="utf-8")
    return p


def _places(codes):
    """Blocks every third in no place; places cut across tracts (block i → place i mod 11)."""
    return [(c, f"{i % 11:05d}") for i, c in enumerate(codes) if i % 3]


def _run(tmp_path, baf, *extra):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC, encoding="utf-8")
    out = tmp_path / "pred"
    args = ["predict", str(spec), "--out", str(out), "--areas", str(baf)]
    args += ["--block-column", "BLOCKID", "--area-column", "PLACEFP", "--area-name", "place"]
    return main([*args, *extra]), out


def test_predict_with_areas_writes_place_ses(tmp_path, capsys):
    codes = _codes()
    baf = _write(tmp_path, _places(codes))
    rc, out = _run(tmp_path, baf)
    assert rc == 0, capsys.readouterr().err
    assert "11 places" in capsys.readouterr().out
    summ = pd.read_csv(out / "summary.csv")
    place = summ[summ.level == "place"]
    assert set(place.table) == {"total", "votingage * hispanic"}
    assert (place.nodes == 11).all()
    areas = pd.read_csv(out / "areas.csv", dtype={"place": str})
    assert list(areas.place) == [f"{i:05d}" for i in range(11)]
    # one table, two views: the per-place file and the summary over places
    tot = place[place.table == "total"].iloc[0]
    se = areas.se_rms_total.to_numpy()
    np.testing.assert_allclose([tot.se_max, tot.se_min, tot.se_mean], [se.max(), se.min(), se.mean()],
                               rtol=1e-12)  # fmt: skip
    assert np.all(se > 0)


def _malformed(codes):
    good = _places(codes)
    return {
        "unknown block": (
            good + [("999999999999999", "00001")],
            'row 201.*BLOCKID.*"?999999999999999',
        ),
        "duplicate block": (good + [(good[0][0], "00002")], "row 201.*BLOCKID.*listed again"),
        "blank area": (good[:5] + [(good[5][0], "")] + good[6:], "row 6.*PLACEFP.*blank place"),
        "blank block": (good[:7] + [("", "00003")] + good[7:], "row 8.*BLOCKID.*blank block"),
    }


@pytest.mark.parametrize("case", ["unknown block", "duplicate block", "blank area", "blank block"])
def test_malformed_equivalency_exits_2_naming_file_row_column(tmp_path, capsys, case):
    rows, pattern = _malformed(_codes())[case]
    baf = _write(tmp_path, rows)
    rc, out = _run(tmp_path, baf)
    err = capsys.readouterr().err
    assert rc == 2
    assert "baf.csv" in err
    assert pytest.importorskip("re").search(pattern.replace('"?', "'?"), err), err
    assert not out.exists()  # nothing written


def test_missing_column_and_area_with_no_blocks(tmp_path, capsys):
    codes = _codes()
    baf = _write(tmp_path, _places(codes), header="BLOCKID,PLACE")
    rc, _ = _run(tmp_path, baf)
    err = capsys.readouterr().err
    assert rc == 2 and "baf.csv" in err and "'PLACEFP'" in err
    h = synthetic_state(2, blocks=300).hierarchy
    baf = _write(tmp_path, _places(codes))
    listed = tmp_path / "places.csv"
    listed.write_text("PLACEFP\n" + "".join(f"{i:05d}\n" for i in range(12)), encoding="utf-8")
    rc, out = _run(tmp_path, baf, "--area-list", str(listed))
    err = capsys.readouterr().err
    named = "places.csv, data row 12 (line 13), column 'PLACEFP': place '00011' is listed but"
    assert rc == 2 and named in err and "no block of baf.csv" in err, err
    assert not out.exists()
    with pytest.raises(DataError, match=r"places.csv, data row 12 \(line 13\), column 'PLACEFP'"):
        read_equivalency(baf, h, block_column="BLOCKID", area_column="PLACEFP", name="place",
                         areas_path=listed)  # fmt: skip
    # blocks in no place, as BAF files list them, are left out on request
    rows = [(c, f"{i % 11:05d}" if i % 3 else "") for i, c in enumerate(codes)]
    eq = read_equivalency(_write(tmp_path, rows, name="baf2.csv"), h, block_column="BLOCKID",
                          area_column="PLACEFP", skip_blank_areas=True)  # fmt: skip
    assert eq.leaf.size == 200 and eq.n_areas == 11
