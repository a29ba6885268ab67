"""Partitioned measurement equals single-process measurement bit for bit, on every backend;
its tasks (and the estimation and rounding tasks after it) receive sub-keys, never the key."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.laminar import round_release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.execute import DaskExecutor, SyncExecutor, open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.measure import measure_partitioned
from censusdp.pipelines.partition import partition_units
from censusdp.rng import KeyedRNG, StreamNotHeld

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


def test_dask_local_cluster_is_bit_identical(dask_executor):
    h, counts = _tree()
    rng = KeyedRNG.reproducible(5, warn=False)
    ref = measure(h.names, counts, PLAN, rng)
    for n_parts in (1, 3, 17):
        got = measure_partitioned(
            h.names, counts, PLAN, rng, partition_units(h, 1, n_parts), dask_executor
        )
        assert all(np.array_equal(a.values, b.values) for a, b in zip(ref, got, strict=True))


class _Recording(SyncExecutor):
    """The reference backend, keeping the pickled form of everything each task receives
    (what Dask would ship to a worker)."""

    def __init__(self) -> None:
        self.shipped: list[tuple[str, bytes]] = []

    def submit(self, fn, items, *extra, cost=None):
        self.shipped += [(fn.__name__, pickle.dumps((fn, item, extra))) for item in items]
        return super().submit(fn, items, *extra, cost=cost)


@pytest.mark.parametrize("cut", [1, 2])
def test_tasks_receive_sub_keys_never_the_key(cut):
    """Measurement, GLS and every rounding method, partition by partition: no task's pickled
    input contains the key (nor the run's master key it derives from), and the output is the
    single-process one bit for bit."""
    h, counts = _tree()
    master = KeyedRNG.reproducible(11, warn=False)
    rng = master.child("repetition/0")
    invs = [invariant(counts, 1, Query.total(CELLS))]
    privacy = None  # derived from the measurements by both estimators
    ref_meas = measure(h.names, counts, PLAN, rng.child("measure"))
    ref = tree_gls(h, CELLS, ref_meas, invs, privacy)
    ex, parts = _Recording(), partition_units(h, cut, 3)
    meas = measure_partitioned(h.names, counts, PLAN, rng.child("measure"), parts, ex, keep=True)
    kept = partitioned_gls(h, CELLS, meas, invs, privacy, parts, ex, keep=True)
    assert all(
        np.array_equal(a, b) for a, b in zip(kept.gather().estimates, ref.estimates, strict=True)
    )
    for method in ("cells", "totals", "bipartite"):
        key = rng.child(f"round/{method}")
        got = partitioned_round(kept, key, parts, ex, method=method).gather()
        want = round_release(ref, key, method=method)
        assert all(np.array_equal(a, b) for a, b in zip(got.estimates, want.estimates, strict=True))
    tasks = {name for name, _ in ex.shipped}
    assert {"_measure_task", "_round_task", "_bipartite_task"} <= tasks
    secrets = [master._key, rng._key, rng.child("measure")._key]  # noqa: SLF001
    secrets += [rng.child(f"round/{m}")._key for m in ("cells", "totals", "bipartite")]  # noqa: SLF001
    for name, blob in ex.shipped:
        assert b"KeyedRNG" not in blob, name
        assert not any(s in blob for s in secrets), name
    # and what a measurement task holds regenerates only its own partition's streams
    task = next(pickle.loads(b)[1] for n, b in ex.shipped if n == "_measure_task")
    lo, hi = task.partition.range(h.depth - 1)
    assert hi < h.leaves.size or lo > 0
    other = 0 if lo > 0 else h.leaves.size - 1
    with pytest.raises(StreamNotHeld):
        task.keys.draw("block/detailed", h.leaves.size, other, other + 1, Laplace(1.0).sample)
    with pytest.raises(StreamNotHeld):
        task.keys.draw("nation/total", 1, 0, 1, Laplace(1.0).sample)


def test_dask_refuses_a_task_carrying_a_key():
    """Defence in depth: the Dask backend will not ship a KeyedRNG (checked before submit)."""

    class _Client:  # stands in for a connected client; nothing is sent anywhere
        scheduler = type("S", (), {"address": "tcp://127.0.0.1:8786"})()

        def scheduler_info(self):
            return {"workers": {"tcp://127.0.0.1:40001": {}}}

        def submit(self, *a, **k):
            raise AssertionError("a task carrying a key reached the scheduler")

    ex = DaskExecutor(client=_Client())
    rng = KeyedRNG.reproducible(1, warn=False)
    with pytest.raises(TypeError, match="secret key"):
        ex.submit(len, [("x", rng)])
    with pytest.raises(TypeError, match="secret key"):
        ex.submit(len, ["x"], {"rng": rng})
