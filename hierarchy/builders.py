"""Builders: hierarchies from code columns, GISJOIN codes, edge lists, and by adding a level.

Every builder goes through :meth:`Hierarchy.from_parents`, so node order is canonical (sorted
by ``(parent, code)`` level by level) and never depends on the order of the input rows. Each
builder also returns what is needed to align input rows with nodes.

The code-column builders are vectorised (pyarrow dictionary encoding, numpy scatter/gather):
one pass per level, no Python loop over rows, so a national block file (8.2 million rows) is
a matter of seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, as_codes
from censusdp.hierarchy.gisjoin import hint as gisjoin_hint
from censusdp.hierarchy.gisjoin import spine_lengths

__all__ = [
    "GISJOIN_LENGTHS",
    "LevelAdded",
    "LevelSpec",
    "add_level",
    "from_columns",
    "from_edges",
    "from_gisjoin",
    "level_specs",
    "parse_level_spec",
]

#: Length of an NHGIS GISJOIN code at each level of the spine (state 4 … block 18), from the
#: layouts of :mod:`censusdp.hierarchy.gisjoin` (which also knows the off-spine levels).
GISJOIN_LENGTHS: dict[str, int] = spine_lengths()


@dataclass(frozen=True)
class LevelSpec:
    """How one level's codes are read from a table.

    Attributes
    ----------
    name : str
        Level name, e.g. ``"state"``.
    column : str
        Column holding the codes (read as strings: keep leading zeros).
    prefix : int or None
        Use only the first ``prefix`` characters of the column (state = ``fips[:2]``).
    """

    name: str
    column: str
    prefix: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise HierarchyError(f"a level needs a non-empty name, got {self.name!r}")
        if self.prefix is not None and (
            isinstance(self.prefix, bool) or not isinstance(self.prefix, int) or self.prefix < 1
        ):
            raise HierarchyError(
                f"level {self.name!r}: prefix length must be a positive integer, "
                f"got {self.prefix!r}"
            )


LevelLike = LevelSpec | tuple[str, str] | tuple[str, str, int | None]


def level_specs(levels: Iterable[LevelLike]) -> list[LevelSpec]:
    """Normalise ``LevelSpec`` objects or ``(name, column[, prefix_len])`` tuples."""
    out: list[LevelSpec] = []
    for lv in levels:
        if isinstance(lv, LevelSpec):
            out.append(lv)
        elif isinstance(lv, tuple | list) and len(lv) in (2, 3):
            out.append(LevelSpec(*lv))
        else:
            raise HierarchyError(
                f"bad level specification {lv!r}: use LevelSpec(name, column, prefix) or a "
                "tuple (name, column) / (name, column, prefix_len)"
            )
    if not out:
        raise HierarchyError("at least one level below the root is needed")
    names = [lv.name for lv in out]
    if len(set(names)) != len(names):
        raise HierarchyError(f"level names must be unique, got {names}")
    return out


# ---------------------------------------------------------------------------------- helpers
def _source(source: str | None) -> str:
    return f"{source}: " if source else ""


def _as_pa_strings(values: object) -> pa.Array:
    """A (non-chunked) pyarrow string array; missing values stay null."""
    if isinstance(values, pa.ChunkedArray):
        arr = values.combine_chunks()
    elif isinstance(values, pa.Array):
        arr = values
    else:
        s = values if isinstance(values, pd.Series) else pd.Series(np.asarray(values, object))
        arr = pa.array(s.astype("str"), from_pandas=True)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.cast(arr, pa.large_string())
    return arr


class _LevelInput(NamedTuple):
    """One level's codes: a checked column (one code per row) and a prefix length."""

    name: str
    column: pa.Array
    column_id: str
    prefix: int | None

    def codes(self) -> pa.Array:
        if self.prefix is None:
            return self.column
        return pc.utf8_slice_codeunits(self.column, 0, self.prefix)


