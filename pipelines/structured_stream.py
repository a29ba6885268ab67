"""The structured GLS streamed partition by partition: the block level is never held whole.

The hierarchy is cut at a level (county for a state; the units of
:func:`~censusdp.pipelines.partition.partition_units`). Three passes:

1. **Upward, per partition.** The partition's measurements (levels at and below the cut) come
   from a caller's function of the partition — generated there (noise is a pure function of
   the key and the node: the keyed ``measure/<level>/<query>`` streams let any partition
   draw its own) or sliced from values held whole (:func:`given_values`). The upward pass of
   every block of the marginal basis runs inside the partition
   (:func:`~censusdp.estimation.gls.structured.structured_upward`) and leaves a small
   message per block at the partition's cut-level nodes: their mean, covariance and flat
   directions.
2. **Top.** The levels above the cut are solved in memory from their own measurements, the
   invariants there and the messages (:func:`~censusdp.estimation.gls.structured.structured_top`).
3. **Downward, per partition,** from the partition's cached upward state when the memory
   budget ``cache_bytes`` allowed keeping it, or from its upward pass run again (the
   measurement function is called again: it must return the same values). The partition's
   levels below the cut — estimates and covariance blocks, a
   :class:`~censusdp.estimation.gls.structured.StructuredPiece` — go to the caller's
   ``on_partition`` (write, summarise, round) and are dropped.

Structural zeros (``StreamOptions.zeros``, as ``structured_gls(..., zeros=)``: per-node
masks, each a 0/1 diagonal inside the blocks of the split axes) and per-node variances
(``node_variance``, +inf for an unmeasured node) may vary by node at every level: each
partition's task is sent its own nodes' masks, weights and information blocks
(:class:`_NodeInputs`), the context every task shares none of the levels below the cut.
The per-node weights and information blocks themselves are set up once, in this process,
for every node (:func:`~censusdp.estimation.gls.structured.structured_setup`).

Memory does not grow with the number of partitions beyond the messages (one per cut-level
node and block) and whatever the cache is allowed to hold. The result equals
:func:`~censusdp.estimation.gls.structured.structured_gls` on the whole tree bit for bit
(``np.array_equal``), in any partition order: every per-node operation gives a node the same
bits whatever nodes it is batched with (the moves in and out of the basis are stacks of
per-node products, :func:`~censusdp.estimation.gls.marginal_basis.node_axis_product`, and the
passes are those of :func:`~censusdp.estimation.gls.tree.gls_upward` / ``gls_downward``).

The three passes are a step of the one partition driver
(:func:`~censusdp.pipelines.partition_driver.drive`, shared with the flat GLS and rounding
of :mod:`~censusdp.pipelines.gls_partitioned`), which owns the executor, the cache and the
order. The per-partition passes run in this process (``workers`` threads) or as tasks on any
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
integer cells (the top-down per-partition scheme of ``estimation/integer/controlled.py``).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls.marginal_basis import BlockDiagonal
from censusdp.estimation.gls.structured import (
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
from censusdp.options import with_keywords
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.partition import Partition
from censusdp.pipelines.partition_driver import (
    DEFAULT_CACHE_BYTES,
    DriverOptions,
    PartitionDriver,
    Task,
    drive,
)
from censusdp.schema import Schema
from censusdp.timing import CPU_PREFIX, stage

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "GivenValues",
    "PartitionSink",
    "StreamOptions",
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
class StreamOptions:
    """How :func:`structured_stream` runs, beyond its data: the estimator's settings, the
    callbacks beside ``on_partition``, the memory budget and where the passes run.

    Attributes
    ----------
    on_top : callable, optional
        Receives the levels ``0 .. cut`` (every node) once, after they are solved and before
        the first partition's downward pass (e.g. to round them top-down, so each partition
        can then be rounded from its cut nodes' integers in ``on_partition``).
    geometry, privacy, delta, acknowledge_exact_release
        As for :func:`~censusdp.estimation.gls.structured.structured_gls`.
    cache_bytes : int
        Memory the cached upward states may take (default :data:`DEFAULT_CACHE_BYTES`, 1 GiB);
        partitions beyond it are recomputed in the downward pass instead of held (0:
        recompute all: measurements and upward pass twice). A cached partition skips its
        second measurement and upward pass, the same bits. On Dask, which partitions fit can
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
        they complete (the pieces for ``on_partition`` in ``order``). Other executors than
        Dask and threads run one partition at a time.
    hand_sunk : bool
        With a ``sink``: ``on_partition`` receives each partition's sink value (in
        ``order``, in this process) instead of its piece, and :attr:`StreamResult.sunk`
        keeps none — for a sink whose value is large and consumed here, e.g. the partition
        rounded on the thread that smoothed it (:func:`~censusdp.pipelines.products.
        pl94_stream.stream_pl94`), so the callbacks here are all that runs one at a time.
    zeros : mapping of level → numpy.ndarray, optional
        Structural zeros, as for ``structured_gls`` (per level a bool ``(n_nodes, d_0, …)``
        over the schema's first axes, given whole: one bool per node and value of the axes
        the masks vary over). Each partition's task is sent its own nodes' masks (and its
        nodes' weights, where ``node_variance`` varies by node), never a whole level below
        the cut.
    memory_bytes : int, optional
        A memory budget for the partitions run in this process's threads (``workers``): a
        partition starts only while the running ones' working sets (``leaf_bytes`` × their
        leaves) and the cached states fit in it, and the cache is held within it
        (:class:`~censusdp.pipelines.partition_driver.DriverOptions`). None: no budget.
    leaf_bytes : int
        A partition's working set per leaf, in bytes (with ``memory_bytes``).
    """

    on_top: Callable[[StructuredPiece], None] | None = None
    geometry: Geometry = "weighted"
    privacy: PrivacyStatement | None = None
    delta: float | None = None
    acknowledge_exact_release: bool = False
    cache_bytes: int = DEFAULT_CACHE_BYTES
    order: Sequence[int] | None = None
    workers: int = 1
    executor: Executor | None = None
    sink: PartitionSink | None = None
    sink_payload: Callable[[Partition], Any] | None = None
    ahead: int | None = None
    hand_sunk: bool = False
    zeros: Mapping[str | int, np.ndarray] | None = None
    memory_bytes: int | None = None
    leaf_bytes: int = 0


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

    ``setup`` holds the hierarchy reduced to its level names and no per-node array below
    the cut (:func:`_shared_part`: each partition is sent its own
    :class:`~censusdp.hierarchy.forest.Forest` and :class:`_NodeInputs`), so what a worker
    receives does not grow with the number of blocks beyond the invariants below the cut.
    ``rows`` is the cache of identified rows shared by the pieces made in one process.
    """

    setup: StructuredSetup
    invariants: tuple[ProductInvariant, ...]
    levels: tuple[int, ...]
    queries: tuple[ProductQuery, ...]
    low: tuple[int, ...]
    cut: int
    identified: BlockDiagonal
    rows: dict


