"""Execution backends: run independent units of work in order, on threads, or over Dask.

Every backend maps a pure function over a list of inputs and returns the results *in input
order*, so the output of a run never depends on the backend or on how many partitions the
work was cut into. Noise is keyed by node (:mod:`censusdp.rng`): a task recomputed after a
worker failure draws exactly the same noise, which is what makes Dask's retry-on-failure safe
for a privacy release (Algorithm 4 of the subspace-DP paper: every agent privatizes locally
with the shared secret key).

``map`` returns values. ``submit`` returns *handles* instead, and the items of a later
``submit`` may contain handles (inside tuples, lists or dicts): on Dask the task then runs
where its inputs already are, and they never pass through the calling process. ``gather``
turns handles into values, ``wait`` blocks until they are computed and ``release`` drops
them. Without Dask a handle is its value.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from censusdp.errors import SpecError

__all__ = [
    "Executor",
    "SyncExecutor",
    "ThreadExecutor",
    "DaskExecutor",
    "open_executor",
    "SCHEDULERS",
    "KEEP_FREED_MEMORY",
]

SCHEDULERS = ("sync", "threads", "distributed")


class Executor(Protocol):
    """Maps a function over items; results come back in input order."""

    name: str
    workers: int

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]: ...

    def submit(
        self,
        fn: Callable[..., Any],
        items: Sequence[Any],
        *extra: Any,
        cost: Sequence[float] | None = None,
    ) -> list[Any]:
        """Like ``map`` but returns handles; ``items`` may contain earlier handles.

        ``cost`` (one figure per item, e.g. its leaves) lets a scheduler that places tasks
        as workers free up start the largest first (longest processing time first), so the
        workers end together; handles still come back in input order.
        """
        ...

    def gather(self, handles: Sequence[Any]) -> list[Any]: ...

    def each(self, handles: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """``(position, value)`` of every handle, each as soon as it is ready: a caller that
        copies values out and drops them holds one at a time."""
        ...

    def release(self, handles: Sequence[Any]) -> None: ...

    def wait(self, handles: Sequence[Any]) -> None: ...


class _Local:
    """Handles of the in-process backends are the values themselves."""

    def submit(
        self,
        fn: Callable[..., Any],
        items: Sequence[Any],
        *extra: Any,
        cost: Sequence[float] | None = None,
    ) -> list[Any]:
        return self.map(fn, items, *extra)  # type: ignore[attr-defined]

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        return list(handles)

    def each(self, handles: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        return iter(enumerate(handles))

    def release(self, handles: Sequence[Any]) -> None:
        pass

    def wait(self, handles: Sequence[Any]) -> None:
        pass


class SyncExecutor(_Local):
    """Everything in the calling thread (the reference backend)."""

    name = "sync"
    workers = 1

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        return [fn(item, *extra) for item in items]


class ThreadExecutor(_Local):
    """A thread pool: numpy and the solvers release the GIL in their heavy parts."""

    name = "threads"

    def __init__(self, workers: int | None = None) -> None:
        import os

        self.workers = workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="censusdp")

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        return list(self._pool.map(lambda item: fn(item, *extra), items))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class _Handle:
    """A Dask future with the recipe that made it, so a lost or cancelled chain can be rebuilt.

    ``item`` may hold other handles (the inputs from earlier maps); they are replaced by their
    futures when the task is submitted, so the task runs where its inputs are.
    """

    __slots__ = ("fn", "item", "extra", "future")

    def __init__(self, fn: Callable[..., Any], item: Any, extra: tuple) -> None:
        self.fn, self.item, self.extra = fn, item, extra
        self.future: Any = None


def _walk(x: Any, leaf: Callable[[_Handle], Any]) -> Any:
    if isinstance(x, _Handle):
        return leaf(x)
    if type(x) in (tuple, list):
        return type(x)(_walk(y, leaf) for y in x)
    if type(x) is dict:
        return {k: _walk(v, leaf) for k, v in x.items()}
    return x


#: glibc ``malloc`` settings that keep the memory a process frees for its own reuse: never
#: trim the heap, serve arrays up to 1 GiB from it, grow it 64 MiB at a time. The stages
#: allocate and free the same large numpy temporaries again and again; memory given back to
#: the kernel has to be faulted in afresh, which on a VM costs about 20 µs per 4 KiB page
#: (measured on the 2-core CI machine: the national distributed benchmark ran 2× slower
#: under Dask's own ``MALLOC_TRIM_THRESHOLD_=65536``, which returns every freed block).
KEEP_FREED_MEMORY = {
    "MALLOC_TRIM_THRESHOLD_": 1 << 34,
    "MALLOC_MMAP_THRESHOLD_": 1 << 30,
    "MALLOC_TOP_PAD_": 1 << 26,
}


def _worker_environ(keep_memory: bool) -> dict:
    """Dask's pre-spawn environment of new workers, with :data:`KEEP_FREED_MEMORY`."""
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}))
    if keep_memory:
        env.update({k: str(v) for k, v in KEEP_FREED_MEMORY.items()})
    return env