def _checked_column(
    df: pd.DataFrame, spec: LevelSpec, source: str | None, cache: dict[str, tuple[pa.Array, int]]
) -> pa.Array:
    """The column of one level as a pyarrow string array: present, no missing codes, long
    enough for the prefix. Each column is converted and checked once (``cache``)."""
    where = _source(source)
    if spec.column not in df.columns:
        shown = ", ".join(map(repr, list(df.columns)[:30]))
        raise DataError(
            f"{where}no column {spec.column!r} for level {spec.name!r}; the columns are "
            f"{shown}{', ...' if len(df.columns) > 30 else ''}"
        )
    col = df[spec.column]
    if spec.prefix is not None and pd.api.types.is_numeric_dtype(col.dtype):
        raise DataError(
            f"{where}column {spec.column!r} (level {spec.name!r}) is numeric, so leading "
            "zeros are lost and a prefix is meaningless; read the codes as strings "
            "(e.g. pandas.read_csv(..., dtype={column: str}))"
        )
    if spec.column not in cache:
        arr = _as_pa_strings(col)
        length = pc.utf8_length(arr)
        if arr.null_count or (len(arr) and pc.min(length).as_py() == 0):
            missing = pc.or_kleene(pc.is_null(arr), pc.equal(length, 0))
            row = int(np.flatnonzero(missing.to_numpy(zero_copy_only=False))[0])
            raise DataError(
                f"{where}data row {row + 1}, column {spec.column!r}: missing code for level "
                f"{spec.name!r}; every row needs a code at every level"
            )
        cache[spec.column] = (arr, pc.min(length).as_py() if len(arr) else 0)
    arr, min_length = cache[spec.column]
    if spec.prefix is not None and spec.prefix > min_length:
        short = pc.less(pc.utf8_length(arr), spec.prefix).to_numpy(zero_copy_only=False)
        row = int(np.flatnonzero(short)[0])
        raise DataError(
            f"{where}data row {row + 1}, column {spec.column!r}: code "
            f"{arr[row].as_py()!r} is shorter than the {spec.prefix} characters that "
            f"define level {spec.name!r}"
        )
    return arr


def _to_codes(arr: pa.Array) -> np.ndarray:
    """A pyarrow string array as a numpy StringDType array.

    Codes of one width in ASCII (FIPS, GISJOIN) are reinterpreted from the Arrow data
    buffer as fixed-width bytes, which avoids one Python object per code.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if n and arr.null_count == 0 and arr.type in (pa.string(), pa.large_string()):
        off_type = np.int64 if arr.type == pa.large_string() else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset : arr.offset + n + 1]
        width = int(offsets[1] - offsets[0])
        if width > 0 and bool((np.diff(offsets) == width).all()):
            data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
            if bool((data > 0).all()) and bool((data < 128).all()):
                return data.view(f"S{width}").astype(STRING_DTYPE)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=STRING_DTYPE)


class _Encoded(NamedTuple):
    """A level's codes, dictionary-encoded over the rows."""

    idx: np.ndarray  # per row: index into ``codes``
    codes: np.ndarray  # unique codes (StringDType), in order of first appearance
    dictionary: pa.Array | None  # the same uniques in Arrow, to derive coarser levels
    parent: np.ndarray | None = None  # per unique: index into the level above, if derived


def _encode(arr: pa.Array) -> _Encoded:
    d = pc.dictionary_encode(arr)
    idx = d.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return _Encoded(idx, _to_codes(d.dictionary), d.dictionary)


def _encode_levels(inputs: Sequence[_LevelInput], fast_leaf: bool) -> list[_Encoded]:
    """Encode every level, bottom up.

    With ``fast_leaf`` each row is its own leaf (no hashing of the leaf codes). A level
    that is a shorter prefix of the same column as the level below is derived from that
    level's unique codes (tens of thousands of tracts, not millions of rows), which also
    makes it nest by construction.
    """
    leaf = inputs[-1].codes()
    out: list[_Encoded] = [_Encoded(np.zeros(0, np.int64), np.zeros(0, STRING_DTYPE), None)]
    out = out * len(inputs)
    if fast_leaf:
        out[-1] = _Encoded(np.arange(len(leaf), dtype=np.int64), _to_codes(leaf), None)
    else:
        out[-1] = _encode(leaf)
    for k in range(len(inputs) - 2, -1, -1):
        lv, below = inputs[k], inputs[k + 1]
        if (
            out[k + 1].dictionary is not None
            and lv.column_id == below.column_id
            and lv.prefix is not None
            and (below.prefix is None or lv.prefix < below.prefix)
        ):
            sub = _encode(pc.utf8_slice_codeunits(out[k + 1].dictionary, 0, lv.prefix))
            out[k + 1] = out[k + 1]._replace(parent=sub.idx)
            out[k] = sub._replace(idx=sub.idx[out[k + 1].idx])
        else:
            out[k] = _encode(lv.codes())
    return out


def _first_row(idx: np.ndarray, n_unique: int) -> np.ndarray:
    """Index of the first row holding each unique value."""
    first = np.empty(n_unique, dtype=np.int64)
    rows = np.arange(idx.size, dtype=np.int64)
    first[idx[::-1]] = rows[::-1]
    return first


