"""Validation of hierarchies and of the counts attached to them.

Each check refuses with a :class:`~censusdp.errors.HierarchyError` (structure) or
:class:`~censusdp.errors.DataError` (counts) whose message names the offending code and
level, or data row and column, and never a count. Cycles, two parents and orphans in edge
lists are refused by :func:`censusdp.hierarchy.builders.from_edges`; a :class:`Hierarchy`
built from parent arrays cannot express them, and :func:`validate` re-checks the arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy.core import Hierarchy, Level, as_codes

__all__ = ["check_additive", "check_counts", "check_leaf_data", "parse_counts", "validate"]


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
    """Refuse missing, NaN, non-numeric, non-integer, infinite, negative or out-of-int64
    counts (:func:`parse_counts` of every column).

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
        parse_counts(df[col], col, source=source)


#: Counts written as plain digits (an optional ``+``, and a fraction of zeros as in ``12.0``).
_PLAIN_COUNT = r"^\+?[0-9]+(\.0*)?$"
_INT64_MAX_TEXT = str(np.iinfo(np.int64).max)
_FLOAT_EXACT = 2.0**53


def parse_counts(
    values: pd.Series | np.ndarray | Sequence[object],
    column: str,
    *,
    source: str | None = None,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Counts as int64, parsed exactly (never through float64 above 2⁵³).

    Text is read digit by digit (pyarrow's integer cast of the digit strings), so a count of
    2⁵³ + 1 stays 2⁵³ + 1; integer columns are taken as they are; floating-point columns and
    floating-point text (``1e3``) are accepted only where they are integral and at most 2⁵³,
    below which a float64 is an exact integer.

    Parameters
    ----------
    values : pandas.Series or array-like
        One column: strings (as read with ``dtype=str``), integers or floats.
    column : str
        The column's name, for messages.
    source : str, optional
        File name, for messages.
    rows : numpy.ndarray, optional
        The 0-based data row of each value (when ``values`` is a subset of a file's rows).

    Returns
    -------
    numpy.ndarray
        int64, one count per value.

    Raises
    ------
    DataError
        The first (in row order) missing, non-numeric, non-integer, negative or out-of-range
        count, naming the 1-based data row and the column, never the value.
    """
    s = values if isinstance(values, pd.Series) else pd.Series(np.asarray(values, dtype=object))
    report = _CountProblems(f"{source}, " if source else "", column, rows)
    dtype = s.dtype
    if pd.api.types.is_bool_dtype(dtype):
        raise DataError(f"{report.where}column {column!r} is boolean, not a count")
    missing = s.isna().to_numpy(dtype=bool)
    if pd.api.types.is_integer_dtype(dtype):
        report.first([(missing, "missing count (empty or NaN)")])
        if pd.api.types.is_unsigned_integer_dtype(dtype):
            u = s.to_numpy(dtype=np.uint64)
            report.first([(u > np.uint64(np.iinfo(np.int64).max), "count exceeds the int64 range")])
            return u.astype(np.int64)
        v = s.to_numpy(dtype=np.int64)
        report.first([(v < 0, "count is negative")])
        return v
    if pd.api.types.is_float_dtype(dtype):
        f = s.to_numpy(dtype=np.float64, na_value=np.nan)
        values, problems = _float_counts(f)
        report.first(problems)
        return values
    return _text_counts(s.to_numpy(dtype=object), missing, report)


@dataclass(frozen=True)
class _CountProblems:
    """Where :func:`parse_counts` reads (file prefix, column, 0-based data rows or None for
    positions) and its refusal of the first problem in row order."""

    where: str
    column: str
    rows: np.ndarray | None

    def first(self, problems: list[tuple[np.ndarray, str]]) -> None:
        """Raise for the problem ``(mask, reason)`` whose first row comes first, if any."""
        hits = [(int(np.flatnonzero(m)[0]), why) for m, why in problems if m.any()]
        if hits:
            i, why = min(hits, key=lambda h: h[0])
            r = i if self.rows is None else int(self.rows[i])
            raise DataError(
                f"{self.where}data row {r + 1}, column {self.column!r}: {why}; counts must be "
                "non-negative integers"
            )


def _text_counts(obj: np.ndarray, missing: np.ndarray, report: _CountProblems) -> np.ndarray:
    """Text (or mixed objects) as counts: digits cast exactly (:func:`_digit_counts`),
    anything else through float (:func:`_float_counts`); the first problem refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = obj.size
    text = np.where(missing, None, obj)
    try:
        arr = pa.array(text, type=pa.large_string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        arr = pa.array(
            [None if m else str(x) for x, m in zip(obj, missing, strict=True)],
            type=pa.large_string(),
        )
    arr = pc.utf8_trim_whitespace(arr)
    empty = pc.fill_null(pc.equal(pc.utf8_length(arr), 0), True).to_numpy(zero_copy_only=False)
    missing = missing | empty
    out, plain, too_big = _digit_counts(arr, missing)
    other = ~plain & ~missing
    problems = [
        (missing, "missing count (empty or NaN)"),
        (too_big, "count exceeds the int64 range (2^63 - 1)"),
    ]
    if other.any():
        f = pd.to_numeric(pd.Series(obj[other]), errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
        values, float_problems = _float_counts(f)
        for mask, why in [(np.isnan(f), "count is not a number"), *float_problems[1:]]:
            full = np.zeros(n, dtype=bool)
            full[other] = mask
            problems.append((full, why))
        out[other] = values
    report.first(problems)
    return out


def _digit_counts(arr: Any, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The counts written as plain digits (:data:`_PLAIN_COUNT`), cast exactly: up to 18
    ASCII digits directly (they always fit in int64), the rest after stripping sign, leading
    zeros and a zero fraction, compared with int64's largest as text. Returns the counts
    (0 elsewhere), which values are plain digits, and which of those exceed int64."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(arr)
    length = pc.utf8_length(arr)
    simple = pc.fill_null(
        pc.and_(pc.ascii_is_decimal(arr), pc.less_equal(length, 18)), False
    ).to_numpy(zero_copy_only=False)
    plain = simple.copy()
    out = np.zeros(n, dtype=np.int64)
    too_big = np.zeros(n, dtype=bool)
    if simple.any():
        out[simple] = pc.cast(arr.filter(pa.array(simple)), pa.int64()).to_numpy(
            zero_copy_only=False
        )
    rest = np.flatnonzero(~simple & ~missing)
    idx = np.zeros(0, dtype=np.int64)
    if rest.size:
        sub = arr.take(pa.array(rest))
        is_plain = pc.fill_null(pc.match_substring_regex(sub, _PLAIN_COUNT), False).to_numpy(
            zero_copy_only=False
        )
        idx = rest[is_plain]
        plain[idx] = True
    if idx.size:
        digits = pc.replace_substring_regex(arr.take(pa.array(idx)), r"^\+?0*|\.0*$", "")
        length = pc.utf8_length(digits).to_numpy(zero_copy_only=False)
        big = (length > len(_INT64_MAX_TEXT)) | (
            (length == len(_INT64_MAX_TEXT))
            & pc.greater(digits, _INT64_MAX_TEXT).to_numpy(zero_copy_only=False)
        )
        too_big[idx] = big
        ok = ~big
        digits = pc.if_else(pc.equal(pc.utf8_length(digits), 0), "0", digits)
        out[idx[ok]] = pc.cast(digits.filter(pa.array(ok)), pa.int64()).to_numpy(
            zero_copy_only=False
        )
    return out, plain, too_big


def _float_counts(f: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, str]]]:
    """Floating-point counts as int64 (valid where integral, non-negative and at most 2⁵³,
    below which a float64 holds integers exactly), and the problems: (mask, reason), the
    first being the missing values."""
    finite = np.isfinite(f)
    integral = finite & (f == np.floor(np.where(finite, f, 0.0)))
    problems = [
        (np.isnan(f), "missing count (empty or NaN)"),
        (~integral & ~np.isnan(f), "count is not an integer"),
        (integral & (f < 0), "count is negative"),
        (
            integral & (np.abs(f) > _FLOAT_EXACT),
            "count is a floating-point number above 2^53, which cannot hold every integer "
            "exactly; store counts as integers (digits, or an integer column)",
        ),
    ]
    return np.where(integral & (np.abs(f) <= _FLOAT_EXACT), f, 0.0).astype(np.int64), problems
