"""The structured GLS streamed partition by partition: the block level is never held whole.

The hierarchy is cut at a level (county for a state; the units of
:func:`~censusdp.pipelines.partition.partition_units`). Three passes:

1. **Upward, per partition.** The partition's measurements (levels at and below the cut) come
   from a caller's function of the partition — generated there (noise is a pure function of
   the key and the node: the keyed ``measure/<level>/<query>`` streams let any partition
   draw its own) or sliced from values held whole (:func:`given_values`). The upward pass of
   every block of the marginal basis runs inside the partition
   (:func:`~censusdp.estimation.structured_gls.structured_upward`) and leaves a small
   message per block at the partition's cut-level nodes: their mean, covariance and flat
   directions.
2. **Top.** The levels above the cut are solved in memory from their own measurements, the
   invariants there and the messages (:func:`~censusdp.estimation.structured_gls.structured_top`).
3. **Downward, per partition,** from the partition's cached upward state when the memory
   budget ``cache_bytes`` allowed keeping it, or from its upward pass run again (the
   measurement function is called again: it must return the same values). The partition's
   levels below the cut — estimates and covariance blocks, a
   :class:`~censusdp.estimation.structured_gls.StructuredPiece` — go to the caller's
   ``on_partition`` (write, summarise, round) and are dropped.

Memory does not grow with the number of partitions beyond the messages (one per cut-level
node and block) and whatever the cache is allowed to hold. The result equals
:func:`~censusdp.estimation.structured_gls.structured_gls` on the whole tree bit for bit
(``np.array_equal``), in any partition order: every per-node operation gives a node the same
bits whatever nodes it is batched with (the moves in and out of the basis are stacks of
per-node products, :func:`~censusdp.estimation.marginal_basis.node_axis_product`, and the
passes are those of :func:`~censusdp.estimation.gls.gls_upward` / ``gls_downward``).

The per-partition passes run in this process (``workers`` threads) or as tasks on any
:class:`~censusdp.pipelines.execute.Executor` (``executor``: sync, threads, a Dask
``LocalCluster`` or a ``tls://`` / loopback ``tcp://`` scheduler). On Dask a partition's
upward state stays on the worker that computed it (a handle the downward task runs next
to), only its messages come to this process, and the downward task either recomputes the
upward pass there or uses that cached state. Each partition's piece is either shipped back
for ``on_partition`` (in ``order``) or handed, where it is, to a ``sink`` (e.g. a
release-store writer) whose small return value comes back. On Dask, messages and sink
results are taken as they complete and placed by partition, so the output is the same bit
for bit for every executor and number of workers; a task lost with a worker is recomputed
from its inputs (keyed noise, per-node arithmetic).

Rounding plugs in at ``on_partition``: the levels down to the cut (``StreamResult.top``) are
rounded first from their estimates, then each partition's levels given its cut-level nodes'
integer cells (the top-down per-partition scheme of ``estimation/structured_rounding.py``).

References
----------
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1) — the two-pass tree algorithm.
Rauch, Tung & Striebel (1965). Maximum likelihood estimates of linear dynamic systems.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm —
    geographic partitioning of the block-level work.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.marginal_basis import BlockDiagonal
from censusdp.estimation.structured_gls import (
    EUCLIDEAN_NOTE,
    Geometry,
    StructuredPiece,
    StructuredSetup,
    StructuredUpward,
    check_residuals,
    check_structured_invariants,
    structured_downward,
    structured_output,
    structured_residuals,
    structured_setup,
    structured_top,
    structured_upward,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    checked_values,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.execute import DaskExecutor, Executor, ThreadExecutor, ordered_ahead
from censusdp.pipelines.partition import Partition
from censusdp.schema import Schema

__all__ = [
    "GivenValues",
    "PartitionSink",
    "StreamResult",
    "given_values",
    "structured_stream",
]

#: ``measure(partition)``: per measurement at or below the cut (in order), its values at the
#: partition's nodes of its level, ``(hi − lo, n_rows)``.
MeasureFn = Callable[[Partition], Sequence[np.ndarray]]


class PartitionSink(Protocol):
    """Receives a partition's piece where it was computed (a worker, on Dask).

    ``sink(piece, partition, payload)``: ``payload`` is what ``sink_payload(partition)``
    returned in the calling process after ``on_top`` (e.g. the partition's cut-level
    integers and the sub-keys of its rounding), None without ``sink_payload``. The return
    value should be small (a summary, the bytes and checksum of a store piece): it is sent
    back and kept in :attr:`StreamResult.sunk`. It must be picklable to run on Dask, and
    hold sub-keys, never a :class:`~censusdp.rng.KeyedRNG`.
    """

    def __call__(self, piece: StructuredPiece, partition: Partition, payload: Any) -> Any: ...


@dataclass(frozen=True, eq=False)
class StreamResult:
    """What stays after a streamed run: the levels down to the cut and the statement.

    Attributes
    ----------
    top : StructuredPiece
        Levels ``0 .. cut``, every node (estimates and covariance blocks).
    privacy : PrivacyStatement
        Derived from the measurements, with the invariants and geometry.
    diagnostics : dict
        Per-stage wall seconds (``measure`` is the time spent in the caller's function,
        ``callback`` in ``on_top`` and ``on_partition``, ``sink`` in the sink; on an
        executor the per-partition stages are summed over its tasks) and their CPU seconds
        (``cpu_seconds_*``: thread time of the threads that ran them, here or on a worker),
        residuals, partitions
        cached and regenerated, bytes of the messages and of the largest cached state, the
        executor and its workers.
    sunk : tuple
        The ``sink``'s return value for every partition, in partition order (empty without
        a sink).
    """

    top: StructuredPiece
    privacy: PrivacyStatement
    diagnostics: dict
    sunk: tuple = ()


@dataclass(frozen=True, eq=False)
class GivenValues:
    """The measurement function of values held whole (:func:`given_values`).

    Attributes
    ----------
    values : tuple of (int, numpy.ndarray)
        Per measurement at or below the cut, in order: its level index and its values at
        every node of that level.
    """

    values: tuple[tuple[int, np.ndarray], ...]

    def __call__(self, part: Partition) -> list[np.ndarray]:
        return [v[slice(*part.range(k))] for k, v in self.values]

    def for_partition(self, part: Partition) -> _PartitionValues:
        """What a task of partition ``part`` is sent: its slices only."""
        return _PartitionValues(part.index, tuple(self(part)))


@dataclass(frozen=True, eq=False)
class _PartitionValues:
    """One partition's slices of :class:`GivenValues` (the measure function its task gets)."""

    partition: int
    values: tuple[np.ndarray, ...]

    def __call__(self, part: Partition) -> list[np.ndarray]:
        if part.index != self.partition:
            raise SpecError(
                f"the values of partition {self.partition} were asked for partition {part.index}"
            )
        return list(self.values)