def _from_code_arrays(
    inputs: Sequence[_LevelInput],
    *,
    root_name: str,
    root_code: str,
    source: str | None,
    duplicates: Literal["error", "first"],
) -> tuple[Hierarchy, np.ndarray]:
    """Shared core of :func:`from_columns` and :func:`from_gisjoin`.

    Fast path (``duplicates="error"``): every row is taken as its own leaf without hashing
    the leaf codes; uniqueness is then confirmed on the canonical order (one linear pass
    when the codes come out globally sorted, as nested codes do) or by counting distinct
    codes. Otherwise, or when that check fails, the leaf codes are dictionary-encoded and
    refused with a precise message.
    """
    names = [lv.name for lv in inputs]
    if duplicates == "error":
        encoded = _encode_levels(inputs, fast_leaf=True)
        h, leaf_row = _build(names, encoded, root_name, root_code, source, duplicates)
        codes = h.leaves.codes
        if (
            bool(np.greater(codes[1:], codes[:-1]).all())
            or pc.count_distinct(inputs[-1].codes()).as_py() == codes.size
        ):
            return h, leaf_row
    encoded = _encode_levels(inputs, fast_leaf=False)
    return _build(names, encoded, root_name, root_code, source, duplicates)


def _build(
    names: Sequence[str],
    encoded: Sequence[_Encoded],
    root_name: str,
    root_code: str,
    source: str | None,
    duplicates: Literal["error", "first"],
) -> tuple[Hierarchy, np.ndarray]:
    where = _source(source)
    idxs = [e.idx for e in encoded]
    uniqs = [e.codes for e in encoded]
    parents: list[np.ndarray | None] = [None, np.zeros(uniqs[0].size, dtype=np.int64)]
    for k in range(1, len(names)):
        if encoded[k].parent is not None:
            parents.append(encoded[k].parent)
            continue
        ci, pi = idxs[k], idxs[k - 1]
        parent_of = np.empty(uniqs[k].size, dtype=np.int64)
        parent_of[ci] = pi
        bad = np.flatnonzero(parent_of[ci] != pi)
        if bad.size:
            r = int(bad[0])
            other = parent_of[ci[r]]
            r2 = int(np.flatnonzero((ci == ci[r]) & (pi == other))[0])
            raise HierarchyError(
                f"{where}code {str(uniqs[k][ci[r]])!r} of level {names[k]!r} does not nest: "
                f"it lies under {str(uniqs[k - 1][other])!r} (data row {r2 + 1}) and under "
                f"{str(uniqs[k - 1][pi[r]])!r} (data row {r + 1}) of level {names[k - 1]!r}; "
                "a node must have exactly one parent (check the codes or the prefix lengths)"
            )
        parents.append(parent_of)
    leaf_idx, leaf_codes = idxs[-1], uniqs[-1]
    first = _first_row(leaf_idx, leaf_codes.size)
    if leaf_codes.size != leaf_idx.size and duplicates == "error":
        dup = np.flatnonzero(first[leaf_idx] != np.arange(leaf_idx.size))
        r = int(dup[0])
        raise DataError(
            f"{where}leaf code {str(leaf_codes[leaf_idx[r]])!r} of level {names[-1]!r} "
            f"appears in data rows {int(first[leaf_idx[r]]) + 1} and {r + 1}; each leaf needs "
            "exactly one row (aggregate the rows or add a finer level)"
        )
    h, orders = Hierarchy.from_parents(
        [root_name, *names],
        [as_codes([root_code]), *uniqs],
        parents,
        return_order=True,
    )
    return h, first[orders[-1]]


# ---------------------------------------------------------------------------------- builders
def from_columns(
    df: pd.DataFrame,
    levels: Iterable[LevelLike],
    *,
    root_name: str = "nation",
    root_code: str = "US",
    source: str | None = None,
    duplicates: Literal["error", "first"] = "error",
) -> tuple[Hierarchy, np.ndarray]:
    """Build a hierarchy from code columns, one row per leaf.

    Parameters
    ----------
    df : pandas.DataFrame
        One row per leaf. Code columns should be strings (leading zeros matter).
    levels : iterable of LevelSpec or tuples
        Levels below the root, top first: ``LevelSpec(name, column, prefix=None)`` or
        ``(name, column)`` / ``(name, column, prefix_len)``; e.g.
        ``[("state", "fips", 2), ("county", "fips")]``.
    root_name, root_code : str
        The implicit root (the nation).
    source : str, optional
        File name used in error messages.
    duplicates : {"error", "first"}
        A leaf code on several rows is an error (default); ``"first"`` keeps its first row
        (for describing a geography from a long table).

    Returns
    -------
    hierarchy : Hierarchy
    leaf_row : numpy.ndarray
        int64; canonical leaf ``i`` is input row ``leaf_row[i]``.

    Raises
    ------
    DataError
        Missing column or code, code shorter than its prefix, duplicate leaf.
    HierarchyError
        A code lying under two parents (codes that do not nest).
    """
    specs = level_specs(levels)
    cache: dict[str, tuple[pa.Array, int]] = {}
    inputs = [
        _LevelInput(s.name, _checked_column(df, s, source, cache), s.column, s.prefix)
        for s in specs
    ]
    return _from_code_arrays(
        inputs,
        root_name=root_name,
        root_code=root_code,
        source=source,
        duplicates=duplicates,
    )


