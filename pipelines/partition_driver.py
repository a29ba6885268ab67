"""One partition driver: upward map → reduce at the root → downward map, over any executor.

Both partitioned front ends — the flat GLS of :mod:`~censusdp.pipelines.gls_partitioned` and
the structured GLS streamed by :mod:`~censusdp.pipelines.structured_stream` — are the same
three passes over the partitions of one cut level
(:func:`~censusdp.pipelines.partition.partition_units`):

1. **up**, per partition, where the executor runs it: the partition's upward state, of which
   only a small *message* (its cut-level nodes' beliefs) comes back to the calling process;
   the state itself is cached — on Dask as a handle on the worker that computed it — while
   the memory budget allows, else dropped and recomputed by the downward task;
2. **top**, in the calling process, from every partition's message, in partition order;
3. **down**, per partition, from its cached state (or none: recompute) and what the top
   gives it; its result is either taken back to the calling process (in partition order, or
   as the tasks complete) or kept where it was computed (its handle returned).

A front end is a :class:`PartitionStep`: it says which :class:`Task` computes a partition's
upward state, the (module-level, picklable) function that takes a state to its message and
size, what the top does with the messages, and which task runs a partition's downward pass
from its state; :func:`drive` hands each downward result to the caller's ``take`` or leaves
it where it was computed.

An integer step is an :class:`Integerizer` (issue 34, build 4): a step whose ``top`` makes
the levels down to the cut integer from the partitions' messages and whose
``partition(pos, state)`` — its ``down`` — makes one partition's levels below the cut integer
where its piece is; :func:`integerize` runs one and returns its finished release. Integer
steps register in :data:`INTEGERIZERS` (the flat rounding and the non-negative product, in
:mod:`~censusdp.pipelines.gls_partitioned`), and each says how to make itself from a release
kept per partition (``of``) and what the single-process computation gives (``whole``), so a
contract test checks every registered one, partitioned against whole, on every executor.

:func:`drive` runs a step over any :class:`~censusdp.pipelines.execute.Executor`: a
:class:`~censusdp.pipelines.execute.ThreadExecutor` (or ``workers`` threads without an
executor) pipelines the partitions in this process, a partition started as soon as a thread
is free (:func:`~censusdp.pipelines.execute.ordered_ahead`); Dask keeps at most ``ahead``
partitions in flight and takes results as they complete; any other executor runs each task
through its ``submit``. Every task is a pure function of its inputs, results are placed by
partition, and the step's reductions run in partition order in this process, so the output
is the same bit for bit for every executor, number of workers, order and cache budget.

References
----------
Hay, Rastogi, Miklau & Suciu, PVLDB 3(1), 2010 (the two-pass tree algorithm); Abowd, J. M.
et al. (2022), The 2020 Census Disclosure Avoidance System TopDown Algorithm (geographic
partitioning of the block-level work); Dean & Ghemawat, OSDI 2004 (map → reduce).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from censusdp.errors import SpecError
from censusdp.pipelines.execute import DaskExecutor, Executor, ThreadExecutor, ordered_ahead
from censusdp.registry import Registry
from censusdp.timing import CPU_PREFIX, stage, thread_cpu_seconds

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DriverOptions",
    "INTEGERIZERS",
    "Integerizer",
    "PartitionDriver",
    "PartitionStep",
    "Task",
    "drive",
    "integerize",
    "no_message",
    "register_integerizer",
    "same",
]

#: The default memory budget of the upward states cached between the passes (1 GiB). A
#: pl94 partition's state is about 17.7 KB per block (measured on the synthetic U.S.), so this
#: holds ~60,000 blocks' states: the whole of a small state, a few partitions of a large run.
DEFAULT_CACHE_BYTES = 1 << 30


@dataclass(frozen=True, eq=False)
class Task:
    """One partition's call ``fn(item, *extra)``, run where the executor runs tasks.

    ``fn`` must be a module-level function (picklable) and ``item`` may hold executor
    handles inside tuples, lists and dicts (replaced by their values where the task runs).
    """

    fn: Callable[..., Any]
    item: Any
    extra: tuple = ()

    def __call__(self) -> Any:
        return self.fn(self.item, *self.extra)


class PartitionStep(Protocol):
    """A front end of :func:`drive`: what the three passes compute for one run.

    Attributes
    ----------
    message_fn : callable
        Module-level ``message_fn(state) → (message, nbytes)``: what partition's upward state
        sends to the top, and the state's size in bytes (for the cache budget).
    """

    message_fn: Callable[[Any], tuple[Any, int]]

    def up(self, pos: int) -> Task:
        """The task computing the upward state of partition ``pos``."""

    def top(self, messages: list[Any]) -> None:
        """The reduce at the root, in this process, from every partition's message (in
        partition order)."""

    def down(self, pos: int, state: Any | None) -> Task:
        """The downward task of partition ``pos`` from its cached upward state (its handle
        on Dask), or None when it was not cached (the task recomputes it)."""


@runtime_checkable
class Integerizer(PartitionStep, Protocol):
    """An integer step on the driver: ``top`` / ``partition`` (issue 34, build 4).

    ``up(pos)`` is what a partition computes before the top (its part rounded up to the cut,
    or nothing), ``top(messages)`` makes the levels ``0 .. cut`` integer in this process, and
    ``partition(pos, state)`` — the step's ``down`` — is the task making partition ``pos``'s
    levels below the cut integer where its piece is. A registered class
    (:func:`register_integerizer`) also has ``of(release, rng, invariants)``, its instance
    for a :class:`~censusdp.pipelines.partitioned_release.PartitionedRelease`, and
    ``whole(release, rng, invariants)``, the single-process release it must equal bit for
    bit.

    Attributes
    ----------
    name : str
        The integer step's name in diagnostics and the registry.
    """

    name: ClassVar[str]

    def partition(self, pos: int, state: Any | None) -> Task:
        """The task making partition ``pos``'s levels below the cut integer."""

    def finish(self, pieces: list) -> Any:
        """The integer release kept per partition, from the partitions' results."""


