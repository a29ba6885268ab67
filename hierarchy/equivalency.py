"""Block → area equivalency files: off-spine areas (places, AIAN areas, districts) as sets of
leaves of a hierarchy.

Places, American Indian / Alaska Native / Native Hawaiian areas, school and legislative
districts do not nest in counties, so they cannot be levels of the hierarchy
(:mod:`censusdp.hierarchy.gisjoin`); they are released as sums of the leaves (blocks) they
contain. An equivalency file is a CSV with one row per block: the block's code and the code
of the area it lies in — the Census Bureau's block assignment files (BAF, e.g.
``BlockAssign_ST06_CA_INCPLACE_CDP.txt``: ``BLOCKID|PLACEFP``) or an NHGIS extract with
GISJOIN columns. The column names (and the delimiter) are configurable. An area may be any
set of leaves; a leaf lies in at most one area of one file (a file per kind of area).

:func:`read_equivalency` reads the file with pyarrow (every column as text: codes keep their
leading zeros), maps the block codes to the hierarchy's leaf indices with one hash join, and
refuses, naming the file, the data row and the column, with a fix: a missing column, a blank
code, a block listed twice, a block the hierarchy does not have, and — when the areas are also
listed separately — an area that contains no block, or a block assigned to an area not in the
list. Everything is vectorised (an 8.2-million-row national file is a few arrays). Codes are
public geography and may be named in messages; no count is ever read here.

References
----------
U.S. Census Bureau (2021). 2020 Census Block Assignment Files — the block → area file
    layout (one row per block, blank area code for blocks in no area).
Manson, S. et al. IPUMS NHGIS — GISJOIN codes of every summary level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import scipy.sparse as sp

from censusdp.errors import DataError, SpecError
from censusdp.hierarchy.core import Hierarchy, as_codes
from censusdp.tabular import refuse_cr_line_ends

__all__ = ["Equivalency", "equivalency_from_arrays", "read_equivalency"]


@dataclass(frozen=True, eq=False)
class Equivalency:
    """Areas of one kind as sets of leaves of a hierarchy.

    Attributes
    ----------
    name : str
        What the areas are (``"place"``), used as their level name in outputs.
    codes : numpy.ndarray
        The area codes, sorted (area ``a`` is ``codes[a]``).
    leaf : numpy.ndarray
        int64 leaf index (canonical order of the hierarchy) of every assigned leaf, sorted.
    area : numpy.ndarray
        int64 area index of each entry of ``leaf``.
    n_leaves : int
        Leaves of the hierarchy (assigned or not).
    source : str
        The file (or "arrays") it came from, for messages.
    """

    name: str
    codes: np.ndarray
    leaf: np.ndarray
    area: np.ndarray
    n_leaves: int
    source: str = "arrays"

    @property
    def n_areas(self) -> int:
        return int(self.codes.shape[0])

    def incidence(self) -> sp.csr_matrix:
        """The leaf × area 0/1 incidence ``(n_leaves, n_areas)`` (CSR)."""
        data = np.ones(self.leaf.size)
        return sp.csr_matrix((data, (self.leaf, self.area)), shape=(self.n_leaves, self.n_areas))

    def leaves_per_area(self) -> np.ndarray:
        """Number of leaves of every area."""
        return np.bincount(self.area, minlength=self.n_areas)

    def sum_leaves(self, leaf_values: np.ndarray) -> np.ndarray:
        """Per area the sum of its leaves' values ``(n_leaves, ...)`` → ``(n_areas, ...)``
        by the sparse incidence (integers summed exactly in int64)."""
        v = np.asarray(leaf_values)
        if v.shape[0] != self.n_leaves:
            raise SpecError(
                f"{self.source}: values for {v.shape[0]} leaves, the hierarchy has {self.n_leaves}"
            )
        flat = v.reshape(self.n_leaves, -1)
        exact = np.issubdtype(flat.dtype, np.integer)
        inc = self.incidence().astype(np.int64 if exact else np.float64)
        out = np.asarray(inc.T @ flat.astype(np.int64 if exact else np.float64))
        return out.reshape((self.n_areas, *v.shape[1:]))


def _text(values: object) -> pa.Array:
    """Codes as a pyarrow string array (missing values as nulls), without a Python list."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values.cast(pa.string())
    arr = np.asarray(values)
    if arr.dtype != object:
        arr = arr.astype(object)
    return pa.array(arr, type=pa.string(), from_pandas=True)


def _where(source: str, row: int, column: str) -> str:
    return f"{source}, data row {row + 1} (line {row + 2}), column {column!r}"


