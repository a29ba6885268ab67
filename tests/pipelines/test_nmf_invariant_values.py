"""The NMF release writes figures held by the published state total as that exact total
with ``_se`` and ``_moe`` exactly 0 (issue 33: a state's ``P1_001N`` was written as
276.99999999999966, the GLS's float error).

Two synthetic states through :func:`~censusdp.pipelines.products.nmf_release.release_nmf`: one with
two parts (only the state is held; its parts are estimated) and one of a single part and a
single county (the part, the spine county and the tabulation county are the state's only
children, held through it as DC's county is). Checked with ``==`` against the published
total; every other figure keeps a positive SE, except the blocks that cannot hold anyone
(every hhgq upper bound 0 in the file's constraints: structural zeros), which are 0 with SE 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.pipelines.io.nmf_writer import simulate_nmf, write_nmf, write_state_totals
from censusdp.pipelines.products.nmf_release import release_nmf
from censusdp.rng import KeyedRNG

WHOLE = ["P1_001N", "P2_001N"]


def _release(tmp, counties: int, aian: bool):
    st = synthetic_us(3, states=1, counties=counties, tracts=3, block_groups=3, blocks=8,
                      population=600)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=3)
    parts = np.zeros(h["county"].size, bool)
    parts[-1] = aian
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=parts, with_us=False,
                             evaluation_rng=KeyedRNG.reproducible(7, warn=False)))  # fmt: skip
    total = int(count.sum())
    write_state_totals(tmp / "p1.csv", {"01": total})
    got = []
    release_nmf(write_nmf(tmp / "nmf", subs), tmp / "p1.csv", tmp / "out", on_state=got.append)
    empty = {
        str(g)[-16:-5] + str(g)[-4:]  # the tabulation GEOID: the 16 without the bg digit
        for sub in subs
        for g, up, has in zip(
            sub.level("Block").geocodes,
            sub.level("Block").upper,
            sub.level("Block").has_bounds,
            strict=True,
        )
        if has and not up.any()
    }
    return tmp / "out", total, got[0], empty


def _read(path):
    head = pd.read_csv(path, nrows=0).columns
    codes = [c for c in head if c in ("GEOID", "geocode") or c.endswith(("_GEOID", "_geocode"))]
    return pd.read_csv(path, dtype=dict.fromkeys(codes, str))


@pytest.mark.parametrize(("counties", "aian"), [(2, True), (1, False)])
def test_held_figures_are_the_published_total_with_se_zero(tmp_path, counties, aian) -> None:
    out, total, r, empty = _release(tmp_path, counties, aian)
    state = _read(out / "pl94_state.csv")
    for c in WHOLE:
        assert state[c].tolist() == [total]  # the published total, not the GLS's float
        assert state[f"{c}_se"].tolist() == [0] and state[f"{c}_moe"].tolist() == [0]
    assert (state["P3_001N_se"] > 0).all()  # the voting-age population is not held
    alone = not aian and counties == 1  # every spine level down to the county: one node
    for name in ("pl94_spine_state_part.csv", "pl94_spine_county.csv", "pl94_county.csv"):
        f = _read(out / name)
        if alone:
            assert len(f) == 1
            for c in WHOLE:
                assert f[c].tolist() == [total] and f[f"{c}_se"].tolist() == [0]
                assert f[f"{c}_moe"].tolist() == [0]
        else:
            assert (f["P1_001N_se"] > 0).all()  # estimated, not held
    for name in ("pl94_spine_tract.csv", "pl94_tract.csv"):
        f = _read(out / name)
        assert (f["P1_001N_se"] > 0).all() and (f["P1_001N_moe"] > 0).all()
    blocks = _read(out / "pl94_block.csv")
    zero = blocks["GEOID"].isin(empty).to_numpy()
    assert 0 < zero.sum() < len(blocks)  # both kinds are there
    for c in ("P1_001N", "P1_001N_se", "P1_001N_moe"):
        assert (blocks.loc[zero, c] == 0).all()  # structural zeros: held, exact
    assert (blocks.loc[~zero, "P1_001N_se"] > 0).all()
    assert (blocks.loc[~zero, "P1_001N_moe"] > 0).all()