def _names_only(hierarchy: Hierarchy) -> Hierarchy:
    """A one-node-per-level hierarchy with ``hierarchy``'s level names."""
    one = np.zeros(1, np.int64)
    return Hierarchy.from_parents(
        hierarchy.names, [np.array(["0"])] * hierarchy.depth, [None] + [one] * (hierarchy.depth - 1)
    )


def _per_node(a: np.ndarray | None) -> bool:
    """Whether ``a`` holds one row per node (not None, not one shared row)."""
    return a is not None and a.shape[0] != 1


@dataclass(frozen=True, eq=False)
class _NodeInputs:
    """The per-node inputs of the setup at a partition's levels (cut … leaf), its own rows
    only: per measurement its weights (None above the cut), per level the information
    blocks and the structural zeros. A task's setup is the context's with these
    (:meth:`apply`), and its node ranges start at 0."""

    weights: tuple
    J: tuple
    zeros: tuple

    @classmethod
    def of(cls, setup: StructuredSetup, cut: int, ranges: Sequence[tuple[int, int]]) -> _NodeInputs:
        """Rows ``ranges[k − cut]`` of every per-node array of ``setup`` at levels ≥ ``cut``
        (views); shared arrays as they are."""

        def rows(k: int, a: Any) -> Any:
            if k < cut or not _per_node(a):
                return a if k >= cut else None
            lo, hi = ranges[k - cut]
            return a[lo:hi]

        J = tuple(
            None if k < cut or Jk is None else {m: rows(k, b) for m, b in Jk.items()}
            for k, Jk in enumerate(setup.J)
        )
        zeros = tuple(rows(k, z) for k, z in enumerate(setup.zeros)) if setup.zeros else ()
        return cls(tuple(rows(k, w) for k, _, w in setup.heads), J, zeros)

    def apply(self, setup: StructuredSetup, cut: int) -> StructuredSetup:
        """``setup`` (the context's) with these inputs at levels ≥ ``cut``."""
        heads = tuple(
            (k, q, w if k < cut else self.weights[i]) for i, (k, q, w) in enumerate(setup.heads)
        )
        J = tuple(Jk if k < cut else self.J[k] for k, Jk in enumerate(setup.J))
        zeros = tuple(z if k < cut else self.zeros[k] for k, z in enumerate(setup.zeros))
        return dataclasses.replace(setup, heads=heads, J=J, zeros=zeros)


