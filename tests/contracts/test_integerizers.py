"""Contract tests over the integerizer registry: every integer step on the partition driver.

Every registered :class:`~censusdp.pipelines.partition_driver.Integerizer`
(``INTEGERIZERS``: the flat rounding and the non-negative product, registered where they are
defined in :mod:`censusdp.pipelines.gls_partitioned`, and the TopDown-style product of
:mod:`censusdp.pipelines.topdown_integerizer`), on one small GLS release (nation →
4 → ~12 → ~30 nodes, six cells, the level-1 totals invariant), run by
:func:`~censusdp.pipelines.partition_driver.integerize` from a release kept per partition:

- partitioned == whole: the same integers, bit for bit (``np.array_equal``), as the step's
  single-process ``whole``, for every cut, several partition counts and the sync, threads and
  Dask executors;
- integer and consistent: int64 at every level, every level the sum of its children (``==``);
- invariants exact (``==``).

An integerizer registered later is picked up by the parametrisation with no edit here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import censusdp.pipelines.gls_partitioned  # noqa: F401  (registers the integer steps)
import censusdp.pipelines.topdown_integerizer  # noqa: F401
from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.partition_driver import (
    INTEGERIZERS,
    DriverOptions,
    Integerizer,
    PartitionDriver,
    integerize,
    register_integerizer,
)
from censusdp.pipelines.partitioned_release import PartitionedRelease
from censusdp.rng import KeyedRNG

CELLS = [f"{s}{a}" for s in ("m", "f") for a in range(3)]
NAMES = INTEGERIZERS.names()


@pytest.fixture(scope="module")
def release():
    gen = np.random.default_rng(4)
    h = random_hierarchy(gen, [(4, 4), (2, 4), (2, 4)])
    counts = h.aggregate(gen.integers(0, 6, (h.leaves.size, len(CELLS))))
    rng = KeyedRNG.reproducible(4, warn=False)
    plan = [(k, Query.detailed(CELLS), DiscreteGaussian(2.0)) for k in range(1, h.depth)]
    meas = measure(h.names, counts, plan, rng.child("measure"))
    invs = [invariant(counts, 1, Query.total(CELLS))]
    privacy = PrivacyStatement("zcdp", rho=1.0, invariants=(f"{h.names[1]}: total",))
    return tree_gls(h, CELLS, meas, invs, privacy), invs


def _check_integer(rel, invs) -> None:
    h = rel.hierarchy
    for k in range(h.depth):
        assert rel.estimates[k].dtype == np.int64
    for k, summed in enumerate(h.aggregate(rel.estimates[-1])):
        assert np.array_equal(summed, rel.estimates[k])
    for iv in invs:
        assert np.array_equal(iv.query.apply(rel.estimates[iv.level]), iv.values)


def _partitioned(cls, whole_release, invs, rng, ex, cut: int, n: int):
    parts = partition_units(whole_release.hierarchy, cut, n)
    kept = PartitionedRelease.of(whole_release, parts, ex)
    try:
        step = cls.of(kept, rng, invs)
        assert isinstance(step, Integerizer)
        got = integerize(step, PartitionDriver(len(parts), ex, DriverOptions(cache_bytes=None)))
        try:
            return got.gather()
        finally:
            got.drop()
    finally:
        kept.drop()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", ["sync", "threads"])
def test_partitioned_equals_whole(release, name, backend):
    rel, invs = release
    cls = INTEGERIZERS.get(name)
    rng = KeyedRNG.reproducible(9, warn=False).child(name)
    want = cls.whole(rel, rng, invs)
    _check_integer(want, invs)
    with open_executor(backend) as ex:
        for cut in range(1, rel.hierarchy.depth - 1):
            for n in (1, 3, 7):
                got = _partitioned(cls, rel, invs, rng, ex, cut, n)
                assert all(
                    np.array_equal(a, b) for a, b in zip(got.estimates, want.estimates, strict=True)
                ), (name, backend, cut, n)
                assert got.integer and got.diagnostics["rounding"] == want.diagnostics["rounding"]
                _check_integer(got, invs)


@pytest.mark.parametrize("name", NAMES)
def test_partitioned_equals_whole_on_dask(release, name, dask_executor):
    rel, invs = release
    cls = INTEGERIZERS.get(name)
    rng = KeyedRNG.reproducible(9, warn=False).child(name)
    want = cls.whole(rel, rng, invs)
    got = _partitioned(cls, rel, invs, rng, dask_executor, 2, 5)
    assert all(np.array_equal(a, b) for a, b in zip(got.estimates, want.estimates, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_other_estimates_give_other_integers(release, name):
    """Power of the equality check: the whole product of the release with 2.5 moved from one
    leaf's first cell to its second (every total, so the invariant, kept) differs, so the
    bit-for-bit check above can fail."""
    rel, invs = release
    cls = INTEGERIZERS.get(name)
    rng = KeyedRNG.reproducible(9, warn=False).child(name)
    leaves = rel.estimates[-1].copy()
    leaves[0, :2] += (2.5, -2.5)
    moved = dataclasses.replace(rel, estimates=rel.hierarchy.aggregate(leaves))
    a, b = cls.whole(rel, rng, invs), cls.whole(moved, rng, invs)
    assert not np.array_equal(a.estimates[-1], b.estimates[-1])


def test_registry_lists_the_integer_steps_and_refuses_an_incomplete_one():
    assert {"round", "nonnegative", "topdown"} <= set(NAMES)

    class Half:
        name = "half"

        def top(self, messages):  # pragma: no cover - never run
            return None

    with pytest.raises(SpecError, match="integerizer Half lacks"):
        register_integerizer(Half)
    assert "half" not in INTEGERIZERS.names()
