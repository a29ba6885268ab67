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