def equivalency_from_arrays(
    hierarchy: Hierarchy,
    blocks: Sequence[str] | np.ndarray,
    areas: Sequence[str] | np.ndarray,
    *,
    name: str = "area",
    listed: Sequence[str] | np.ndarray | None = None,
    source: str = "arrays",
    block_column: str = "block",
    area_column: str = "area",
    skip_blank_areas: bool = False,
    listed_source: str = "the list of areas",
) -> Equivalency:
    """Map block → area code pairs to leaf indices of ``hierarchy``, refusing bad rows.

    Parameters
    ----------
    hierarchy : Hierarchy
        Its leaves' codes are the block codes.
    blocks, areas : sequences of str (or pyarrow string arrays), same length
        One pair per row; missing values as None / NaN / "".
    name : str
        What the areas are (``"place"``).
    listed : sequence of str, optional
        The areas, listed separately: each must contain at least one block, and every
        assigned area must be listed (the result's areas are these, in sorted order).
    source, block_column, area_column : str
        File and columns named in messages.
    skip_blank_areas : bool
        Drop rows whose area code is blank (blocks in no area, as BAF files list them)
        instead of refusing them.

    Raises
    ------
    DataError
        Blank codes, a block listed twice, a block the hierarchy does not have, an area
        with no block, an area not listed — naming the file, data row and column.
    """
    cols = _Columns(name, source, block_column, area_column)
    b, a, rows = _nonblank_pairs(cols, _text(blocks), _text(areas), skip_blank_areas)
    leaf, order = _leaf_rows(cols, hierarchy, b, rows)
    codes, area = _area_index(cols, a, rows, listed, listed_source)
    return Equivalency(
        name=name,
        codes=as_codes(codes),
        leaf=leaf[order],
        area=area[order],
        n_leaves=hierarchy.leaves.size,
        source=source,
    )


@dataclass(frozen=True)
class _Columns:
    """What the areas are and the file and columns an equivalency's messages name."""

    name: str
    source: str
    block_column: str
    area_column: str


def _nonblank_pairs(
    cols: _Columns, b: pa.Array, a: pa.Array, skip_blank_areas: bool
) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """The block and area codes trimmed, and each pair's 0-based data row: a blank block is
    refused, a blank area refused or (``skip_blank_areas``) its row dropped."""
    source, name = cols.source, cols.name
    if len(b) != len(a):
        raise SpecError(f"{source}: {len(b)} block codes but {len(a)} area codes")
    b, a = pc.utf8_trim_whitespace(b), pc.utf8_trim_whitespace(a)
    blank_b = pc.fill_null(pc.equal(b, ""), True).to_numpy(zero_copy_only=False)
    if blank_b.any():
        i = int(np.flatnonzero(blank_b)[0])
        raise DataError(
            f"{_where(source, i, cols.block_column)}: blank block code ({int(blank_b.sum())} "
            "such rows); every row needs the block's code: fill it in or delete the row"
        )
    blank_a = pc.fill_null(pc.equal(a, ""), True).to_numpy(zero_copy_only=False)
    rows = np.arange(len(b), dtype=np.int64)
    if blank_a.any():
        if not skip_blank_areas:
            i = int(np.flatnonzero(blank_a)[0])
            raise DataError(
                f"{_where(source, i, cols.area_column)}: blank {name} code "
                f"({int(blank_a.sum())} such rows); delete the rows of blocks in no {name}, or "
                "pass skip_blank_areas (CLI: the file's blocks in no area are then left out)"
            )
        keep = ~blank_a
        b, a, rows = b.filter(pa.array(keep)), a.filter(pa.array(keep)), rows[keep]
    return b, a, rows