def _gisjoin_pattern(length: int) -> str:
    pattern = r"^G\d\d0"
    if length >= 8:
        pattern += r"\d{3}0" + (rf"\d{{{length - 8}}}" if length > 8 else "")
    return pattern + "$"


def from_gisjoin(
    codes: Sequence[str] | np.ndarray | pd.Series,
    levels: Sequence[str | tuple[str, int]] = ("state", "county", "cousub"),
    *,
    root_name: str = "nation",
    root_code: str = "US",
    source: str | None = None,
) -> tuple[Hierarchy, np.ndarray]:
    """Build a hierarchy from NHGIS GISJOIN codes of the leaves.

    A GISJOIN is ``G`` + 2-digit state FIPS + ``0`` (state, 4 characters), + 3-digit county
    FIPS + ``0`` (county, ``G1700310`` = Cook County), and finer codes extend the county
    code (county subdivision: + 5 digits; tract: + 6 digits; block: tract + 4 digits). Each
    level's code is the prefix of the leaf code of that level's length.

    Parameters
    ----------
    codes : sequence of str
        One GISJOIN per leaf (row).
    levels : sequence of str or (name, length)
        Levels below the root, top first; names from :data:`GISJOIN_LENGTHS` or explicit
        ``(name, code_length)`` pairs.

    Returns
    -------
    hierarchy, leaf_row
        As :func:`from_columns`.

    Raises
    ------
    DataError
        A code that is not a GISJOIN of the leaf level (named with its 1-based row).
    """
    where = _source(source)
    named: list[tuple[str, int]] = []
    for lv in levels:
        if isinstance(lv, str):
            if lv not in GISJOIN_LENGTHS:
                raise HierarchyError(
                    f"unknown GISJOIN level {lv!r}; use one of {list(GISJOIN_LENGTHS)} or a "
                    "(name, code_length) pair"
                )
            named.append((lv, GISJOIN_LENGTHS[lv]))
        else:
            named.append((str(lv[0]), int(lv[1])))
    lengths = [n for _, n in named]
    if not named or any(b <= a for a, b in zip(lengths, lengths[1:], strict=False)):
        raise HierarchyError(f"GISJOIN levels must get strictly longer top to bottom: {named}")
    series = (
        codes.reset_index(drop=True)
        if isinstance(codes, pd.Series)
        else pd.Series(np.asarray(codes, dtype=object))
    )
    arr = _checked_column(
        pd.DataFrame({"gisjoin": series}), LevelSpec(named[-1][0], "gisjoin"), source, {}
    )
    ok = pc.match_substring_regex(arr, _gisjoin_pattern(lengths[-1])).to_numpy(zero_copy_only=False)
    if not ok.all():
        r = int(np.flatnonzero(~ok)[0])
        raise DataError(
            f"{where}row {r + 1}: {arr[r].as_py()!r} is not a GISJOIN code of level "
            f"{named[-1][0]!r} ({lengths[-1]} characters: 'G' + 2-digit state FIPS + '0'"
            + (" + 3-digit county FIPS + '0'" if lengths[-1] >= 8 else "")
            + (f" + {lengths[-1] - 8} digits" if lengths[-1] > 8 else "")
            + ")"
            + (f"; {why}" if (why := gisjoin_hint(arr[r].as_py(), named[-1][0])) else "")
        )
    inputs = [
        _LevelInput(name, arr, "gisjoin", n if n < lengths[-1] else None) for name, n in named
    ]
    return _from_code_arrays(
        inputs,
        root_name=root_name,
        root_code=root_code,
        source=source,
        duplicates="error",
    )


def _edge_frame(edges: pd.DataFrame | Iterable[tuple[str, str, str]]) -> pd.DataFrame:
    if isinstance(edges, pd.DataFrame):
        missing = [c for c in ("parent", "child", "level") if c not in edges.columns]
        if missing:
            raise DataError(
                f"the edge table has no column(s) {missing}; it needs 'parent', 'child' and "
                "'level' (the child's level)"
            )
        df = edges[["parent", "child", "level"]]
    else:
        rows = list(edges)
        if any(len(r) != 3 for r in rows):
            raise DataError("each edge is a (parent_code, child_code, child_level) triple")
        df = pd.DataFrame(rows, columns=["parent", "child", "level"])
    if df.empty:
        raise HierarchyError("the edge list is empty: a hierarchy needs at least one level")
    out = df.astype("str")
    if out.isna().any().any():
        r, c = np.argwhere(out.isna().to_numpy())[0]
        raise DataError(f"edge {r + 1}: missing {out.columns[c]!r}")
    return out.reset_index(drop=True)


