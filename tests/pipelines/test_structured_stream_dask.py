"""Estimators over executors, on one Dask ``LocalCluster`` per module.

The streamed structured GLS: sync, threads and Dask give the in-memory release bit for bit;
noise drawn inside the tasks from sub-keys; a sink run where the piece is; a worker killed
mid-run recomputed from lineage. TopDown-style's per-parent solves on the same executors give
the serial release."""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import pytest
from stream_fixtures import assert_same, problem, problem_with_counts, stream, zeros_problem

from censusdp.errors import SpecError
from censusdp.estimation.gls.structured import StructuredPiece, structured_gls
from censusdp.estimation.topdown.schema import TopDownOptions, topdown_schema
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import measure_range, stream_label
from censusdp.pipelines.execute import DaskExecutor, SyncExecutor, ThreadExecutor, open_executor
from censusdp.pipelines.partition import Partition, partition_units
from censusdp.pipelines.structured_stream import StreamOptions, given_values, structured_stream
from censusdp.rng import KeyedRNG, SubKeys, chunk_range

CUT, N_PARTS = 2, 5


@pytest.fixture(scope="module")
def cluster():
    """One 2-worker cluster for the module (its start-up dominates these tests)."""
    pytest.importorskip("dask.distributed")
    from dask.distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=50,
        ) as c,
        Client(c) as client,
    ):
        yield DaskExecutor(client=client), client


@dataclass(frozen=True, eq=False)
class PartitionMeasure:
    """One partition's measurement: its exact answers' counts and the sub-keys of its noise
    streams (what its task is sent)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    plan: tuple[tuple[int, ProductQuery, NoiseLaw], ...]
    counts: tuple[np.ndarray, ...]  # per plan entry, the partition's rows of its level
    keys: SubKeys | KeyedRNG

    def __call__(self, p: Partition) -> list[np.ndarray]:
        return [
            measure_range(
                q.apply(x), self.names[k], self.sizes[k], p.range(k)[0], q, law, self.keys
            )  # fmt: skip
            for (k, q, law), x in zip(self.plan, self.counts, strict=True)
        ]


@dataclass(frozen=True, eq=False)
class KeyedMeasure:
    """Draws a partition's noise where it runs, keyed by node (the levels at or below the cut
    of ``plan``); each task gets :meth:`for_partition`: its counts and sub-keys only."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    plan: tuple[tuple[int, ProductQuery, NoiseLaw], ...]
    counts: tuple[np.ndarray, ...]  # per level, every node
    rng: KeyedRNG

    def _part(self, p: Partition, keys) -> PartitionMeasure:
        counts = tuple(self.counts[k][slice(*p.range(k))] for k, _, _ in self.plan)
        return PartitionMeasure(self.names, self.sizes, self.plan, counts, keys)

    def __call__(self, p: Partition) -> list[np.ndarray]:
        return self._part(p, self.rng)(p)

    def for_partition(self, p: Partition) -> PartitionMeasure:
        labels = {stream_label(self.names[k], q.name): chunk_range(*p.range(k))
                  for k, q, _ in self.plan}  # fmt: skip
        return self._part(p, self.rng.restrict(labels))


@dataclass(frozen=True)
class PieceDigest:
    """A sink: SHA-256 of the piece's estimates and covariance blocks, the process it ran
    in and its payload."""

    def __call__(self, piece: StructuredPiece, part: Partition, payload) -> tuple:
        return digest(piece.estimates, piece.covariances), os.getpid(), payload


def digest(estimates, covariances) -> str:
    h = hashlib.sha256()
    for est, cov in zip(estimates, covariances, strict=True):
        h.update(np.ascontiguousarray(est).tobytes())
        for mask in sorted(cov.blocks):
            h.update(np.ascontiguousarray(cov.blocks[mask]).tobytes())
    return h.hexdigest()


def keyed_problem(seed: int = 3):
    """The stream fixture's problem and the KeyedMeasure of its levels at or below CUT (the
    same key, so the same noise)."""
    s, h, meas, invs, counts = problem_with_counts(seed=seed)
    plan = tuple(
        (h.level_index(m.level), m.query, m.law) for m in meas if h.level_index(m.level) >= CUT
    )
    rng = KeyedRNG.reproducible(seed, warn=False)
    return s, h, meas, invs, KeyedMeasure(h.names, h.sizes, plan, tuple(counts), rng)


def check_executors(runs, seed: int = 3) -> None:
    """Each ``(executor, order, cache_bytes, ahead)`` run gives the in-memory release."""
    s, h, meas, invs = problem(seed=seed)
    rel = structured_gls(h, s, meas, invs)
    for ex, order, cache, ahead in runs:
        res, pieces, parts = stream(h, s, meas, invs, CUT, N_PARTS, executor=ex, order=order,
                                    cache_bytes=cache, ahead=ahead)  # fmt: skip
        assert len(parts) == N_PARTS
        assert_same(h, rel, res, pieces, parts, CUT)
        assert res.diagnostics["partitions_cached"] == (N_PARTS if cache else 0)
        assert res.diagnostics["executor"] == ex.name


