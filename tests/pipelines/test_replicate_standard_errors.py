"""The streamed engine's replicate roundings and the PPMF route's ``_se`` (issue 33.3).

* the engine's replicate errors (``rounding_replicates = R``) do not depend on the
  partitioning, leave the release's own integers unchanged, and equal the in-memory
  :func:`~censusdp.estimation.integer.controlled.rounding_replicates` on the same estimates
  (the top and every partition re-rounded, each partition from its replicate's cut integers);
* every P1–P5 column's ``_se`` (:func:`~censusdp.pipelines.products.ppmf_persons.column_standard_errors`
  as the route calls it) is at least its GLS standard error, strictly larger wherever the
  column's real estimate is not an integer (the rounding moved it), and equal where it is
  (the invariant totals).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from ppmf_fixtures import ppmf_persons

from censusdp.errors import SpecError
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.integer.controlled import replicate_variance, rounding_replicates
from censusdp.pipelines.execute import SyncExecutor
from censusdp.pipelines.io.ppmf import read_ppmf
from censusdp.pipelines.products.pl94_stream import (
    Pl94StreamOptions,
    SparseHistogram,
    StandardErrorSummary,
    stream_pl94,
)
from censusdp.pipelines.products.pl94_tables import pl94_codebook
from censusdp.pipelines.products.ppmf_persons import CUT, INVARIANTS, column_standard_errors
from censusdp.rng import KeyedRNG

R = 3


@pytest.fixture(scope="module")
def county_pair(tmp_path_factory):
    """Two counties of one state, 2 tracts × 2 block groups × 2 blocks each, 800 persons."""
    blocks = [
        ("01", c, f"000{t}00", bg, f"{bg}{b:03d}")
        for c in ("001", "003")
        for t in (1, 2)
        for bg in ("1", "2")
        for b in range(2)
    ]
    d = tmp_path_factory.mktemp("pair")
    ppmf_persons(np.random.default_rng(7), 800, blocks, household_share=0.85).to_csv(
        d / "ppmf.csv", index=False
    )
    hist = read_ppmf(d / "ppmf.csv")
    h, schema = hist.hierarchy, hist.schema
    alloc = schema.allocation
    plan = allocation_plan(
        schema, dataclasses.replace(alloc, rho=Fraction(alloc.rho)), levels=h.names
    )
    return h, schema, SparseHistogram.of(hist), plan


def _run(h, schema, source, plan, replicates, partitions=0):
    got: dict = {"parts": []}
    stream_pl94(
        h, schema, source, plan, KeyedRNG.reproducible(5, warn=False),
        on_top=lambda t: got.__setitem__("top", t),
        on_partition=lambda p: got["parts"].append(p),
        options=Pl94StreamOptions(invariants=INVARIANTS, cut=CUT, partitions=partitions,
                                  rounding_replicates=replicates),
    )  # fmt: skip
    top, parts = got["top"], sorted(got["parts"], key=lambda p: p.partition.units)
    k = h.level_index(CUT)
    below = range(h.depth - k - 1)
    est = list(top.piece.estimates) + [
        np.concatenate([p.piece.estimates[j] for p in parts]) for j in below
    ]
    counts = list(top.counts) + [np.concatenate([p.counts[j] for p in parts]) for j in below]
    errs = None
    if replicates:
        errs = list(top.replicate_errors) + [
            np.concatenate([p.replicate_errors[j] for p in parts], axis=1) for j in below
        ]
    return top, parts, est, counts, errs


def test_stream_replicates_are_partition_free_and_equal_the_in_memory_ones(county_pair):
    h, schema, source, plan = county_pair
    top, parts, est, counts, errs = _run(h, schema, source, plan, R)
    assert len(parts) == 2
    _, parts1, _, counts1, errs1 = _run(h, schema, source, plan, R, partitions=1)
    assert len(parts1) == 1
    _, _, _, counts0, errs0 = _run(h, schema, source, plan, 0)
    assert errs0 is None
    for k in range(h.depth):
        assert np.array_equal(counts[k], counts0[k])  # the release does not see the replicates
        assert np.array_equal(counts[k], counts1[k])
        assert errs[k].shape == (R, h.sizes[k], 298)
        assert np.array_equal(errs[k], errs1[k])
    rel = SimpleNamespace(hierarchy=h, schema=schema, estimates=est)
    ref = rounding_replicates(
        rel, KeyedRNG.reproducible(5, warn=False), R, pl94_codebook().rows,
        invariants=list(top.invariants), cut=h.level_index(CUT),
    )  # fmt: skip
    for k in range(h.depth):
        np.testing.assert_allclose(errs[k], ref[k], rtol=0, atol=1e-9)
        assert np.any(errs[k] != 0)


def test_every_column_se_includes_the_rounding_where_it_rounded(county_pair):
    h, schema, source, plan = county_pair
    top, parts, _, _, _ = _run(h, schema, source, plan, R)
    rows = pl94_codebook().rows
    whole = list(pl94_codebook().columns).index("P1_001N")
    k_cut = h.level_index(CUT)
    # (piece, level name, its row j in the piece, replicate errors, exact total variance)
    cases = [
        (top.piece, h.names[k], k, top.replicate_errors[k],
         top.rounded.spread[k] if top.rounded.total_is_exact(k) else None)
        for k in range(k_cut + 1)
    ]  # fmt: skip
    cases += [
        (p.piece, name, j, p.replicate_errors[j], None)
        for p in parts
        for j, name in enumerate(p.names)
    ]
    moved_total = 0
    for piece, name, j, z, tv in cases:
        se = column_standard_errors(piece, name, tv, replicate_variance(z))
        gls = column_standard_errors(piece, name)
        real = rows.apply(piece.estimates[j])
        moved = np.abs(real - np.rint(real)) > 1e-6
        assert np.all(se >= gls), name
        assert np.all(se[moved] > gls[moved]), name
        assert np.all(se[~moved] == gls[~moved]), name
        if tv is not None:  # the top network's totals: the exact ψ(1 − ψ) of one arc
            np.testing.assert_allclose(se[:, whole] ** 2, gls[:, whole] ** 2 + tv, rtol=1e-9)
        moved_total += int(moved.sum())
    assert moved_total > 1000
    # the nation and state totals are invariant: integral, their _se the GLS one (≈ 0)
    nation = column_standard_errors(top.piece, "nation", top.rounded.spread[0],
                                    replicate_variance(top.replicate_errors[0]))  # fmt: skip
    assert nation[0, whole] < 1e-6


def test_replicate_count_and_rows_are_checked(county_pair):
    h, schema, source, plan = county_pair
    with pytest.raises(SpecError, match="rounding replicates"):
        stream_pl94(h, schema, source, plan, KeyedRNG.reproducible(5, warn=False),
                    options=Pl94StreamOptions(invariants=INVARIANTS, cut=CUT,
                                              rounding_replicates=-1))  # fmt: skip


def test_standard_error_summary_says_gls_only_or_adds_the_replicates(county_pair):
    h, schema, source, plan = county_pair
    tables = ("total", "votingage * hispanic")
    plain, with_reps = StandardErrorSummary(schema, tables), StandardErrorSummary(schema, tables)
    got: dict = {"parts": []}
    stream_pl94(
        h, schema, source, plan, KeyedRNG.reproducible(5, warn=False),
        on_top=lambda t: got.__setitem__("top", t),
        on_partition=lambda p: got["parts"].append(p),
        options=Pl94StreamOptions(invariants=INVARIANTS, cut=CUT, rounding_replicates=R,
                                  replicate_rows=with_reps.rows),
    )  # fmt: skip
    releases = [got["top"], *got["parts"]]
    for rel in releases:
        plain.add(rel.piece)
        with_reps.add(rel.piece, rel.replicate_errors)
    a, b = plain.result(h.names), with_reps.result(h.names)
    assert a["tract"]["total"]["rounding"].startswith("not included (GLS only)")
    assert b["tract"]["total"]["rounding"].endswith(f"(R = {R})")
    for lvl in ("tract", "block_group", "block"):
        for t in tables:
            assert b[lvl][t]["mean"] > a[lvl][t]["mean"], (lvl, t)
    # the same replicate roundings seen through other rows: the total row is P1_001N
    _, _, _, _, errs = _run(h, schema, source, plan, R)
    parts = sorted(got["parts"], key=lambda p: p.partition.units)
    j = list(parts[0].names).index("tract")
    mine = np.concatenate([p.replicate_errors[j] for p in parts], axis=1)
    p1 = list(pl94_codebook().columns).index("P1_001N")
    np.testing.assert_allclose(mine[:, :, 0], errs[h.level_index("tract")][:, :, p1], atol=1e-9)
    # the direct mean over the tract nodes of sqrt(GLS² + mean of squared errors)
    se = []
    for p in got["parts"]:
        j = list(p.names).index("tract")
        gls = p.piece.query_standard_errors("tract", with_reps.queries[0])[:, 0]
        se.append(np.sqrt(gls**2 + np.mean(p.replicate_errors[j][:, :, 0] ** 2, axis=0)))
    assert np.isclose(b["tract"]["total"]["mean"], np.concatenate(se).mean(), rtol=1e-12)


def test_replicates_in_tasks_with_restricted_keys_equal_the_in_process_ones(county_pair):
    """With an executor each partition is rounded in its task from sub-keys of its own
    chunks (never a key): the replicates too, and they give the same errors."""
    h, schema, source, plan = county_pair
    _, parts, _, _, _ = _run(h, schema, source, plan, R)
    want = {p.partition.units: p.replicate_errors for p in parts}
    res = stream_pl94(
        h, schema, source, plan, KeyedRNG.reproducible(5, warn=False),
        options=Pl94StreamOptions(
            invariants=INVARIANTS, cut=CUT, rounding_replicates=R, executor=SyncExecutor(),
            sink=lambda rel, payload: (rel.partition.units, rel.replicate_errors),
            sink_payload=lambda p: None,
        ),
    )  # fmt: skip
    assert len(res.sunk) == len(want) == 2
    for units, errs in res.sunk:
        for a, b in zip(errs, want[units], strict=True):
            assert np.array_equal(a, b)
