"""Ctrl-C with local Dask workers: the driver stops them, they do not react themselves.

A terminal delivers Ctrl-C (SIGINT) to every process of the foreground job, the worker
processes of a ``LocalCluster`` included. Left to themselves, each prints its own
``KeyboardInterrupt`` traceback and dies mid-task while the driver is still shutting the
cluster down. With :func:`workers_ignore_interrupts` around the cluster's creation, every
worker process loads this module as a Dask preload and ignores SIGINT; the driver takes the
interrupt alone, and its executor's context manager closes the cluster (stopping the workers)
on the way out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["workers_ignore_interrupts", "dask_setup"]

_PRELOAD = __name__


def dask_setup(worker: Any = None) -> None:
    """Dask preload hook, run in each worker process: ignore SIGINT there."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def workers_ignore_interrupts(scheduler: str) -> Iterator[None]:
    """Make the worker processes of a local Dask cluster created in this block ignore Ctrl-C
    (a no-op for the in-process schedulers and for clusters this process does not start), and
    keep Dask's note that its dashboard port is taken off the user's terminal."""
    if scheduler != "distributed":
        yield
        return
    import dask

    preloads = list(dask.config.get("distributed.worker.preload", default=[]) or [])
    with (
        dask.config.set({"distributed.worker.preload": [*preloads, _PRELOAD]}),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message="Port .* is already in use")
        yield