def test_sync_and_dask_give_the_in_memory_release(cluster):
    """The fast form: the sync executor and the Dask cluster, upward states recomputed and
    cached on the workers, give the in-memory structured GLS bit for bit."""
    ex_dask, _ = cluster
    check_executors([(SyncExecutor(), None, 0, None), (ex_dask, None, 1 << 30, None)])


@pytest.mark.slow  # ~15 s under load; the fast form is the test above
def test_every_executor_order_and_window_gives_the_in_memory_release(cluster):
    """Threads and Dask — the cluster's client, and a second one joining its ``tcp://``
    loopback address — with cached or recomputed upward states, in any order and window,
    give the in-memory structured GLS bit for bit."""
    ex_dask, _ = cluster
    shuffled = [int(i) for i in np.random.default_rng(0).permutation(N_PARTS)]
    address = ex_dask.client.scheduler.address  # tcp:// on the loopback: joined as is
    assert address.startswith("tcp://127.0.0.1")
    threads = ThreadExecutor(2)
    try:
        with open_executor(address) as ex_tcp:
            check_executors([
                (threads, shuffled, 1 << 30, None),
                (ex_dask, None, 0, None),
                (ex_dask, shuffled, 1 << 30, 1),
                (ex_tcp, None, 1 << 30, None),
            ])  # fmt: skip
    finally:
        threads.close()


def test_zeros_and_node_variances_on_dask_give_the_in_memory_release(cluster):
    """Structural zeros at every level and per-node variances below the cut (the NMF's
    case): each Dask task is sent its own partition's masks and weights, and the release,
    recomputed or cached on the workers, is the in-memory ``structured_gls(zeros=)`` bit
    for bit."""
    ex, _ = cluster
    s, h, meas, invs, zeros = zeros_problem(seed=2)
    rel = structured_gls(h, s, meas, invs, zeros=zeros)
    for cache in (0, 1 << 30):
        res, pieces, parts = stream(h, s, meas, invs, CUT, N_PARTS, zeros=zeros, executor=ex,
                                    cache_bytes=cache)  # fmt: skip
        assert_same(h, rel, res, pieces, parts, CUT)
        assert res.diagnostics["executor"] == ex.name


def test_noise_drawn_in_the_tasks_from_sub_keys(cluster):
    """Each task draws its own partition's noise from sub-keys (keyed by node): the release
    equals the in-memory one on noise drawn level by level with the key; a measure function
    that would carry the key itself is refused before anything is sent."""
    ex, _ = cluster
    s, h, meas, invs, keyed = keyed_problem()
    rel = structured_gls(h, s, meas, invs)
    res, pieces, parts = stream(h, s, meas, invs, CUT, N_PARTS, measure=keyed, executor=ex)
    assert_same(h, rel, res, pieces, parts, CUT)

    class Unrestricted:  # no for_partition: the task would be sent the KeyedMeasure
        def __call__(self, p):
            return keyed(p)

    bare = lambda p: keyed(p)  # noqa: E731  (closes over the key)
    for measure in (keyed.__call__, bare):
        with pytest.raises(TypeError, match="secret key"):
            stream(h, s, meas, invs, CUT, N_PARTS, measure=measure, executor=ex)
    # in this process the key may be used directly
    res, pieces, parts = stream(h, s, meas, invs, CUT, N_PARTS, measure=Unrestricted())
    assert_same(h, rel, res, pieces, parts, CUT)


def test_sink_runs_where_the_piece_is(cluster):
    """A sink gets each partition's piece and payload in the process that computed it (a
    worker on Dask) and only its return value comes back, in partition order; it is the
    piece of the in-memory release."""
    ex, _ = cluster
    s, h, meas, invs = problem(seed=3)
    rel = structured_gls(h, s, meas, invs)
    parts = partition_units(h, CUT, N_PARTS)
    expect = [
        digest(
            [rel.estimates[k][slice(*p.range(k))] for k in range(CUT + 1, h.depth)],
            [type(c)(c.basis, {m: b[slice(*p.range(k))] for m, b in c.blocks.items()})
             for k, c in enumerate(rel.covariances) if k > CUT],
        )
        for p in parts
    ]  # fmt: skip
    for executor, remote in ((None, False), (ex, True)):
        res, pieces, _ = stream(h, s, meas, invs, CUT, N_PARTS, executor=executor,
                                sink=PieceDigest(), sink_payload=lambda p: 10 * p.index)  # fmt: skip
        assert [d for d, _, _ in res.sunk] == expect
        assert [pay for _, _, pay in res.sunk] == [10 * p.index for p in parts]
        pids = {pid for _, pid, _ in res.sunk}
        assert (os.getpid() not in pids) if remote else pids == {os.getpid()}
    # without on_partition no piece is sent back, and the sink still runs
    res = structured_stream(
        h, s, meas, given_values(meas, h, CUT), parts, invs,
        options=StreamOptions(executor=ex, sink=PieceDigest()),
    )  # fmt: skip
    assert [d for d, _, _ in res.sunk] == expect