#: Every integer step that runs on the driver, by name, in registration order.
INTEGERIZERS: Registry[type] = Registry("integerizer")


def register_integerizer(cls: type) -> type:
    """Class decorator: register an :class:`Integerizer` class by its ``name``.

    Raises
    ------
    SpecError
        A class without ``name``, ``up``, ``top``, ``partition``, ``down``, ``finish``,
        ``of`` or ``whole``.
    """
    need = ("name", "up", "top", "partition", "down", "finish", "of", "whole")
    missing = [a for a in need if not hasattr(cls, a)]
    if missing:
        raise SpecError(f"integerizer {cls.__name__} lacks {missing}; see Integerizer")
    INTEGERIZERS.add(cls.name, cls)
    return cls


@dataclass(frozen=True, eq=False)
class DriverOptions:
    """Where and how the partitions' passes run.

    Attributes
    ----------
    cache_bytes : int or None
        Memory the cached upward states may take (default :data:`DEFAULT_CACHE_BYTES`); a
        partition beyond it is recomputed by its downward task (0: recompute all). None:
        keep every state. On Dask which partitions fit can depend on the order their upward
        passes complete; the output does not.
    order : sequence of int, optional
        Order in which the partitions are submitted (positions); the output does not
        depend on it.
    workers : int
        Threads of this process running partitions at once when no executor is given.
    ahead : int, optional
        On Dask, partitions submitted and not yet taken back (default ``2 ×`` the workers).
    memory_bytes : int, optional
        A memory budget for this process's threads: a partition's pass starts only while
        the working sets of those running (``costs``) plus the cached states fit in it (a
        partition alone always runs), and the cache keeps at most ``memory_bytes`` minus
        the largest working set. None: no budget (``workers`` partitions at once).
    costs : sequence of int, optional
        Per partition position, its estimated working set in bytes (with ``memory_bytes``).
    """

    cache_bytes: int | None = DEFAULT_CACHE_BYTES
    order: Sequence[int] | None = None
    workers: int = 1
    ahead: int | None = None
    memory_bytes: int | None = None
    costs: Sequence[int] | None = None


