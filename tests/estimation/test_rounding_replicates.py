"""Replicate estimates of the rounding variance (structured_rounding, "Replicate rounding
variances"; issue 33.3).

* the kernel (:func:`rounding_replicates` + :func:`replicate_variance`) equals the slow,
  obvious computation: a Python loop over replicates and nodes, each replicate rounded by
  :func:`round_structured` with its key spelled out (``child("rounding-replicates")``);
* the estimate is unbiased: where the rounding variance is known exactly (each detailed
  cell ``f(1 − f)``; each node's total at the top network's levels ``ψ(1 − ψ)``) the mean of
  ``R = 400`` replicates is within the Bonferroni bound at α = 1e-6 of it, and an estimator
  centred at the release's own integers (the wrong law: ``Var + (N − x)²``) is rejected;
* the replicates' law is the release's, below the cut too: node totals' replicate variance
  against the spread of the release's own rounding over 400 keys, two-sample, and the
  replicates of a wrong law (partitions rounded from the *release's* cut integers, which
  forgets the cut nodes' error share) are rejected at the same α.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import norm

from censusdp.errors import SpecError
from censusdp.estimation.integer.controlled import (
    MAX_REPLICATES,
    REPLICATES,
    PartitionOptions,
    replicate_keys,
    replicate_variance,
    round_structured,
    round_structured_partition,
    rounding_replicates,
)
from censusdp.hierarchy.forest import Forest
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

ALPHA = 1e-6
SCHEMA = Schema.from_dict(
    {
        "name": "t",
        "attributes": [
            {"name": "a", "labels": ["x", "y", "z"]},
            {"name": "b", "labels": ["p", "q"]},
        ],
    }
)
CUT = 1


def _tiny(seed: int = 5, fanouts=((2, 2), (2, 3), (2, 3))):
    """Consistent real estimates on a random tree (noise centred within each level-1 node,
    so the nation and state totals are integers and held invariant)."""
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, list(fanouts))
    K = SCHEMA.n_cells
    truth = gen.integers(0, 5, size=(h.leaves.size, K))
    e = gen.normal(0.0, 0.8, size=truth.shape)
    anc = h.ancestor_index(-1, 1)
    sums = np.bincount(anc, weights=e.sum(axis=1), minlength=h.levels[1].size)
    e -= (sums / (np.bincount(anc, minlength=h.levels[1].size) * K))[anc][:, None]
    est = h.aggregate(truth + e)
    tru = h.aggregate(truth)
    total = ProductQuery.parse(SCHEMA, "total")
    invs = [
        ProductInvariant(k, total, total.apply(tru[k].reshape(-1, *SCHEMA.shape))) for k in (0, 1)
    ]
    rel = SimpleNamespace(
        hierarchy=h, schema=SCHEMA, estimates=[x.reshape(-1, *SCHEMA.shape) for x in est]
    )
    return h, rel, invs


def _z(m: int) -> float:
    return float(norm.isf(ALPHA / (2 * m)))


def test_replicate_variance_equals_the_slow_direct_computation():
    h, rel, invs = _tiny()
    rng = KeyedRNG.reproducible(3, warn=False)
    q = ProductQuery.parse(SCHEMA, "a")
    R = 5
    got = rounding_replicates(rel, rng, R, q, invariants=invs, cut=CUT)
    base = rng.child("rounding-replicates")
    outs = [round_structured(rel, base.child(str(r)), invariants=invs, cut=CUT) for r in range(R)]
    for k in range(h.depth):
        n = h.sizes[k]
        ref = np.zeros((n, 3))
        for i in range(n):  # node by node, replicate by replicate: the obvious computation
            x = q.apply(rel.estimates[k][i])
            for out in outs:
                ref[i] += (q.apply(out.counts[k][i]) - x) ** 2 / R
        assert got[k].shape == (R, n, 3)
        np.testing.assert_allclose(replicate_variance(got[k]), ref, rtol=1e-12, atol=1e-12)
    # the replicates are not the release's draws (their own key domain)
    release = round_structured(rel, rng.child("rounding"), invariants=invs, cut=CUT)
    assert any(not np.array_equal(release.counts[k], outs[0].counts[k]) for k in range(h.depth))


def test_replicate_count_is_checked():
    rng = KeyedRNG.reproducible(3, warn=False)
    assert replicate_keys(rng, 0) == []
    assert len(replicate_keys(rng, 3)) == 3
    for bad in (-1, MAX_REPLICATES + 1, 2.5, True):
        with pytest.raises(SpecError, match="rounding replicates"):
            replicate_keys(rng, bad)
    with pytest.raises(SpecError, match="no replicates"):
        replicate_variance(np.zeros((0, 2, 3)))
    assert REPLICATES == "rounding-replicates"


def _exact_z(V, v, m4, R):
    """z of the replicate means against their exact expectations (SD from the exact
    fourth moment), where the variance is not zero."""
    live = v > 1e-9
    return np.abs(V - v)[live] / np.sqrt((m4 - v**2)[live] / R)


def test_replicate_estimate_is_unbiased_where_the_variance_is_exact_and_has_power():
    h, rel, invs = _tiny()
    rng = KeyedRNG.reproducible(11, warn=False)
    R = 400
    cells = ProductQuery.parse(SCHEMA, "detailed")
    total = ProductQuery.parse(SCHEMA, "total")
    zc = rounding_replicates(rel, rng, R, cells, invariants=invs, cut=CUT)
    zt = rounding_replicates(rel, rng, R, total, invariants=invs, cut=CUT)
    release = round_structured(rel, rng.child("rounding"), invariants=invs, cut=CUT)
    assert release.top_network
    right, wrong, m = [], [], 0
    for k in range(h.depth):
        for z, q, exact in ((zc[k], cells, True), (zt[k], total, release.total_is_exact(k))):
            if not exact:
                continue
            x = q.apply(rel.estimates[k])
            f = x - np.floor(x)
            f[(f < 1e-9) | (f > 1 - 1e-9)] = 0.0
            v = f * (1 - f)  # one arc: floor or ceiling, P(up) = f
            m4 = v * ((1 - f) ** 3 + f**3)
            right.append(_exact_z(replicate_variance(z), v, m4, R))
            # the wrong law: centred at the release's own integers, not the estimates
            d = z - (q.apply(release.counts[k]) - x)[None]
            wrong.append(_exact_z(replicate_variance(d), v, m4, R))
            m += int((v > 1e-9).sum())
    assert m > 100
    assert np.concatenate(right).max() < _z(m)
    assert np.concatenate(wrong).max() > _z(m)


def _wrong_law_replicates(h, rel, invs, rng, R, q):
    """Replicates whose partitions start from the release's cut integers (not their own):
    the replicate forgets the cut nodes' share of the error, a narrower law."""
    release = round_structured(rel, rng.child("rounding"), invariants=invs, cut=CUT)
    n_cut = h.sizes[CUT]
    ranges = [(0, n_cut)]
    for k in range(CUT, h.depth - 1):
        ranges.append((0, h.sizes[k + 1]))
    out = []
    for key in replicate_keys(rng, R):
        part = round_structured_partition(
            Forest.of(h, CUT, ranges), [0] * len(ranges), h.sizes[CUT:], SCHEMA,
            release.counts[CUT], None, rel.estimates[CUT + 1 :], key,
            PartitionOptions(negative=True),
        )  # fmt: skip
        out.append([q.apply(c) - q.apply(rel.estimates[CUT + 1 + j]) for j, c in
                    enumerate(part.counts)])  # fmt: skip
    return [np.stack([o[j] for o in out]) for j in range(h.depth - CUT - 1)]


