"""Linear queries on a node's cell vector, and hierarchical measurements and invariants.

A :class:`Query` is a (k × cells) matrix: ``detailed`` (identity), ``total`` (1ᵀ) or a
marginal (0/1 rows from cell-name patterns). A :class:`Measurement` is one query answered with
noise at every node of one level; an :class:`Invariant` is one query released exactly at every
node of one level. :func:`measure` draws the noise from the keyed streams of
:mod:`censusdp.rng`, so any node range can be measured on its own (Dask partitions) and the
union equals the single-process result bit for bit.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.errors import DataError, SpecError
from censusdp.hierarchy.core import exact_int64
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.rng import KeyedRNG

__all__ = [
    "Query",
    "Measurement",
    "Invariant",
    "measure",
    "measure_range",
    "invariant",
    "stream_label",
]


@dataclass(frozen=True, eq=False)
class Query:
    """A linear query: ``matrix @ cells`` for every node.

    Attributes
    ----------
    name : str
        ``"detailed"``, ``"total"`` or a marginal's name.
    matrix : numpy.ndarray
        int64 array of shape (k, n_cells).
    labels : tuple of str
        One label per row of ``matrix``.
    """

    name: str
    matrix: np.ndarray
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        m = np.asarray(self.matrix)
        if m.ndim != 2 or m.shape[0] != len(self.labels):
            raise ValueError(f"query {self.name!r}: matrix must be (len(labels), n_cells)")

    @property
    def n_rows(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def n_cells(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def is_identity(self) -> bool:
        m = self.matrix
        return m.shape[0] == m.shape[1] and bool(
            np.array_equal(m, np.eye(m.shape[0], dtype=m.dtype))
        )

    @classmethod
    def detailed(cls, cells: Sequence[str]) -> Query:
        """The identity: every cell."""
        return cls("detailed", np.eye(len(cells), dtype=np.int64), tuple(cells))

    @classmethod
    def total(cls, cells: Sequence[str]) -> Query:
        """The node total 1ᵀ x."""
        return cls("total", np.ones((1, len(cells)), dtype=np.int64), ("total",))

    @classmethod
    def marginal(
        cls, name: str, cells: Sequence[str], groups: Mapping[str, str | Sequence[str]]
    ) -> Query:
        """A 0/1 marginal: one row per group; a group is a glob pattern or a list of cells.

        Raises
        ------
        SpecError
            When a group matches no cell.
        """
        cells = list(cells)
        rows = []
        for label, pat in groups.items():
            if isinstance(pat, str):
                hit = [fnmatch.fnmatchcase(c, pat) for c in cells]
            else:
                wanted = set(pat)
                unknown = wanted.difference(cells)
                if unknown:
                    raise SpecError(
                        f"marginal {name!r}, group {label!r}: unknown cells {sorted(unknown)}; "
                        f"cells are {cells}"
                    )
                hit = [c in wanted for c in cells]
            if not any(hit):
                raise SpecError(
                    f"marginal {name!r}, group {label!r}: pattern {pat!r} matches no cell; "
                    f"cells are {cells}"
                )
            rows.append(np.asarray(hit, dtype=np.int64))
        return cls(name, np.vstack(rows), tuple(groups))

    def apply(self, counts: np.ndarray) -> np.ndarray:
        """Answers for node counts of shape (n_nodes, n_cells) → (n_nodes, k).

        Integer counts give exact int64 answers (a sum beyond the int64 range is refused,
        never wrapped around).

        Raises
        ------
        SpecError
            Counts that are not (n_nodes, n_cells) for this query's n_cells (no broadcasting).
        DataError
            An integer answer beyond the int64 range.
        """
        counts = np.asarray(counts)
        if counts.ndim != 2 or counts.shape[1] != self.n_cells:
            raise SpecError(
                f"query {self.name!r} is on {self.n_cells} cells but the counts have shape "
                f"{counts.shape}; counts must be (nodes, {self.n_cells})"
            )
        if self.is_identity:
            return np.array(counts, copy=True)
        matrix = np.asarray(self.matrix)
        if matrix.dtype.kind in "iu" and counts.dtype.kind in "iu":
            weight = int(np.abs(matrix).sum(axis=1).max(initial=0))
            out, overflow = exact_int64(lambda a: a @ matrix.T.astype(a.dtype), counts, weight)
            if overflow is not None:
                node, row = np.argwhere(overflow)[0]
                raise DataError(
                    f"query {self.name!r}, row {self.labels[row]!r}, node {int(node)}: the "
                    "answer exceeds the int64 range (2^63 - 1), so it cannot be held exactly; "
                    "check the counts for a unit or scale error"
                )
            return out
        return counts @ matrix.T


@dataclass(frozen=True, eq=False)
class Measurement:
    """A noisy answer to ``query`` at every node of level ``level``.

    Attributes
    ----------
    level : int
        Level index in the hierarchy.
    query : Query
    values : numpy.ndarray
        (n_nodes, k) noisy answers.
    law : NoiseLaw
        The noise law of every entry (its variance is the measurement variance).
    """

    level: int
    query: Query
    values: np.ndarray
    law: NoiseLaw

    @property
    def variance(self) -> float:
        return float(self.law.variance)


@dataclass(frozen=True, eq=False)
class Invariant:
    """An exact answer to ``query`` at every node of level ``level``."""

    level: int
    query: Query
    values: np.ndarray


def stream_label(level_name: str, query_name: str) -> str:
    """The keyed-stream label of one (level, query) measurement."""
    return f"measure/{level_name}/{query_name}"


def measure_range(
    true_answers: np.ndarray,
    level_name: str,
    n_nodes: int,
    start: int,
    query: Query,
    law: NoiseLaw,
    rng: KeyedRNG,
) -> np.ndarray:
    """Noisy answers for nodes ``[start, start + len(true_answers))`` of a level.

    ``true_answers`` are the exact answers ``query.apply(counts)`` of those nodes. An
    integer law needs integer answers (integral floats up to 2⁵³ are converted exactly),
    so that the measurements are integers.

    Raises
    ------
    DataError
        Non-integer answers under an integer noise law.
    """
    true_answers = np.asarray(true_answers)
    if law.is_integer and true_answers.dtype.kind not in "iu":
        finite = np.isfinite(true_answers)
        exact = finite & (np.abs(np.where(finite, true_answers, 0.0)) <= 2.0**53)
        exact &= true_answers == np.round(np.where(exact, true_answers, 0.0))
        if true_answers.dtype.kind != "f" or not exact.all():
            raise DataError(
                f"level {level_name!r}, query {query.name!r}: the counts are not integers "
                f"(dtype {true_answers.dtype}) but the noise law {law!r} is an integer law; "
                "give int64 counts (or use a continuous law)"
            )
        true_answers = true_answers.astype(np.int64)
    stop = start + true_answers.shape[0]
    noise = rng.draw(
        stream_label(level_name, query.name), n_nodes, start, stop, law.sample, query.n_rows
    )
    return true_answers + noise


def measure(
    level_names: Sequence[str],
    level_counts: Sequence[np.ndarray],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    rng: KeyedRNG,
) -> list[Measurement]:
    """Measure every (level, query, law) of ``plan`` at every node of its level.

    Parameters
    ----------
    level_names : sequence of str
        The hierarchy's level names (stream labels).
    level_counts : sequence of arrays
        Exact counts per level, (n_nodes, n_cells), e.g. ``Hierarchy.aggregate(leaf_counts)``.
    plan : sequence of (level index, Query, NoiseLaw)
    rng : KeyedRNG
    """
    out = []
    for k, q, law in plan:
        counts = level_counts[k]
        truth = q.apply(counts)
        vals = measure_range(truth, level_names[k], counts.shape[0], 0, q, law, rng)
        out.append(Measurement(k, q, vals, law))
    return out


def invariant(level_counts: Sequence[np.ndarray], level: int, query: Query) -> Invariant:
    """The exact answers of ``query`` at level ``level``."""
    return Invariant(level, query, query.apply(level_counts[level]))
