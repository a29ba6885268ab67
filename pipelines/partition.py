"""Cut a hierarchy into units of work and group them into partitions.

The units are the nodes of the *cut level* (the deepest invariant level, e.g. states when state
totals are invariant); everything below a unit is its subtree. Because nodes are sorted by
parent at every level, the descendants of a contiguous run of units form a contiguous index
range at every level below, so a partition is just one ``[start, stop)`` range per level.
Partitions are contiguous runs of units with roughly equal numbers of leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from censusdp.hierarchy import Hierarchy

__all__ = ["Partition", "partition_units"]


@dataclass(frozen=True)
class Partition:
    """A contiguous run of units: ``ranges[k] = (start, stop)`` for levels ``cut .. leaf``."""

    index: int
    cut: int
    ranges: tuple[tuple[int, int], ...]

    def range(self, level: int) -> tuple[int, int]:
        """Node range of this partition at ``level`` (≥ the cut level)."""
        if level < self.cut:
            raise ValueError(f"level {level} is above the cut level {self.cut}")
        return self.ranges[level - self.cut]

    @property
    def units(self) -> tuple[int, int]:
        return self.ranges[0]

    @property
    def leaves(self) -> int:
        """Number of leaves in the partition (its share of the work)."""
        lo, hi = self.ranges[-1]
        return hi - lo


def partition_units(hierarchy: Hierarchy, cut: int, n_partitions: int) -> list[Partition]:
    """Split the nodes of level ``cut`` into ≤ ``n_partitions`` contiguous, leaf-balanced runs.

    Partitions never split a unit; empty partitions are dropped, so fewer than
    ``n_partitions`` may come back when there are fewer units.
    """
    if n_partitions < 1:
        raise ValueError("n_partitions must be at least 1")
    depth = hierarchy.depth
    n_units = hierarchy.levels[cut].size
    leaf_of_unit = hierarchy.ancestor_index(depth - 1, cut)
    weight = np.bincount(leaf_of_unit, minlength=n_units).astype(np.float64) + 1.0
    cum = np.concatenate([[0.0], np.cumsum(weight)])  # cum[b] = weight of units [0, b)
    targets = cum[-1] * np.arange(1, n_partitions) / n_partitions
    right = np.clip(np.searchsorted(cum, targets), 1, n_units)
    nearest = np.where(targets - cum[right - 1] < cum[right] - targets, right - 1, right)
    bounds = np.unique(np.concatenate([[0], nearest, [n_units]]))
    parts: list[Partition] = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        ranges = [(int(a), int(b))]
        for k in range(cut, depth - 1):
            lo = hierarchy.descendant_range(cut, int(a), k + 1)[0]
            hi = hierarchy.descendant_range(cut, int(b) - 1, k + 1)[1]
            ranges.append((lo, hi))
        parts.append(Partition(len(parts), cut, tuple(ranges)))
    return parts