def _leaf_rows(
    cols: _Columns, hierarchy: Hierarchy, b: pa.Array, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's leaf index (one hash join against the leaf codes) and the pairs' order by
    leaf; a block the hierarchy lacks, or listed twice, is refused."""
    source = cols.source
    leaf = pc.index_in(b, value_set=_text(hierarchy.leaves.codes))
    leaf = leaf.to_numpy(zero_copy_only=False)
    unknown = np.isnan(leaf) if leaf.dtype.kind == "f" else leaf < 0
    if unknown.any():
        i = int(np.flatnonzero(unknown)[0])
        code = b[i].as_py()
        leaf_name = hierarchy.names[-1]
        example = str(hierarchy.leaves.codes[0]) if hierarchy.leaves.size else ""
        raise DataError(
            f"{_where(source, int(rows[i]), cols.block_column)}: block {code!r} is not a "
            f"{leaf_name} of the hierarchy ({int(unknown.sum())} unknown blocks; the "
            f"hierarchy's {leaf_name} codes look like {example!r}); check that the file is of "
            "the same state and vintage as the hierarchy and that its codes are in the same "
            "format (GISJOIN vs GEOID: see gisjoin=)"
        )
    leaf = np.asarray(leaf, dtype=np.int64)
    order = np.argsort(leaf, kind="stable")
    sl = leaf[order]
    dup = np.flatnonzero(sl[1:] == sl[:-1])
    if dup.size:
        first, second = sorted((int(rows[order[dup[0]]]), int(rows[order[dup[0] + 1]])))
        code = b[int(order[dup[0]])].as_py()
        raise DataError(
            f"{_where(source, second, cols.block_column)}: block {code!r} is listed again "
            f"(first at data row {first + 1}; {dup.size} repeated blocks); a block lies in at "
            f"most one {cols.name} of a file: keep one row per block (one file per kind of "
            "area)"
        )
    return leaf, order


def _area_index(
    cols: _Columns,
    a: pa.Array,
    rows: np.ndarray,
    listed: Sequence[str] | np.ndarray | None,
    listed_source: str,
) -> tuple[np.ndarray, np.ndarray]:
    """The area codes, sorted (the ``listed`` ones, each with a block and naming every
    assigned area), and each pair's area index: a dictionary encoding (hashing), then the
    small dictionary sorted."""
    source, name = cols.source, cols.name
    enc = a.dictionary_encode()
    words = np.asarray(enc.dictionary.to_numpy(zero_copy_only=False), dtype=object).astype(str)
    index = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    if listed is None:
        by_code = np.argsort(words, kind="stable")
        rank = np.empty_like(by_code)
        rank[by_code] = np.arange(by_code.size)
        return words[by_code], np.asarray(rank[index], dtype=np.int64).reshape(-1)
    lst = pd.Index(np.asarray(listed, dtype=object).astype(str))
    if lst.has_duplicates:
        raise DataError(f"{source}: the list of {name}s names {lst[lst.duplicated()][0]!r} twice")
    codes = np.sort(lst.to_numpy(dtype=str))
    area = pd.Index(codes).get_indexer(words)[index]
    if np.any(area < 0):
        i = int(np.flatnonzero(area < 0)[0])
        raise DataError(
            f"{_where(source, int(rows[i]), cols.area_column)}: {name} {a[i].as_py()!r} is "
            f"not in the list of {name}s; add it to the list or correct the code"
        )
    empty = np.flatnonzero(np.bincount(area, minlength=codes.size) == 0)
    if empty.size:
        row = int(lst.get_loc(str(codes[empty[0]])))
        raise DataError(
            f"{_where(listed_source, row, cols.area_column)}: {name} "
            f"{str(codes[empty[0]])!r} is listed but contains no block of {source} "
            f"({empty.size} such {name}s); an area is released as the sum of its blocks: "
            "assign its blocks in the file or drop it from the list"
        )
    return codes, np.asarray(area, dtype=np.int64).reshape(-1)


def _gisjoin_blocks(codes: pa.Array, source: str, column: str) -> pa.Array:
    """GISJOIN block codes (``G SS 0 CCC 0 TTTTTT BBBB``) as 15-digit GEOIDs."""
    from censusdp.hierarchy.gisjoin import parse

    parts = parse(np.asarray(codes.to_numpy(zero_copy_only=False), dtype=object), "block",
                  source=source, column=column)  # fmt: skip
    joined = parts["state"] + parts["county"] + parts["tract"] + parts["block"]
    return _text(joined)


def read_equivalency(
    path: str | Path,
    hierarchy: Hierarchy,
    *,
    block_column: str = "block",
    area_column: str = "area",
    name: str | None = None,
    delimiter: str | None = None,
    encoding: str | None = None,
    gisjoin: bool = False,
    areas_path: str | Path | None = None,
    skip_blank_areas: bool = False,
) -> Equivalency:
    """Read a block → area equivalency CSV and map it to ``hierarchy``'s leaves.

    Parameters
    ----------
    path : path
        CSV (or ``|``-delimited BAF) with a header row.
    hierarchy : Hierarchy
    block_column, area_column : str
        The columns holding the block code and the area code (e.g. ``BLOCKID``,
        ``PLACEFP``; NHGIS: ``GISJOIN`` and the place's ``GISJOIN``).
    name : str, optional
        What the areas are (default: ``area_column`` in lower case).
    delimiter : str, optional
        Default: ``|`` when the header holds one and no comma, else ``,``.
    encoding : str, optional
        Default: UTF-8, with a fall back to latin-1 for files that are not UTF-8.
    gisjoin : bool
        The block codes are NHGIS GISJOINs and the hierarchy's leaves are 15-digit GEOIDs.
    areas_path : path, optional
        A one-column CSV (header ``area_column``) listing the areas: each must contain a
        block.
    skip_blank_areas : bool
        Leave out the blocks whose area code is blank (in no area) instead of refusing.

    Raises
    ------
    DataError
        Unreadable file, missing columns, and every refusal of
        :func:`equivalency_from_arrays`, naming the file, data row and column.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such equivalency file; check the path")
    table = _read_text_table(p, (block_column, area_column), delimiter, encoding)
    blocks = table.column(block_column).combine_chunks()
    if gisjoin:
        blocks = _gisjoin_blocks(blocks, p.name, block_column)
    listed = None
    if areas_path is not None:
        q = Path(areas_path)
        if not q.is_file():
            raise DataError(f"{q}: no such area list; check the path")
        listed = _read_text_table(q, (area_column,), delimiter, encoding).column(area_column)
        listed = pc.utf8_trim_whitespace(listed.combine_chunks())
        blank = pc.fill_null(pc.equal(listed, ""), True).to_numpy(zero_copy_only=False)
        if blank.any():
            i = int(np.flatnonzero(blank)[0])
            raise DataError(f"{_where(q.name, i, area_column)}: blank area code; remove the row")
        listed = np.asarray(listed.to_numpy(zero_copy_only=False), dtype=object)
    return equivalency_from_arrays(
        hierarchy,
        blocks,
        table.column(area_column),
        name=name or area_column.lower(),
        listed=listed,
        source=p.name,
        block_column=block_column,
        area_column=area_column,
        skip_blank_areas=skip_blank_areas,
        listed_source=q.name if areas_path is not None else "the list of areas",
    )


def _parse_error(path: Path, delimiter: str, encoding: str, width: int) -> DataError:
    """The first row whose number of fields differs from the header's (a slow diagnostic
    pass, run only on a file the fast reader refused), without quoting its values."""
    import csv

    with path.open(encoding=encoding, newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        next(reader, None)
        for i, row in enumerate(reader):
            if row and len(row) != width:
                return DataError(
                    f"{path.name}, data row {i + 1} (line {reader.line_num}): {len(row)} fields, "
                    f"the header has {width}; fix the row's delimiters or quoting"
                )
    return DataError(f"{path.name}: malformed delimited file; check the delimiter and quoting")


def _read_text_table(
    path: Path, columns: Sequence[str], delimiter: str | None, encoding: str | None
) -> pa.Table:
    """``columns`` of a delimited text file, all as strings, refusing missing columns."""
    with path.open("rb") as f:
        head = f.readline()
    refuse_cr_line_ends(head, path)
    if not head.strip():
        raise DataError(f"{path.name}: empty file (no header row); give a CSV with a header line")
    if delimiter is None:
        delimiter = "|" if b"|" in head and b"," not in head else ","
    tried = [encoding] if encoding else ["utf8", "latin-1"]
    table, last = None, None
    for enc in tried:
        try:
            header = head.decode(enc).removeprefix("\ufeff").rstrip("\r\n").split(delimiter)
            header = [h.strip().strip('"') for h in header]
            missing = [c for c in columns if c not in header]
            if missing:  # the header is not quoted: a file without one starts with a record
                raise DataError(
                    f"{path.name}: no column {missing[0]!r} in the header's {len(header)} "
                    f"column(s) ({delimiter!r}-delimited); name the block and area columns as "
                    "the file's header line does (block_column / area_column), and check that "
                    "this is the block → area file"
                )
            table = pacsv.read_csv(
                path,
                read_options=pacsv.ReadOptions(encoding=enc),
                parse_options=pacsv.ParseOptions(delimiter=delimiter),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(columns),
                    column_types={c: pa.string() for c in columns},
                    strings_can_be_null=False,
                ),
            )
            break
        except UnicodeDecodeError as exc:
            last = exc
        except pa.ArrowInvalid as exc:
            text = str(exc)
            if "UTF8" in text or "utf8" in text or "decode" in text:
                last = exc
                continue
            raise _parse_error(path, delimiter, enc, len(header)) from None
    if table is None:
        raise DataError(
            f"{path.name}: cannot decode as {' or '.join(tried)} ({type(last).__name__}); "
            "give the file's encoding"
        )
    if table.num_rows == 0:
        raise DataError(f"{path.name}: a header but no data rows; the file assigns no block")
    return table