def given_values(
    measurements: Sequence[ProductMeasurement], hierarchy: Hierarchy, cut: int
) -> GivenValues:
    """The measurement function of values held whole: each measurement at or below ``cut``
    sliced to the partition's range of its level (views, no copy). On an executor each task
    is sent its own partition's slices (:meth:`GivenValues.for_partition`)."""
    return GivenValues(
        tuple(
            (hierarchy.level_index(m.level), m.values)
            for m in measurements
            if hierarchy.level_index(m.level) >= cut
        )
    )


def _task_measure(measure: MeasureFn, part: Partition) -> MeasureFn:
    """The measure function sent to partition ``part``'s tasks: its ``for_partition(part)``
    when it has one (its own slices or sub-keys), else itself."""
    restrict = getattr(measure, "for_partition", None)
    return measure if restrict is None else restrict(part)


# ----------------------------------------------------------------------------- tasks
@dataclass(frozen=True, eq=False)
class _Context:
    """What every partition's passes share; on Dask sent once to each worker (a handle).

    ``setup`` holds the hierarchy reduced to its level names (:func:`_names_only`: the
    per-partition passes read nothing else of it; each partition is sent its own
    :class:`~censusdp.estimation.gls.Forest`), so what a worker receives does not grow with
    the number of blocks beyond the invariants below the cut. ``rows`` is the cache of
    identified rows shared by the pieces made in one process.
    """

    setup: StructuredSetup
    invariants: tuple[ProductInvariant, ...]
    levels: tuple[int, ...]
    queries: tuple[ProductQuery, ...]
    low: tuple[int, ...]
    cut: int
    identified: BlockDiagonal
    rows: dict


def _same(x: Any) -> Any:
    return x


