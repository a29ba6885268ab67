"""A release whose levels below the cut stay where the partitions computed them.

:func:`~censusdp.pipelines.gls_partitioned.partitioned_gls` with ``keep=True`` and
:func:`~censusdp.pipelines.gls_partitioned.partitioned_round` on such a release leave every
partition's share of the levels below the cut with the executor (on Dask, on the worker that
computed it) as one :class:`ReleasePiece`; the levels at and above the cut are small and live
in the calling process. Only :meth:`PartitionedRelease.gather` brings the pieces together,
into the plain :class:`~censusdp.estimation.release.Release` that equals the single-process
result bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.estimation.release import Release, SumVariances
from censusdp.hierarchy import Hierarchy
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.partition import Partition
from censusdp.pipelines.partition_driver import same

__all__ = ["ReleasePiece", "PartitionedRelease"]


@dataclass(frozen=True, eq=False)
class ReleasePiece:
    """One partition's levels below the cut (``cut + 1 ..`` leaf), in hierarchy node order.

    Attributes
    ----------
    estimates : tuple of numpy.ndarray
        Per level below the cut, the partition's rows (n_nodes, n_cells).
    variances, covariances : tuple of numpy.ndarray or None
        Same rows; None where the release has none.
    head : numpy.ndarray or None
        The partition's cut-level estimates as the piece's own levels sum to them (the
        rounded counts of an integer release); None when the caller already has them.
    summary : dict
        Small facts about the piece, merged by the caller (residuals, rounding variance).
    sums : tuple or None
        Per level below the cut, ``(estimator, rounding)`` variances (n_nodes, m) of the
        release's tracked sums (:class:`~censusdp.estimation.release.SumVariances`).
    """

    estimates: tuple[np.ndarray, ...]
    variances: tuple[np.ndarray, ...] | None
    covariances: tuple[np.ndarray, ...] | None = None
    head: np.ndarray | None = None
    summary: dict = field(default_factory=dict)
    sums: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None


def piece_head(piece: ReleasePiece) -> tuple[np.ndarray | None, dict]:
    """The small part of a piece that the calling process needs: ``(head, summary)``."""
    return piece.head, piece.summary


@dataclass(eq=False)
class PartitionedRelease:
    """A :class:`~censusdp.estimation.release.Release` kept partition by partition.

    Attributes
    ----------
    estimator, hierarchy, cells, privacy, integer, diagnostics
        As for :class:`~censusdp.estimation.release.Release`.
    partitions : tuple of Partition
        The partitions (one cut level, node order) the pieces belong to.
    executor : Executor
        Where the pieces are.
    estimates, variances, covariances : lists of numpy.ndarray
        Levels 0 .. cut (variances and covariances None where the release has none).
    pieces : list
        Partition ``i``'s :class:`ReleasePiece` (an executor handle).
    sums : SumVariances or None
        Variances of tracked sums for levels 0 .. cut (the pieces hold the rest).
    """

    estimator: str
    hierarchy: Hierarchy
    cells: tuple[str, ...]
    privacy: PrivacyStatement
    integer: bool
    diagnostics: dict
    partitions: tuple[Partition, ...]
    executor: Executor
    estimates: list[np.ndarray]
    variances: list[np.ndarray] | None
    covariances: list[np.ndarray] | None
    pieces: list
    sums: SumVariances | None = None

    @property
    def cut(self) -> int:
        return self.partitions[0].cut

    def level(self, level: str | int) -> np.ndarray:
        """Estimates at a level at or above the cut (below it, :meth:`gather` first)."""
        k = self.hierarchy.level_index(level)
        if k > self.cut:
            raise ValueError(
                f"level {self.hierarchy.names[k]!r} is below the cut "
                f"{self.hierarchy.names[self.cut]!r}: its pieces are with the executor; "
                "gather() the release to read it"
            )
        return self.estimates[k]

    def totals(self, level: str | int) -> np.ndarray:
        """Node totals (sum over cells) at a level at or above the cut."""
        return self.level(level).sum(axis=1)

    def wait(self) -> None:
        """Block until every piece is computed."""
        self.executor.wait(self.pieces)

    def drop(self) -> None:
        """Free the pieces (the release cannot be gathered afterwards)."""
        self.executor.release(self.pieces)
        self.pieces = []

    def gather(self) -> Release:
        """The whole :class:`~censusdp.estimation.release.Release` in this process.

        Pieces are copied into the level arrays as they arrive and dropped, so besides the
        release this process holds one piece at a time.
        """
        if len(self.pieces) != len(self.partitions):
            raise ValueError("the pieces of this release were dropped")
        h = self.hierarchy
        levels = range(self.cut + 1, h.depth)
        names = [
            n for n in ("estimates", "variances", "covariances") if getattr(self, n) is not None
        ]
        below: dict[str, list[np.ndarray]] = {}
        sums_below: list[list[np.ndarray]] | None = None
        for i, piece in self.executor.each(self.pieces):
            p = self.partitions[i]
            if self.sums is not None and piece.sums is not None:
                if sums_below is None:
                    m = self.sums.masks.shape[0]
                    sums_below = [
                        [np.empty((h.levels[k].size, m)) for k in levels] for _ in range(2)
                    ]
                for t in range(2):
                    for k, dst, src in zip(levels, sums_below[t], piece.sums, strict=True):
                        dst[slice(*p.range(k))] = src[t]
            for name in names:
                parts = getattr(piece, name)
                if name not in below:  # shapes and types from the first piece
                    below[name] = [
                        np.empty((h.levels[k].size, *a.shape[1:]), a.dtype)
                        for k, a in zip(levels, parts, strict=True)
                    ]
                for k, dst, src in zip(levels, below[name], parts, strict=True):
                    dst[slice(*p.range(k))] = src
            del piece
        whole = {n: [*getattr(self, n), *below.get(n, [])] for n in names}
        sums = None
        if self.sums is not None:
            extra = sums_below or [[], []]
            sums = SumVariances(
                self.sums.masks,
                self.sums.labels,
                [*self.sums.estimator, *extra[0]],
                [*self.sums.rounding, *extra[1]],
            )
        return Release(
            estimator=self.estimator,
            hierarchy=h,
            cells=self.cells,
            estimates=whole["estimates"],
            variances=whole.get("variances"),
            privacy=self.privacy,
            integer=self.integer,
            diagnostics=dict(self.diagnostics),
            covariances=whole.get("covariances"),
            sums=sums,
        )

    @classmethod
    def of(
        cls, release: Release, partitions: Sequence[Partition], executor: Executor
    ) -> PartitionedRelease:
        """A plain release cut into pieces, each placed with the executor by a task that
        carries it (so a lost piece can be recomputed from its task, as every other)."""
        cut = partitions[0].cut
        D = release.hierarchy.depth

        def rows(arrays: list | None, p: Partition) -> tuple | None:
            if arrays is None:
                return None
            return tuple(arrays[k][slice(*p.range(k))] for k in range(cut + 1, D))

        su = release.sums

        def sum_rows(p: Partition) -> tuple | None:
            if su is None:
                return None
            return tuple(
                (su.estimator[k][slice(*p.range(k))], su.rounding[k][slice(*p.range(k))])
                for k in range(cut + 1, D)
            )

        pieces = [
            ReleasePiece(
                rows(release.estimates, p),
                rows(release.variances, p),
                rows(release.covariances, p),
                sums=sum_rows(p),
            )
            for p in partitions
        ]
        return cls(
            release.estimator,
            release.hierarchy,
            release.cells,
            release.privacy,
            release.integer,
            dict(release.diagnostics),
            tuple(partitions),
            executor,
            release.estimates[: cut + 1],
            None if release.variances is None else release.variances[: cut + 1],
            None if release.covariances is None else release.covariances[: cut + 1],
            executor.submit(same, pieces),
            None
            if su is None
            else SumVariances(su.masks, su.labels, su.estimator[: cut + 1], su.rounding[: cut + 1]),
        )
