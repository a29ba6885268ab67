"""Partitioned measurement equals single-process measurement bit for bit, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, measure
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.measure import measure_partitioned
from censusdp.pipelines.partition import partition_units
from censusdp.rng import KeyedRNG

CELLS = ["a", "b"]


def _tree():
    gen = np.random.default_rng(3)  # test fixture shape only
    fan1 = gen.integers(1, 6, 9)
    fan2 = gen.integers(1, 8, int(fan1.sum()))
    h = Hierarchy.from_parents(
        ["nation", "state", "county", "block"],
        [
            ["US"],
            [f"s{i}" for i in range(9)],
            [f"c{i:03d}" for i in range(int(fan1.sum()))],
            [f"b{i:04d}" for i in range(int(fan2.sum()))],
        ],
        [
            None,
            np.zeros(9, int),
            np.repeat(np.arange(9), fan1),
            np.repeat(np.arange(fan1.sum()), fan2),
        ],
    )
    leaves = gen.integers(0, 50, (h.leaves.size, 2))
    return h, h.aggregate(leaves)


PLAN = [
    (0, Query.total(CELLS), Laplace(2.0)),
    (1, Query.detailed(CELLS), Gaussian(1.5)),
    (2, Query.total(CELLS), Laplace(1.0)),
    (2, Query.detailed(CELLS), Laplace(1.0)),
    (3, Query.detailed(CELLS), Gaussian(3.0)),
]


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("n_parts", [1, 3, 17])
@pytest.mark.parametrize("cut", [1, 2])
def test_partitioned_measurement_is_bit_identical(scheduler, n_parts, cut):
    h, counts = _tree()
    rng = KeyedRNG.reproducible(5, warn=False)
    ref = measure(h.names, counts, PLAN, rng)
    with open_executor(scheduler, workers=2) as ex:
        got = measure_partitioned(h.names, counts, PLAN, rng, partition_units(h, cut, n_parts), ex)
    for a, b in zip(ref, got, strict=True):
        assert a.level == b.level and a.query is b.query
        assert np.array_equal(a.values, b.values)


def test_dask_local_cluster_is_bit_identical():
    h, counts = _tree()
    rng = KeyedRNG.reproducible(5, warn=False)
    ref = measure(h.names, counts, PLAN, rng)
    with open_executor("distributed", workers=2) as ex:
        for n_parts in (1, 3, 17):
            got = measure_partitioned(
                h.names, counts, PLAN, rng, partition_units(h, 1, n_parts), ex
            )
            assert all(np.array_equal(a.values, b.values) for a, b in zip(ref, got, strict=True))
