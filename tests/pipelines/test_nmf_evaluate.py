"""The NMF release against its synthetic truth: the size-class metrics equal a slow direct
computation, are zero when the file's noise is (σ² at the sampler's least grid step), and are
written confidential, apart from the release; mismatched truths and outputs are refused."""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError, SpecError
from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.pipelines.io.nmf_writer import production_laws, simulate_nmf, write_nmf
from censusdp.pipelines.metrics import SIZE_CLASSES
from censusdp.pipelines.products.nmf_evaluate import (
    block_truth_totals,
    evaluate_nmf_release,
    nmf_size_class_metrics,
    released_totals,
)
from censusdp.pipelines.products.nmf_release import release_nmf
from censusdp.pipelines.report import CONFIDENTIAL_LABEL
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

PREFIX = {"state": 2, "county": 5, "tract": 11, "block_group": 12, "block": 15}


def _release(d, *, exact: bool):
    """A synthetic state (AIAN part = its second county), its NMF and its release. With
    ``exact`` the schema's ρ is so large that σ² is the sampler's least step (2⁻¹⁰): every
    noise draw is 0 (P(|Z| ≥ 1) ≈ e⁻⁵¹²)."""
    st = synthetic_us(5, states=1, counties=4, tracts=8, block_groups=16, blocks=60,
                      population=2500)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=5)
    aian = np.zeros(h["county"].size, bool)
    aian[1] = True
    schema = None
    if exact:
        s = Schema.load("pl94")
        schema = dataclasses.replace(s, allocation=dataclasses.replace(s.allocation,
                                                                       rho=Fraction(10**12)))  # fmt: skip
        assert max(float(law.sigma2) for law in production_laws(schema).values()) < 1e-3
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian, with_us=False,
                             schema=schema, evaluation_rng=KeyedRNG.reproducible(11, warn=False)))  # fmt: skip
    root = write_nmf(d / "nmf", subs)
    release_nmf(root, {"01": int(count.sum())}, d / "release")
    # the truth per block entry, every block listed (blocks of 0 persons too)
    geo = np.concatenate([h["block"].codes[block], h["block"].codes])
    persons = np.concatenate([count, np.zeros(h["block"].size, np.int64)])
    return h, geo, persons


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    d = tmp_path_factory.mktemp("nmf_eval_noisy")
    return (d, *_release(d, exact=False))


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    d = tmp_path_factory.mktemp("nmf_eval_exact")
    return (d, *_release(d, exact=True))