def _names_only(hierarchy: Hierarchy) -> Hierarchy:
    """A one-node-per-level hierarchy with ``hierarchy``'s level names."""
    one = np.zeros(1, np.int64)
    return Hierarchy.from_parents(
        hierarchy.names, [np.array(["0"])] * hierarchy.depth, [None] + [one] * (hierarchy.depth - 1)
    )


def _upward(
    ctx: _Context, p: Partition, measure: MeasureFn, forest: Forest
) -> tuple[StructuredUpward, dict]:
    """Partition ``p``'s upward pass over its ``forest`` from ``measure(p)``, and its
    seconds."""
    setup, cut, levels, low = ctx.setup, ctx.cut, ctx.levels, ctx.low
    names, depth = setup.hierarchy.names, setup.hierarchy.depth
    t0, c0 = time.perf_counter(), time.thread_time()
    vals = list(measure(p))
    t1, c1 = time.perf_counter(), time.thread_time()
    if len(vals) != len(low):
        raise SpecError(
            f"partition {p.index}: measure returned {len(vals)} arrays for the "
            f"{len(low)} measurements at or below level {names[cut]!r}"
        )
    full: list = [None] * len(levels)
    for i, v in zip(low, vals, strict=True):
        k, q = levels[i], ctx.queries[i]
        lo, hi = p.range(k)
        full[i] = checked_values(v, hi - lo, q, f"partition {p.index}: measurement", names[k])
    meas_values = [
        [full[i] if levels[i] == cut + j else None for i in range(len(levels))]
        for j in range(depth - cut)
    ]
    inv_values = [
        [inv.values[slice(*p.range(inv.level))] if inv.level == cut + j else None
         for inv in ctx.invariants]
        for j in range(depth - cut)
    ]  # fmt: skip
    up = structured_upward(setup, forest, p.ranges, meas_values, inv_values)
    seconds = {"measure": t1 - t0, "up": time.perf_counter() - t1}
    return up, seconds | {"cpu_measure": c1 - c0, "cpu_up": time.thread_time() - c1}


def _up_task(
    item: tuple[_Context, Partition, MeasureFn, Forest],
) -> tuple[StructuredUpward, dict]:
    return _upward(*item)


def _message_task(state: tuple[StructuredUpward, dict]) -> tuple[dict, int, dict]:
    """What an upward state sends up: its messages, its size (for the cache) and seconds."""
    up, seconds = state
    return up.messages(), up.nbytes(), seconds


#: Partition ``partition``'s downward pass: ``[context, partition, state, measure, forest,
#: cut_blocks, cut_estimates, payload]`` — its cut nodes' smoothed blocks and estimates, its
#: cached upward state (None: recompute it from ``measure`` over ``forest``) and its sink's
#: payload. A plain
#: list: the executor replaces the handles inside lists (context, state) by their values, and
#: the pass drops its reference to the upward state as soon as it is smoothed.
_DownItem = list[Any]


def _downward(
    item: _DownItem, sink: PartitionSink | None, keep_piece: bool
) -> tuple[StructuredPiece | None, tuple, bool, Any, dict]:
    """Smoothing of one partition: its piece (if ``keep_piece``), residuals, whether its
    upward pass was recomputed, the sink's return value and the seconds per stage."""
    ctx, p, state, measure, forest, cut_blocks, cut_estimates, payload = item
    item[2] = None
    setup, cut = ctx.setup, ctx.cut
    names = setup.hierarchy.names
    fresh = state is None
    up, seconds = _upward(ctx, p, measure, forest) if fresh else state
    del state
    seconds = dict.fromkeys(("measure", "up", "cpu_measure", "cpu_up"), 0.0) | (
        seconds if fresh else {}
    )
    t0, c0 = time.perf_counter(), time.thread_time()
    smoothed = structured_downward(setup, up, cut_blocks)
    forest = up.forest
    del up
    t1, c1 = time.perf_counter(), time.thread_time()
    est, cov = structured_output(setup, smoothed, range(1, forest.depth), forest.sizes[1:])
    del smoothed
    residuals = structured_residuals(setup, forest, p.ranges, [cut_estimates, *est], ctx.invariants)
    piece = StructuredPiece(
        names=tuple(names[cut + 1 :]),
        first=cut + 1,
        ranges=tuple(p.ranges[1:]),
        schema=setup.schema,
        basis=setup.basis,
        estimates=tuple(est),
        covariances=None if cov is None else tuple(cov),
        identified=ctx.identified,
        _rows=ctx.rows,
        partition=p.index,
    )
    t2, c2 = time.perf_counter(), time.thread_time()
    sunk = None if sink is None else sink(piece, p, payload)
    seconds |= {"down": t1 - t0, "output": t2 - t1, "sink": time.perf_counter() - t2}
    seconds |= {"cpu_down": c1 - c0, "cpu_output": c2 - c1, "cpu_sink": time.thread_time() - c2}
    return (piece if keep_piece else None), residuals, fresh, sunk, seconds


