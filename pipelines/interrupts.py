"""Ctrl-C with local Dask workers: the driver stops them, they do not react themselves.

A terminal delivers Ctrl-C (SIGINT) to every process of the foreground job, the worker
processes of a ``LocalCluster`` included. Left to themselves, each prints its own
``KeyboardInterrupt`` traceback and dies mid-task while the driver is still shutting the
cluster down. With :func:`workers_ignore_interrupts` around the cluster's creation, every
worker process loads this module as a Dask preload and ignores SIGINT; the driver takes the
interrupt alone, and its executor's context manager closes the cluster (stopping the workers)
on the way out.

SIGTERM (``kill PID``, ``timeout``, a batch scheduler or a service manager stopping the run)
is Ctrl-C by another name: :func:`terminate_as_interrupt` makes it raise :class:`Terminated`
in the main thread, a :class:`KeyboardInterrupt`, so that every clean-up that runs for
Ctrl-C runs for it — temporaries removed (:mod:`censusdp.atomic`), Dask clusters closed —
and the command line ends with one line and status :data:`EXIT_TERMINATED`, 143 = 128 + 15,
the shell's status for a process ended by signal 15 (as 130 = 128 + 2 is Ctrl-C's). Worker
processes of a local cluster ignore SIGTERM like SIGINT when it reaches the whole process
group: the driver stops them by closing the cluster (asking each worker to close; a worker
that does not is then killed).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = [
    "EXIT_TERMINATED",
    "Terminated",
    "dask_setup",
    "terminate_as_interrupt",
    "workers_ignore_interrupts",
]

#: Exit status of a run stopped by SIGTERM (128 + 15, the shell's convention).
EXIT_TERMINATED = 128 + signal.SIGTERM

_PRELOAD = __name__


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises :class:`KeyboardInterrupt` (it is one, so every
    ``except KeyboardInterrupt`` and ``except BaseException`` clean-up runs for it).

    :func:`censusdp.app.commands.common.run_cli` prints ``censusdp: {what}; nothing was written``
    and returns :attr:`exit_status`.
    """

    what = "terminated (SIGTERM)"
    exit_status = EXIT_TERMINATED


def _raise_terminated(signum: int, frame: Any) -> None:
    # once: a second SIGTERM must not break off the clean-up the first one started
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (the first
    one; later ones are ignored while it unwinds); the previous handler is restored after.
    A no-op outside the main thread, where no handler can be installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def dask_setup(worker: Any = None) -> None:
    """Dask preload hook, run in each worker process: ignore SIGINT and SIGTERM there."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def workers_ignore_interrupts(scheduler: str) -> Iterator[None]:
    """Make the worker processes of a local Dask cluster created in this block ignore Ctrl-C
    and SIGTERM (a no-op for the in-process schedulers and for clusters this process does not start), and
    keep Dask's note that its dashboard port is taken off the user's terminal."""
    if scheduler != "distributed":
        yield
        return
    import dask
    import dask.distributed  # noqa: F401  (loads distributed's config first: a config.set of a
    # "distributed.*" key made before that would, on exit, remove the whole "distributed" section)

    preloads = list(dask.config.get("distributed.worker.preload", default=[]) or [])
    with (
        dask.config.set({"distributed.worker.preload": [*preloads, _PRELOAD]}),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message="Port .* is already in use")
        yield
