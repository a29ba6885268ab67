"""Execution backends: run independent units of work in order, on threads, or over Dask.

Every backend maps a pure function over a list of inputs and returns the results *in input
order*, so the output of a run never depends on the backend or on how many partitions the
work was cut into. Noise is keyed by node (:mod:`censusdp.rng`): a task recomputed after a
worker failure draws exactly the same noise, which is what makes Dask's retry-on-failure safe
for a privacy release (Algorithm 4 of the subspace-DP paper: every agent privatizes locally
with the shared secret key).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from censusdp.errors import SpecError

__all__ = [
    "Executor",
    "SyncExecutor",
    "ThreadExecutor",
    "DaskExecutor",
    "open_executor",
    "SCHEDULERS",
]

SCHEDULERS = ("sync", "threads", "distributed")


class Executor(Protocol):
    """Maps a function over items; results come back in input order."""

    name: str
    workers: int

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]: ...


class SyncExecutor:
    """Everything in the calling thread (the reference backend)."""

    name = "sync"
    workers = 1

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        return [fn(item, *extra) for item in items]


class ThreadExecutor:
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


class DaskExecutor:
    """Dask distributed: a ``LocalCluster`` by default, or an existing scheduler address.

    Shared arguments (``extra``) are scattered once and passed to every task. Tasks are
    submitted with ``pure=False`` and retried on worker loss.
    """

    name = "distributed"

    def __init__(
        self, address: str | None = None, workers: int | None = None, *, client: Any = None
    ) -> None:
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
            self._cluster = LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=40,
            )
            self.client = Client(self._cluster)
        self.workers = len(self.client.scheduler_info().get("workers", {})) or 1

    #: Whole-map resubmissions after the cluster lost or cancelled a task.
    attempts = 3

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        from dask.distributed import KilledWorker
        from distributed.client import FutureCancelledError

        for attempt in range(self.attempts):
            # one future per argument (scatter splits lists), never content-hashed: a
            # re-scatter of equal data must not share, and then cancel, earlier futures
            shared = [self.client.scatter([x], broadcast=True, hash=False)[0] for x in extra]
            futures = [
                self.client.submit(fn, item, *shared, pure=False, retries=3) for item in items
            ]
            try:
                return self.client.gather(futures)
            except (FutureCancelledError, KilledWorker):
                # a worker died and Dask dropped a task instead of recomputing it; every task
                # is a pure function of its inputs (keyed noise), so resubmitting the map
                # gives exactly the same results
                if attempt == self.attempts - 1:
                    raise
                self.client.cancel(futures)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._cluster is not None:
            self.client.close()
            self._cluster.close()


@contextlib.contextmanager
def open_executor(
    scheduler: str = "sync", *, address: str | None = None, workers: int | None = None
) -> Iterator[Executor]:
    """Context manager yielding the executor for a scheduler name (``sync``, ``threads``,
    ``distributed``); an ``address`` such as ``tcp://host:8786`` joins an existing cluster."""
    if scheduler.startswith("tcp://"):
        scheduler, address = "distributed", scheduler
    if scheduler == "sync":
        yield SyncExecutor()
        return
    if scheduler == "threads":
        ex = ThreadExecutor(workers)
    elif scheduler == "distributed":
        ex = DaskExecutor(address, workers)
    else:
        raise SpecError(
            f"unknown scheduler {scheduler!r}; choose one of {list(SCHEDULERS)} or tcp://HOST:PORT"
        )
    try:
        yield ex
    finally:
        ex.close()
