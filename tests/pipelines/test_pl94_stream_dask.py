"""The streamed pl94 engine on executors (censusdp.pipelines.products.pl94_stream with ``executor=``,
``sink=``): each partition rounded, checked and written to the store where its piece is
computed; the release's digest equals the in-process run's on sync, threads and Dask with 1
and 2 workers (the session's cluster; a 1-worker one in the slow form), in any partitioning
and order; tasks never carry the key, and a partition's restricted source and measure
function give what the whole ones give."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from pl94_fixtures import PLAN, QUERIES, SCHEMA, small_us

from censusdp.pipelines.execute import SyncExecutor, ThreadExecutor, open_executor
from censusdp.pipelines.io.pl94_store import Pl94Store, Pl94StoreWriter
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.products.pl94_stream import (
    PartitionMeasure,
    Pl94StreamOptions,
    ReleaseChecks,
    Sinks,
    SparseHistogram,
    stream_pl94,
)
from censusdp.rng import KeyedRNG, SubKeys


@pytest.fixture(scope="module")
def state():
    """Two states, four counties, six levels, 120 blocks: every level branches."""
    return small_us(counties=4, tracts=7, block_groups=14, blocks=120, population=3000)


@pytest.fixture(scope="module")
def reference(state, tmp_path_factory) -> dict:
    """The in-process run (no executor, rounded and written by ``on_partition`` here)."""
    h, source = state
    out = run(h, source, tmp_path_factory.mktemp("ref") / "s", partitions=0)
    assert_checks(out)
    return out


def run(h, source, path: Path, seed: int = 12, **kw) -> dict:
    """One run written to a store at ``path``: in process (``on_partition``) without an
    executor, else each partition checked and written by the sink where it is."""
    if path.exists():
        shutil.rmtree(path)
    rng = KeyedRNG.reproducible(seed, warn=False)
    checks = ReleaseChecks(h, tables=True)
    with Pl94StoreWriter(path, h, SCHEMA) as w:

        def on_top(top) -> None:
            checks.top(top)
            w.top(top)

        if kw.get("executor") is None:

            def on_partition(out) -> None:
                checks.partition(out)
                w.partition(out)

            res = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=on_top,
                              on_partition=on_partition,
                              options=Pl94StreamOptions(**kw))  # fmt: skip
        else:
            res = stream_pl94(
                h, SCHEMA, source, PLAN, rng, on_top=on_top, options=Pl94StreamOptions(
                    sink=Sinks((checks.for_partition(), w.piece_sink())),
                    sink_payload=lambda p: (None, w.payload(p)), **kw,
                ),
            )  # fmt: skip
            for checked, written in res.sunk:
                checks.add(checked)
                w.add(written)
        out = w.finish(res, QUERIES)
    out["checks"] = checks.result(res.persons)
    out["verified"] = Pl94Store(path).verify()
    return out


def assert_checks(out: dict) -> None:
    c = out["checks"]
    assert c["every_level_total_equals_the_persons"] and c["invariants_exact"]
    assert c["every_cell_floor_or_ceil"] and c["children_sum_to_parent_cell_by_cell"]
    assert c["table_identities_exact_at_every_node"]
    assert out["verified"] == out["digest"]


def test_sink_on_sync_gives_the_in_process_digest(state, reference, tmp_path) -> None:
    h, source = state
    n = len(partition_units(h, 2, h.sizes[2]))
    sync = run(h, source, tmp_path / "s", partitions=0, executor=SyncExecutor(),
               order=list(range(n))[::-1])  # fmt: skip
    assert sync["digest"] == reference["digest"]
    assert_checks(sync)
    assert sync["checks"] == reference["checks"]


def test_dask_workers_write_the_same_release(state, reference, dask_executor, tmp_path) -> None:
    """Every partition rounded, checked and written on a worker (largest first, upward
    states cached there): the in-process digest."""
    h, source = state
    parts = partition_units(h, 2, 3)
    largest_first = list(np.argsort([-p.leaves for p in parts], kind="stable"))
    dask = run(h, source, tmp_path / "s", partitions=parts, executor=dask_executor,
               order=largest_first, cache_bytes=1 << 30)  # fmt: skip
    assert dask["digest"] == reference["digest"]
    assert_checks(dask)
    assert dask["checks"] == reference["checks"]


@pytest.mark.slow
def test_threads_one_worker_and_another_key(state, reference, tmp_path) -> None:
    """Threads and a 1-worker cluster give the same digest; another key another one (the
    digest sees the noise and the rounding)."""
    pytest.importorskip("dask.distributed")
    h, source = state
    threads = run(h, source, tmp_path / "t" / "s", partitions=3, executor=ThreadExecutor(2))
    with open_executor("distributed", workers=1) as one:
        dask1 = run(h, source, tmp_path / "d" / "s", partitions=0, executor=one)
    assert threads["digest"] == dask1["digest"] == reference["digest"]
    assert_checks(threads)
    assert_checks(dask1)
    other = run(h, source, tmp_path / "o" / "s", seed=13, executor=SyncExecutor())
    assert other["digest"] != reference["digest"]


def test_a_partition_task_gets_its_own_leaves_and_sub_keys_only(state) -> None:
    h, source = state
    rng = KeyedRNG.reproducible(5, warn=False)
    cut = h.level_index("county")
    measure = PartitionMeasure(h, SCHEMA, source, PLAN, rng, cut)
    for p in partition_units(h, cut, 3):
        lo, hi = p.range(h.depth - 1)
        one = measure.for_partition(p)
        assert isinstance(one.keys, SubKeys)
        assert one.source.populations.size == hi - lo  # its leaves, not the nation's
        for a, b in zip(one(p), measure(p), strict=True):
            assert np.array_equal(a, b)
        mid = (lo + hi) // 2
        for x, y in zip(one.source(mid, hi), source(mid, hi), strict=True):
            assert np.array_equal(x, y)
        with pytest.raises(ValueError, match="outside the restricted range"):
            one.source(0, hi) if lo else one.source(lo, h.sizes[-1] + 1)
    sparse = SparseHistogram(*source(0, h.sizes[-1]))
    part = sparse.restrict(40, 80)
    for x, y in zip(part(40, 80), source(40, 80), strict=True):
        assert np.array_equal(x, y)
    assert part.leaf.size < sparse.leaf.size
