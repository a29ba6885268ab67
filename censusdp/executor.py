"""The executor protocol: how a computation hands independent tasks to a scheduler.

Defined in core so that any layer may accept an executor (the TopDown-style driver's
per-parent solves, the streamed GLS's partitions) without importing the schedulers
themselves, which live in :mod:`censusdp.pipelines.execute` (sync, threads, Dask).

A backend that computes in this process implements ``map`` only and subclasses
:class:`Executor`: its other methods default to handles that are the values themselves
(``submit`` maps, ``each`` enumerates, ``release`` and ``wait`` have nothing to do); a
remote backend (Dask) overrides them and keeps ``gather``, which collects ``each``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Executor"]


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
        return self.map(fn, items, *extra)

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        """The values of ``handles``, in their order."""
        out: list[Any] = [None] * len(handles)
        for i, value in self.each(handles):
            out[i] = value
        return out

    def each(self, handles: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """``(position, value)`` of every handle, each as soon as it is ready: a caller that
        copies values out and drops them holds one at a time."""
        return iter(enumerate(handles))

    def release(self, handles: Sequence[Any]) -> None:
        """The caller needs these results no more."""

    def wait(self, handles: Sequence[Any]) -> None:
        """Block until the handles are computed."""
