"""Coverage of the PPMF route's intervals, rounding included (issue 33.3).

A synthetic PPMF county file (6 tracts × 2 block groups × 4 blocks, 3,000 persons) is
released 200 times by the route's engine (production allocation, nation and state totals
invariant, :data:`~censusdp.pipelines.products.ppmf_persons.ROUNDING_REPLICATES` replicate
roundings) with different seeds; per level the nominal 90% intervals ``released ± 1.645 ·
_se`` are checked against the truth, with ``_se`` what the route writes
(:func:`~censusdp.pipelines.products.ppmf_persons.column_standard_errors`: the GLS variance plus the
rounding's, exact ``ψ(1 − ψ)`` for the totals of the top network, the replicate estimate
elsewhere) for the whole population (``P1_001N``) and two other columns, ``P1_003N`` (White
alone) and ``P2_002N`` (Hispanic or Latino). The county (= the state: one county) is
invariant: its total is released exactly with a zero standard error.

Coverage must lie within 87–93% (± 3 points: the binomial SE of a 90% coverage over 200 ×
the level's nodes is at most 0.87 points, at tracts), for ``P1_001N`` at tract, block group
and block, for the other two columns at tract and block group. Power: the GLS-only standard
error (what the route wrote before) under-covers somewhere (below 87%). The totals' bound
(:attr:`~censusdp.estimation.integer.controlled.RoundedLevels.spread`, no longer used for
``_se`` below the county) is reported against the simulated rounding SD and must still be a
bound. Slow (~520 s on a shared 2-core machine): run with ``-m slow``.

Measured (R = 32 replicates; coverage with the written ``_se`` / with the GLS-only one)::

    level        P1_001N          P1_003N          P2_002N          bound / SD
    tract        0.9125 / 0.6983  0.8992 / 0.6217  0.8983 / 0.7550  1.303
    block_group  0.9100 / 0.6875  0.8929 / 0.6250  0.9054 / 0.8096  1.388
    block        0.9031 / 0.9031  0.8940 / 0.8933  0.8958 / 0.8917  1.298
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.integer.controlled import replicate_variance
from censusdp.pipelines.io.ppmf import read_ppmf
from censusdp.pipelines.products.pl94_stream import Pl94StreamOptions, SparseHistogram, stream_pl94
from censusdp.pipelines.products.pl94_tables import pl94_codebook
from censusdp.pipelines.products.ppmf_persons import (
    CUT,
    INVARIANTS,
    ROUNDING_REPLICATES,
    column_standard_errors,
)
from censusdp.rng import KeyedRNG

R = 200
Z90 = 1.6448536269514722
COLUMNS = ("P1_001N", "P1_003N", "P2_002N")
#: (column, levels) whose 90% intervals must cover within 87–93%
CHECKED = {
    "P1_001N": ("tract", "block_group", "block"),
    "P1_003N": ("tract", "block_group"),
    "P2_002N": ("tract", "block_group"),
}


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
def test_intervals_cover_at_every_level(tmp_path):
    hist = _county(tmp_path)
    h, schema = hist.hierarchy, hist.schema
    alloc = schema.allocation
    plan = allocation_plan(
        schema, dataclasses.replace(alloc, rho=Fraction(alloc.rho)), levels=h.names
    )
    source = SparseHistogram.of(hist)
    K = schema.n_cells
    book = pl94_codebook()
    cols = [list(book.columns).index(c) for c in COLUMNS]
    leaf = np.zeros((h.leaves.size, K), np.int64)
    lf, cell, count = source(0, h.leaves.size)
    np.add.at(leaf, (lf, cell), count)
    truth = {
        name: book.rows.apply(x.reshape(-1, *schema.shape))[:, cols]
        for name, x in zip(h.names, h.aggregate(leaf), strict=True)
    }
    rows: dict[str, list] = {name: [] for name in h.names}
    for r in range(R):
        got: dict = {}

        def keep(piece, counts, exact, reps, bound, got=got):
            for j, name in enumerate(piece.names):
                released = book.rows.apply(np.asarray(counts[j]))[:, cols]
                se = column_standard_errors(piece, name, exact[j], replicate_variance(reps[j]))
                gls = column_standard_errors(piece, name)
                moved = counts[j].reshape(len(counts[j]), -1).sum(axis=1) - piece.estimates[
                    j
                ].reshape(-1, K).sum(axis=1)
                got[name] = (released, se[:, cols], gls[:, cols], moved, bound[j])

        def on_top(top):
            rl = top.rounded
            exact = [rl.spread[k] if rl.total_is_exact(k) else None for k in range(len(rl.counts))]
            keep(top.piece, top.counts, exact, top.replicate_errors, rl.spread)

        stream_pl94(
            h, schema, source, plan, KeyedRNG.reproducible(1000 + r, warn=False),
            options=Pl94StreamOptions(invariants=INVARIANTS, cut=CUT,
                                      rounding_replicates=ROUNDING_REPLICATES),
            on_top=on_top,
            on_partition=lambda pr: keep(pr.piece, pr.counts, [None] * len(pr.counts),
                                         pr.replicate_errors, pr.total_var),
        )  # fmt: skip
        for name in h.names:
            rows[name].append(got[name])
    report: dict = {}
    for name in h.names:
        released, se, gls, moved, bound = (np.array(x) for x in zip(*rows[name], strict=True))
        err = released - truth[name][None]
        if name in ("nation", "state", "county"):
            # invariant total: exact (its GLS standard error zero up to the solver's float error)
            assert np.all(err[..., 0] == 0) and np.all(se[..., 0] < 1e-6), name
            continue
        cover = np.mean(np.abs(err) <= Z90 * se, axis=(0, 1))
        cover_gls = np.mean(np.abs(err) <= Z90 * gls, axis=(0, 1))
        ratio = float(np.sqrt(bound.mean() / np.mean(moved**2)))
        report[name] = {
            c: (round(float(a), 4), round(float(b), 4))
            for c, a, b in zip(COLUMNS, cover, cover_gls, strict=True)
        } | {"total_bound_over_sd": round(ratio, 3)}
        # the totals' spread is still a bound on the rounding variance of a node's total
        assert ratio >= 1.0, (name, report)
    print(report)
    for c, levels in CHECKED.items():
        for name in levels:
            assert 0.87 <= report[name][c][0] <= 0.93, (c, name, report)
    # power: without the rounding's variance the intervals under-cover somewhere
    assert min(report[name][c][1] for c, levels in CHECKED.items() for name in levels) < 0.87
