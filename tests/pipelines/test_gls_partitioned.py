"""Partitioned GLS and rounding equal the single-process results bit for bit, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.estimation.gls.tree import NodeVarianceMeasurement, tree_gls
from censusdp.estimation.integer.laminar import round_release, round_tree, rounding_variance
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import Invariant, Measurement, Query
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.partition import partition_units
from censusdp.rng import KeyedRNG

PARTS = (1, 3, 17)
KINDS = ("diagonal", "general", "node_variance", "flat")


def _tree(seed: int, one_block_per_tract: bool = False) -> Hierarchy:
    gen = np.random.default_rng(seed)  # fixture shape only
    f1 = gen.integers(1, 6, 9)
    f2 = gen.integers(1, 8, int(f1.sum()))
    f3 = np.ones(int(f2.sum()), int) if one_block_per_tract else gen.integers(1, 5, int(f2.sum()))
    sizes = [1, 9, int(f1.sum()), int(f2.sum()), int(f3.sum())]
    names = ["nation", "state", "county", "tract", "block"]
    codes = [[f"{n[0]}{i}" for i in range(s)] for n, s in zip(names, sizes, strict=True)]
    parents = [None, np.zeros(9, int)] + [
        np.repeat(np.arange(s), f) for s, f in zip(sizes[1:4], (f1, f2, f3), strict=True)
    ]
    return Hierarchy.from_parents(names, codes, parents)


def _problem(kind: str, seed: int = 1):
    """A hierarchy and GLS inputs exercising one path of the tree passes."""
    gen = np.random.default_rng(seed)
    h = _tree(seed, one_block_per_tract=kind == "flat")
    cells = ["a", "b"] if kind == "diagonal" else ["a", "b", "c"]
    counts = h.aggregate(gen.integers(0, 40, (h.leaves.size, len(cells))))
    det, tot = Query.detailed(cells), Query.total(cells)

    def noisy(k: int, q: Query, s: float) -> Measurement:
        t = q.apply(counts[k]).astype(float)
        return Measurement(k, q, t + gen.normal(0, s, t.shape), Gaussian(s))

    if kind == "diagonal":  # identity queries only
        meas = [noisy(k, det, s) for k, s in ((1, 2.0), (2, 1.5), (3, 3.0), (4, 2.5))]
        invs = [Invariant(k, det, counts[k].astype(float)) for k in (0, 1)]
        return h, cells, meas, invs
    invs = [Invariant(1, tot, tot.apply(counts[1]).astype(float))]
    if kind == "flat":  # leaves measured by their total only: bordered relations at tracts
        meas = [noisy(4, tot, 1.0), noisy(3, det, 2.0), noisy(2, tot, 1.5), noisy(1, tot, 1.0)]
        return h, cells, meas, invs
    half = Query.marginal("halves", cells, {"x": cells[:1], "y": cells[1:]})
    leaf = noisy(4, det, 2.0)
    if kind == "node_variance":
        nv = gen.uniform(1, 5, h.leaves.size)
        leaf = NodeVarianceMeasurement(4, det, leaf.values, leaf.law, node_variance=nv)
    meas = [noisy(0, tot, 1.0), noisy(1, half, 2.0), noisy(2, tot, 1.5)]
    meas += [noisy(3, half, 3.0), noisy(3, tot, 1.0), leaf]
    return h, cells, meas, invs


def _equal(a: list | None, b: list | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _check_all(ex, kinds=KINDS, cuts=(1, 2, 4), parts=PARTS) -> None:
    rng = KeyedRNG.reproducible(3, warn=False)
    for kind in kinds:
        h, cells, meas, invs = _problem(kind)
        ref = tree_gls(h, cells, meas, invs, None, covariance=True)
        rounded = {m: round_release(ref, rng, method=m) for m in ("cells", "totals", "bipartite")}
        for cut in cuts:
            for n in parts:
                units = partition_units(h, cut, n)
                got = partitioned_gls(h, cells, meas, invs, None, units, ex, covariance=True)
                where = f"{kind}, cut {cut}, {len(units)} partitions"
                assert _equal(got.estimates, ref.estimates), where
                assert _equal(got.variances, ref.variances), where
                assert _equal(got.covariances, ref.covariances), where
                for method, want in rounded.items():
                    r = partitioned_round(ref, rng, units, ex, method=method)
                    assert r.integer and _equal(r.estimates, want.estimates), (where, method)
                    assert _equal(r.variances, want.variances), (where, method)


@pytest.mark.parametrize(
    ("scheduler", "cuts"),
    [
        ("sync", (1, 2, 4)),
        ("threads", (2,)),
        pytest.param("threads", (1, 2, 4), marks=pytest.mark.slow),
    ],
    ids=["sync", "threads", "threads-every-cut"],
)
def test_partitioned_gls_and_rounding_are_bit_identical(scheduler, cuts):
    """Every problem kind, cut level and partition count on the sync scheduler; threads add
    concurrency, which one cut level shows in the fast suite (every cut runs slow)."""
    with open_executor(scheduler, workers=2) as ex:
        _check_all(ex, cuts=cuts)


def test_problems_cover_plain_and_bordered_relations():
    """The bit-identity problems exercise both branches of the kernel's upward pass: only
    plain information updates, and bordered relations (flat children) below the cuts."""
    from censusdp.estimation.gls.tree import gls_plan, gls_upward, whole_forest

    bordered = {}
    for kind in KINDS:
        h, cells, meas, invs = _problem(kind)
        plan, m, i = gls_plan(h, cells, meas, invs)
        ups = gls_upward(plan, whole_forest(h), m, i).ups
        bordered[kind] = any(u.rc is not None and bool(np.any(u.rc > 0)) for u in ups)
    assert bordered == {"diagonal": False, "general": False, "node_variance": False, "flat": True}
    # the flat case is not determined by the leaves' own measurements
    h, cells, meas, invs = _problem("flat")
    with pytest.raises(Exception, match="not identifiable"):
        tree_gls(h, cells, [m for m in meas if m.level == 4], [], None)


@pytest.mark.parametrize(
    "parts", [(3,), pytest.param(PARTS, marks=pytest.mark.slow)], ids=["fast", "full"]
)
def test_dask_local_cluster_is_bit_identical(dask_executor, parts):
    """What only the cluster adds is shipping partitions to other processes: three partitions
    show it (one and seventeen are the sync and threads tests' business); all counts run slow."""
    _check_all(dask_executor, kinds=("diagonal", "flat"), cuts=(2,), parts=parts)


def test_partitioned_rounding_keeps_sums_and_invariants():
    rng = KeyedRNG.reproducible(9, warn=False)
    with open_executor("sync") as ex:
        # "cells": every (node, cell) sum within floor/ceil; state histograms invariant
        h, cells, meas, invs = _problem("diagonal", seed=4)
        real = tree_gls(h, cells, meas, invs, None)
        got = partitioned_round(real, rng, partition_units(h, 2, 5), ex, method="cells").estimates
        for k in range(h.depth):
            r = real.estimates[k]
            assert np.all((got[k] >= np.floor(r - 1e-7)) & (got[k] <= np.ceil(r + 1e-7))), k
        for k in (0, 1):
            assert np.array_equal(got[k], np.rint(real.estimates[k]).astype(np.int64))
        # "totals": every node total and every leaf cell; state totals invariant
        h, cells, meas, invs = _problem("general", seed=4)
        real = tree_gls(h, cells, meas, invs, None)
        got = partitioned_round(real, rng, partition_units(h, 2, 5), ex, method="totals").estimates
    for k in range(h.depth):
        r = real.estimates[k].sum(1)
        assert np.all((got[k].sum(1) >= np.floor(r - 1e-7)) & (got[k].sum(1) <= np.ceil(r + 1e-7)))
    assert np.array_equal(got[1].sum(1), np.rint(real.estimates[1].sum(1)).astype(np.int64))
    leaf = real.estimates[-1]
    assert np.all((got[-1] == np.floor(leaf)) | (got[-1] == np.ceil(leaf)))


@pytest.mark.parametrize("R", [300, pytest.param(1500, marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", ["cells", "totals"])
def test_keyed_tree_rounding_is_unbiased(mode, R):
    h = _tree(5)
    gen = np.random.default_rng(2)
    x = gen.uniform(-2, 6, (h.leaves.size, 2))
    acc = np.zeros_like(x)
    base = KeyedRNG.reproducible(11, warn=False)
    for r in range(R):
        acc += round_tree(h, x, base.child(str(r)), mode=mode)[-1]
    se = np.sqrt(rounding_variance(x) / R)
    live = se > 0
    assert np.all(np.abs(acc / R - x)[live] < 4 * se[live])