def _shared_part(setup: StructuredSetup, cut: int) -> StructuredSetup:
    """What every partition's tasks share of ``setup``: its hierarchy reduced to the level
    names (:func:`_names_only`) and, at levels ≥ ``cut``, no per-node array (weights,
    information blocks, structural zeros: each task gets its own rows, :class:`_NodeInputs`),
    so what a worker receives does not grow with the nodes below the cut."""
    names = _names_only(setup.hierarchy)
    heads = tuple(
        (k, q, None if k >= cut and _per_node(w) else w) for k, q, w in setup.heads
    )  # fmt: skip
    J = tuple(
        Jk if k < cut or Jk is None else {m: None if _per_node(b) else b for m, b in Jk.items()}
        for k, Jk in enumerate(setup.J)
    )
    zeros = tuple(None if k >= cut else z for k, z in enumerate(setup.zeros))
    return dataclasses.replace(setup, hierarchy=names, heads=heads, J=J, zeros=zeros)


def _upward(
    ctx: _Context, p: Partition, measure: MeasureFn, forest: Forest, nodes: _NodeInputs
) -> tuple[StructuredUpward, dict]:
    """Partition ``p``'s upward pass over its ``forest`` from ``measure(p)`` and its
    per-node inputs ``nodes``, and its seconds."""
    cut, levels, low = ctx.cut, ctx.levels, ctx.low
    setup = nodes.apply(ctx.setup, cut)
    names, depth = setup.hierarchy.names, setup.hierarchy.depth
    seconds: dict[str, float] = {}
    with stage(seconds, "measure"):
        vals = list(measure(p))
    with stage(seconds, "up"):
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
        rows = [(0, hi - lo) for lo, hi in p.ranges]  # the per-node inputs are the rows
        up = structured_upward(setup, forest, rows, meas_values, inv_values)
    return up, seconds


def _up_task(
    item: tuple[_Context, Partition, MeasureFn, Forest, _NodeInputs],
) -> tuple[StructuredUpward, dict]:
    return _upward(*item)


def _message_task(state: tuple[StructuredUpward, dict]) -> tuple[tuple[dict, dict], int]:
    """What an upward state sends up: its messages and seconds, and its size (for the
    cache)."""
    up, seconds = state
    return (up.messages(), seconds), up.nbytes()


#: Partition ``partition``'s downward pass: ``[context, partition, state, measure, forest,
#: nodes, cut_blocks, cut_estimates, payload]`` — its cut nodes' smoothed blocks and
#: estimates, its cached upward state (None: recompute it from ``measure`` and its per-node
#: inputs ``nodes`` over ``forest``) and its sink's payload. A plain
#: list: the executor replaces the handles inside lists (context, state) by their values, and
#: the pass drops its reference to the upward state as soon as it is smoothed.
_DownItem = list[Any]