def _results(
    ex: Executor,
    n: int,
    submit: Callable[[range], list[tuple]],
    group: int,
    ahead: int,
    in_order: bool,
) -> Iterator[tuple[int, tuple, Any]]:
    """``(i, handles, value)`` for every position ``i`` in ``0 .. n-1``.

    Positions are submitted in groups of ``group`` (``submit(range)`` → per position a tuple
    of handles, the last one's value wanted), at most ``ahead`` groups at a time; results
    come in position order, or (``in_order=False``) as they complete, so one long task does
    not hold back the workers.
    """
    groups = [range(i, min(i + group, n)) for i in range(0, n, group)]
    inflight: dict[int, tuple] = {}
    nxt = 0
    while True:
        while nxt < len(groups) and len(inflight) + len(groups[nxt]) <= ahead * group:
            r = groups[nxt]
            inflight.update(zip(r, submit(r), strict=True))
            nxt += 1
        if not inflight:
            return
        if in_order:
            i = min(inflight)
            value = ex.gather([inflight[i][-1]])[0]
        else:
            keys = list(inflight)
            j, value = next(ex.each([inflight[k][-1] for k in keys]))
            i = keys[j]
        yield i, inflight.pop(i), value


def _check_partitions(hierarchy: Hierarchy, partitions: Sequence[Partition]) -> int:
    """The cut level of ``partitions``; they must tile it in order, each with every level."""
    if not partitions:
        raise SpecError("structured_stream needs at least one partition")
    cut = partitions[0].cut
    depth = hierarchy.depth
    expect = 0
    for p in partitions:
        if p.cut != cut or len(p.ranges) != depth - cut:
            raise SpecError(
                f"partition {p.index}: every partition must cut level {hierarchy.names[cut]!r} "
                "and hold its ranges down to the leaves (use partition_units)"
            )
        if p.units[0] != expect:
            raise SpecError(
                f"partition {p.index} starts at {hierarchy.names[cut]} node {p.units[0]}, not "
                f"{expect}: partitions must tile the cut level in node order (partition_units)"
            )
        expect = p.units[1]
    if expect != hierarchy.sizes[cut]:
        raise SpecError(
            f"the partitions cover {expect} of the {hierarchy.sizes[cut]} nodes of level "
            f"{hierarchy.names[cut]!r}"
        )
    return cut


