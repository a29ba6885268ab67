"""Measure a hierarchy partition by partition.

Levels at or below the cut are measured per partition, each partition drawing the keyed noise
of its own node ranges only; levels above the cut are measured once. The result equals
:func:`censusdp.mechanisms.queries.measure` on the whole hierarchy bit for bit, for every
backend and partition count (the shared-key protocol of the subspace-DP paper, Algorithm 4).
A partition's task receives the sub-keys of its own streams and chunks
(:meth:`KeyedRNG.restrict <censusdp.rng.KeyedRNG.restrict>`), never the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.queries import Measurement, Query, measure_range, stream_label
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.partition import Partition
from censusdp.rng import KeyedRNG, SubKeys, chunk_range

__all__ = ["PartitionTask", "PartitionedMeasurements", "measure_keys", "measure_partitioned"]


@dataclass(frozen=True, eq=False)
class PartitionTask:
    """What one partition needs to measure itself: its node ranges, exact counts there and
    the sub-keys of its noise (the chunks of its ranges in the streams it measures)."""

    partition: Partition
    counts: tuple[np.ndarray, ...]  # per level cut..leaf, the partition's rows
    keys: SubKeys


def measure_keys(
    rng: KeyedRNG,
    level_names: Sequence[str],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    partition: Partition,
) -> SubKeys:
    """The sub-keys partition ``partition`` needs to measure its levels of ``plan``."""
    return rng.restrict(
        {
            stream_label(level_names[k], q.name): chunk_range(*partition.range(k))
            for k, q, _ in plan
            if k >= partition.cut
        }
    )


def _measure_task(
    task: PartitionTask,
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    level_names: Sequence[str],
    level_sizes: Sequence[int],
) -> list[np.ndarray | None]:
    part, rng = task.partition, task.keys
    out: list[np.ndarray | None] = []
    for k, q, law in plan:
        if k < part.cut:
            out.append(None)
            continue
        start, _ = part.range(k)
        counts = task.counts[k - part.cut]
        out.append(
            measure_range(q.apply(counts), level_names[k], level_sizes[k], start, q, law, rng)
        )
    return out


@dataclass(eq=False)
class PartitionedMeasurements:
    """Measurements whose levels at or below the cut stay with the executor, per partition.

    ``handles[i]`` is partition ``i``'s :func:`_measure_task` result (one array per plan entry
    at or below the cut, in plan order; on Dask a handle on the worker that drew it);
    ``top`` holds the measurements above the cut. :func:`partitioned_gls
    <censusdp.pipelines.gls_partitioned.partitioned_gls>` consumes this directly, so the noisy
    values never pass through the calling process; :meth:`gather` gives the plain list.
    """

    plan: tuple[tuple[int, Query, NoiseLaw], ...]
    sizes: tuple[int, ...]
    partitions: tuple[Partition, ...]
    top: dict[int, Measurement]  # plan position -> measurement (levels above the cut)
    handles: list
    executor: Executor

    def wait(self) -> None:
        """Block until every partition is measured."""
        self.executor.wait(self.handles)

    def gather(self) -> list[Measurement]:
        """The plain measurements, equal to :func:`measure_partitioned`'s."""
        per_part = self.executor.gather(self.handles)
        out = []
        for i, (k, q, law) in enumerate(self.plan):
            if i in self.top:
                out.append(self.top[i])
            else:
                vals = np.concatenate([res[i] for res in per_part], axis=0)
                out.append(Measurement(k, q, vals, law))
        return out


def measure_partitioned(
    level_names: Sequence[str],
    level_counts: Sequence[np.ndarray],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    rng: KeyedRNG,
    partitions: Sequence[Partition],
    executor: Executor,
    *,
    keep: bool = False,
) -> list[Measurement] | PartitionedMeasurements:
    """Measure ``plan`` with the levels at or below the cut split over ``partitions``.

    ``keep=True`` returns a :class:`PartitionedMeasurements` instead of the list: the
    partitions' measurements stay where they were drawn, for :func:`partitioned_gls
    <censusdp.pipelines.gls_partitioned.partitioned_gls>`. Same numbers either way.
    """
    sizes = [c.shape[0] for c in level_counts]
    cut = partitions[0].cut
    tasks = [
        PartitionTask(
            p,
            tuple(level_counts[k][slice(*p.range(k))] for k in range(cut, len(level_counts))),
            measure_keys(rng, level_names, plan, p),
        )
        for p in partitions
    ]
    handles = executor.submit(
        _measure_task,
        tasks,
        list(plan),
        list(level_names),
        sizes,
        cost=[p.leaves for p in partitions],
    )
    top = {
        i: Measurement(
            k,
            q,
            measure_range(q.apply(level_counts[k]), level_names[k], sizes[k], 0, q, law, rng),
            law,
        )
        for i, (k, q, law) in enumerate(plan)
        if k < cut
    }
    out = PartitionedMeasurements(
        tuple(plan), tuple(sizes), tuple(partitions), top, handles, executor
    )
    if keep:
        return out
    try:
        return out.gather()
    finally:
        executor.release(handles)
