"""Validation of hierarchies and of the counts attached to them.

Each check refuses with a :class:`~censusdp.errors.HierarchyError` (structure) or
:class:`~censusdp.errors.DataError` (counts) whose message names the offending code and
level, or data row and column, and never a count. Cycles, two parents and orphans in edge
lists are refused by :func:`censusdp.hierarchy.builders.from_edges`; a :class:`Hierarchy`
built from parent arrays cannot express them, and :func:`validate` re-checks the arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy.core import Hierarchy, Level, as_codes

__all__ = ["check_additive", "check_counts", "check_leaf_data", "validate"]


def _duplicate_code(codes: np.ndarray, increasing: np.ndarray) -> str | None:
    """A code that occurs twice, or None; ``increasing[i]`` is ``codes[i+1] > codes[i]``.

    Linear when the codes are globally sorted (nested codes usually are); else one sort.
    """
    if bool(increasing.all()):
        return None
    s = np.sort(codes)
    eq = np.flatnonzero(s[1:] == s[:-1])
    return str(s[eq[0]]) if eq.size else None


def _check_level_arrays(h: Hierarchy, k: int) -> None:
    lv, up = h.levels[k], h.levels[k - 1]
    if lv.size == 0:
        raise HierarchyError(f"level {lv.name!r} is empty: every level needs at least one node")
    if lv.parent.shape != (lv.size,) or lv.codes.shape != (lv.size,):
        raise HierarchyError(f"level {lv.name!r}: codes and parent arrays differ in length")
    bad = np.flatnonzero((lv.parent < 0) | (lv.parent >= up.size))
    if bad.size:
        raise HierarchyError(
            f"node {str(lv.codes[bad[0]])!r} of level {lv.name!r} has no parent in level "
            f"{up.name!r} (orphan); every node needs a parent one level up"
        )
    count = np.bincount(lv.parent, minlength=up.size)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    if (np.diff(lv.parent) < 0).any() or not (
        np.array_equal(count, up.child_count) and np.array_equal(start, up.child_start)
    ):
        raise HierarchyError(
            f"level {lv.name!r}: parent and child offsets disagree or nodes are not grouped "
            "by parent; build hierarchies with Hierarchy.from_parents or the builders"
        )


def _check_sorted_within_parent(lv: Level, increasing: np.ndarray) -> None:
    bad = np.flatnonzero((np.diff(lv.parent) == 0) & ~increasing)
    if bad.size == 0:
        return
    j = int(bad[0])
    if lv.codes[j] == lv.codes[j + 1]:
        raise HierarchyError(
            f"code {str(lv.codes[j])!r} appears twice in level {lv.name!r}; codes must be "
            "unique within a level"
        )
    raise HierarchyError(
        f"level {lv.name!r} is not in canonical order at node {str(lv.codes[j + 1])!r}; "
        "build hierarchies with Hierarchy.from_parents or the builders"
    )


def _check_prefix_nesting(up: Level, lv: Level) -> None:
    """Every code of ``lv`` starts with its parent's code.

    Children are sorted within their parent (checked before), and the strings starting with
    a given code form one interval in lexicographic order, so checking each parent's first
    and last child suffices: O(parents) string operations, not O(children).
    """
    has = np.flatnonzero(up.child_count > 0)
    first = up.child_start[has]
    last = first + up.child_count[has] - 1
    ok = np.strings.startswith(lv.codes[first], up.codes[has]) & np.strings.startswith(
        lv.codes[last], up.codes[has]
    )
    if ok.all():
        return
    j = int(np.flatnonzero(~ok)[0])
    lo, hi = int(first[j]), int(last[j]) + 1
    child = lo + int(np.flatnonzero(~np.strings.startswith(lv.codes[lo:hi], up.codes[has[j]]))[0])
    raise HierarchyError(
        f"code {str(lv.codes[child])!r} of level {lv.name!r} does not start with its parent's "
        f"code {str(up.codes[has[j]])!r} (level {up.name!r}): the codes do not nest"
    )


def validate(h: Hierarchy, *, nesting: Literal["prefix"] | None = None) -> None:
    """Refuse a malformed hierarchy.

    Checks: one root; no empty level; every parent index valid (no orphans) with consistent
    child offsets; canonical order; codes unique within each level; every node above the
    leaves has at least one child (no leaf at the wrong level); and, with
    ``nesting="prefix"``, every code below the root's children starts with its parent's
    code (FIPS/GISJOIN-style nesting).

    Raises
    ------
    HierarchyError
        Naming the first offending code and its level.
    """
    if h.levels[0].size != 1:
        raise HierarchyError(f"the root level {h.names[0]!r} must hold exactly one node")
    if nesting not in (None, "prefix"):
        raise HierarchyError(f"unknown nesting check {nesting!r}; use 'prefix' or None")
    for k in range(1, h.depth):
        _check_level_arrays(h, k)
        lv = h.levels[k]
        increasing = np.greater(lv.codes[1:], lv.codes[:-1])
        _check_sorted_within_parent(lv, increasing)
        dup = _duplicate_code(lv.codes, increasing)
        if dup is not None:
            raise HierarchyError(
                f"code {dup!r} appears twice in level {lv.name!r}; codes must be unique "
                "within a level"
            )
        if nesting == "prefix" and k >= 2:
            _check_prefix_nesting(h.levels[k - 1], lv)
    for k in range(1, h.depth - 1):
        lv = h.levels[k]
        empty = np.flatnonzero(lv.child_count == 0)
        if empty.size:
            raise HierarchyError(
                f"node {str(lv.codes[empty[0]])!r} of level {lv.name!r} has no children in "
                f"level {h.names[k + 1]!r} (a leaf at the wrong level); give it a child or "
                "remove it"
            )


def check_leaf_data(h: Hierarchy, data_codes: object, *, source: str | None = None) -> None:
    """Refuse leaves without a data row and data rows without a leaf.

    Parameters
    ----------
    data_codes : array-like of str
        The leaf code of every data row (file order).

    Raises
    ------
    HierarchyError
        Naming the leaf code (and level) without data, or the data row whose code is not a
        leaf.
    """
    where = f"{source}: " if source else ""
    leaves = h.leaves
    codes = np.asarray(as_codes(data_codes), dtype=object)
    pos = pd.Index(np.asarray(leaves.codes, dtype=object)).get_indexer(codes)
    if (pos < 0).any():
        r = int(np.flatnonzero(pos < 0)[0])
        raise HierarchyError(
            f"{where}data row {r + 1}: code {codes[r]!r} is not a node of level {leaves.name!r}"
        )
    has = np.zeros(leaves.size, dtype=bool)
    has[pos] = True
    if not has.all():
        j = int(np.flatnonzero(~has)[0])
        raise HierarchyError(
            f"{where}leaf {str(leaves.codes[j])!r} of level {leaves.name!r} has no data row; "
            "every leaf needs one (use an explicit zero row for an empty unit)"
        )


def check_additive(
    h: Hierarchy,
    level_counts: Sequence[np.ndarray],
    *,
    cells: Sequence[str] | None = None,
) -> None:
    """Refuse counts whose parent ≠ Σ children.

    Parameters
    ----------
    level_counts : sequence of arrays
        One per level, root first, shape ``(n_nodes,)`` or ``(n_nodes, n_cells)``.
    cells : sequence of str, optional
        Cell names, used in the message.

    Raises
    ------
    HierarchyError
        Naming the first parent whose counts differ from the sum of its children's,
        scanning from the leaves up (so the message points at the lowest inconsistent
        level, where the error usually is), with its code, level and cell; never the counts.
    """
    if len(level_counts) != h.depth:
        raise HierarchyError(f"expected counts for {h.depth} levels, got {len(level_counts)}")
    for k in range(h.depth - 2, -1, -1):
        have = np.asarray(level_counts[k])
        if have.shape[0] != h.levels[k].size:
            raise HierarchyError(
                f"level {h.names[k]!r} has {h.levels[k].size} nodes but its counts have "
                f"{have.shape[0]} rows"
            )
        want = h.aggregate_up(k + 1, np.asarray(level_counts[k + 1]))
        diff = (have != want).reshape(have.shape[0], -1)
        if diff.any():
            node, cell = np.argwhere(diff)[0]
            what = f" (cell {cells[cell]!r})" if cells is not None else ""
            if cells is None and diff.shape[1] > 1:
                what = f" (cell {int(cell)})"
            raise HierarchyError(
                f"node {str(h.levels[k].codes[node])!r} of level {h.names[k]!r} is not the "
                f"sum of its children in level {h.names[k + 1]!r}{what}; the counts are not "
                "additive"
            )


def check_counts(df: pd.DataFrame, columns: Sequence[str], *, source: str | None = None) -> None:
    """Refuse missing, NaN, non-numeric, non-integer, infinite or negative counts.

    Raises
    ------
    DataError
        Naming the 1-based data row (the header is not counted; line = row + 1) and the
        column, never the value.
    """
    where = f"{source}: " if source else ""
    for col in columns:
        if col not in df.columns:
            raise DataError(f"{where}no count column {col!r}")
        s = df[col]
        if pd.api.types.is_bool_dtype(s.dtype):
            raise DataError(f"{where}column {col!r} is boolean, not a count")
        na = s.isna().to_numpy()
        if na.any():
            r = int(np.flatnonzero(na)[0])
            raise DataError(
                f"{where}data row {r + 1}, column {col!r}: missing count (empty or NaN); "
                "every cell needs a count"
            )
        if pd.api.types.is_integer_dtype(s.dtype):
            v = s.to_numpy()
        else:
            num = pd.to_numeric(s, errors="coerce")
            bad = num.isna().to_numpy()
            if bad.any():
                r = int(np.flatnonzero(bad)[0])
                raise DataError(
                    f"{where}data row {r + 1}, column {col!r}: not a number; counts must "
                    "be non-negative integers"
                )
            v = num.to_numpy(dtype=np.float64)
            nonint = ~np.isfinite(v) | (v != np.floor(v)) | (np.abs(v) > 2.0**53)
            if nonint.any():
                r = int(np.flatnonzero(nonint)[0])
                raise DataError(
                    f"{where}data row {r + 1}, column {col!r}: not an integer; counts must "
                    "be non-negative integers"
                )
        neg = np.flatnonzero(v < 0)
        if neg.size:
            raise DataError(
                f"{where}data row {int(neg[0]) + 1}, column {col!r}: negative count; counts "
                "must be non-negative integers"
            )
