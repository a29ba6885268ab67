"""Coverage of the PPMF route's total-population intervals, rounding included (issue 33.3).

A synthetic PPMF county file (6 tracts × 2 block groups × 4 blocks, 3,000 persons) is
released 200 times by the route's engine (production allocation, nation and state totals
invariant) with different seeds; per level the nominal 90% intervals ``released ± 1.645 ·
_se`` of the whole population (``P1_001N``, the standard error the route writes:
:func:`~censusdp.pipelines.privatize_ppmf.column_standard_errors` with the rounding's
total-variance bound) are checked against the truth. The county (= the state: one county)
is invariant: released exactly with a zero standard error. Power: the GLS-only standard
error (what the route wrote before) under-covers the tracts. Slow (~200 s): run with
``-m slow``.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.estimation.predict import allocation_plan
from censusdp.pipelines.pl94_stream import SparseHistogram, stream_pl94
from censusdp.pipelines.ppmf import read_ppmf
from censusdp.pipelines.privatize_ppmf import CUT, INVARIANTS, column_standard_errors
from censusdp.rng import KeyedRNG

R = 200
Z90 = 1.6448536269514722


def _county(tmp_path):
    blocks = [
        ("01", "001", f"000{t}00", bg, f"{bg}{b:03d}")
        for t in range(1, 7)
        for bg in ("1", "2")
        for b in range(4)
    ]
    frame = ppmf_persons(np.random.default_rng(3), 3000, blocks, household_share=0.9)
    frame.to_csv(tmp_path / "ppmf.csv", index=False)
    return read_ppmf(tmp_path / "ppmf.csv")


@pytest.mark.slow
def test_total_population_intervals_cover_at_every_level(tmp_path):
    hist = _county(tmp_path)
    h, schema = hist.hierarchy, hist.schema
    alloc = schema.allocation
    plan = allocation_plan(
        schema, dataclasses.replace(alloc, rho=Fraction(alloc.rho)), levels=h.names
    )
    source = SparseHistogram.of(hist)
    K = schema.n_cells
    leaf = np.bincount(hist.block, weights=hist.count, minlength=h.leaves.size)
    truth = {
        name: np.bincount(h.ancestor_index(h.depth - 1, k), weights=leaf, minlength=h.sizes[k])
        for k, name in enumerate(h.names)
    }
    rows: dict[str, list] = {name: [] for name in h.names}
    for r in range(R):
        got: dict = {}

        def keep(piece, counts, spread, got=got):
            for j, name in enumerate(piece.names):
                total = np.asarray(counts[j]).reshape(len(counts[j]), -1).sum(axis=1)
                se = column_standard_errors(piece, name, spread[j])[:, 0]
                gls = column_standard_errors(piece, name, None)[:, 0]
                est = piece.estimates[j].reshape(-1, K).sum(axis=1)
                got[name] = (total, se, gls, total - est, spread[j])

        stream_pl94(
            h, schema, source, plan, KeyedRNG.reproducible(1000 + r, warn=False),
            invariants=INVARIANTS, cut=CUT,
            on_top=lambda top: keep(top.piece, top.counts, top.rounded.spread),
            on_partition=lambda pr: keep(pr.piece, pr.counts, pr.total_var),
        )  # fmt: skip
        for name in h.names:
            rows[name].append(got[name])
    report = {}
    for name in h.names:
        total, se, gls, moved, bound = (np.array(x) for x in zip(*rows[name], strict=True))
        err = total - truth[name]
        if name in ("nation", "state", "county"):
            # invariant: exact (its GLS standard error zero up to the solver's float error)
            assert np.all(err == 0) and np.all(se < 1e-6), name
            continue
        cover = float(np.mean(np.abs(err) <= Z90 * se))
        cover_gls = float(np.mean(np.abs(err) <= Z90 * gls))
        ratio = float(np.sqrt(bound.mean() / np.mean(moved**2)))
        report[name] = (cover, cover_gls, ratio)
        # the written standard error covers: 90% intervals at least 87% (binomial SE of a
        # 90% coverage over 200 × nodes draws is ≤ 2.1 points; 3 points is > 4 SE at tracts)
        assert cover >= 0.87, (name, report)
        # the bound is a bound, and not a loose one: within 1.5× the simulated rounding SD
        assert 1.0 <= ratio <= 1.5, (name, report)
    # power: without the rounding's variance the tracts' intervals under-cover
    assert report["tract"][1] < 0.87, report
    print(report)