def no_message(state: Any) -> tuple[None, int]:
    """The ``message_fn`` of a step whose partitions send nothing up (each is settled from
    the top's state alone): no message, size 0 for the driver's cache."""
    return None, 0


def same(x: Any) -> Any:
    """The identity, as a task: puts ``x`` on an executor once (:meth:`PartitionDriver.share`)."""
    return x


class PartitionDriver:
    """Runs :class:`PartitionStep` passes over ``n`` partitions on one executor.

    Parameters
    ----------
    n : int
        Number of partitions.
    executor : Executor, optional
        Sync, threads (pipelined in this process, ``executor.workers`` threads) or Dask;
        None: ``options.workers`` threads of this process.
    options : DriverOptions, optional

    Raises
    ------
    SpecError
        An ``order`` that does not list every partition once; both ``workers > 1`` and an
        executor.
    """

    def __init__(
        self, n: int, executor: Executor | None = None, options: DriverOptions | None = None
    ) -> None:
        opts = options or DriverOptions()
        order = list(range(n)) if opts.order is None else [int(i) for i in opts.order]
        if sorted(order) != list(range(n)):
            raise SpecError("order must list every partition position once")
        if executor is not None and opts.workers != 1:
            raise SpecError("give workers (threads in this process) or an executor, not both")
        self.n, self.order, self.options = n, order, opts
        self.name = "in-process threads" if executor is None else executor.name
        self.workers = max(1, int(opts.workers))
        self.ex: Executor | None = executor
        if isinstance(executor, ThreadExecutor):
            # this process's threads: pipelined in order, a partition started as soon as a
            # thread is free, not in groups of ``workers`` that each wait for their slowest
            self.workers, self.ex = executor.workers, None
        self.seconds: dict[str, float] = {}
        self.cached: dict[int, Any] = {}
        self.sent: dict[int, Any] = {}
        self.shared: list[Any] = []
        self.thread_cpu: list[list[float]] = []
        self.used = self.largest = self.regenerated = 0
        # the memory budget's gate: bytes of the running partitions and of the cached states
        self._gate = threading.Condition()
        self.running = self.held = self.waited = self.turn = 0
        self.sizes: dict[int, int] = {}

    # ------------------------------------------------------------------ where tasks run
    @property
    def dask(self) -> bool:
        return isinstance(self.ex, DaskExecutor)

    @property
    def window(self) -> int:
        """Partitions in flight at once (``ahead`` on Dask, else one)."""
        if not self.dask:
            return 1
        ahead = self.options.ahead
        return max(1, int(ahead) if ahead is not None else 2 * self.ex.workers)  # type: ignore[union-attr]

    @property
    def remote(self) -> bool:
        """Whether tasks run through an executor's handles (not this process's threads)."""
        return self.ex is not None

    def share(self, obj: Any) -> Any:
        """``obj`` for the tasks: its handle on an executor (sent once, released by
        :meth:`release`), itself in this process."""
        if self.ex is None:
            return obj
        handle = self.ex.submit(same, [obj])[0]
        self.shared.append(handle)
        return handle

    def _submit(self, task: Task) -> Any:
        return self.ex.submit(task.fn, [task.item], *task.extra)[0]  # type: ignore[union-attr]

    def _results(
        self, tasks: Callable[[int], tuple[Task, ...]], in_order: bool
    ) -> Iterator[tuple[int, tuple, Any]]:
        """``(i, handles, value)`` for every position ``i`` of ``order``, on the executor:
        ``tasks(i)`` is a chain (each task after the first is given the previous one's
        handle; the last one's value is wanted). At most :attr:`window` positions in flight,
        results in position order or (``in_order`` False, Dask) as they complete, so one long
        task does not hold back the workers."""
        ex: Any = self.ex
        n, ahead = len(self.order), self.window
        inflight: dict[int, tuple] = {}
        nxt = 0
        while True:
            while nxt < n and len(inflight) < ahead:
                handles: list = []
                for t in tasks(nxt):
                    item = t.item if not handles else handles[-1]
                    handles.append(ex.submit(t.fn, [item], *t.extra)[0])
                inflight[nxt] = tuple(handles)
                nxt += 1
            if not inflight:
                return
            if in_order or not self.dask:
                i = min(inflight)
                value = ex.gather([inflight[i][-1]])[0]
            else:
                keys = list(inflight)
                j, value = next(ex.each([inflight[k][-1] for k in keys]))
                i = keys[j]
            yield i, inflight.pop(i), value

    def _acquire(self, i: int) -> None:
        """Wait until the ``i``-th partition of ``order`` may start: every earlier one has
        started (so none waits on a later one) and the memory budget has room for its
        working set beside the partitions not yet taken back and the cached states (or
        none of those is left)."""
        need = int(self.options.costs[self.order[i]])  # type: ignore[index]
        budget = int(self.options.memory_bytes)  # type: ignore[arg-type]

        def room() -> bool:
            fits = self.running == 0 or self.running + self.held + need <= budget
            return self.turn == i and fits

        with self._gate:
            if not room():
                self.waited += 1
                self._gate.wait_for(room)
            self.running += need
            self.turn += 1
            self._gate.notify_all()

    def _free(self, i: int) -> None:
        """The ``i``-th partition's result was taken back: its working set is free."""
        with self._gate:
            self.running -= int(self.options.costs[self.order[i]])  # type: ignore[index]
            self._gate.notify_all()

    def _threaded(self, fn: Callable[[int], Any]) -> Iterator[tuple[int, Any]]:
        """``fn(pos)`` over ``order`` in this process's threads, in order; with
        ``memory_bytes`` a partition's working set counts from its start until its result
        is taken back (:meth:`_acquire`). With a pool, each pool thread's CPU seconds are
        appended to :attr:`thread_cpu` (the pass's balance)."""
        if self.workers <= 1:
            yield from enumerate(ordered_ahead(fn, self.order, 1))
            return
        busy: dict[int, float] = {}
        gated = self.options.memory_bytes is not None and self.options.costs is not None
        index = {pos: i for i, pos in enumerate(self.order)}
        self.turn = 0

        def timed(pos: int) -> Any:
            if gated:
                self._acquire(index[pos])
            out = fn(pos)
            busy[threading.get_ident()] = thread_cpu_seconds()  # a fresh pool's thread
            return out

        for i, out in enumerate(ordered_ahead(timed, self.order, self.workers)):
            yield i, out
            del out
            if gated:
                self._free(i)
        self.thread_cpu.append(sorted(busy.values(), reverse=True))

    # ------------------------------------------------------------------ the passes
    def upward(self, step: PartitionStep) -> list[Any]:
        """Pass 1: every partition's upward state; its message by partition position, the
        state cached while the budget allows (else dropped, recomputed in pass 3)."""
        messages: list[Any] = [None] * self.n
        budget = self.options.cache_bytes
        if self.options.memory_bytes is not None and self.options.costs and self.ex is None:
            room = self.options.memory_bytes - max(self.options.costs)
            budget = max(0, room if budget is None else min(budget, room))
        if self.ex is None:

            def up(pos: int) -> tuple:
                state = step.up(pos)()
                return (state,), step.message_fn(state)

            results: Iterator = ((i, *out) for i, out in self._threaded(up))
        else:

            def chain(i: int) -> tuple[Task, ...]:
                return step.up(self.order[i]), Task(step.message_fn, None)

            results = self._results(chain, in_order=False)
        for i, handles, msg in results:
            pos, state = self.order[i], handles[0]
            if self.ex is not None:
                self.ex.release(handles[1:])
            messages[pos], size = msg
            if budget is None or self.used + size <= budget:
                self.cached[pos] = state
                self.used += size
                self.largest = max(self.largest, size)
                with self._gate:
                    self.held += size
                    self.sizes[pos] = size
            elif self.ex is not None:
                self.ex.release([state])
            del state, handles, msg
        self.regenerated = self.n - len(self.cached)
        return messages

    def _down_task(self, step: PartitionStep, pos: int) -> Task:
        state = self.cached.pop(pos, None)
        with self._gate:  # the state is now the running partition's working set
            self.held -= self.sizes.pop(pos, 0)
        if state is not None and self.ex is not None:
            self.sent[pos] = state  # its handle, released once its downward task is taken
        return step.down(pos, state)

    def downward(
        self, step: PartitionStep, take: Callable[[int, Any], None], *, in_order: bool = True
    ) -> None:
        """Pass 3: every partition's downward task; ``take(position, result)`` in this
        process, in ``order`` (``in_order``) or, on Dask, as they complete."""
        if self.ex is None:
            for i, out in self._threaded(lambda pos: self._down_task(step, pos)()):
                take(self.order[i], out)
                del out
            return
        results = self._results(lambda i: (self._down_task(step, self.order[i]),), in_order)
        for i, handles, out in results:
            pos = self.order[i]
            self.ex.release([*handles, *([self.sent.pop(pos)] if pos in self.sent else [])])
            del handles
            take(pos, out)
            del out

    def kept(self, step: PartitionStep) -> list[Any]:
        """Pass 3 with the results left where they are computed: per partition position
        the handle of its downward result (the value itself in this process)."""
        out: list[Any] = [None] * self.n
        if self.ex is None:
            for i, value in self._threaded(lambda pos: self._down_task(step, pos)()):
                out[self.order[i]] = value
            return out
        for pos in self.order:
            out[pos] = self._submit(self._down_task(step, pos))
        self.ex.release(list(self.sent.values()))  # the downward tasks hold them
        self.sent.clear()
        return out

    def release(self) -> None:
        """On an executor: drop what this run still holds there (also after an error)."""
        if self.ex is not None:
            self.ex.release([*self.shared, *self.cached.values(), *self.sent.values()])
        self.shared, self.cached, self.sent = [], {}, {}

    def stats(self) -> dict[str, Any]:
        """What the run cached and recomputed, where it ran, and the passes' seconds."""
        return {
            "partitions": self.n,
            "partitions_cached": self.n - self.regenerated,
            "partitions_regenerated": self.regenerated,
            "cache_bytes_used": self.used,
            "largest_cached_state_bytes": self.largest,
            "partitions_waiting_for_memory": self.waited,
            "executor": self.name,
            "workers": self.workers if self.ex is None else self.ex.workers,
            "worker_thread_cpu_seconds": self.thread_cpu,
            **{f"seconds_{k}": v for k, v in self.seconds.items() if not k.startswith(CPU_PREFIX)},
            **{
                f"cpu_seconds_{k[len(CPU_PREFIX) :]}": v
                for k, v in self.seconds.items()
                if k.startswith(CPU_PREFIX)
            },
        }