def _find_cycle(par: np.ndarray, start: int) -> list[int]:
    seen: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = int(par[node])
    return path[seen[node] :] + [node]


def from_edges(
    edges: pd.DataFrame | Iterable[tuple[str, str, str]],
    *,
    levels: Sequence[str] | None = None,
    root_name: str = "root",
    root: str | None = None,
) -> tuple[Hierarchy, list[np.ndarray]]:
    """Build a hierarchy from a parent → child edge list.

    Parameters
    ----------
    edges : DataFrame with columns ``parent``, ``child``, ``level`` or iterable of triples
        ``(parent_code, child_code, child_level)``: one edge per node below the root.
    levels : sequence of str, optional
        Level names root first. Given, the parent of a ``level[k]`` node is looked up among
        the codes of ``level[k-1]`` (codes need only be unique within a level). Omitted,
        codes must be unique across levels and the level order is inferred from the tree.
    root_name : str
        Name of the root level when ``levels`` is omitted.
    root : str, optional
        The root code, when the edges leave it ambiguous.

    Returns
    -------
    hierarchy : Hierarchy
    edge_row : list of numpy.ndarray
        Per level, the edge (0-based row) that defines each canonical node; ``-1`` for the
        root.

    Raises
    ------
    HierarchyError
        A cycle, a node with two parents, an orphan (parent not in the tree), a repeated
        edge, a level that is not at one consistent depth; each names the code and level.
    """
    df = _edge_frame(edges)
    e = _Edges(
        df["parent"].to_numpy(dtype=object),
        df["child"].to_numpy(dtype=object),
        df["level"].to_numpy(dtype=object),
    )
    levels = None if levels is None else list(levels)
    pos = None if levels is None else _level_positions(e, levels)
    child_key, parent_key = _edge_keys(e, pos)
    _check_one_parent(e, child_key)
    par = pd.Index(child_key).get_indexer(parent_key)
    dangling = par < 0
    if levels is not None:
        root_code, root_level = _root_of_levels(e, levels, pos, dangling), levels[0]
    else:
        root_code, root_level = _inferred_root(e, par, dangling, root), root_name
    depth = _depths(e, par, dangling)
    names = _level_names(e, depth, root_level, levels)

    node_rows = [np.flatnonzero(depth == dd) for dd in range(1, len(names))]
    local = np.empty(len(df), dtype=np.int64)
    for rows in node_rows:
        local[rows] = np.arange(rows.size)
    codes: list[object] = [as_codes([root_code])]
    parents: list[np.ndarray | None] = [None]
    for dd, rows in enumerate(node_rows, start=1):
        codes.append(as_codes(e.child[rows]))
        parents.append(np.zeros(rows.size, np.int64) if dd == 1 else local[par[rows]])
    h, orders = Hierarchy.from_parents(names, codes, parents, return_order=True)
    edge_row = [np.full(1, -1, np.int64)] + [
        rows[o] for rows, o in zip(node_rows, orders[1:], strict=True)
    ]
    return h, edge_row


class _Edges(NamedTuple):
    """The edge list's columns as object arrays, one entry per edge (row)."""

    parent: np.ndarray
    child: np.ndarray
    level: np.ndarray


def _level_positions(e: _Edges, levels: list[str]) -> np.ndarray:
    """Each edge's child level as its position in ``levels``; a level that is not one below
    the root is refused, naming the edge."""
    pos_of = {name: i for i, name in enumerate(levels)}
    unknown = [lv for lv in pd.unique(e.level) if lv not in pos_of or pos_of[lv] == 0]
    if unknown:
        r = int(np.flatnonzero(e.level == unknown[0])[0])
        raise HierarchyError(
            f"edge {r + 1}: level {unknown[0]!r} is not a level below the root of {levels}"
        )
    return np.array([pos_of[lv] for lv in e.level], dtype=np.int64)


def _edge_keys(e: _Edges, pos: np.ndarray | None) -> tuple[pd.Series, pd.Series]:
    """The keys a node is known by as a child and its parent is looked up by: the code, or
    with levels given, the level position and the code (codes unique within a level)."""
    if pos is None:
        return pd.Series(e.child, dtype=object), pd.Series(e.parent, dtype=object)
    child_key = pd.Series(pos.astype(str), dtype=object) + "\x1f" + e.child
    parent_key = pd.Series((pos - 1).astype(str), dtype=object) + "\x1f" + e.parent
    return child_key, parent_key