def test_replicates_follow_the_release_law_below_the_cut_and_a_wrong_law_is_rejected():
    h, rel, invs = _tiny(seed=9, fanouts=((2, 2), (3, 3), (4, 4)))
    rng = KeyedRNG.reproducible(21, warn=False)
    R = S = 400
    total = ProductQuery.parse(SCHEMA, "total")
    zt = rounding_replicates(rel, rng, R, total, invariants=invs, cut=CUT)
    # the release's own law: its rounding under S other keys
    rel_err = [[] for _ in range(h.depth)]
    for s in range(S):
        out = round_structured(
            rel, KeyedRNG.reproducible(10_000 + s, warn=False).child("rounding"),
            invariants=invs, cut=CUT,
        )  # fmt: skip
        for k in range(h.depth):
            rel_err[k].append(total.apply(out.counts[k]) - total.apply(rel.estimates[k]))
    wrong = _wrong_law_replicates(h, rel, invs, rng, R, total)
    zs_right, zs_wrong = [], []
    for k in range(CUT + 1, h.depth):
        e = np.stack(rel_err[k])
        a, b, w = zt[k] ** 2, e**2, wrong[k - CUT - 1] ** 2
        se = np.sqrt(a.var(axis=0, ddof=1) / R + b.var(axis=0, ddof=1) / S)
        live = se > 1e-9
        zs_right.append(np.abs(a.mean(0) - b.mean(0))[live] / se[live])
        sw = np.sqrt(w.var(axis=0, ddof=1) / R + b.var(axis=0, ddof=1) / S)
        live = sw > 1e-9
        zs_wrong.append(np.abs(w.mean(0) - b.mean(0))[live] / sw[live])
    m = sum(z.size for z in zs_right)
    assert m >= 20
    assert np.concatenate(zs_right).max() < _z(m)
    assert np.concatenate(zs_wrong).max() > _z(m)
