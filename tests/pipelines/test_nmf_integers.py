"""The NMF route's non-negative integer product: non-negative int64, children == sum of
their parents' cells, the state total == the published one across the two state parts,
structural zeros == 0, written under nonnegative/ labelled BIASED; its bias by size class by
simulation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError
from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.pipelines.io.nmf import collect_nmf
from censusdp.pipelines.io.nmf_writer import simulate_nmf, write_nmf, write_state_totals
from censusdp.pipelines.products.nmf_evaluate import integer_bias
from censusdp.pipelines.products.nmf_integers import check_integers, held_cells, nmf_integers
from censusdp.pipelines.products.nmf_release import NMFReleaseOptions, estimate_state, release_nmf
from censusdp.rng import KeyedRNG


def _state(seed=3, blocks=30):
    st = synthetic_us(seed, states=1, counties=3, tracts=5, block_groups=8, blocks=blocks,
                      population=1500)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=seed)
    aian = np.zeros(h["county"].size, bool)
    aian[1] = True
    return h, block, cell, count, aian


@pytest.fixture(scope="module")
def state():
    h, block, cell, count, aian = _state()
    subs = simulate_nmf(h, block, cell, count, aian_counties=aian, with_us=False,
                        evaluation_rng=KeyedRNG.reproducible(7, warn=False))  # fmt: skip
    r = estimate_state(collect_nmf(subs, {"01": int(count.sum())}))
    return r, int(count.sum())


def test_integers_are_consistent_nonnegative_and_hold_zeros_and_totals(state):
    r, total = state
    ints = nmf_integers(r, KeyedRNG.reproducible(1, warn=False))
    h = r.hierarchy
    held = held_cells(r)
    assert [c.shape[0] for c in ints.counts] == list(h.sizes)
    for k, c in enumerate(ints.counts):
        assert c.dtype == np.int64 and c.min() >= 0
        assert np.all(c.reshape(c.shape[0], -1)[held[k]] == 0)  # structural zeros == 0
        assert np.all(c[:, 3, 0] == 0)  # nursing facilities: no one under 18
        if k + 1 < h.depth:
            sums = np.zeros_like(c)
            np.add.at(sums, h.levels[k + 1].parent, ints.counts[k + 1])
            assert np.array_equal(sums, c)  # children == parent, cell by cell
    parts = ints.counts[h.level_index("state_part")]
    assert parts.shape[0] == 2 and int(parts.sum()) == total  # across the two parts
    assert int(ints.counts[h.level_index("state")].sum()) == total
    # held cells are a real constraint here: most blocks hold some group-quarters type
    assert held[-1].mean() > 0.5 and (~held[-1]).any()
    # reproducible from the seed, different with another
    again = nmf_integers(r, KeyedRNG.reproducible(1, warn=False))
    assert all(np.array_equal(a, b) for a, b in zip(ints.counts, again.counts, strict=True))
    other = nmf_integers(r, KeyedRNG.reproducible(2, warn=False))
    assert not np.array_equal(ints.counts[-1], other.counts[-1])
    assert set(ints.bound_violations) == {"State", "County", "Tract", "Block_Group", "Block"}


def test_check_integers_refuses_a_broken_product(state):
    r, _ = state
    ints = nmf_integers(r, KeyedRNG.reproducible(1, warn=False))
    bad = [c.copy() for c in ints.counts]
    b = bad[-1]
    held = held_cells(r)[-1]
    i, c = np.argwhere(held)[0]
    b.reshape(b.shape[0], -1)[i, c] += 1  # a person in a held cell (parents unchanged)
    with pytest.raises(DataError, match="held cell|sum to parents"):
        check_integers(r, bad)
    bad = [c.copy() for c in ints.counts]
    bad[1].reshape(1, -1)[0, 0] += 1  # the state no longer its nation's (one more person)
    with pytest.raises(DataError, match="sum to parents"):
        check_integers(r, bad)


def test_release_writes_the_integer_product_labelled_biased(tmp_path):
    h, block, cell, count, aian = _state(seed=4)
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian, with_us=False,
                             evaluation_rng=KeyedRNG.reproducible(9, warn=False)))  # fmt: skip
    root = write_nmf(tmp_path / "nmf", subs)
    write_state_totals(tmp_path / "p1.csv", {"01": int(count.sum())})
    opts = NMFReleaseOptions(integers=True, seed=5)
    res = release_nmf(root, tmp_path / "p1.csv", tmp_path / "out", options=opts)
    out = tmp_path / "out"
    man = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    nn = man["nonnegative"]
    assert nn["label"].startswith("BIASED") and nn["statement"] == res.statement
    assert "Post-processing of the Census Bureau's published measurements" in nn["statement"]
    for f in nn["files"]:
        assert f"nonnegative/{f}" in res.files and (out / "nonnegative" / f).is_file()
    st = pd.read_csv(out / "nonnegative" / "pl94_state.csv", dtype={"GEOID": str})
    assert st["P1_001N"].tolist() == [int(count.sum())]
    assert not any(c.endswith("_se") for c in st.columns)  # biased: no standard errors
    parts = pd.read_csv(out / "nonnegative" / "pl94_spine_state_part.csv", dtype=str)
    assert parts["P1_001N"].astype(int).sum() == int(count.sum())
    blocks = pd.read_csv(out / "nonnegative" / "pl94_block.csv", dtype={"GEOID": str,
                                                                         "geocode": str})  # fmt: skip
    vals = blocks.drop(columns=["GEOID", "geocode"])
    assert (vals.dtypes == np.int64).all() and (vals.to_numpy() >= 0).all()
    for level in ("county", "tract", "block_group"):
        f = pd.read_csv(out / "nonnegative" / f"pl94_{level}.csv", dtype={"GEOID": str})
        assert f["P1_001N"].sum() == int(count.sum())  # sums of the integer blocks


def test_integer_bias_by_size_class_by_simulation():
    """The simulation's control, the unbiased GLS, is within 4 SEs of 0 in every class; the
    classes cover every block; blocks of 0 persons cannot hold anyone in the synthetic frame
    (all upper bounds 0), so both products give them exactly 0."""
    h, block, cell, count, aian = _state()
    df = integer_bias(h, block, cell, count, range(3), aian_counties=aian)
    assert df["blocks"].sum() == h["block"].size
    assert (np.abs(df["gls_bias"]) <= 4 * df["gls_bias_se"] + 1e-9).all()
    zero = df[df["size_class"] == "0"].iloc[0]
    assert zero["integer_bias"] == 0 and zero["gls_bias"] == 0
    assert (df["integer_bias_se"] > 0).any()


def test_district_covariance_is_the_same_swept_in_chunks(state, monkeypatch):
    """The pairs' unions are swept in chunks (memory); the covariance matrix is the same,
    bit for bit, with chunks of a few leaf entries."""
    import censusdp.pipelines.products.nmf_release as nr
    from censusdp.estimation.gls.areas import area_release
    from censusdp.hierarchy.equivalency import equivalency_from_arrays

    r, _ = state
    h = r.hierarchy
    codes = np.array([f"d{i % 5}" for i in range(h["block"].size)])
    eq = equivalency_from_arrays(h, h["block"].codes, codes, name="d")
    a = area_release(r.release, eq)
    whole = nr.area_total_covariance(r.release, eq, a)
    monkeypatch.setattr(nr, "_PAIR_ENTRIES", 7)
    assert np.array_equal(nr.area_total_covariance(r.release, eq, a), whole)
    assert np.all(np.diag(whole) > 0) and np.array_equal(whole, whole.T)