def _slow_metrics(release_dir, geo, persons):
    """The metric set by a direct computation: dicts, loops, the Bureau's definitions."""
    rows = []
    for level, width in PREFIX.items():
        truth: dict[str, int] = {}
        for g, n in zip(geo.tolist(), persons.tolist(), strict=True):
            truth[g[:width]] = truth.get(g[:width], 0) + int(n)
        f = pd.read_csv(release_dir / f"pl94_{level}.csv", dtype={"GEOID": str})
        released = dict(zip(f["GEOID"], f["P1_001N"], strict=True))
        assert sorted(released) == sorted(truth)
        for label, lo, hi in SIZE_CLASSES:
            errs = [(released[a] - t, t) for a, t in truth.items() if lo <= t <= hi]
            n = len(errs)
            pct = [abs(e) / t for e, t in errs if t > 0]
            rows.append({
                "level": level, "size_class": label, "n": n,
                "mae": sum(abs(e) for e, _ in errs) / n if n else math.nan,
                "rmse": math.sqrt(sum(e * e for e, _ in errs) / n) if n else math.nan,
                "mean_error": sum(e for e, _ in errs) / n if n else math.nan,
                "mape": 100 * sum(pct) / len(pct) if pct else math.nan,
                "over_10pct": sum(p > 0.1 for p in pct),
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_metrics_equal_a_slow_direct_computation(noisy, tmp_path):
    d, _, geo, persons = noisy
    got = evaluate_nmf_release(d / "release", geo, persons, tmp_path / "evaluation")
    want = _slow_metrics(d / "release", geo, persons)
    assert (got["product"] == "unbiased").all()
    assert got["level"].tolist() == want["level"].tolist()
    assert got["size_class"].tolist() == want["size_class"].tolist()
    assert got["n"].tolist() == want["n"].tolist()
    assert got["over_10pct"].tolist() == want["over_10pct"].tolist()
    for m in ("mae", "rmse", "mean_error", "mape"):
        np.testing.assert_allclose(got[m], want[m], rtol=1e-12, atol=1e-9, equal_nan=True)
    # the file has noise: blocks are off (the comparison is not trivially zero), but an
    # empty block has every hhgq upper bound 0 in the synthetic frame: held, exactly 0
    blk = got[(got["level"] == "block") & (got["n"] > 0)]
    assert (blk.loc[blk["size_class"] != "0", "mae"] > 0.5).all()
    assert (blk.loc[blk["size_class"] == "0", "mae"] == 0).all()
    # the state total is invariant: no error at the state level
    assert got.loc[got["level"] == "state", "mae"].max() < 1e-6
    # each level's areas are counted once
    n_areas = {lv: released_totals(d / "release")[lv][0].size for lv in PREFIX}
    assert got.groupby("level", sort=False)["n"].sum().to_dict() == n_areas


def test_zero_noise_gives_zero_error(exact, tmp_path):
    d, h, geo, persons = exact
    got = evaluate_nmf_release(d / "release", geo, persons, tmp_path / "evaluation")
    live = got[got["n"] > 0]
    assert (live["mae"] < 1e-6).all() and (live["rmse"] < 1e-6).all()
    assert (got["over_10pct"] == 0).all()
    # the blocks of the release are every block of the truth's hierarchy
    assert got.loc[got["level"] == "block", "n"].sum() == h["block"].size
    # power: a truth one person off in one block is seen, in that block's size class
    wrong = persons.copy()
    wrong[0] += 1
    bad = nmf_size_class_metrics(released_totals(d / "release"), block_truth_totals(geo, wrong))
    blk = bad[(bad["level"] == "block") & (bad["n"] > 0)]
    assert blk["mae"].max() > 1e-3
    assert np.isclose((blk["mean_error"] * blk["n"]).sum(), -1.0)


def test_evaluation_is_written_apart_and_labelled(noisy, tmp_path):
    d, _, geo, persons = noisy
    before = sorted(p.name for p in (d / "release").iterdir())
    out = tmp_path / "evaluation"
    got = evaluate_nmf_release(d / "release", geo, persons, out)
    assert sorted(p.name for p in (d / "release").iterdir()) == before
    assert (out / "CONFIDENTIAL.txt").read_text(encoding="utf-8") == CONFIDENTIAL_LABEL + "\n"
    assert CONFIDENTIAL_LABEL in (out / "size_classes.md").read_text(encoding="utf-8")
    man = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert man["confidential"] is True and man["label"] == CONFIDENTIAL_LABEL
    assert man["states"] == ["01"] and man["column"] == "P1_001N"
    back = pd.read_csv(out / "size_classes.csv")
    assert back["n"].tolist() == got["n"].tolist()
    # not inside the release, nor holding it: refused, nothing written
    for bad in (d / "release" / "evaluation", d):
        with pytest.raises(SpecError, match="kept apart from the release"):
            evaluate_nmf_release(d / "release", geo, persons, bad)
    assert sorted(p.name for p in (d / "release").iterdir()) == before


def test_a_truth_that_does_not_match_is_refused(noisy, tmp_path):
    d, _, geo, persons = noisy
    last = geo[-1]
    keep = geo != last  # one block left out of the truth
    with pytest.raises(DataError, match=f"block {last} is released but not in the truth"):
        evaluate_nmf_release(d / "release", geo[keep], persons[keep], tmp_path / "e1")
    assert not (tmp_path / "e1").exists()
    with pytest.raises(DataError, match="entry 0 has a block GEOID of 14 characters"):
        block_truth_totals(np.array(["01001000100123"] + geo[1:].tolist()), persons)
    neg = persons.copy()
    neg[3] = -2
    with pytest.raises(DataError, match="entry 3 has a negative count") as e:
        block_truth_totals(geo, neg)
    assert "-2" not in str(e.value)


def test_truth_of_states_not_released_is_left_out(noisy):
    d, _, geo, persons = noisy
    rel = released_totals(d / "release")
    want = nmf_size_class_metrics(rel, block_truth_totals(geo, persons))
    other = np.strings.add("02", np.strings.slice(geo, 2, None))  # a state not in the release
    both = block_truth_totals(np.concatenate([geo, other]), np.concatenate([persons, persons]))
    assert both["state"][0].tolist() == ["01", "02"]
    got = nmf_size_class_metrics(rel, both)
    pd.testing.assert_frame_equal(got, want)


def test_a_release_table_with_a_bad_geoid_is_refused_naming_file_row_and_column(noisy, tmp_path):
    d, _, _, _ = noisy
    for p in (d / "release").glob("pl94_*.csv"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    f = pd.read_csv(tmp_path / "pl94_county.csv", dtype={"GEOID": str})
    f.loc[2, "GEOID"] = "0100"
    f.to_csv(tmp_path / "pl94_county.csv", index=False)
    with pytest.raises(DataError, match=r"pl94_county.csv: row 4, column GEOID: not 5 char"):
        released_totals(tmp_path)
    f.loc[2, "GEOID"] = f.loc[1, "GEOID"]
    f.to_csv(tmp_path / "pl94_county.csv", index=False)
    with pytest.raises(DataError, match=r"pl94_county.csv: GEOID \d{5} appears twice"):
        released_totals(tmp_path)
    (tmp_path / "pl94_county.csv").write_bytes((d / "release" / "pl94_county.csv").read_bytes())
    (tmp_path / "pl94_tract.csv").unlink()
    with pytest.raises(DataError, match="pl94_tract.csv: not found"):
        released_totals(tmp_path)
