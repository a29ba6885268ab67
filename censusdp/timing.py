"""Stage timing kept out of algorithm bodies: wall and CPU seconds recorded into a dict.

A pipeline's diagnostics report, per named stage, the wall seconds it took and the CPU
seconds of the thread that ran it. :func:`stage` is the one place that reads the clocks:

>>> seconds = {}
>>> with stage(seconds, "solve"):
...     pass
>>> sorted(seconds)
['cpu_solve', 'solve']

Repeated stages of one name (per partition, per task) add up. CPU time is by default
:func:`time.thread_time`, the time of the calling thread only, so a stage run on a worker
thread counts that thread's work and stages summed over threads may exceed the wall time;
``cpu=time.process_time`` counts every thread of the process instead (a stage that waits on
a thread pool).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["CPU_PREFIX", "stage", "thread_cpu_seconds"]

#: The key of a stage's CPU seconds is its name with this prefix.
CPU_PREFIX = "cpu_"

#: Serialises the read-add-write of the seconds, which threads of one run share.
_ADD = threading.Lock()


@contextmanager
def stage(
    seconds: dict[str, float], name: str, cpu: Callable[[], float] = time.thread_time
) -> Iterator[None]:
    """Add the wall and thread CPU seconds of the ``with`` body to ``seconds``.

    Parameters
    ----------
    seconds : dict
        Receives ``seconds[name]`` (wall, :func:`time.perf_counter`) and
        ``seconds["cpu_" + name]`` (``cpu``), each added to what is there (0 when absent).
        Written also when the body raises, so a failed run's diagnostics still show where
        the time went. Threads may share one dict: the additions are serialised.
    name : str
        The stage.
    cpu : callable
        The CPU clock: :func:`time.thread_time` (this thread) or :func:`time.process_time`
        (every thread of the process).
    """
    wall, cpu0 = time.perf_counter(), cpu()
    try:
        yield
    finally:
        elapsed, used = time.perf_counter() - wall, cpu() - cpu0
        cpu_key = CPU_PREFIX + name
        with _ADD:
            seconds[name] = seconds.get(name, 0.0) + elapsed
            seconds[cpu_key] = seconds.get(cpu_key, 0.0) + used


def thread_cpu_seconds() -> float:
    """The CPU seconds the calling thread has used since it started (a pool thread's
    whole work, read when it finishes a task: :class:`~censusdp.pipelines.partition_driver.PartitionDriver`'s
    balance of a pass over its threads)."""
    return time.thread_time()
