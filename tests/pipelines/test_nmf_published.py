"""``--published``: the metric set by size class of a release's P1_001N against a published
table, checked against a slow direct computation; bad tables exit 2 naming file, row and
column."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.errors import DataError
from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.pipelines.io.nmf_writer import simulate_nmf, write_nmf, write_state_totals
from censusdp.pipelines.products.nmf_evaluate import compare_published, read_published
from censusdp.rng import KeyedRNG


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    d = tmp_path_factory.mktemp("published")
    st = synthetic_us(5, states=1, counties=2, tracts=4, block_groups=6, blocks=24,
                      population=1200)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=5)
    subs = list(simulate_nmf(h, block, cell, count, with_us=False,
                             evaluation_rng=KeyedRNG.reproducible(3, warn=False)))  # fmt: skip
    root = write_nmf(d / "nmf", subs)
    write_state_totals(d / "p1.csv", {"01": int(count.sum())})
    # a "published" table: the truth's county and tract totals plus an offset (public data
    # stand-in), GEOIDs with the API's summary-level prefix
    per_block = np.bincount(block, weights=count, minlength=h["block"].size).astype(np.int64)
    codes = h["block"].codes.tolist()
    rows = []
    for width, prefix in ((5, "0500000US"), (11, "1400000US")):
        keys, inv = np.unique([c[:width] for c in codes], return_inverse=True)
        tot = np.bincount(inv, weights=per_block).astype(np.int64) + 3
        rows += [(prefix + k, int(t)) for k, t in zip(keys, tot, strict=True)]
    pub = pd.DataFrame(rows, columns=["GEOID", "P1_001N"])
    pub.to_csv(d / "published.csv", index=False)
    code = main(["nmf", str(root), "--state-totals", str(d / "p1.csv"), "--out",
                 str(d / "out"), "--integers", "--seed", "4", "--published",
                 str(d / "published.csv")])  # fmt: skip
    assert code == 0
    return d, pub


def _slow(release: pd.DataFrame, pub: pd.DataFrame) -> dict:
    """Per (level, size class): n, mean error and MAE of release − published, directly."""
    out = {}
    classes = [("0", 0, 0), ("1–9", 1, 9), ("10–99", 10, 99), ("100–999", 100, 999),
               ("1000+", 1000, np.inf)]  # fmt: skip
    for level, width in (("county", 5), ("tract", 11)):
        p = pub[pub["GEOID"].str.len() == width].set_index("GEOID")["P1_001N"]
        r = release.set_index("GEOID")["P1_001N"].reindex(p.index)
        for label, lo, hi in classes:
            sel = (p >= lo) & (p <= hi)
            e = (r[sel] - p[sel]).to_numpy(float)
            out[(level, label)] = (int(sel.sum()), e.mean() if e.size else np.nan,
                                   np.abs(e).mean() if e.size else np.nan)  # fmt: skip
    return out


def test_comparison_equals_a_slow_direct_computation(released):
    d, pub = released
    got = pd.read_csv(d / "out" / "published_comparison.csv")
    assert set(got["product"]) == {"unbiased", "nonnegative"}
    plain = pub.assign(GEOID=pub["GEOID"].str.replace(r"^.*US", "", regex=True))
    for product, folder in (("unbiased", d / "out"), ("nonnegative", d / "out" / "nonnegative")):
        both = pd.concat([pd.read_csv(folder / f"pl94_{lv}.csv", dtype={"GEOID": str})
                          for lv in ("county", "tract")])  # fmt: skip
        want = _slow(both, plain)
        g = got[got["product"] == product]
        for (level, label), (n, me, mae) in want.items():
            row = g[(g["level"] == level) & (g["size_class"] == label)].iloc[0]
            assert row["n"] == n
            if n:
                assert abs(row["mean_error"] - me) <= 1e-9 * max(1.0, abs(me))
                assert abs(row["mae"] - mae) <= 1e-9 * max(1.0, mae)
    # power: the +3 offset shows as a mean difference near −3 where the published sizes are
    # large, for the integer product too
    big = got[(got["level"] == "county") & (got["n"] > 0)]
    assert (big["mean_error"] < -1).all()
    man = json.loads((d / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert "not an error against the truth" in man["published_comparison"]["what"]


def test_bad_published_tables_are_refused(released, tmp_path, capsys):
    d, pub = released
    bad = pub.astype({"P1_001N": object})
    bad.loc[2, "P1_001N"] = "12.5"
    bad.to_csv(tmp_path / "frac.csv", index=False)
    with pytest.raises(DataError, match=r"frac.csv: row 3, column 'P1_001N'"):
        read_published(tmp_path / "frac.csv")
    bad = pub.copy()
    bad.loc[1, "GEOID"] = "0100"
    bad.to_csv(tmp_path / "width.csv", index=False)
    with pytest.raises(DataError, match=r"width.csv: row 2, column 'GEOID'"):
        read_published(tmp_path / "width.csv")
    other = pd.DataFrame({"GEOID": ["02013"], "P1_001N": [5]})
    other.to_csv(tmp_path / "other.csv", index=False)
    with pytest.raises(DataError, match="county 02013 is published but not released"):
        compare_published(d / "out", tmp_path / "other.csv")
    root = d / "nmf"
    code = main(["nmf", str(root), "--state-totals", str(d / "p1.csv"), "--out",
                 str(tmp_path / "o2"), "--published", str(tmp_path / "frac.csv")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "frac.csv" in err[0]
    assert not (tmp_path / "o2").exists()  # nothing half-written


def _water_release(folder, blocks: dict[str, float]) -> None:
    """A hand-made release folder: the blocks' P1_001N and every level as sums of blocks by
    GEOID prefix (what `censusdp nmf` writes)."""
    folder.mkdir()
    geo = np.array(list(blocks))
    val = np.array(list(blocks.values()))
    for level, width in (("state", 2), ("county", 5), ("tract", 11), ("block_group", 12),
                         ("block", 15)):  # fmt: skip
        keys, inv = np.unique([g[:width] for g in geo], return_inverse=True)
        tot = np.bincount(inv, weights=val)
        pd.DataFrame({"GEOID": keys, "P1_001N": tot}).to_csv(
            folder / f"pl94_{level}.csv", index=False
        )


def test_water_block_patch_matches_published_rows_by_geoid(tmp_path, monkeypatch):
    """Block 4502999010000001 of the NMF (water tract 9901) is published as land block
    4502997080033004 (tract 9708, block group 3): the comparison moves the release's persons
    of the water block to the land block, its tract and block group, and then matches the
    published rows by GEOID; without the patch the land block is not in the release."""
    water, land = "450299901000001", "450299708003004"
    _water_release(tmp_path / "rel", {water: 7.5, "450299901000003": 2.0,
                                      "450299708003001": 10.0, "450299708003002": 20.25})  # fmt: skip
    pub = pd.DataFrame({
        "GEOID": ["45", "45029", "45029970800", "45029990100", "450299708003", "450299901000",
                  land, "450299708003001", "450299708003002", water, "450299901000003"],
        "P1_001N": [39, 39, 37, 2, 37, 2, 7, 10, 20, 0, 2],
    })  # fmt: skip
    pub.to_csv(tmp_path / "pub.csv", index=False)
    got = compare_published(tmp_path / "rel", tmp_path / "pub.csv")

    def row(level, size):
        return got[(got["level"] == level) & (got["size_class"] == size)].iloc[0]

    # after the patch: land block 7.5 vs 7, water block 0 vs 0; tract 9708 37.75 vs 37,
    # tract 9901 2.0 vs 2; the county unchanged (39.75 vs 39)
    assert row("block", "1–9")["n"] == 2 and row("block", "1–9")["mean_error"] == 0.25
    assert row("block", "0")["n"] == 1 and row("block", "0")["mean_error"] == 0.0
    assert row("block", "10–99")["mean_error"] == 0.125
    assert row("tract", "10–99")["mean_error"] == 0.75 and row("tract", "1–9")["mean_error"] == 0
    assert row("block_group", "10–99")["mean_error"] == 0.75
    assert row("county", "10–99")["mean_error"] == 0.75
    # without the patch the published land block has no released row
    import censusdp.pipelines.products.nmf_evaluate as ne

    monkeypatch.setattr(ne, "WATER_BLOCK_PATCH", {})
    with pytest.raises(DataError, match=f"block {land} is published but not released"):
        ne.compare_published(tmp_path / "rel", tmp_path / "pub.csv")


def test_regeocode_water_blocks_is_exact_on_integers():
    """Integer totals move exactly; a release without a patched block is returned as is."""
    from censusdp.pipelines.products.nmf_evaluate import WATER_BLOCK_PATCH, regeocode_water_blocks

    geo = {"block": np.array(["060759902000001", "060759902000002"]),
           "block_group": np.array(["060759902000"]), "tract": np.array(["06075990200"]),
           "county": np.array(["06075"]), "state": np.array(["06"])}  # fmt: skip
    rel = {lv: (g, np.array([5, 3][: g.size], np.int64)) for lv, g in geo.items()}
    rel["tract"] = (geo["tract"], np.array([8], np.int64))
    rel["block_group"] = (geo["block_group"], np.array([8], np.int64))
    rel["county"] = (geo["county"], np.array([8], np.int64))
    rel["state"] = (geo["state"], np.array([8], np.int64))
    out = regeocode_water_blocks(rel)
    assert "0607501790311031" in WATER_BLOCK_PATCH
    assert dict(zip(out["block"][0].tolist(), out["block"][1].tolist(), strict=True)) == {
        "060750179031031": 5, "060759902000001": 0, "060759902000002": 3}  # fmt: skip
    assert dict(zip(out["tract"][0].tolist(), out["tract"][1].tolist(), strict=True)) == {
        "06075017903": 5, "06075990200": 3}  # fmt: skip
    assert dict(zip(out["block_group"][0].tolist(), out["block_group"][1].tolist(),
                    strict=True)) == {"060750179031": 5, "060759902000": 3}  # fmt: skip
    assert out["county"][1].tolist() == [8] and out["state"][1].tolist() == [8]
    assert all(v[1].dtype == np.int64 for v in out.values())
    other = {"block": (np.array(["010010201001000"]), np.array([4.0]))}
    assert regeocode_water_blocks(other) is other