def _downward(
    item: _DownItem, sink: PartitionSink | None, keep_piece: bool
) -> tuple[StructuredPiece | None, tuple, bool, Any, dict]:
    """Smoothing of one partition: its piece (if ``keep_piece``), residuals, whether its
    upward pass was recomputed, the sink's return value and the seconds per stage."""
    ctx, p, state, measure, forest, nodes, cut_blocks, cut_estimates, payload = item
    item[2] = None
    setup, cut = ctx.setup, ctx.cut
    names = setup.hierarchy.names
    fresh = state is None
    up, seconds = _upward(ctx, p, measure, forest, nodes) if fresh else state
    del state
    seconds = dict.fromkeys(("measure", "up", "cpu_measure", "cpu_up"), 0.0) | (
        seconds if fresh else {}
    )
    with stage(seconds, "down"):
        smoothed = structured_downward(setup, up, cut_blocks)
        forest = up.forest
        del up
    with stage(seconds, "output"):
        est, cov = structured_output(setup, smoothed, range(1, forest.depth), forest.sizes[1:])
        del smoothed
        residuals = structured_residuals(
            setup, forest, p.ranges, [cut_estimates, *est], ctx.invariants
        )
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
    with stage(seconds, "sink"):
        sunk = None if sink is None else sink(piece, p, payload)
    return (piece if keep_piece else None), residuals, fresh, sunk, seconds


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
    options: StreamOptions | None = None,
    **legacy: Any,
) -> StreamResult:
    """The structured GLS of :func:`~censusdp.estimation.gls.structured.structured_gls`,
    partition by partition.

    Parameters
    ----------
    hierarchy, schema, invariants
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
        :class:`~censusdp.estimation.gls.structured.StructuredPiece`, in this process, in
        ``order``; dropped afterwards. With an ``executor`` the piece is sent back for it;
        without ``on_partition`` it is not.
    options : StreamOptions, optional
        The estimator's settings, ``on_top``, the cache, the order, the workers or executor
        and the sink (:class:`StreamOptions`; defaults when omitted).
    **legacy
        The fields of :class:`StreamOptions` as keyword arguments, as before it existed
        (applied over ``options``; accepted for one release).

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
        On Dask, a task that would carry a :class:`~censusdp.rng.KeyedRNG`; a keyword that
        is no field of :class:`StreamOptions`.
    """
    opts = with_keywords(StreamOptions, options, legacy, "structured_stream")
    clock: dict[str, float] = {}
    with stage(clock, "run"):
        step, driver = _start(
            hierarchy, schema, measurements, measure, partitions, invariants, opts
        )
        step.on_partition, step.sunk = on_partition, [None] * len(partitions)
        drive(step, driver, step.take, in_order=on_partition is not None)
        check_residuals(*step.residuals[1:])
    diagnostics = step.diagnostics(driver) | {"seconds": clock["run"]}
    if step.setup.vscale is None:
        diagnostics["note"] = EUCLIDEAN_NOTE
    return StreamResult(
        step.result[0], floating_point_note(step.setup.statement), diagnostics,
        tuple(step.sunk) if opts.sink is not None and not opts.hand_sunk else (),
    )  # fmt: skip


#: The stages of a streamed run's diagnostics (``seconds_*`` and ``cpu_seconds_*``):
#: ``measure`` is the time spent in the caller's function, ``callback`` in ``on_top`` and
#: ``on_partition``, ``sink`` in the sink; the per-partition stages are summed over tasks.
_STAGES = ("setup", "measure", "up", "top", "down", "output", "sink", "callback")


def _start(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    measure: MeasureFn,
    partitions: Sequence[Partition],
    invariants: Sequence[ProductInvariant],
    opts: StreamOptions,
) -> tuple[_StreamStep, PartitionDriver]:
    """Check the inputs and set a run up: the estimator's setup (measurements above the cut
    checked here, those below per partition), the context every partition's passes share,
    and the driver that runs them."""
    seconds = dict.fromkeys(_STAGES, 0.0) | dict.fromkeys((CPU_PREFIX + s for s in _STAGES), 0.0)
    with stage(seconds, "setup"):
        cut = _check_partitions(hierarchy, partitions)
        names = hierarchy.names
        levels = [hierarchy.level_index(m.level) for m in measurements]
        for m, k in zip(measurements, levels, strict=True):
            if k < cut:
                checked_values(m.values, hierarchy.sizes[k], m.query, "measurement", names[k])
        setup = structured_setup(
            hierarchy, schema, measurements, invariants, geometry=opts.geometry,
            privacy=opts.privacy, delta=opts.delta,
            acknowledge_exact_release=opts.acknowledge_exact_release, check_values=False,
            zeros=opts.zeros,
        )  # fmt: skip
        invs = check_structured_invariants(hierarchy, schema, invariants)
        if opts.sink_payload is not None and opts.sink is None:
            raise SpecError("structured_stream: sink_payload without a sink")
        try:
            driver = PartitionDriver(
                len(partitions),
                opts.executor,
                DriverOptions(
                    opts.cache_bytes,
                    opts.order,
                    opts.workers,
                    opts.ahead,
                    opts.memory_bytes,
                    [p.leaves * opts.leaf_bytes for p in partitions],
                ),
            )
        except SpecError as e:
            raise SpecError(f"structured_stream: {e}") from None
    ctx = _Context(
        _shared_part(setup, cut), tuple(invs),
        tuple(levels), tuple(m.query for m in measurements),
        tuple(i for i, k in enumerate(levels) if k >= cut), cut,
        BlockDiagonal(setup.basis, setup.ident), {},
    )  # fmt: skip
    step = _StreamStep(
        hierarchy, partitions, measurements, measure, opts, setup, ctx, seconds,
        remote=driver.remote, ctx_h=driver.share(ctx),
    )  # fmt: skip
    return step, driver