def _check_one_parent(e: _Edges, child_key: pd.Series) -> None:
    """Each node listed once: a repeated edge or a node with two parents is refused, naming
    both edges."""
    dup = child_key.duplicated(keep=False).to_numpy()
    if not dup.any():
        return
    rows = np.flatnonzero(child_key.to_numpy() == child_key.iloc[np.flatnonzero(dup)[0]])
    r1, r2 = int(rows[0]), int(rows[1])
    parent, child, level = e.parent, e.child, e.level
    if parent[r1] == parent[r2]:
        raise HierarchyError(
            f"edge {r2 + 1} repeats edge {r1 + 1} (node {child[r1]!r} of level "
            f"{level[r1]!r} under {parent[r1]!r}); list each node once"
        )
    raise HierarchyError(
        f"node {child[r1]!r} of level {level[r1]!r} has two parents, {parent[r1]!r} "
        f"(edge {r1 + 1}) and {parent[r2]!r} (edge {r2 + 1}); a node must have exactly "
        "one parent"
    )


def _root_of_levels(e: _Edges, levels: list[str], pos: np.ndarray, dangling: np.ndarray) -> str:
    """With levels given: the one code the top level's nodes hang from; a node below them
    whose parent is not a node (an orphan) is refused."""
    at_root = pos == 1
    bad = np.flatnonzero(dangling & ~at_root)
    if bad.size:
        r = int(bad[0])
        raise HierarchyError(
            f"node {e.child[r]!r} of level {e.level[r]!r} names parent {e.parent[r]!r}, which "
            f"is not a node of level {levels[pos[r] - 1]!r} (orphan); add its edge or "
            "fix the code"
        )
    candidates = pd.unique(e.parent[at_root])
    if candidates.size == 0:
        raise HierarchyError(f"no edge has a node of level {levels[1]!r} under the root")
    if candidates.size > 1:
        raise HierarchyError(
            f"level {levels[0]!r} must have one node, but level {levels[1]!r} nodes hang "
            f"from {candidates[0]!r} and {candidates[1]!r}; give every top node one root"
        )
    return str(candidates[0])


def _inferred_root(e: _Edges, par: np.ndarray, dangling: np.ndarray, root: str | None) -> str:
    """Without levels: ``root`` or the parent most edges name that is not a node (ambiguous
    ties refused); no such parent means a cycle; other such parents are orphans'."""
    counts = pd.Series(e.parent[dangling]).value_counts()
    if counts.empty:
        raise HierarchyError(_cycle_message(_find_cycle(par, 0), e.child, e.level))
    if root is None:
        if counts.size > 1 and counts.iloc[0] == counts.iloc[1]:
            raise HierarchyError(
                f"the root is ambiguous: {counts.index[0]!r} and {counts.index[1]!r} are "
                "parents but not nodes; pass root=... (the others are orphans' parents)"
            )
        root = str(counts.index[0])
    bad = np.flatnonzero(dangling & (e.parent != root))
    if bad.size:
        r = int(bad[0])
        raise HierarchyError(
            f"node {e.child[r]!r} of level {e.level[r]!r} names parent {e.parent[r]!r}, which "
            f"is not a node of the hierarchy (orphan); add its edge or fix the code"
        )
    return root


def _depths(e: _Edges, par: np.ndarray, dangling: np.ndarray) -> np.ndarray:
    """Each edge's child depth (1: under the root), a frontier per depth; a node the root
    does not reach sits on a cycle, which is named."""
    depth = np.zeros(par.size, dtype=np.int64)
    depth[dangling] = 1
    d = 1
    while True:
        new = (depth == 0) & ~dangling
        new[new] = depth[par[new]] == d
        if not new.any():
            break
        d += 1
        depth[new] = d
    unreached = np.flatnonzero(depth == 0)
    if unreached.size:
        raise HierarchyError(_cycle_message(_find_cycle(par, int(unreached[0])), e.child, e.level))
    return depth


def _level_names(
    e: _Edges, depth: np.ndarray, root_level: str, levels: list[str] | None
) -> list[str]:
    """The level names root first: ``levels`` (each must have a node), or read off the
    depths (each level at one depth, each depth one level)."""
    n_levels = int(depth.max())
    if levels is not None:
        if n_levels != len(levels) - 1:
            raise HierarchyError(
                f"level {levels[n_levels + 1]!r} is empty: no edge has a node of that level"
            )
        return levels
    names = [root_level]
    for dd in range(1, n_levels + 1):
        at = np.flatnonzero(depth == dd)
        lv = pd.unique(e.level[at])
        if lv.size > 1:
            r = int(at[np.flatnonzero(e.level[at] == lv[1])[0]])
            raise HierarchyError(
                f"node {e.child[r]!r} has level {e.level[r]!r} but sits at depth {dd} with "
                f"nodes of level {lv[0]!r}; every level must sit at one depth"
            )
        names.append(str(lv[0]))
    if len(set(names)) != len(names):
        name = next(x for x in names if names.count(x) > 1)
        r = int(np.flatnonzero(e.level == name)[-1])
        raise HierarchyError(
            f"level {name!r} appears at two depths (e.g. node {e.child[r]!r}); every level "
            "must sit at one depth"
        )
    return names