def test_killing_a_worker_mid_run_gives_the_same_release(cluster, tmp_path):
    """A worker process exits while running its third task (after upward states were cached
    on it); Dask recomputes what it held from the tasks' inputs (keyed noise drawn again from
    sub-keys) and the release is the in-memory one bit for bit."""
    from distributed import WorkerPlugin

    class KillOnce(WorkerPlugin):
        """Exits the first worker process that starts its third task (once per test)."""

        def __init__(self, marker):
            self.marker = marker
            self.started = 0

        def transition(self, key, start, finish, **kwargs):
            if finish == "executing":
                self.started += 1
                if self.started == 3 and not os.path.exists(self.marker):
                    open(self.marker, "w").close()
                    os._exit(1)

    ex, client = cluster
    s, h, meas, invs, keyed = keyed_problem(seed=4)
    rel = structured_gls(h, s, meas, invs)
    marker = tmp_path / "killed"
    client.register_plugin(KillOnce(str(marker)), name="kill-once")
    try:
        res, pieces, parts = stream(h, s, meas, invs, CUT, 8, measure=keyed, executor=ex,
                                    cache_bytes=1 << 30)  # fmt: skip
    finally:
        client.unregister_worker_plugin("kill-once")
    assert marker.exists(), "no worker was killed: the fault was not injected"
    assert_same(h, rel, res, pieces, parts, CUT)
    client.wait_for_workers(2, timeout=60)


def test_topdown_per_parent_solves_on_every_executor(cluster):
    """TopDown-style's per-parent problems (L2 passes by Clarabel, the rounder by HiGHS) run
    as tasks give the serial release exactly, whatever the runs of parents."""
    ex_dask, _ = cluster
    s, h, meas, invs = problem(seed=3)
    invs = [ProductInvariant(i.level, i.query, np.rint(i.values).astype(np.int64)) for i in invs]
    base = topdown_schema(h, s, meas, invs)
    assert base.diagnostics["levels"][h.names[-1]]["parents_solved"] > 2
    for ex, chunks in ((ex_dask, None), (SyncExecutor(), 2)):
        rel = topdown_schema(h, s, meas, invs, options=TopDownOptions(executor=ex, chunks=chunks))
        for a, b in zip(base.estimates, rel.estimates, strict=True):
            assert np.array_equal(a, b)


def test_key_guard_looks_inside_callables_and_records():
    """The Dask backend finds a KeyedRNG inside a dataclass, a partial, a closure or a bound
    method (checked before submission: nothing reaches the scheduler); sub-keys pass."""

    class _Client:  # stands in for a connected client
        scheduler = type("S", (), {"address": "tcp://127.0.0.1:8786"})()

        def scheduler_info(self):
            return {"workers": {"tcp://127.0.0.1:40001": {}}}

        def submit(self, *a, **k):
            return None

    ex = DaskExecutor(client=_Client())
    s, h, meas, invs, keyed = keyed_problem()
    parts = partition_units(h, CUT, N_PARTS)
    rng = keyed.rng
    hidden = [keyed, functools.partial(len, rng), (lambda: rng), keyed.for_partition]
    for x in hidden:
        with pytest.raises(TypeError, match="secret key"):
            ex.submit(len, [(1, x)])
    with pytest.raises(TypeError, match="secret key"):
        ex.submit(functools.partial(len, rng), [1])
    ex.submit(len, [(1, keyed.for_partition(parts[0]))])  # sub-keys only


def test_refusals():
    s, h, meas, invs = problem()
    parts = partition_units(h, CUT, N_PARTS)
    measure = given_values(meas, h, CUT)
    with pytest.raises(SpecError, match="not both"):
        structured_stream(h, s, meas, measure, parts, invs,
                          options=StreamOptions(executor=SyncExecutor(), workers=2))  # fmt: skip
    with pytest.raises(SpecError, match="without a sink"):
        structured_stream(h, s, meas, measure, parts, invs,
                          options=StreamOptions(sink_payload=lambda p: 0))  # fmt: skip
    with pytest.raises(SpecError, match="were asked for partition"):
        measure.for_partition(parts[0])(parts[1])
