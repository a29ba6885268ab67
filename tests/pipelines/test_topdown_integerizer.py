"""The TopDown-style integer step (:mod:`censusdp.pipelines.topdown_integerizer`) beyond the
integerizer contract (partitioned == whole, integer, consistent, invariants exact, in
``tests/contracts/test_integerizers.py``): what makes it TopDown-style.

- a GLS release of small counts under large noise has negative cells; its TopDown-style
  product has none, every level sums from its children (``==``), the invariants hold (``==``),
  no standard errors are claimed and the statement is the release's with the product's note;
- a release that already is the truth (non-negative integers, consistent) comes back
  unchanged: every per-parent L2 fit is exact and the rounding keeps it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.topdown_integerizer import NOTE, TopDownIntegerizer
from censusdp.rng import KeyedRNG

CELLS = [f"c{j}" for j in range(4)]


def _problem(seed: int):
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(3, 4), (2, 4), (2, 5)])
    counts = h.aggregate(gen.poisson(0.7, (h.leaves.size, len(CELLS))).astype(np.int64))
    rng = KeyedRNG.reproducible(seed, warn=False)
    plan = [(k, Query.detailed(CELLS), DiscreteGaussian(9.0)) for k in range(1, h.depth)]
    meas = measure(h.names, counts, plan, rng.child("measure"))
    invs = [invariant(counts, 1, Query.total(CELLS))]
    privacy = PrivacyStatement("zcdp", rho=1.0, invariants=(f"{h.names[1]}: total",))
    return h, counts, tree_gls(h, CELLS, meas, invs, privacy), invs


def test_negative_estimates_become_non_negative_consistent_integers():
    h, counts, rel, invs = _problem(3)
    assert (rel.estimates[-1] < 0).any()  # the release the step must repair
    got = TopDownIntegerizer.whole(rel, KeyedRNG.reproducible(1, warn=False), invs)
    for k, est in enumerate(got.estimates):
        assert est.dtype == np.int64 and est.min() >= 0
        if k:
            assert np.array_equal(h.aggregate_up(k, est), got.estimates[k - 1])
    for iv in invs:
        assert np.array_equal(iv.query.apply(got.estimates[1]), iv.values)
    assert got.estimates[0].sum() == counts[0].sum()  # the root total the invariant implies
    assert got.integer and got.variances is None and got.covariances is None
    assert got.diagnostics["rounding"] == "topdown"
    assert NOTE in got.privacy.notes and got.privacy.rho == rel.privacy.rho


def test_the_truth_comes_back_unchanged():
    h, counts, rel, invs = _problem(5)
    truth = dataclasses.replace(rel, estimates=[c.astype(np.float64) for c in counts])
    got = TopDownIntegerizer.whole(truth, KeyedRNG.reproducible(1, warn=False), invs)
    assert all(np.array_equal(a, b) for a, b in zip(got.estimates, counts, strict=True))
    # power: the noisy release does not come back as the truth
    noisy = TopDownIntegerizer.whole(rel, KeyedRNG.reproducible(1, warn=False), invs)
    assert not np.array_equal(noisy.estimates[-1], counts[-1])
