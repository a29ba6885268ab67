"""``Table``: a hierarchy with integer counts on its leaves.

Only the leaf counts are stored (int64, shape ``(n_leaves, n_cells)``, canonical leaf
order); every upper level is a sum over the CSR child ranges
(:meth:`Hierarchy.aggregate`), so a table is additive by construction.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from censusdp.errors import DataError
from censusdp.hierarchy.builders import LevelLike, from_columns
from censusdp.hierarchy.core import Hierarchy
from censusdp.hierarchy.validate import parse_counts
from censusdp.tabular import shown_columns

__all__ = ["MIDWEST_CELLS", "Table", "resolve_cells"]

#: Race cells of ggplot2's ``midwest`` data (real 2000 census county populations).
MIDWEST_CELLS = ("popwhite", "popblack", "popamerindian", "popasian", "popother")


def resolve_cells(
    patterns: str | Iterable[str], available: Sequence[str], *, source: str | None = None
) -> list[str]:
    """Expand cell names and glob patterns (``"M_*"``) against ``available``, in order.

    Each pattern's matches are taken in the order of ``available``; a name matched twice
    is kept once. A pattern that matches nothing is a :class:`DataError`.
    """
    where = f"{source}: " if source else ""
    if isinstance(patterns, str):
        patterns = [patterns]
    out: list[str] = []
    for pat in patterns:
        hits = [c for c in available if c == pat] or fnmatch.filter(list(available), pat)
        if not hits:
            raise DataError(
                f"{where}no column matches cell {pat!r}; the columns are {shown_columns(available)}"
            )
        out.extend(h for h in hits if h not in out)
    if not out:
        raise DataError(f"{where}no cells were given")
    return out


@dataclass(frozen=True, eq=False)
class Table:
    """A hierarchy with non-negative int64 counts on its leaves.

    Attributes
    ----------
    hierarchy : Hierarchy
    cells : tuple of str
        Cell (column) names, e.g. ``("M_0-4", ..., "F_85+")``.
    leaf_counts : numpy.ndarray
        int64, shape ``(n_leaves, n_cells)``, in canonical leaf order.
    """

    hierarchy: Hierarchy
    cells: tuple[str, ...]
    leaf_counts: np.ndarray

    def __post_init__(self) -> None:
        cells = tuple(str(c) for c in self.cells)
        counts = np.asarray(self.leaf_counts)
        if counts.ndim == 1:
            counts = counts[:, None]
        if not np.issubdtype(counts.dtype, np.integer):
            raise DataError(f"leaf counts must be integers, got dtype {counts.dtype}")
        counts = counts.astype(np.int64, copy=False)
        if counts.shape != (self.hierarchy.leaves.size, len(cells)):
            raise DataError(
                f"leaf counts have shape {counts.shape}, expected "
                f"({self.hierarchy.leaves.size}, {len(cells)}) (leaves, cells)"
            )
        if len(set(cells)) != len(cells):
            raise DataError(f"cell names must be unique, got {list(cells)}")
        if (counts < 0).any():
            node, cell = np.argwhere(counts < 0)[0]
            raise DataError(
                f"leaf {str(self.hierarchy.leaves.codes[node])!r} of level "
                f"{self.hierarchy.leaves.name!r}, cell {cells[cell]!r}: negative count"
            )
        object.__setattr__(self, "cells", cells)
        object.__setattr__(self, "leaf_counts", counts)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_frame(
        cls,
        df: pd.DataFrame,
        levels: Iterable[LevelLike],
        cells: str | Iterable[str],
        *,
        source: str | None = None,
        root_name: str = "nation",
        root_code: str = "US",
    ) -> Table:
        """Build from a frame with one row per leaf.

        Parameters
        ----------
        df : pandas.DataFrame
            Code columns (strings) and count columns.
        levels : iterable of LevelSpec or tuples
            As :func:`censusdp.hierarchy.builders.from_columns`.
        cells : str or iterable of str
            Count columns, by name or glob pattern (``"M_*"``).
        source : str, optional
            File name for error messages.

        Raises
        ------
        DataError
            Negative, non-integer, NaN, missing, non-numeric or out-of-int64 counts (naming
            the 1-based data row and the column), missing columns, duplicate leaves. Counts
            are parsed exactly (:func:`~censusdp.hierarchy.validate.parse_counts`), never
            through float64.
        HierarchyError
            Codes that do not nest.
        """
        names = resolve_cells(cells, [str(c) for c in df.columns], source=source)
        counts = np.empty((len(df), len(names)), dtype=np.int64)
        for j, c in enumerate(names):
            counts[:, j] = parse_counts(df[c], c, source=source)
        h, leaf_row = from_columns(
            df, levels, root_name=root_name, root_code=root_code, source=source
        )
        counts = counts[leaf_row]
        return cls(h, tuple(names), counts)

    @classmethod
    def from_midwest(cls) -> Table:
        """The embedded demo: ggplot2's ``midwest`` (IL, IN, MI, OH, WI; 437 counties).

        Read from the CSV packaged with censusdp (``censusdp/data/midwest.csv``, its
        provenance and checksum in ``censusdp/data/README.md``) with the standard library's
        :mod:`csv`; counts are parsed by :meth:`from_frame` (exactly, never through float).
        State codes are postal abbreviations, county codes ``"IL-ADAMS"``; cells are
        :data:`MIDWEST_CELLS`.

        References
        ----------
        ggplot2's ``midwest`` (Wickham et al., MIT licence): 2000 U.S. census county
        demographics.
        """
        import csv
        from importlib import resources

        with (
            resources.files("censusdp").joinpath("data", "midwest.csv").open(encoding="utf-8") as f
        ):
            rows = list(csv.DictReader(f))
        states = np.array([r["state"] for r in rows], dtype=object)
        counties = np.array([r["state"] + "-" + r["county"] for r in rows], dtype=object)
        df = pd.DataFrame({"state": states, "county": counties})
        for c in MIDWEST_CELLS:
            df[c] = [r[c] for r in rows]
        return cls.from_frame(
            df, [("state", "state"), ("county", "county")], MIDWEST_CELLS, source="midwest"
        )

    # ------------------------------------------------------------------ access
    @property
    def n_cells(self) -> int:
        return len(self.cells)

    @property
    def n_leaves(self) -> int:
        return int(self.leaf_counts.shape[0])

    @property
    def total(self) -> int:
        """Grand total over all leaves and cells (a Python int: exact beyond int64)."""
        return sum(int(v) for v in self.cell_totals)

    @property
    def cell_totals(self) -> np.ndarray:
        """Root counts per cell, shape ``(n_cells,)`` (overflow-checked sums)."""
        return self.level_counts(0)[0]

    def level_counts(self, level: str | int) -> np.ndarray:
        """Counts of every node of ``level``, shape ``(n_nodes, n_cells)``, int64."""
        h = self.hierarchy
        k = h.level_index(level)
        out = self.leaf_counts
        for j in range(h.depth - 1, k, -1):
            out = h.aggregate_up(j, out, cells=self.cells)
        return out

    def all_levels(self) -> list[np.ndarray]:
        """Counts of every level, root first (:meth:`Hierarchy.aggregate`)."""
        return self.hierarchy.aggregate(self.leaf_counts, cells=self.cells)

    def subset_cells(self, cells: str | Iterable[str]) -> Table:
        """A table with only the given cells (names or glob patterns), in that order."""
        names = resolve_cells(cells, self.cells)
        idx = [self.cells.index(c) for c in names]
        return Table(self.hierarchy, tuple(names), self.leaf_counts[:, idx])

    def to_frame(self, level: str | int | None = None) -> pd.DataFrame:
        """One row per node of ``level`` (default: leaves): ``code`` then one column per cell."""
        h = self.hierarchy
        k = h.level_index(-1 if level is None else level)
        counts = self.level_counts(k)
        df = pd.DataFrame(counts, columns=list(self.cells))
        df.insert(0, "code", pd.array(np.asarray(h.levels[k].codes, dtype=object), dtype="str"))
        return df

    def __repr__(self) -> str:
        return f"Table({self.hierarchy!r}, cells={self.n_cells})"