class DaskExecutor:
    """Dask distributed: a ``LocalCluster`` by default, or an existing scheduler address.

    Every task carries its item and the shared arguments (``extra``, meant to be small) in
    its own specification, and later tasks receive earlier results as futures; nothing is
    ``scatter``-ed, so the scheduler can recompute any result lost with a worker from its
    lineage. Tasks are submitted with ``pure=False`` and retried on worker loss; should Dask
    cancel a task instead, the whole chain of maps behind a ``gather`` is resubmitted (every
    task is a pure function of its inputs: keyed noise, per-node arithmetic).

    The worker processes of a ``LocalCluster`` started here keep the memory they free
    (:data:`KEEP_FREED_MEMORY`) unless ``keep_memory=False``; workers of an existing
    cluster run as their owner started them.
    """

    name = "distributed"

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        client: Any = None,
        keep_memory: bool = True,
    ) -> None:
        import dask
        import dask.distributed  # noqa: F401  (loads the distributed config)
        from dask.distributed import Client, LocalCluster

        self._cluster = None
        if client is not None:
            self.client = client
        elif address:
            try:
                self.client = Client(address, timeout="20s")
            except OSError as exc:
                raise SpecError(
                    f"cannot reach the Dask scheduler at {address!r} ({exc}); start it or drop --scheduler"
                ) from None
        else:
            import os

            n = workers or min(2, os.cpu_count() or 1)
            environ = {"distributed.nanny.pre-spawn-environ": _worker_environ(keep_memory)}
            with dask.config.set(environ):  # read when the nannies are made
                self._cluster = LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=40,
                )
            self.client = Client(self._cluster)
        self.workers = len(self.client.scheduler_info().get("workers", {})) or 1

    #: Whole-chain resubmissions after the cluster lost or cancelled a task.
    attempts = 3

    def _launch(self, h: _Handle) -> Any:
        if h.future is None:
            args = _walk(h.item, self._launch)
            with warnings.catch_warnings():
                # a task carries its partition's data on purpose (nothing is scattered, so
                # lineage can recompute it); Dask's advice to scatter large graphs does not apply
                warnings.filterwarnings("ignore", "Sending large graph", UserWarning)
                h.future = self.client.submit(h.fn, args, *h.extra, pure=False, retries=3)
        return h.future

    def _forget(self, h: _Handle) -> None:
        """Drop the futures of ``h`` and of every handle it was computed from."""
        if h.future is not None:
            h.future.release()
            h.future = None
        _walk(h.item, self._forget)

    def submit(
        self,
        fn: Callable[..., Any],
        items: Sequence[Any],
        *extra: Any,
        cost: Sequence[float] | None = None,
    ) -> list[_Handle]:
        handles = [_Handle(fn, item, extra) for item in items]
        # Dask queues tasks without inputs on the scheduler in submission order and hands
        # them out as worker threads free up: largest first balances the workers
        order = (
            range(len(handles)) if cost is None else np.argsort(-np.asarray(cost), kind="stable")
        )
        for i in order:
            self._launch(handles[i])
        return handles

    def gather(self, handles: Sequence[_Handle]) -> list[Any]:
        out: list[Any] = [None] * len(handles)
        for i, value in self.each(handles):
            out[i] = value
        return out

    def each(self, handles: Sequence[_Handle]) -> Iterator[tuple[int, Any]]:
        """Results with their positions, each fetched as soon as it is ready (the transfers
        of early results overlap the computation of later ones)."""
        from dask.distributed import KilledWorker, as_completed
        from distributed.client import FutureCancelledError

        done: set[int] = set()
        for attempt in range(self.attempts):
            try:
                futures = [self._launch(h) for h in handles]
                index = {f.key: i for i, f in enumerate(futures)}
                pending = [f for i, f in enumerate(futures) if i not in done]
                # this client's loop: as_completed would otherwise run on the process's
                # default client, and a future awaited on two loops fails with "bound to a
                # different event loop" (seen with a second client in the process)
                for f in as_completed(pending, loop=self.client.loop):
                    i = index[f.key]
                    value = f.result()
                    done.add(i)
                    yield i, value
                return
            except (FutureCancelledError, KilledWorker):
                # a worker died and Dask dropped a task instead of recomputing it; every task
                # is a pure function of its inputs (keyed noise), so resubmitting the chain
                # gives exactly the same results
                if attempt == self.attempts - 1:
                    raise
                for i, h in enumerate(handles):
                    if i not in done:
                        self._forget(h)

    def wait(self, handles: Sequence[_Handle]) -> None:
        """Block until the handles are computed (for timings); errors surface in ``gather``."""
        from dask.distributed import as_completed

        futures = [self._launch(h) for h in handles]
        for _ in as_completed(futures, loop=self.client.loop):  # not dask's wait(): it
            pass  # uses the process's default client, which may not be this one

    def release(self, handles: Sequence[_Handle]) -> None:
        """The caller needs these results no more (tasks depending on them keep them)."""
        for h in handles:
            if h.future is not None:
                h.future.release()
                h.future = None

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        handles = self.submit(fn, items, *extra)
        try:
            return self.gather(handles)
        finally:
            self.release(handles)

    def close(self) -> None:
        if self._cluster is not None:
            self.client.close()
            self._cluster.close()


@contextlib.contextmanager
def open_executor(
    scheduler: str = "sync",
    *,
    address: str | None = None,
    workers: int | None = None,
    keep_memory: bool = True,
) -> Iterator[Executor]:
    """Context manager yielding the executor for a scheduler name (``sync``, ``threads``,
    ``distributed``); an ``address`` such as ``tcp://host:8786`` joins an existing cluster.
    ``keep_memory``: see :class:`DaskExecutor`."""
    if scheduler.startswith("tcp://"):
        scheduler, address = "distributed", scheduler
    if scheduler == "sync":
        yield SyncExecutor()
        return
    if scheduler == "threads":
        ex = ThreadExecutor(workers)
    elif scheduler == "distributed":
        ex = DaskExecutor(address, workers, keep_memory=keep_memory)
    else:
        raise SpecError(
            f"unknown scheduler {scheduler!r}; choose one of {list(SCHEDULERS)} or tcp://HOST:PORT"
        )
    try:
        yield ex
    finally:
        ex.close()
