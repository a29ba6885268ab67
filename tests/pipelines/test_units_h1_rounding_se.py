"""The H1 release's ``_se`` include the rounding's variance (issue 33.3, the units route).

The units route rounds each node's occupied count to the floor or ceiling of its GLS
estimate with mean the estimate, so the rounding's variance is ``ψ(1 − ψ)`` exactly (``ψ``
the estimate's fractional part), and ``_se = sqrt(Var_GLS + ψ(1 − ψ))``
(:mod:`censusdp.pipelines.products.ppmf_units`, "Standard errors"). Fast: that identity against
the estimates (a wrong variance formula fails it), ``_se ≥`` the GLS SE everywhere and ``>``
wherever the rounding is random, the invariant ``H1_001N`` at ``_se`` and ``_moe`` exactly 0.

Slow: coverage by simulation. A synthetic units file (2 counties × 3 tracts × 2 block groups ×
4 blocks, 1,500 housing units) is released ``R = 1000`` times with different seeds at ρ = 1
(13 times the production units budget: the regime where the rounding is a sizeable share of
the error, so that the check has power). The released error ``e`` is an integer, so a plain
``|e| ≤ 1.645 · se`` interval covers by the lattice, not by the SE (95–98% at tract here,
whatever the SE); the check uses the lattice-aware normal interval: ``e`` spread over its unit
cell, ``|e + U| ≤ 1.645 · sqrt(se² + 1/12)`` with ``U ~ U(−½, ½)`` fixed-seed (the randomised
continuity correction; ``Var(e + U) = se² + 1/12`` exactly when ``se`` is right). Occupied
(``H1_002N``) must cover within 87–93% at every level (none is invariant for it); vacant's
error is minus occupied's with the same ``_se`` (checked ``==``). Power: with the GLS-only
SE (what the route wrote before) the same intervals cover below 87% somewhere.

Measured (R = 1000, 11.5 s CPU; coverage with the written ``_se`` / with the GLS-only SE)::

    nation 0.886 / 0.863   state 0.883 / 0.866         county 0.900 / 0.885
    tract  0.895 / 0.811   block_group 0.887 / 0.800   block  0.896 / 0.876
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp.pipelines.io.outputs import lattice_moe
from censusdp.pipelines.io.ppmf import read_ppmf_units
from censusdp.pipelines.products.ppmf_units import h1_frames, release_h1
from censusdp.rng import KeyedRNG

Z90 = 1.6448536269514722
#: (state, county, tract, block group, block): 2 × 3 × 2 × 4 = 48 blocks.
BLOCKS = [
    ("44", f"00{c}", f"0{c}0{t}00", bg, f"{bg}{b:03d}")
    for c in (1, 3)
    for t in (1, 2, 3)
    for bg in ("1", "2")
    for b in range(4)
]
COLUMNS = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE", "TABBLK")


def _units_file(path: Path, n: int, seed: int = 7) -> Path:
    """``n`` housing units (occupied with probability 0.7) over :data:`BLOCKS`, in the DAS MDF
    unit layout."""
    gen = np.random.default_rng(seed)
    b = gen.integers(0, len(BLOCKS), n)
    frame = pd.DataFrame(
        {
            "SCHEMA_TYPE_CODE": "MUD",
            "SCHEMA_BUILD_ID": "1.1.0",
            **{col: [BLOCKS[i][j] for i in b] for j, col in enumerate(COLUMNS)},
            "RTYPE": "2",
            "HH_STATUS": np.where(gen.random(n) < 0.7, "1", "2"),
        }
    )
    frame.to_csv(path, sep="|", index=False)
    return path


@pytest.mark.parametrize("rho", [None, Fraction(4)])
def test_se_is_the_gls_and_the_exact_rounding_variance(tmp_path: Path, rho) -> None:
    hist = read_ppmf_units(_units_file(tmp_path / "units.csv", 600))
    h = hist.hierarchy
    truth = h.aggregate(hist.dense())
    rel = release_h1(hist, KeyedRNG.reproducible(3, warn=False), rho=rho)
    random_somewhere = False
    for k in range(h.depth):
        occ = rel.estimates[k][:, 0]
        psi = occ - np.floor(occ)
        se, gls = rel.standard_errors[k], rel.gls_standard_errors[k]
        # the reference: GLS variance + ψ(1 − ψ) of the node's own estimate
        assert np.allclose(se[:, 1] ** 2, gls**2 + psi * (1 - psi), rtol=1e-9, atol=1e-12)
        assert (se[:, 1] == se[:, 2]).all()  # vacant = total − occupied: the same error
        assert (se[:, 1] >= gls).all()
        rounded = psi * (1 - psi) > 1e-9  # where the rounding is random
        assert (se[rounded, 1] > gls[rounded]).all()
        random_somewhere |= bool(rounded.any())
        # the invariant: the exact value, _se exactly 0
        assert (rel.counts[k][:, 0] == truth[k].sum(axis=1)).all()
        assert (se[:, 0] == 0).all()
    assert random_somewhere
    wide, long = h1_frames(rel)
    for frame in wide.values():
        assert (frame.H1_001N_se == 0).all() and (frame.H1_001N_moe == 0).all()
        assert np.array_equal(frame.H1_002N_moe.to_numpy(), lattice_moe(frame.H1_002N_se))
    total = long[long.column == "H1_001N"]
    assert (total.se == 0).all() and (total.moe == 0).all()


def _coverage(R: int, rho: Fraction, tmp: Path) -> dict[str, tuple[float, float]]:
    hist = read_ppmf_units(_units_file(tmp / "units.csv", 1500))
    h = hist.hierarchy
    truth = [c for c in h.aggregate(hist.dense())]
    err = {name: [] for name in h.names}
    se = {name: [] for name in h.names}
    gls = {name: [] for name in h.names}
    for r in range(R):
        rel = release_h1(hist, KeyedRNG.reproducible(1000 + r, warn=False), rho=rho)
        for k, name in enumerate(h.names):
            e = rel.counts[k][:, 1:] - truth[k]
            assert (e[:, 1] == -e[:, 0]).all()  # vacant's error is minus occupied's
            assert (rel.standard_errors[k][:, 1] == rel.standard_errors[k][:, 2]).all()
            err[name].append(e[:, 0])
            se[name].append(rel.standard_errors[k][:, 1])
            gls[name].append(rel.gls_standard_errors[k])
    jitter = np.random.default_rng(11)
    out = {}
    for name in h.names:
        e, s, g = (np.array(x[name]) for x in (err, se, gls))
        u = jitter.random(e.shape) - 0.5
        cover = np.mean(np.abs(e + u) <= Z90 * np.sqrt(s**2 + 1 / 12))
        cover_gls = np.mean(np.abs(e + u) <= Z90 * np.sqrt(g**2 + 1 / 12))
        out[name] = (round(float(cover), 4), round(float(cover_gls), 4))
    return out


@pytest.mark.slow
def test_occupied_and_vacant_intervals_cover_at_every_level(tmp_path: Path) -> None:
    report = _coverage(1000, Fraction(1), tmp_path)
    print(report)
    for name, (cover, _) in report.items():
        assert 0.87 <= cover <= 0.93, (name, report)
    # power: without the rounding's variance the intervals under-cover somewhere
    assert min(gls for _, gls in report.values()) < 0.87, report
