"""Sub-forests of a hierarchy: a contiguous run of subtrees with local node indices.

A :class:`Forest` is what one partition of a level-by-level computation receives (the GLS
passes of :mod:`censusdp.estimation.gls.tree` and :mod:`censusdp.estimation.gls.structured`, the
roundings of :mod:`censusdp.estimation.integer.laminar`, the streamed pipelines): the child counts
of its levels, from which the CSR layout of :class:`~censusdp.hierarchy.core.Hierarchy`
(docs/design.md § Data model: nodes sorted by parent, children contiguous) follows, and the codes that name
nodes in error messages. Per node, its sums are those of :meth:`Hierarchy.aggregate_up`
(``np.add.reduceat`` over the node's contiguous children), so a partitioned computation
adds exactly as the whole one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from censusdp.hierarchy.core import Hierarchy

__all__ = ["Forest", "whole_forest"]


class Forest:
    """Levels ``first, first + 1, ...`` of a contiguous run of subtrees, with local indices.

    Nodes are sorted by parent at every level, so the child counts of the levels above the
    last one determine everything else (``child_start`` is their running sum, ``parent`` their
    repeat); that is all a partition has to receive. ``codes`` (levels above the last) name
    nodes in error messages.

    Parameters
    ----------
    first : int
        Hierarchy index of the top level of the forest.
    names : sequence of str
        Names of the forest's levels.
    sizes : sequence of int
        Number of nodes of each level in the forest.
    child_count : sequence of int arrays
        For every level but the last, the number of children of each node.
    codes : sequence of arrays
        For every level but the last, the codes of its nodes.
    """

    __slots__ = ("first", "names", "sizes", "child_count", "codes", "_cache")

    def __init__(
        self,
        first: int,
        names: Sequence[str],
        sizes: Sequence[int],
        child_count: Sequence[np.ndarray],
        codes: Sequence[np.ndarray],
    ) -> None:
        self.first = int(first)
        self.names = tuple(names)
        self.sizes = tuple(int(s) for s in sizes)
        self.child_count = tuple(np.asarray(c, dtype=np.int64) for c in child_count)
        self.codes = tuple(codes)
        self._cache: dict = {}

    def __getstate__(self) -> tuple:
        return (self.first, self.names, self.sizes, self.child_count, self.codes)

    def __setstate__(self, state: tuple) -> None:
        self.first, self.names, self.sizes, self.child_count, self.codes = state
        self._cache = {}

    @classmethod
    def of(cls, hierarchy: Hierarchy, first: int, ranges: Sequence[tuple[int, int]]) -> Forest:
        """The forest of node ranges ``ranges[j]`` at levels ``first + j`` (nested ranges)."""
        lv = hierarchy.levels
        return cls(
            first,
            hierarchy.names[first : first + len(ranges)],
            [hi - lo for lo, hi in ranges],
            [lv[first + j].child_count[lo:hi] for j, (lo, hi) in enumerate(ranges[:-1])],
            [lv[first + j].codes[lo:hi] for j, (lo, hi) in enumerate(ranges[:-1])],
        )

    def without_codes(self) -> Forest:
        """The same forest without node codes (smaller to send; messages then use indices)."""
        return Forest(self.first, self.names, self.sizes, self.child_count, ())

    @property
    def depth(self) -> int:
        return len(self.sizes)

    def child_start(self, j: int) -> np.ndarray:
        """Local index of the first child of every node of forest level ``j``."""
        key = ("start", j)
        if key not in self._cache:
            c = self.child_count[j]
            self._cache[key] = np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)
        return self._cache[key]

    def parent(self, j: int) -> np.ndarray:
        """Local parent index of every node of forest level ``j`` ≥ 1."""
        key = ("parent", j)
        if key not in self._cache:
            self._cache[key] = np.repeat(
                np.arange(self.sizes[j - 1], dtype=np.int64), self.child_count[j - 1]
            )
        return self._cache[key]

    def sum_children(self, j: int, values: np.ndarray, shared: bool = False) -> np.ndarray:
        """Σ over the children of every node of level ``j``; ``shared``: one row for all.

        The same ``np.add.reduceat`` over each node's contiguous children as
        :meth:`Hierarchy.aggregate_up`, so a node's sum depends on its children only.
        """
        count = self.child_count[j]
        if shared:
            return count.reshape((-1,) + (1,) * (values.ndim - 1)) * values
        out = np.zeros((self.sizes[j],) + values.shape[1:], dtype=values.dtype)
        nz = count > 0
        if values.shape[0]:
            out[nz] = np.add.reduceat(values, self.child_start(j)[nz], axis=0)
        return out

    def aggregate(self, leaf_values: np.ndarray) -> list[np.ndarray]:
        """Sum the last level's values to every level of the forest, first level first
        (per node the sums of :meth:`Hierarchy.aggregate`)."""
        out = [np.asarray(leaf_values)]
        for j in range(self.depth - 2, -1, -1):
            out.append(self.sum_children(j, out[-1]))
        return out[::-1]

    def code(self, j: int, node: int) -> str:
        return str(self.codes[j][node]) if self.codes else f"#{node}"


def whole_forest(hierarchy: Hierarchy, first: int = 0, last: int | None = None) -> Forest:
    """Every node of levels ``first .. last`` (default: to the leaves) as one forest."""
    last = hierarchy.depth - 1 if last is None else last
    return Forest.of(
        hierarchy, first, [(0, hierarchy.levels[k].size) for k in range(first, last + 1)]
    )