def _add_seconds(total: dict[str, float], seconds: dict[str, float]) -> None:
    """Add a task's per-stage seconds to the run's."""
    for k, v in seconds.items():
        total[k] += v


def _worst(residuals: tuple, more: tuple) -> tuple[float, float, float, str]:
    """The larger residuals of two ``(consistency, invariant, invariant value, level of the
    worst invariant)`` (:func:`~censusdp.estimation.gls.structured.structured_residuals`)."""
    cons, inv_res, inv_val, worst = residuals
    c, r, v, w = more
    if r >= inv_res:
        inv_res, worst = r, w
    return max(cons, c), inv_res, max(inv_val, v), worst


@dataclass(eq=False)
class _StreamStep:
    """The structured GLS as a :class:`~censusdp.pipelines.partition_driver.PartitionStep`:
    the upward pass of a partition (its measurements from ``measure``), the levels down to
    the cut solved from the messages, and each partition's levels below the cut handed to
    the sink where computed and to ``on_partition`` here.

    ``remote`` says whether tasks run on an executor (then ``ctx_h`` is the context's handle
    there and each task gets its partition's own measure function, ``for_partition``);
    ``sunk`` holds the sink's values by partition position.
    """

    hierarchy: Hierarchy
    partitions: Sequence[Partition]
    measurements: Sequence[ProductMeasurement]
    measure: MeasureFn
    opts: StreamOptions
    setup: StructuredSetup
    ctx: _Context
    seconds: dict[str, float]
    remote: bool = False
    ctx_h: Any = None
    on_partition: Callable[[StructuredPiece], None] | None = None
    message_bytes: int = 0
    residuals: tuple = ()
    result: tuple = ()
    sunk: list = dataclasses.field(default_factory=list)
    message_fn = staticmethod(_message_task)

    def forest_of(self, p: Partition) -> Forest:
        return Forest.of(self.hierarchy, self.ctx.cut, p.ranges)

    def nodes_of(self, p: Partition) -> _NodeInputs:
        return _NodeInputs.of(self.setup, self.ctx.cut, p.ranges)

    def _measure_of(self, p: Partition) -> MeasureFn:
        return _task_measure(self.measure, p) if self.remote else self.measure

    def up(self, pos: int) -> Task:
        p = self.partitions[pos]
        context = self.ctx_h if self.remote else self.ctx
        return Task(
            _up_task, (context, p, self._measure_of(p), self.forest_of(p), self.nodes_of(p))
        )

    def top(self, messages: list[tuple[dict, dict]]) -> None:
        """The levels down to the cut from their measurements, invariants and the
        partitions' messages; then ``on_top``. Sets :attr:`result` to the top piece, its
        smoothed state (the cut nodes' blocks for the downward pass) and its estimates."""
        bottom = []
        for msg, seconds in messages:
            _add_seconds(self.seconds, seconds)
            bottom.append(msg)
        del messages
        self.result = self._solve_top(bottom)
        if self.opts.on_top is not None:
            with stage(self.seconds, "callback"):
                self.opts.on_top(self.result[0])

    def _solve_top(self, bottom: list[dict]) -> tuple[StructuredPiece, dict, list]:
        setup, cut, levels = self.setup, self.ctx.cut, self.ctx.levels
        invs = self.ctx.invariants
        with stage(self.seconds, "top"):
            top_rows = [(0, n) for n in self.hierarchy.sizes[: cut + 1]]
            top_meas = [
                [m.values if levels[i] == j and j < cut else None
                 for i, m in enumerate(self.measurements)]
                for j in range(cut + 1)
            ]  # fmt: skip
            top_invs = [
                [inv.values if inv.level == j else None for inv in invs] for j in range(cut + 1)
            ]
            top_forest = whole_forest(self.hierarchy, 0, cut)
            top_up = structured_upward(
                setup, top_forest, top_rows, top_meas, top_invs, bottom=bottom
            )
            self.message_bytes = _message_bytes(bottom)
            del bottom
            smoothed_top = structured_top(setup, top_up)
            del top_up
        with stage(self.seconds, "output"):
            top_est, top_cov = structured_output(
                setup, smoothed_top, range(cut + 1), self.hierarchy.sizes[: cut + 1]
            )
            self.residuals = structured_residuals(setup, top_forest, top_rows, top_est, invs)
        top = StructuredPiece(
            names=tuple(self.hierarchy.names[: cut + 1]),
            first=0,
            ranges=tuple(top_rows),
            schema=setup.schema,
            basis=setup.basis,
            estimates=tuple(top_est),
            covariances=None if top_cov is None else tuple(top_cov),
            identified=self.ctx.identified,
            _rows=self.ctx.rows,
        )
        return top, smoothed_top, top_est

    def down(self, pos: int, state: Any | None) -> Task:
        """Partition ``pos``'s downward task: its cut nodes' smoothed blocks and estimates,
        its cached state or what recomputes it, and its sink's payload."""
        _, smoothed_top, top_est = self.result
        p, cut = self.partitions[pos], self.ctx.cut
        lo, hi = p.units
        cut_blocks = {
            mask: None if sm is None else (sm[0][cut][lo:hi], _rows_of(sm[1][cut], lo, hi))
            for mask, sm in smoothed_top.items()
        }
        if state is not None:  # a cached state needs no measurements: nothing to send
            task_measure = forest = nodes = None
        else:
            task_measure, forest, nodes = self._measure_of(p), self.forest_of(p), self.nodes_of(p)
        payload = None if self.opts.sink_payload is None else self.opts.sink_payload(p)
        context = self.ctx_h if self.remote else self.ctx
        item = [context, p, state, task_measure, forest, nodes, cut_blocks, top_est[cut][lo:hi],
                payload]  # fmt: skip
        keep_piece = self.on_partition is not None and not self.opts.hand_sunk
        return Task(_downward, item, (self.opts.sink, keep_piece))

    def take(self, pos: int, out: tuple) -> None:
        """Partition ``pos``'s downward result: its seconds and residuals counted, the sink's
        value kept, its piece (or with ``hand_sunk`` the sink's value) handed to
        ``on_partition`` (then dropped)."""
        piece, residuals, _, value, seconds = out
        del out
        _add_seconds(self.seconds, seconds)
        self.residuals = _worst(self.residuals, residuals)
        handed = value if self.opts.hand_sunk else piece
        self.sunk[pos] = None if self.opts.hand_sunk else value
        del piece, value
        if self.on_partition is not None:
            with stage(self.seconds, "callback"):
                self.on_partition(handed)

    def diagnostics(self, driver: PartitionDriver) -> dict:
        """The run's diagnostics (:attr:`StreamResult.diagnostics`), but its total seconds."""
        t, counts = self.seconds, driver.stats()
        cons, inv_res, inv_val, _ = self.residuals
        return {
            "estimator": "structured_gls (streamed)",
            "geometry": self.opts.geometry,
            "cut_level": self.hierarchy.names[self.ctx.cut],
            **{k: counts[k] for k in _DRIVER_COUNTS[:5]},
            "message_bytes": self.message_bytes,
            **{k: counts[k] for k in _DRIVER_COUNTS[5:]},
            "unidentified": self.setup.dropped,
            "max_consistency_residual": cons,
            "max_invariant_residual": inv_res,
            "max_invariant_value": inv_val,
            **{f"seconds_{k}": v for k, v in t.items() if not k.startswith(CPU_PREFIX)},
            **{f"cpu_seconds_{k[4:]}": v for k, v in t.items() if k.startswith(CPU_PREFIX)},
        }


#: The driver's counts in a streamed run's diagnostics (:meth:`PartitionDriver.stats`).
_DRIVER_COUNTS = (
    "partitions", "partitions_cached", "partitions_regenerated", "cache_bytes_used",
    "largest_cached_state_bytes", "partitions_waiting_for_memory", "executor", "workers",
    "worker_thread_cpu_seconds",
)  # fmt: skip


def _message_bytes(messages: Sequence[dict]) -> int:
    """Bytes of the partitions' upward messages (means, covariances, flat directions)."""
    return sum(
        a.nbytes
        for msg in messages
        for u in msg.values()
        if u is not None
        for a in (u.m, u.P, u.N)
        if a is not None
    )


def _rows_of(P: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of per-node matrices (one shared matrix stays as it is)."""
    return P if P.shape[0] == 1 else P[lo:hi]