def drive(
    step: PartitionStep,
    driver: PartitionDriver,
    take: Callable[[int, Any], None] | None = None,
    *,
    in_order: bool = True,
) -> list[Any] | None:
    """Run ``step``'s three passes with ``driver``: up (messages), top, down.

    Parameters
    ----------
    step : PartitionStep
    driver : PartitionDriver
        Where the passes run; its :meth:`~PartitionDriver.stats` hold the passes' seconds
        (``upward``, ``top``, ``downward``) and the cache's counts afterwards.
    take : callable, optional
        ``take(position, result)``: each partition's downward result, in this process. None:
        leave the results where they are computed and return their handles.
    in_order : bool
        With ``take``: take the results in ``order`` (False: as they complete on Dask).

    Returns
    -------
    list or None
        Without ``take``, the downward results' handles by partition position (the values
        themselves in this process); else None.
    """
    try:
        with stage(driver.seconds, "upward"):
            messages = driver.upward(step)
        with stage(driver.seconds, "top"):
            step.top(messages)
            del messages
        with stage(driver.seconds, "downward"):
            if take is None:
                return driver.kept(step)
            driver.downward(step, take, in_order=in_order)
            return None
    finally:  # the executor drops what this run left there (also after an error)
        driver.release()


def integerize(integerizer: Integerizer, driver: PartitionDriver) -> Any:
    """Run an :class:`Integerizer` with ``driver`` (up, top, every partition where its piece
    is) and return what its ``finish`` makes of the partitions' results."""
    return integerizer.finish(drive(integerizer, driver))