def structured_stream(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    measure: MeasureFn,
    partitions: Sequence[Partition],
    invariants: Sequence[ProductInvariant] = (),
    on_partition: Callable[[StructuredPiece], None] | None = None,
    *,
    on_top: Callable[[StructuredPiece], None] | None = None,
    geometry: Geometry = "weighted",
    privacy: PrivacyStatement | None = None,
    delta: float | None = None,
    acknowledge_exact_release: bool = False,
    cache_bytes: int = 0,
    order: Sequence[int] | None = None,
    workers: int = 1,
    executor: Executor | None = None,
    sink: PartitionSink | None = None,
    sink_payload: Callable[[Partition], Any] | None = None,
    ahead: int | None = None,
) -> StreamResult:
    """The structured GLS of :func:`~censusdp.estimation.structured_gls.structured_gls`,
    partition by partition.

    Parameters
    ----------
    hierarchy, schema, invariants, geometry, privacy, delta, acknowledge_exact_release
        As for ``structured_gls`` (invariants are given whole: they are small).
    measurements : sequence of ProductMeasurement
        Every measurement, in the order ``structured_gls`` would get them (the order of the
        sums). Those above the cut carry their values; the values of those at or below the
        cut are not read (they may be empty) — ``measure`` gives them per partition.
    measure : callable
        ``measure(partition)`` → per measurement at or below the cut, in order, its values
        at the partition's nodes of its level (:func:`given_values` for values held whole).
        Called once per partition, and again in the downward pass for partitions whose
        upward state was not cached: it must return the same values. With an ``executor``
        it runs in the partition's tasks: each is sent ``measure.for_partition(partition)``
        if it has that method (e.g. only its own slices, or the sub-keys of its own noise
        streams), else ``measure`` itself; on Dask it must be picklable and carry no
        :class:`~censusdp.rng.KeyedRNG` (refused: send sub-keys, ``KeyedRNG.restrict``).
    partitions : sequence of Partition
        :func:`~censusdp.pipelines.partition.partition_units` of one cut level, in node order.
    on_partition : callable, optional
        Receives each partition's levels below the cut as a
        :class:`~censusdp.estimation.structured_gls.StructuredPiece`, in this process, in
        ``order``; dropped afterwards. With an ``executor`` the piece is sent back for it;
        without ``on_partition`` it is not.
    on_top : callable, optional
        Receives the levels ``0 .. cut`` (every node) once, after they are solved and before
        the first partition's downward pass (e.g. to round them top-down, so each partition
        can then be rounded from its cut nodes' integers in ``on_partition``).
    cache_bytes : int
        Memory the cached upward states may take; partitions beyond it are recomputed in the
        downward pass instead of held (0: recompute all). On Dask, which partitions fit can
        depend on the order their upward passes complete; the output does not.
    order : sequence of int, optional
        Order in which partitions are processed (positions in ``partitions``); the result
        does not depend on it. On an executor, largest partitions first (by leaves) keeps
        the workers busy to the end.
    workers : int
        Threads running partitions' passes at once (numpy releases the GIL in the large
        products); at most ``workers`` partitions are computed ahead of the one being
        consumed, results are taken in ``order`` and callbacks run one at a time in this
        thread, so the output is the same bit for bit for any number of workers. Per-stage
        seconds are then summed over threads. Give either ``workers`` or ``executor``.
    executor : Executor, optional
        Runs the partitions' upward and downward passes as tasks
        (:mod:`censusdp.pipelines.execute`); the levels above the cut and the callbacks run
        here. The output is the same bit for bit as without it, for any executor and number
        of workers. On Dask the cache (``cache_bytes``) holds upward states on the workers
        that computed them.
    sink : PartitionSink, optional
        Called with each partition's piece where it is computed (in this process without an
        executor or with an in-process one; on a worker with Dask), before ``on_partition``
        sees it; its return values are :attr:`StreamResult.sunk`.
    sink_payload : callable, optional
        ``sink_payload(partition)`` → the third argument of ``sink`` for that partition,
        called in this process after ``on_top``.
    ahead : int, optional
        On Dask, partitions submitted and not yet taken back (default ``2 ×`` the workers):
        bounds the data waiting on the scheduler and workers. Their results are taken as
        they complete (the pieces for ``on_partition`` in ``order``). In-process executors
        run one group of ``executor.workers`` partitions at a time.

    Returns
    -------
    StreamResult

    Raises
    ------
    SpecError, DataError, BudgetError
        As ``structured_gls``; also partitions that do not tile the cut level, values from
        ``measure`` of the wrong shape or non-finite (naming the partition), and both
        ``workers > 1`` and an ``executor``.
    TypeError
        On Dask, a task that would carry a :class:`~censusdp.rng.KeyedRNG`.
    """
    t_start, c_start = time.perf_counter(), time.thread_time()
    cut = _check_partitions(hierarchy, partitions)
    names = hierarchy.names
    levels = [hierarchy.level_index(m.level) for m in measurements]
    for m, k in zip(measurements, levels, strict=True):
        if k < cut:
            checked_values(m.values, hierarchy.sizes[k], m.query, "measurement", names[k])
        elif m.node_variance is not None:
            raise SpecError(
                f"measurement {m.query.name!r} at level {names[k]!r}: per-node variances "
                "below the cut are not streamed; use structured_gls"
            )
    setup = structured_setup(
        hierarchy, schema, measurements, invariants, geometry=geometry, privacy=privacy,
        delta=delta, acknowledge_exact_release=acknowledge_exact_release, check_values=False,
    )  # fmt: skip
    invs = check_structured_invariants(hierarchy, schema, invariants)
    low = [i for i, k in enumerate(levels) if k >= cut]
    order = list(range(len(partitions))) if order is None else [int(i) for i in order]
    if sorted(order) != list(range(len(partitions))):
        raise SpecError("order must list every partition position once")
    if executor is not None and workers != 1:
        raise SpecError(
            "structured_stream: give workers (threads in this process) or an executor, not both"
        )
    if sink_payload is not None and sink is None:
        raise SpecError("structured_stream: sink_payload without a sink")
    executor_name = "in-process threads" if executor is None else executor.name
    if isinstance(executor, ThreadExecutor):
        # this process's threads: pipelined in order, a partition started as soon as a thread
        # is free, not in groups of ``workers`` that each wait for their slowest
        workers, executor = executor.workers, None
    # wall seconds per stage, and CPU (``cpu_*``: thread time, of the tasks' threads for the
    # per-partition stages wherever they ran, of this thread for the others)
    t = dict(setup=time.perf_counter() - t_start, measure=0.0, up=0.0, top=0.0, down=0.0,
             output=0.0, sink=0.0, callback=0.0)  # fmt: skip
    t |= {f"cpu_{k}": 0.0 for k in t}
    t["cpu_setup"] = time.thread_time() - c_start
    ctx = _Context(
        dataclasses.replace(setup, hierarchy=_names_only(hierarchy)), tuple(invs),
        tuple(levels), tuple(m.query for m in measurements), tuple(low), cut,
        BlockDiagonal(setup.basis, setup.ident), {},
    )  # fmt: skip

    def forest_of(p: Partition) -> Forest:
        return Forest.of(hierarchy, cut, p.ranges)

    def add(seconds: dict) -> None:
        for k, v in seconds.items():
            t[k] += v

    ex = executor
    dask = isinstance(ex, DaskExecutor)
    group = 1 if ex is None or dask else max(1, int(ex.workers))
    window = max(1, int(ahead) if ahead is not None else 2 * (ex.workers if ex else 1))
    window = window if dask else 1
    ctx_h = None if ex is None else ex.submit(_same, [ctx])[0]
    cached: dict[int, Any] = {}  # position → upward state (on Dask: its handle)
    sent: dict[int, Any] = {}  # Dask: cached states given to downward tasks not yet gathered
    try:
        # per position of ``order``: (position, (upward state or its handle, ...), message)
        if ex is None:

            def up_in_process(pos: int) -> tuple:
                p = partitions[pos]
                state = _upward(ctx, p, measure, forest_of(p))
                return (state,), _message_task(state)

            ups: Iterator = (
                (i, *out) for i, out in enumerate(ordered_ahead(up_in_process, order, workers))
            )
        else:

            def submit_up(r: range) -> list:
                parts = [partitions[order[i]] for i in r]
                items = [(ctx_h, p, _task_measure(measure, p), forest_of(p)) for p in parts]
                states = ex.submit(_up_task, items)
                return list(zip(states, ex.submit(_message_task, states), strict=True))

            ups = _results(ex, len(order), submit_up, group, window, in_order=not dask)

        messages: dict[int, dict] = {}
        used = largest = 0
        for i, handles, msg in ups:
            pos, state = order[i], handles[0]
            if ex is not None:
                ex.release(handles[1:])
            messages[pos], size, seconds = msg
            add(seconds)
            if used + size <= cache_bytes:
                cached[pos] = state
                used += size
                largest = max(largest, size)
            elif ex is not None:
                ex.release([state])
            del state, handles, msg

        t0, c0 = time.perf_counter(), time.thread_time()
        top_rows = [(0, n) for n in hierarchy.sizes[: cut + 1]]
        top_meas = [
            [m.values if levels[i] == j and j < cut else None for i, m in enumerate(measurements)]
            for j in range(cut + 1)
        ]
        top_invs = [
            [inv.values if inv.level == j else None for inv in invs] for j in range(cut + 1)
        ]
        top_forest = whole_forest(hierarchy, 0, cut)
        top_up = structured_upward(
            setup, top_forest, top_rows, top_meas, top_invs,
            bottom=[messages[pos] for pos in range(len(partitions))],
        )  # fmt: skip
        message_bytes = sum(
            a.nbytes
            for msg in messages.values()
            for u in msg.values()
            if u is not None
            for a in (u.m, u.P, u.N)
            if a is not None
        )
        del messages
        smoothed_top = structured_top(setup, top_up)
        del top_up
        t["top"] += time.perf_counter() - t0
        t["cpu_top"] += time.thread_time() - c0
        t0, c0 = time.perf_counter(), time.thread_time()
        top_est, top_cov = structured_output(
            setup, smoothed_top, range(cut + 1), hierarchy.sizes[: cut + 1]
        )
        cons, inv_res, inv_val, worst = structured_residuals(
            setup, top_forest, top_rows, top_est, invs
        )
        t["output"] += time.perf_counter() - t0
        t["cpu_output"] += time.thread_time() - c0

        top = StructuredPiece(
            names=tuple(names[: cut + 1]),
            first=0,
            ranges=tuple(top_rows),
            schema=schema,
            basis=setup.basis,
            estimates=tuple(top_est),
            covariances=None if top_cov is None else tuple(top_cov),
            identified=ctx.identified,
            _rows=ctx.rows,
        )
        if on_top is not None:
            t0 = time.perf_counter()
            on_top(top)
            t["callback"] += time.perf_counter() - t0

        def down_item(pos: int, context: Any) -> _DownItem:
            p = partitions[pos]
            lo, hi = p.units
            cut_blocks = {
                mask: None if sm is None else (sm[0][cut][lo:hi], _rows_of(sm[1][cut], lo, hi))
                for mask, sm in smoothed_top.items()
            }
            state = cached.pop(pos, None)
            if dask and state is not None:
                sent[pos] = state  # its handle, released once its downward task is gathered
            if state is not None:  # a cached state needs no measurements: nothing to send
                task_measure = forest = None
            else:
                task_measure = measure if ex is None else _task_measure(measure, p)
                forest = forest_of(p)
            return [
                context, p, state, task_measure, forest, cut_blocks,
                top_est[cut][lo:hi], None if sink_payload is None else sink_payload(p),
            ]  # fmt: skip

        keep_piece = on_partition is not None
        if ex is None:
            downs: Iterator = (
                (i, (), out)
                for i, out in enumerate(
                    ordered_ahead(
                        lambda pos: _downward(down_item(pos, ctx), sink, keep_piece), order, workers
                    )
                )
            )
        else:

            def submit_down(r: range) -> list:
                items = [down_item(order[i], ctx_h) for i in r]
                return [(h,) for h in ex.submit(_downward, items, sink, keep_piece)]

            # the callbacks see the pieces in ``order``; a sink's results may come as ready
            in_order = not dask or on_partition is not None
            downs = _results(ex, len(order), submit_down, group, window, in_order)

        regenerated = 0
        sunk: list = [None] * len(partitions)
        for i, handles, out in downs:
            if ex is not None:
                ex.release([*handles, *([sent.pop(order[i])] if order[i] in sent else [])])
            piece, (c, r, v, w), fresh, sunk[order[i]], seconds = out
            del out, handles
            add(seconds)
            regenerated += fresh
            cons = max(cons, c)
            inv_val = max(inv_val, v)
            if r >= inv_res:
                inv_res, worst = r, w
            if on_partition is not None:
                t0 = time.perf_counter()
                on_partition(piece)
                t["callback"] += time.perf_counter() - t0
            del piece
    finally:  # on Dask: the workers drop what this run left there (also after an error)
        if ex is not None:
            ex.release([ctx_h, *cached.values(), *sent.values()])
    check_residuals(inv_res, inv_val, worst)

    diagnostics = {
        "estimator": "structured_gls (streamed)",
        "geometry": geometry,
        "cut_level": names[cut],
        "partitions": len(partitions),
        "partitions_cached": len(partitions) - regenerated,
        "partitions_regenerated": regenerated,
        "cache_bytes_used": used,
        "largest_cached_state_bytes": largest,
        "message_bytes": message_bytes,
        "executor": executor_name,
        "workers": workers if ex is None else ex.workers,
        "unidentified": setup.dropped,
        "max_consistency_residual": cons,
        "max_invariant_residual": inv_res,
        "max_invariant_value": inv_val,
        **{f"seconds_{k}": v for k, v in t.items() if not k.startswith("cpu_")},
        **{f"cpu_seconds_{k[4:]}": v for k, v in t.items() if k.startswith("cpu_")},
        "seconds": time.perf_counter() - t_start,
    }
    if setup.vscale is None:
        diagnostics["note"] = EUCLIDEAN_NOTE
    return StreamResult(
        top, floating_point_note(setup.statement), diagnostics,
        tuple(sunk) if sink is not None else (),
    )  # fmt: skip


def _rows_of(P: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of per-node matrices (one shared matrix stays as it is)."""
    return P if P.shape[0] == 1 else P[lo:hi]