def _cycle_message(cycle: list[int], child: np.ndarray, level: np.ndarray) -> str:
    path = " → ".join(f"{child[i]!r} ({level[i]})" for i in cycle)
    return (
        f"cycle in the edge list: {path}; node {child[cycle[0]]!r} of level "
        f"{level[cycle[0]]!r} is among its own ancestors (a hierarchy has no cycles)"
    )


# ---------------------------------------------------------------------------------- add_level
class LevelAdded(NamedTuple):
    """Result of :func:`add_level`.

    Attributes
    ----------
    hierarchy : Hierarchy
        The new hierarchy (one more level).
    order : list of numpy.ndarray
        Per level of the new hierarchy: canonical node ``i`` is node ``order[k][i]`` of the
        same level in the old hierarchy (old canonical index), or, for the new level, entry
        ``order[k][i]`` of ``new_codes``. Re-align old data with ``values[order[k]]``.
    """

    hierarchy: Hierarchy
    order: list[np.ndarray]


def _lookup(level_codes: np.ndarray, queries: object) -> np.ndarray:
    index = pd.Index(np.asarray(level_codes, dtype=object))
    return index.get_indexer(np.asarray(as_codes(queries), dtype=object))


def _mapping_arrays(
    children: Mapping[str, str] | tuple[Sequence[str], Sequence[str]] | pd.Series,
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(children, pd.Series):
        return as_codes(children.index.to_numpy(dtype=object)), as_codes(children.to_numpy())
    if isinstance(children, Mapping):
        return as_codes(list(children.keys())), as_codes(list(children.values()))
    child_codes, new_codes = children
    return as_codes(child_codes), as_codes(new_codes)


def add_level(
    hierarchy: Hierarchy,
    name: str,
    parent_codes: Sequence[str] | np.ndarray,
    new_codes: Sequence[str] | np.ndarray,
    *,
    below: str | int | None = None,
    children: Mapping[str, str] | tuple[Sequence[str], Sequence[str]] | pd.Series | None = None,
) -> LevelAdded:
    """Add a level: below the leaves, or between two existing levels.

    Parameters
    ----------
    hierarchy : Hierarchy
    name : str
        Name of the new level.
    parent_codes, new_codes : sequences of str, same length
        New node ``new_codes[j]`` lies under the node ``parent_codes[j]`` of level ``below``.
    below : str or int, optional
        The level the new one goes under (default: the leaves, i.e. append a level).
    children : mapping or (child_codes, new_codes) pair, optional
        Required when ``below`` is not the leaf level: the new parent of every node of the
        level that used to be under ``below`` (e.g. tract → block group). A child's new
        parent must lie under the child's old parent.

    Returns
    -------
    LevelAdded
        ``(hierarchy, order)``; see :class:`LevelAdded`. Aggregates of the old levels are
        unchanged (the tree above them is the same).

    Raises
    ------
    HierarchyError
        Duplicate new codes, unknown parent codes (orphans), a node of ``below`` left
        without children, an unmapped or doubly mapped child, a child whose new parent lies
        under another node.
    """
    k = hierarchy.depth - 1 if below is None else hierarchy.level_index(below)
    new, pidx = _new_nodes(hierarchy, k, name, parent_codes, new_codes)
    names = list(hierarchy.names)
    codes: list[np.ndarray] = [lv.codes for lv in hierarchy.levels]
    parents: list[np.ndarray | None] = [lv.parent for lv in hierarchy.levels]
    if k == hierarchy.depth - 1:
        if children is not None:
            raise HierarchyError("children= is only for a level inserted above existing levels")
        names.append(name)
        codes.append(new)
        parents.append(pidx)
    else:
        if children is None:
            raise HierarchyError(
                f"inserting {name!r} between {names[k]!r} and {names[k + 1]!r} needs "
                f"children=: the new parent of every {names[k + 1]!r} node"
            )
        new_parent = _new_parents(hierarchy, k, name, new, pidx, children)
        names.insert(k + 1, name)
        codes.insert(k + 1, new)
        parents.insert(k + 1, pidx)
        parents[k + 2] = new_parent
    h, order = Hierarchy.from_parents(names, codes, parents, return_order=True)
    return LevelAdded(h, order)


def _new_nodes(
    hierarchy: Hierarchy,
    k: int,
    name: str,
    parent_codes: Sequence[str] | np.ndarray,
    new_codes: Sequence[str] | np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The new level's codes and each one's parent (index in level ``k``), checked: a new
    name, as many parents as codes, unique codes, known parents, every level-``k`` node
    given a child."""
    up = hierarchy.levels[k]
    if name in hierarchy.names:
        raise HierarchyError(f"there is already a level named {name!r}")
    new = as_codes(new_codes)
    pcodes = as_codes(parent_codes)
    if new.size != pcodes.size:
        raise HierarchyError(f"level {name!r}: {new.size} new codes but {pcodes.size} parent codes")
    if new.size == 0:
        raise HierarchyError(f"level {name!r} is empty: give it at least one node")
    dup = pd.Index(np.asarray(new, dtype=object)).duplicated()
    if dup.any():
        raise HierarchyError(
            f"code {str(new[np.flatnonzero(dup)[0]])!r} appears twice in the new level "
            f"{name!r}; codes must be unique within a level"
        )
    pidx = _lookup(up.codes, pcodes)
    if (pidx < 0).any():
        j = int(np.flatnonzero(pidx < 0)[0])
        raise HierarchyError(
            f"new {name!r} node {str(new[j])!r} names parent {str(pcodes[j])!r}, which is not "
            f"a node of level {up.name!r} (orphan)"
        )
    childless = np.flatnonzero(np.bincount(pidx, minlength=up.size) == 0)
    if childless.size:
        raise HierarchyError(
            f"node {str(up.codes[childless[0]])!r} of level {up.name!r} gets no child in the "
            f"new level {name!r}; every node above the leaves needs a child (give it one, "
            "e.g. a single unit with its own code)"
        )
    return new, pidx


def _new_parents(
    hierarchy: Hierarchy,
    k: int,
    name: str,
    new: np.ndarray,
    pidx: np.ndarray,
    children: Mapping[str, str] | tuple[Sequence[str], Sequence[str]] | pd.Series,
) -> np.ndarray:
    """For a level inserted under level ``k``: each node of level ``k + 1``'s new parent
    (index in ``new``) from ``children``, checked: every node mapped once to a known code,
    under its old parent, and every new node given a child."""
    up, low = hierarchy.levels[k], hierarchy.levels[k + 1]
    ccodes, cnew = _mapping_arrays(children)
    cidx = _lookup(low.codes, ccodes)
    if (cidx < 0).any():
        j = int(np.flatnonzero(cidx < 0)[0])
        raise HierarchyError(
            f"children= maps {str(ccodes[j])!r}, which is not a node of level {low.name!r}"
        )
    seen = np.bincount(cidx, minlength=low.size)
    if (seen > 1).any():
        raise HierarchyError(
            f"node {str(low.codes[np.flatnonzero(seen > 1)[0]])!r} of level {low.name!r} "
            "is mapped twice in children= (a node must have exactly one parent)"
        )
    if (seen == 0).any():
        raise HierarchyError(
            f"node {str(low.codes[np.flatnonzero(seen == 0)[0]])!r} of level {low.name!r} "
            f"has no parent in the new level {name!r} (orphan); map every node"
        )
    new_parent = np.empty(low.size, dtype=np.int64)
    new_parent[cidx] = _lookup(new, cnew)
    if (new_parent < 0).any():
        j = int(np.flatnonzero(new_parent < 0)[0])
        raise HierarchyError(
            f"node {str(low.codes[j])!r} of level {low.name!r} is mapped to an unknown "
            f"{name!r} code (orphan); every target must be in new_codes"
        )
    moved = np.flatnonzero(pidx[new_parent] != low.parent)
    if moved.size:
        j = int(moved[0])
        raise HierarchyError(
            f"node {str(low.codes[j])!r} of level {low.name!r} lies under "
            f"{str(up.codes[low.parent[j]])!r} but its new parent "
            f"{str(new[new_parent[j]])!r} lies under {str(up.codes[pidx[new_parent[j]]])!r}; "
            "the codes do not nest"
        )
    childless_new = np.flatnonzero(np.bincount(new_parent, minlength=new.size) == 0)
    if childless_new.size:
        raise HierarchyError(
            f"new node {str(new[childless_new[0]])!r} of level {name!r} has no child in "
            f"level {low.name!r}; drop it or map a child to it"
        )
    return new_parent


_LEVEL_RE = re.compile(r"^(?P<name>[^=]+)=(?P<column>[^:]+)(?::(?P<prefix>\d+))?$")


def parse_level_spec(text: str) -> LevelSpec:
    """Parse ``NAME=COLUMN[:PREFIXLEN]`` (the CLI's ``--level``)."""
    m = _LEVEL_RE.match(text.strip())
    if not m or (m["prefix"] is not None and int(m["prefix"]) < 1):
        raise HierarchyError(
            f"bad level specification {text!r}: use NAME=COLUMN or NAME=COLUMN:PREFIXLEN, "
            "e.g. state=fips:2"
        )
    prefix = int(m["prefix"]) if m["prefix"] is not None else None
    return LevelSpec(m["name"].strip(), m["column"].strip(), prefix)
