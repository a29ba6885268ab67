"""The Census Bureau's Privacy-Protected Microdata File (PPMF) in: persons → blocks × ``pl94``.

A PPMF has one row per person. Its geography is split over five fixed-width code columns —
``TABBLKST`` (state FIPS, 2 digits), ``TABBLKCOU`` (county FIPS, 3), ``TABTRACT`` (tract, 6),
``TABBLKGRP`` (block group, 1) and ``TABBLK`` (block, 4) — which compose the hierarchy
nation → state → county → tract → block group → block with codes ``SS``, ``SSCCC``,
``SSCCCTTTTTT``, ``SSCCCTTTTTTG`` and ``SSCCCTTTTTTBBBB`` (the Bureau's 15-character block
GEOID; the block group is not part of it). The Microdata Detail Files written by the Bureau's
DAS name two of them ``TABTRACTCE`` and ``TABBLKGRPCE``; both spellings are read.

Two layouts of the person attributes are recognised from the header:

* ``pl94`` — the 2020 redistricting PPMF (vintage 2021-04-28 onwards) and the DAS's
  ``MDF2020PersonPL94HistogramWriter``: ``GQTYPE_PL`` 0 household, 1–7 group-quarters major
  type (→ ``hhgq`` 0–7), ``VOTING_AGE`` 1 under 18, 2 18 and over (→ ``votingage`` 0, 1),
  ``CENHISP`` 1 not Hispanic, 2 Hispanic (→ ``hispanic`` 0, 1), ``CENRACE`` 01–63 (→
  ``cenrace`` 0–62), and ``RTYPE`` 3 (housing unit) or 5 (group quarters), which must agree
  with ``GQTYPE_PL``;
* ``demonstration`` — the 2010 demonstration PPMFs (2019–2020 vintages) and the confidential
  edited file's naming: a three-digit group-quarters type ``GQTYPE`` (or ``QGQTYP``), ``000``
  for households and otherwise the major type as its first digit (8xx and 9xx are other
  non-institutional, type 7, as in the DAS recode), and the age ``QAGE`` (0–115; voting age
  is ``QAGE ≥ 18``), with ``CENHISP`` and ``CENRACE`` as above.

The *units* file (the DAS's ``MDF2020H1HistogramWriter``: one row per housing unit or
group-quarters facility, ``SCHEMA_TYPE_CODE|SCHEMA_BUILD_ID|TABBLKST|TABBLKCOU|TABTRACTCE|
TABBLKGRPCE|TABBLK|RTYPE|HH_STATUS``) is read by :func:`read_ppmf_units` into the ``h1``
histogram (occupied, vacant) per block: ``RTYPE`` 2 is a housing unit, with ``HH_STATUS``
1 occupied or 2 vacant; ``RTYPE`` 4 is a group-quarters facility, ``HH_STATUS`` 0 (not a
housing unit: counted and skipped). The same geography columns, chunked reading and error
discipline serve both files (one implementation).

The file is streamed in chunks of about 64 MB that end at a line end, and each chunk is
reduced at once to its (block, cell, count) triples, so memory is bounded by the size of the
result (the non-empty block × cell pairs), never by the number of persons. Every row of a
PPMF has the same layout (fixed-width codes), so a chunk whose rows all share one is cut
straight from its bytes as a ``(rows, width)`` matrix per column; any other chunk (quoted
fields, rows of different widths, a malformed row) goes through pyarrow's CSV parser. Comma- and
pipe-separated files are read, and leading ``#`` comment lines (as in the DAS's MDFs) are
skipped; a row whose fields are all empty is skipped and counted.

The hierarchy built from a PPMF's rows has only the blocks with people, so releasing it would
disclose which blocks are occupied. :func:`read_block_list` reads the public geography (any
file listing every block, e.g. a block assignment file) and :meth:`PPMFHistogram.on_blocks`
moves the persons onto it, the empty blocks present with zero counts.

Every malformed row is a :class:`~censusdp.errors.DataError` naming the file, the data row
(1-based, after the header), the column and the code: a geocode of the wrong width or with
non-digits, a code outside the schema, an ``RTYPE`` that contradicts the group-quarters type,
a block that appears under two block groups. Messages never contain a count.

References
----------
U.S. Census Bureau (2021). 2010 Demonstration Privacy-Protected Microdata File (PPMF),
    vintage 2021-04-28, technical documentation (record layout: VINTAGE, TABBLKST,
    TABBLKCOU, TABTRACT, TABBLKGRP, TABBLK, RTYPE, GQTYPE_PL, VOTING_AGE, CENHISP, CENRACE).
U.S. Census Bureau. DAS_2020_Redistricting_Production_Code,
    ``MDF2020H1HistogramWriter`` and ``H12020MDFHousehold2020Recoder`` (the units file:
    RTYPE 2 housing unit, 4 group quarters; HH_STATUS 1 occupied, 2 vacant, 0 not a housing
    unit), ``PL94ToMDFPersons2020Recoder`` (GQTYPE_PL, VOTING_AGE, CENHISP and CENRACE from the
    ``pl94`` histogram's hhgq, votingage, hispanic and cenrace).
Kenny, C. T. (2021). ppmf: Read Census Privacy Protected Microdata Files (R package;
    the column names above and the block GEOID from TABBLKST + TABBLKCOU + TABTRACT + TABBLK).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (the hhgq × votingage × hispanic × cenrace
    histogram).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from censusdp.errors import DataError
from censusdp.hierarchy.builders import from_columns
from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy
from censusdp.schema import Schema
from censusdp.tabular import refuse_cr_line_ends

__all__ = [
    "BLOCK_LIST_COLUMNS",
    "GEOGRAPHY",
    "LEVELS",
    "PPMFHistogram",
    "read_block_list",
    "read_ppmf",
    "read_ppmf_units",
    "sniff_csv",
]

#: The geography columns, their fixed widths and accepted spellings (PPMF, then DAS MDF).
GEOGRAPHY: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("TABBLKST", 2, ("TABBLKST",)),
    ("TABBLKCOU", 3, ("TABBLKCOU",)),
    ("TABTRACT", 6, ("TABTRACT", "TABTRACTCE")),
    ("TABBLKGRP", 1, ("TABBLKGRP", "TABBLKGRPCE")),
    ("TABBLK", 4, ("TABBLK",)),
)
#: The levels of the hierarchy a PPMF is read into, root first.
LEVELS = ("nation", "state", "county", "tract", "block_group", "block")
#: Shape of the ``pl94`` histogram (hhgq × votingage × hispanic × cenrace).
_SHAPE = (8, 2, 2, 63)
_N_CELLS = 8 * 2 * 2 * 63
#: The histogram of each kind of file: persons → ``pl94``, housing units → ``h1``.
_SCHEMAS = {"persons": "pl94", "units": "h1"}
#: A column of one chunk: an ``(n, width)`` byte matrix (rows of one layout) or strings.
_Codes = np.ndarray | pa.Array
#: Bytes of the file read per chunk (about 1.6 million PPMF rows).
_BLOCK_BYTES = 64 << 20
#: Merge the per-chunk partial results when they pass twice the last merge plus this many.
_COMPACT_AT = 8_000_000


@dataclass(eq=False)
class PPMFHistogram:
    """A PPMF read into the block hierarchy and a sparse histogram per block (``pl94`` for
    persons, ``h1`` for housing units).

    Attributes
    ----------
    hierarchy : Hierarchy
        nation → state → county → tract → block_group → block, canonical order; every block
        with at least one person.
    block, cell, count : numpy.ndarray
        int64, one entry per non-empty (block, cell), sorted by block then cell: ``block``
        indexes ``hierarchy.leaves``, ``cell`` the flat cell of ``schema`` (``pl94``: C order
        of hhgq × votingage × hispanic × cenrace, as
        :func:`censusdp.hierarchy.synthetic.pl94_histogram`; ``h1``: 0 occupied, 1 vacant).
    persons : int
        Records counted: persons (``pl94``) or housing units (``h1``).
    skipped_blank : int
        Rows with every field empty, skipped.
    layout : {"pl94", "demonstration", "units"}
        The attribute layout found in the header.
    path : Path
    schema : Schema
    facilities : int
        Group-quarters facility rows of a units file (``RTYPE`` 4), not housing units.
    """

    hierarchy: Hierarchy
    block: np.ndarray
    cell: np.ndarray
    count: np.ndarray
    persons: int
    skipped_blank: int
    layout: str
    path: Path
    schema: Schema = field(default_factory=lambda: Schema.load("pl94"), repr=False)
    facilities: int = 0

    def dense(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The histograms of blocks ``[start, stop)`` as int64 ``(n, *schema.shape)`` tensors.

        A block takes 16 KB dense: use ranges (``Hierarchy.descendant_range``) on large files.
        """
        n = self.hierarchy.leaves.size
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"block range [{start}, {stop}) is outside [0, {n})")
        lo, hi = np.searchsorted(self.block, [start, stop])
        out = np.zeros((stop - start, self.schema.n_cells), dtype=np.int64)
        out[self.block[lo:hi] - start, self.cell[lo:hi]] = self.count[lo:hi]
        return out.reshape((stop - start, *self.schema.shape))

    def block_totals(self) -> np.ndarray:
        """Records (persons or housing units) per block (int64, one per leaf)."""
        return _weighted_bincount(self.block, self.count, self.hierarchy.leaves.size)

    def on_blocks(self, hierarchy: Hierarchy, source: str = "the block list") -> PPMFHistogram:
        """The same persons on a public block hierarchy (:func:`read_block_list`).

        A PPMF holds only the blocks with people, so a hierarchy built from its rows makes the
        set of occupied blocks part of the release; on the public hierarchy every block is
        present and the empty ones hold zero counts.

        Raises
        ------
        DataError
            A block of the PPMF that the list does not have, or that the list puts in another
            block group (the PPMF's file, data row, column and block code named).
        """
        pub = np.asarray(hierarchy.levels[-1].codes, dtype=STRING_DTYPE)
        mine = np.asarray(self.hierarchy.levels[-1].codes, dtype=STRING_DTYPE)
        order = np.argsort(pub, kind="stable")
        pos = np.minimum(np.searchsorted(pub[order], mine), pub.size - 1)
        leaf = order[pos]
        missing = np.flatnonzero(pub[leaf] != mine)
        k_bg = LEVELS.index("block_group")
        bg_pub = np.asarray(hierarchy.levels[k_bg].codes, dtype=STRING_DTYPE)[
            hierarchy.ancestor_index(LEVELS[-1], "block_group")[leaf]
        ]
        bg_mine = np.asarray(self.hierarchy.levels[k_bg].codes, dtype=STRING_DTYPE)[
            self.hierarchy.ancestor_index(LEVELS[-1], "block_group")
        ]
        moved = np.flatnonzero(bg_pub != bg_mine)
        if missing.size or moved.size:
            first = int(missing[0] if missing.size else moved[0])
            code = mine[first]
            row = next(_rows_of_block(self.path, code))[0]
            where = f"{self.path.name}, data row {row}"
            if missing.size:
                raise DataError(
                    f"{where}, column 'TABBLK': block {code} is not in {source}; the public "
                    "block list must list every block of the state(s) (check that it is the "
                    "same vintage of geography as the PPMF)"
                )
            raise DataError(
                f"{where}, column 'TABBLKGRP': block {code} is in block group "
                f"{bg_mine[first]!r} here but in {bg_pub[first]!r} in {source}; correct "
                "TABBLKGRP (a block's group is the first digit of its number)"
            )
        block = leaf[self.block]
        cell, count = self.cell, self.count
        if not bool(np.all(block[1:] >= block[:-1])):
            o = np.lexsort((cell, block))
            block, cell, count = block[o], cell[o], count[o]
        return dataclasses.replace(self, hierarchy=hierarchy, block=block, cell=cell, count=count)


def _weighted_bincount(index: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``weights`` by ``index`` (``np.bincount`` would go through float64)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, index, weights)
    return out


# -- attribute layouts ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Attr:
    """One attribute column: accepted widths, and its codes → the schema axis index."""

    column: str
    widths: tuple[int, ...]
    recode: Callable[[np.ndarray], np.ndarray]  # code values → axis index, -1 if invalid
    valid: str  # the valid codes, for messages


def _between(lo: int, hi: int, shift: int) -> Callable[[np.ndarray], np.ndarray]:
    def f(v: np.ndarray) -> np.ndarray:
        return np.where((v >= lo) & (v <= hi), v - shift, -1)

    return f


def _gqtype3(v: np.ndarray) -> np.ndarray:
    major = v // 100
    out = np.where(major >= 7, 7, major)
    # '000' is a household; 001–099 are not group-quarters types
    return np.where((v == 0) | ((v >= 100) & (v <= 999)), out, -1)


def _voting_age_from_qage(v: np.ndarray) -> np.ndarray:
    return np.where(v <= 115, (v >= 18).astype(np.int64), -1)


_CENHISP = _Attr("CENHISP", (1,), _between(1, 2, 1), "1 (not Hispanic) or 2 (Hispanic)")
_CENRACE = _Attr("CENRACE", (2,), _between(1, 63, 1), "01 to 63")
_LAYOUTS: dict[str, tuple[_Attr, ...]] = {
    "pl94": (
        _Attr("GQTYPE_PL", (1,), _between(0, 7, 0), "0 (household) to 7"),
        _Attr("VOTING_AGE", (1,), _between(1, 2, 1), "1 (under 18) or 2 (18 and over)"),
        _CENHISP,
        _CENRACE,
    ),
    "demonstration": (
        _Attr("GQTYPE", (3,), _gqtype3, "000 (household) or a type 101 to 999"),
        _Attr("QAGE", (1, 2, 3), _voting_age_from_qage, "an age 0 to 115"),
        _CENHISP,
        _CENRACE,
    ),
}


#: The housing-unit attribute of a units file (group-quarters rows, HH_STATUS 0, are
#: dropped before it is recoded; :func:`_units_cells`).
_UNITS = (_Attr("HH_STATUS", (1,), _between(1, 2, 1), "1 (occupied) or 2 (vacant)"),)


def _layout(header: list[str], path: Path) -> tuple[str, dict[str, str], tuple[_Attr, ...]]:
    """The attribute layout of a header, and the file's name for every column we read."""
    names: dict[str, str] = {}
    for canonical, _, spellings in GEOGRAPHY:
        hit = [s for s in spellings if s in header]
        if not hit:
            raise DataError(
                f"{path.name}: no column {' or '.join(map(repr, spellings))}; a PPMF needs the "
                f"geography columns {[g[0] for g in GEOGRAPHY]} (the header has {len(header)} "
                "columns; is this the PPMF, with its header line?)"
            )
        names[canonical] = hit[0]
    if "HH_STATUS" in header:
        if "RTYPE" not in header:
            raise DataError(
                f"{path.name}: no column 'RTYPE'; a PPMF units file has RTYPE (2 housing "
                "unit, 4 group quarters) beside HH_STATUS"
            )
        names["HH_STATUS"], names["RTYPE"] = "HH_STATUS", "RTYPE"
        return "units", names, _UNITS
    if "GQTYPE_PL" in header:
        layout = "pl94"
    elif ("GQTYPE" in header or "QGQTYP" in header) and "QAGE" in header:
        layout = "demonstration"
    else:
        raise DataError(
            f"{path.name}: no person attributes of a known PPMF layout; give GQTYPE_PL, "
            "VOTING_AGE, CENHISP, CENRACE (2020 redistricting PPMF) or GQTYPE (or QGQTYP), "
            "QAGE, CENHISP, CENRACE (demonstration PPMF) for persons, or RTYPE, HH_STATUS for "
            f"housing units (the header has {len(header)} columns)"
        )
    attrs = _LAYOUTS[layout]
    for a in attrs:
        spelling = a.column
        if a.column == "GQTYPE" and "GQTYPE" not in header:
            spelling = "QGQTYP"
        if spelling not in header:
            raise DataError(
                f"{path.name}: no column {spelling!r}, needed with the {layout} PPMF layout"
            )
        names[a.column] = spelling
    if layout == "pl94" and "RTYPE" in header:
        names["RTYPE"] = "RTYPE"
    return layout, names, attrs


# -- reading ----------------------------------------------------------------------------------
def sniff_csv(path: Path) -> tuple[int, str, list[str]]:
    """Byte offset of the first data row, the delimiter and the header of a CSV file.

    Leading ``#`` comment lines (as in the DAS's MDFs) are skipped; the delimiter is ``|``
    when the header holds more pipes than commas, else ``,``.

    Raises
    ------
    DataError
        A header that is not text, an empty file, a column named twice, bare-CR line ends
        (file named).
    """
    offset = 0
    line = b""
    with path.open("rb") as f:
        for raw in f:
            if raw.startswith(b"#"):
                offset += len(raw)
                continue
            line = raw
            offset += len(raw)
            break
    refuse_cr_line_ends(line, path)
    try:
        text = line.decode("utf-8-sig").strip("\r\n")
    except UnicodeDecodeError:
        raise DataError(
            f"{path.name}: the header is not UTF-8 or ASCII text; a PPMF is an ASCII CSV file"
        ) from None
    if not text.strip():
        raise DataError(f"{path.name}: empty file (no header row); give a PPMF CSV with a header")
    delimiter = "|" if text.count("|") > text.count(",") else ","
    header = [h.strip() for h in next(csv.reader([text], delimiter=delimiter))]
    seen: dict[str, int] = {}
    for i, h in enumerate(header):
        if h in seen:  # a file without a header line starts with a record: not quoted
            raise DataError(
                f"{path.name}: header columns {seen[h] + 1} and {i + 1} have the same name; "
                "each column must occur once (is the header line missing?)"
            )
        seen[h] = i
    return offset, delimiter, header


def _chunks(path: Path, offset: int, block_bytes: int) -> Iterator[bytearray]:
    """The data rows from byte ``offset`` on, in pieces of about ``block_bytes`` completed
    to a line end (the last one given one if it lacks it)."""
    with path.open("rb") as f:
        f.seek(offset)
        while True:
            piece = bytearray(block_bytes)
            got = f.readinto(piece)  # straight into the buffer: no copy
            if not got:
                return
            del piece[got:]
            if not piece.endswith(b"\n"):
                piece += f.readline()  # in place: no copy of the piece
                if not piece.endswith(b"\n"):
                    if not piece.strip():
                        return
                    piece += b"\n"
            yield piece


def _fixed_width(
    chunk: bytearray, header: list[str], delimiter: str, wanted: list[str]
) -> dict[str, np.ndarray] | None:
    """The wanted columns of a chunk whose rows all share one layout (every PPMF row has
    the same field widths), as ``(rows, width)`` byte matrices (views of the chunk); None
    when they do not (then the CSV parser reads the chunk)."""
    buf = np.frombuffer(chunk, dtype=np.uint8)
    first = chunk.find(b"\n") + 1
    n, rest = divmod(buf.size, first)
    if rest or b'"' in chunk:
        return None
    rows = buf.reshape(n, first)
    if not bool((rows[:, -1] == ord("\n")).all()):
        return None
    end = first - 1
    if end and bool((rows[:, end - 1] == ord("\r")).all()):
        end -= 1
    sep = np.flatnonzero(rows[0, :end] == ord(delimiter))
    if sep.size != len(header) - 1:
        return None
    if not bool((rows[:, sep] == ord(delimiter)).all()):
        return None
    if chunk.count(delimiter.encode()) != n * sep.size:
        return None
    starts = np.concatenate(([0], sep + 1))
    stops = np.concatenate((sep, [end]))
    return {name: rows[:, starts[j] : stops[j]] for name in wanted for j in [header.index(name)]}


def _batches(
    path: Path,
    offset: int,
    header: list[str],
    delimiter: str,
    columns: list[str],
    block_bytes: int,
) -> Iterator[dict[str, _Codes]]:
    """The wanted columns of the data rows, a chunk at a time: byte matrices where the
    chunk's rows share one layout, else string arrays from the CSV parser."""
    head = delimiter.join(header).encode() + b"\n"
    for chunk in _chunks(path, offset, block_bytes):
        fixed = _fixed_width(chunk, header, delimiter, columns)
        if fixed is not None:
            yield fixed
            continue
        try:
            table = pacsv.read_csv(
                pa.py_buffer(head + bytes(chunk)),
                read_options=pacsv.ReadOptions(use_threads=False),
                parse_options=pacsv.ParseOptions(delimiter=delimiter),
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns,
                    column_types={c: pa.string() for c in columns},
                    strings_can_be_null=False,
                ),
            )
        except pa.ArrowInvalid as exc:
            text = str(exc)
            if "columns" in text:
                detail = "a row has more or fewer fields than the header"
            elif "utf8" in text.lower():
                detail = "the file is not UTF-8 text"
            else:
                detail = "malformed CSV"
            raise DataError(
                f"{path.name}: {detail}; fix the file (check delimiters and quoting)"
            ) from None
        yield {c: table.column(c).combine_chunks() for c in columns}


def _codes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets, lengths and the data buffer (uint8) of a string array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    off_type = np.int64 if arr.type == pa.large_string() else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset : arr.offset + n + 1]
    data = arr.buffers()[2]
    buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64, copy=False), np.diff(offsets).astype(np.int64), buf


def _digits(
    arr: _Codes, widths: tuple[int, ...], bad: Callable[[int, str], DataError]
) -> np.ndarray:
    """The decimal value of every code (int64), each of one of ``widths`` digits.

    ``bad(i, why)`` makes the error for row ``i`` of the batch.
    """
    if isinstance(arr, np.ndarray):
        n, w = arr.shape
        if w not in widths:
            return _raise(bad(0, f"has {w} characters, expected {_widths(widths)}"))
        return _value(arr, bad)
    offsets, lengths, buf = _codes(arr)
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.int64)
    w = widths[-1]
    ok = (lengths == w) if len(widths) == 1 else (lengths >= widths[0]) & (lengths <= w)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        return _raise(bad(i, f"has {int(lengths[i])} characters, expected {_widths(widths)}"))
    if lengths[0] == w and bool((lengths == w).all()):
        mat = buf[offsets[0] : offsets[0] + n * w].reshape(n, w)
    else:
        # right-align shorter codes (QAGE '7' = '007') in an (n, w) matrix of '0'
        mat = np.full((n, w), ord("0"), dtype=np.uint8)
        col = np.arange(w)[None, :]
        start = offsets[:-1, None] + col - (w - lengths[:, None])
        take = col >= (w - lengths[:, None])
        mat[take] = buf[start[take]]
    return _value(mat, bad)


def _value(mat: np.ndarray, bad: Callable[[int, str], DataError]) -> np.ndarray:
    """The decimal value of each row of an ``(n, w)`` matrix of ASCII digits (int32 for the
    code widths of a PPMF, w ≤ 9; int64 beyond)."""
    n, w = mat.shape
    if w == 0:
        return np.zeros(n, np.int64)
    d = mat - np.uint8(ord("0"))  # non-digits wrap around to values above 9
    if int(d.max()) > 9:
        i = int(np.flatnonzero((d > 9).any(axis=1))[0])
        return _raise(bad(i, "is not all digits"))
    value = d[:, 0].astype(np.int32 if w <= 9 else np.int64)
    for j in range(1, w):  # a few digit columns, each a vector operation
        value *= 10
        value += d[:, j]
    return value


def _take(arr: _Codes, keep: np.ndarray) -> _Codes:
    return arr[keep] if isinstance(arr, np.ndarray) else arr.take(pa.array(keep))


def _widths(widths: tuple[int, ...]) -> str:
    if len(widths) == 1:
        return f"{widths[0]}"
    return f"{widths[0]} to {widths[-1]}"


def _raise(err: DataError) -> np.ndarray:
    raise err


class _Reduced:
    """Per-chunk (block key, cell, count) triples, each chunk's sorted by key then cell.

    A PPMF is sorted by block, so chunks hold (almost) disjoint runs of blocks and merging
    them is a concatenation; the merge sorts (stably, on nearly sorted data) only what a file
    out of order needs. Partial results are merged when they reach twice the size of the
    last merge, so an unsorted file costs O(N log N) over all, and a sorted one no repeated
    work.
    """

    def __init__(self, n_cells: int = _N_CELLS) -> None:
        self.n_cells = n_cells
        self.keys: list[np.ndarray] = []
        self.cells: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.size = 0
        self.merged = 0

    def add(self, key: np.ndarray, cell: np.ndarray) -> None:
        if key.size == 0:
            return
        n_cells = self.n_cells
        low = int(key.min())
        if int(key.max()) - low < np.iinfo(np.int64).max // n_cells:
            uniq, counts = np.unique((key - low) * n_cells + cell, return_counts=True)
            blocks = uniq // n_cells + low
        else:  # geocodes too far apart to pair with a cell in one int64: rank blocks first
            first, rank = np.unique(key, return_inverse=True)
            uniq, counts = np.unique(rank * n_cells + cell, return_counts=True)
            blocks = first[uniq // n_cells]
        self.keys.append(blocks)
        self.cells.append((uniq % n_cells).astype(np.int16))
        self.counts.append(counts.astype(np.int64))
        self.size += uniq.size
        if self.size > 2 * self.merged + _COMPACT_AT and len(self.keys) > 1:
            self.compact()

    def compact(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Merge into one sorted run of distinct (key, cell); returns it."""
        if not self.keys:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        key = np.concatenate(self.keys)
        self.keys = []
        cell = np.concatenate(self.cells).astype(np.int64)
        self.cells = []
        count = np.concatenate(self.counts)
        self.counts = []
        new = np.concatenate(([True], key[1:] != key[:-1]))
        if bool(np.all(key[1:] >= key[:-1])):  # blocks in file order: rank by runs
            blocks, rank = key[new], np.cumsum(new) - 1
        else:
            blocks, rank = np.unique(key, return_inverse=True)
        del key, new
        pair = rank * self.n_cells + cell
        del rank, cell
        if not bool(np.all(pair[1:] >= pair[:-1])):
            order = np.argsort(pair, kind="stable")  # nearly sorted: close to linear
            pair, count = pair[order], count[order]
            del order
        start = np.flatnonzero(np.concatenate(([True], pair[1:] != pair[:-1])))
        pair = pair[start]
        count = np.add.reduceat(count, start)
        out = (blocks[pair // self.n_cells], pair % self.n_cells, count)
        self.keys, self.cells, self.counts = [out[0]], [out[1].astype(np.int16)], [out[2]]
        self.size = self.merged = start.size
        return out


def read_ppmf(path: str | Path, *, block_bytes: int = _BLOCK_BYTES) -> PPMFHistogram:
    """Read a PPMF persons file into the block hierarchy and a sparse ``pl94`` histogram.

    Parameters
    ----------
    path : path-like
        A PPMF (or DAS Microdata Detail File) of persons, CSV with a header, comma or pipe
        separated.
    block_bytes : int
        Bytes of the file parsed per step (memory per step is a small multiple of it).

    Returns
    -------
    PPMFHistogram

    Raises
    ------
    DataError
        No such file, no header, missing columns, a units file, a malformed row, a geocode of
        the wrong width, a code outside the schema, an RTYPE contradicting the
        group-quarters type, a block under two block groups (file, data row, column and code
        named).
    """
    return _read(Path(path), "persons", block_bytes)


def read_ppmf_units(path: str | Path, *, block_bytes: int = _BLOCK_BYTES) -> PPMFHistogram:
    """Read a PPMF units file into the block hierarchy and a sparse ``h1`` histogram.

    One row per housing unit (``RTYPE`` 2, ``HH_STATUS`` 1 occupied or 2 vacant) or
    group-quarters facility (``RTYPE`` 4, ``HH_STATUS`` 0: not a housing unit, counted in
    ``facilities`` and skipped), with the geography columns of the persons file; streamed the
    same way (memory bounded by the non-empty (block, cell) pairs).

    Parameters
    ----------
    path : path-like
        The units file (CSV with a header, comma or pipe separated; ``#`` comment lines
        skipped).
    block_bytes : int
        Bytes of the file parsed per step.

    Returns
    -------
    PPMFHistogram
        ``schema`` ``h1`` (cell 0 occupied, 1 vacant), ``layout`` ``"units"``, ``persons``
        the housing units counted.

    Raises
    ------
    DataError
        No such file, a persons file, a malformed row, a geocode of the wrong width, an
        RTYPE or HH_STATUS outside the layout or contradicting each other, a block under two
        block groups (file, data row, column and code named; never a count).

    References
    ----------
    U.S. Census Bureau, DAS_2020_Redistricting_Production_Code, ``MDF2020H1HistogramWriter``.
    """
    return _read(Path(path), "units", block_bytes)


def _read(path: Path, kind: str, block_bytes: int) -> PPMFHistogram:
    """Both readers: ``kind`` ``"persons"`` or ``"units"`` (the layout must agree)."""
    what = "PPMF" if kind == "persons" else "PPMF units file"
    if not path.is_file():
        raise DataError(f"{path}: no such file; check the {what} path")
    offset, delimiter, header = sniff_csv(path)
    layout, names, attrs = _layout(header, path)
    if (layout == "units") != (kind == "units"):
        found = "housing units (RTYPE, HH_STATUS)" if layout == "units" else "persons"
        raise DataError(
            f"{path.name}: the header is a file of {found}, but a {what} was expected; give "
            "the persons file and the units file each in its place"
        )
    schema = Schema.load(_SCHEMAS[kind])
    columns = list(dict.fromkeys(names.values()))
    reduced = _Reduced(schema.n_cells)
    row0 = 0  # data rows before the current batch
    blank_total = 0
    facilities = 0
    source = (path, offset, header, delimiter)
    for batch in _batches(*source, columns, block_bytes):
        arrays = {canonical: batch[col] for canonical, col in names.items()}
        n = len(next(iter(arrays.values())))  # rows of the chunk (matrix rows or strings)
        blank = np.ones(n, dtype=bool)
        for a in arrays.values():
            blank &= (a.shape[1] == 0) if isinstance(a, np.ndarray) else (_codes(a)[1] == 0)
        rows = None
        if blank.any():
            keep = np.flatnonzero(~blank)
            blank_total += int(blank.sum())
            rows = row0 + keep
            arrays = {k: _take(v, keep) for k, v in arrays.items()}
        key, cell, dropped = _reduce_batch(arrays, attrs, names, path, row0, rows, schema.shape)
        facilities += dropped
        reduced.add(key, cell)
        row0 += n
    keys, cells, counts = reduced.compact()
    if keys.size == 0:
        none = "persons" if kind == "persons" else "housing units"
        raise DataError(f"{path.name}: a header but no {none}; the file holds no such rows")
    records = row0 - blank_total - facilities
    block, h = _hierarchy(keys, source, names, block_bytes)
    # canonical leaf order is geocode order, so the compacted triples are already sorted
    if not bool(np.all(block[1:] >= block[:-1])):
        order = np.lexsort((cells, block))
        block, cells, counts = block[order], cells[order], counts[order]
    return PPMFHistogram(
        h, block, cells, counts, records, blank_total, layout, path, schema, facilities
    )


def _reduce_batch(
    arrays: dict[str, _Codes],
    attrs: tuple[_Attr, ...],
    names: dict[str, str],
    path: Path,
    row0: int,
    rows: np.ndarray | None,
    shape: tuple[int, ...] = _SHAPE,
) -> tuple[np.ndarray, np.ndarray, int]:
    """One batch → (geocode16 key, flat cell) per counted record, and the number of rows
    dropped (group-quarters facilities of a units file)."""

    def where(i: int) -> int:
        return int(rows[i]) + 1 if rows is not None else row0 + i + 1

    def bad_factory(canonical: str, what: str) -> Callable[[int, str], DataError]:
        column = names[canonical]

        def bad(i: int, why: str) -> DataError:
            return DataError(
                f"{path.name}, data row {where(i)}, column {column!r}: the {what} {why}; "
                f"{_fix(canonical)}"
            )

        return bad

    key = np.zeros(len(next(iter(arrays.values()))), dtype=np.int64)
    for canonical, width, _ in GEOGRAPHY:
        v = _digits(arrays[canonical], (width,), bad_factory(canonical, "geocode"))
        key *= 10**width
        key += v
    if "HH_STATUS" in arrays:
        return _units_cells(arrays, key, path, where, bad_factory)
    cell = np.zeros_like(key)
    for a, size in zip(attrs, shape, strict=True):
        v = _digits(arrays[a.column], a.widths, bad_factory(a.column, "code"))
        idx = a.recode(v)
        out = np.flatnonzero(idx < 0)
        if out.size:
            i = int(out[0])
            raise DataError(
                f"{path.name}, data row {where(i)}, column {names[a.column]!r}: the code "
                f"is outside the pl94 schema (valid: {a.valid}); "
                "correct the row or drop it"
            )
        cell = cell * size + idx
    if "RTYPE" in arrays:
        rtype = _digits(arrays["RTYPE"], (1,), bad_factory("RTYPE", "code"))
        gq = cell // (2 * 2 * 63)
        wrong = ((rtype != 3) & (rtype != 5)) | ((rtype == 3) != (gq == 0))
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise DataError(
                f"{path.name}, data row {where(i)}, column 'RTYPE': the code does not agree "
                "with GQTYPE_PL in the same row (RTYPE 3 is a housing-unit person, "
                "GQTYPE_PL 0; RTYPE 5 a group-quarters person, GQTYPE_PL 1-7); correct the row"
            )
    return key, cell, 0


def _units_cells(
    arrays: dict[str, _Codes],
    key: np.ndarray,
    path: Path,
    where: Callable[[int], int],
    bad_factory: Callable[[str, str], Callable[[int, str], DataError]],
) -> tuple[np.ndarray, np.ndarray, int]:
    """A units batch: the housing units' (key, ``h1`` cell) and the facility rows dropped."""
    rtype = _digits(arrays["RTYPE"], (1,), bad_factory("RTYPE", "code"))
    status = _digits(arrays["HH_STATUS"], (1,), bad_factory("HH_STATUS", "code"))
    bad_rtype = np.flatnonzero((rtype != 2) & (rtype != 4))
    bad_status = np.flatnonzero(status > 2)
    if bad_rtype.size or bad_status.size:
        i = int(min(bad_rtype[:1].tolist() + bad_status[:1].tolist()))
        col = "RTYPE" if bad_rtype.size and bad_rtype[0] == i else "HH_STATUS"
        valid = "2 (housing unit) or 4 (group quarters)" if col == "RTYPE" else "0, 1 or 2"
        raise DataError(
            f"{path.name}, data row {where(i)}, column {col!r}: the code "
            f"is outside the units layout (valid: {valid}); "
            "correct the row or drop it"
        )
    unit = rtype == 2
    wrong = np.flatnonzero(unit == (status == 0))
    if wrong.size:
        i = int(wrong[0])
        raise DataError(
            f"{path.name}, data row {where(i)}, column 'HH_STATUS': the code does not agree "
            "with RTYPE in the same row (a housing unit, RTYPE 2, is occupied 1 or vacant "
            "2; a group-quarters facility, RTYPE 4, has HH_STATUS 0); correct the row"
        )
    return key[unit], status[unit].astype(np.int64) - 1, int(unit.size - np.count_nonzero(unit))


def _fix(canonical: str) -> str:
    widths = {g[0]: g[1] for g in GEOGRAPHY}
    if canonical in widths:
        return (
            f"{canonical} codes have exactly {widths[canonical]} digits; a leading zero was "
            "probably lost (codes read as numbers): zero-pad the column"
        )
    return "correct the row or drop it"


# -- the hierarchy ------------------------------------------------------------------------------
def _split(keys: np.ndarray) -> dict[str, np.ndarray]:
    """geocode16 keys → the five geography parts (int64)."""
    out: dict[str, np.ndarray] = {}
    rest = keys
    for canonical, width, _ in reversed(GEOGRAPHY):
        out[canonical] = rest % (10**width)
        rest = rest // (10**width)
    return out


def _padded(v: np.ndarray, width: int) -> np.ndarray:
    return np.strings.zfill(v.astype(STRING_DTYPE), width)


def _hierarchy(
    keys: np.ndarray,
    source: tuple[Path, int, list[str], str],
    names: dict[str, str],
    block_bytes: int,
) -> tuple[np.ndarray, Hierarchy]:
    """The leaf index of each entry of ``keys`` (geocode16 = state, county, tract, block
    group, block), and the block hierarchy of the non-empty blocks."""
    new = np.concatenate(([True], keys[1:] != keys[:-1]))  # keys come sorted
    uniq, inverse = keys[new], np.cumsum(new) - 1
    parts = _split(uniq)
    geoid15 = (
        (parts["TABBLKST"] * 1000 + parts["TABBLKCOU"]) * 10**6 + parts["TABTRACT"]
    ) * 10**4 + parts["TABBLK"]
    dup = np.flatnonzero(pd.Series(geoid15).duplicated(keep=False).to_numpy())
    if dup.size:
        _two_block_groups(int(geoid15[dup[0]]), source, names, block_bytes)
    st = _padded(parts["TABBLKST"], 2)
    county = np.strings.add(st, _padded(parts["TABBLKCOU"], 3))
    tract = np.strings.add(county, _padded(parts["TABTRACT"], 6))
    bg = np.strings.add(tract, _padded(parts["TABBLKGRP"], 1))
    block = np.strings.add(tract, _padded(parts["TABBLK"], 4))
    frame = pd.DataFrame(
        {"state": st, "county": county, "tract": tract, "block_group": bg, "block": block}
    )
    h, leaf_row = from_columns(
        frame,
        [(n, n) for n in LEVELS[1:]],
        root_name=LEVELS[0],
        root_code="US",
        source=source[0].name,
    )
    leaf_of_row = np.empty(uniq.size, dtype=np.int64)
    leaf_of_row[leaf_row] = np.arange(uniq.size, dtype=np.int64)
    return leaf_of_row[inverse], h


def _strings(arr: _Codes) -> np.ndarray:
    if isinstance(arr, np.ndarray):
        return np.array([r.tobytes().decode("utf-8", errors="replace") for r in arr], dtype=object)
    return np.asarray(arr.to_pylist(), dtype=object)


def _rows_of_block(path: Path, geoid15: str, block_bytes: int = _BLOCK_BYTES) -> Iterator:
    """``(data row, block group)`` of every row of block ``geoid15`` (a second pass over the
    file, for error messages only)."""
    offset, delimiter, header = sniff_csv(path)
    names = _layout(header, path)[1]
    geo = {g[0]: names[g[0]] for g in GEOGRAPHY}
    row0 = 0
    for batch in _batches(path, offset, header, delimiter, list(geo.values()), block_bytes):
        cols = {k: _strings(batch[v]).astype(str) for k, v in geo.items()}
        g15 = np.char.add(
            np.char.add(np.char.add(cols["TABBLKST"], cols["TABBLKCOU"]), cols["TABTRACT"]),
            cols["TABBLK"],
        )
        for i in np.flatnonzero(g15 == geoid15):
            yield row0 + int(i) + 1, str(cols["TABBLKGRP"][i])
        row0 += g15.size


def _two_block_groups(
    geoid15: int,
    source: tuple[Path, int, list[str], str],
    names: dict[str, str],
    block_bytes: int,
) -> None:
    """Find the rows of a block found under two block groups (a second pass: errors only)."""
    path = source[0]
    first: tuple[int, str] | None = None
    for row, bgv in _rows_of_block(path, f"{geoid15:015d}", block_bytes):
        if first is None:
            first = (row, bgv)
        elif bgv != first[1]:
            raise DataError(
                f"{path.name}, data row {row}, column {names['TABBLKGRP']!r}: "
                f"block {geoid15:015d} is in block group {bgv!r} here but in block group "
                f"{first[1]!r} in data row {first[0]}; a block lies in one block group "
                "(the first digit of its number): correct TABBLKGRP or TABBLK"
            )
    raise AssertionError("a block under two block groups was found but not located")


# -- the public block list --------------------------------------------------------------------
#: Block code columns recognised in a block list, in order of preference (a plain list, a
#: Census block assignment file, a TIGER/NHGIS-style extract).
BLOCK_LIST_COLUMNS = ("block", "BLOCKID", "GEOID20", "GEOID", "GEOCODE")


def read_block_list(path: str | Path, *, column: str | None = None) -> Hierarchy:
    """The public block hierarchy from a list of every block (one row per block).

    Any delimited text file with a header and a column of 15-digit block GEOIDs (state 2,
    county 3, tract 6, block 4) serves: a plain list, or a Census block assignment file
    (``BLOCKID|PLACEFP``), which lists every block of a state. The block group is the first
    digit of the block number (the Census Bureau's rule for 2010 and 2020 blocks).

    Parameters
    ----------
    path : path-like
    column : str, optional
        The block code column (default: the first of :data:`BLOCK_LIST_COLUMNS` present).

    Returns
    -------
    Hierarchy
        nation → state → county → tract → block_group → block, every listed block.

    Raises
    ------
    DataError
        No such file, no block column, a code that is not 15 digits, a block listed twice
        (file, data row and column named).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such block list; check the path")
    offset, delimiter, header = sniff_csv(path)
    if column is None:
        column = next((c for c in BLOCK_LIST_COLUMNS if c in header), None)
        if column is None:
            raise DataError(
                f"{path.name}: no block code column in the header (looked for "
                f"{list(BLOCK_LIST_COLUMNS)}); name it with [hierarchy] block_column"
            )
    elif column not in header:
        raise DataError(
            f"{path.name}: no column {column!r} in the header; name the block column as the "
            "file's header line does ([hierarchy] block_column)"
        )
    with path.open("rb") as f:
        f.seek(offset)
        body = f.read()
    head = delimiter.join(header).encode() + b"\n"
    try:
        table = pacsv.read_csv(
            pa.py_buffer(head + body),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(
                include_columns=[column], column_types={column: pa.string()}
            ),
        )
    except pa.ArrowInvalid as exc:
        raise DataError(f"{path.name}: malformed CSV ({exc}); fix the file") from None
    codes = np.asarray(table.column(column).to_numpy(zero_copy_only=False), dtype=object)
    if codes.size == 0:
        raise DataError(f"{path.name}: a header but no blocks; list every block")
    text = np.where(pd.isna(codes), "", codes).astype(str)
    bad = np.flatnonzero((np.strings.str_len(text) != 15) | ~np.strings.isdigit(text))
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{path.name}, data row {i + 1}, column {column!r}: the value is not a 15-digit "
            "block GEOID (state 2, county 3, tract 6, block 4 digits); keep leading zeros"
        )
    dup = np.flatnonzero(pd.Series(text).duplicated().to_numpy())
    if dup.size:
        i = int(dup[0])
        raise DataError(
            f"{path.name}, data row {i + 1}, column {column!r}: block {text[i]} is listed "
            "twice; list every block once"
        )
    tract = np.strings.slice(text, 0, 11)
    frame = pd.DataFrame(
        {
            "state": np.strings.slice(text, 0, 2),
            "county": np.strings.slice(text, 0, 5),
            "tract": tract,
            "block_group": np.strings.add(tract, np.strings.slice(text, 11, 12)),
            "block": text,
        }
    )
    h, _ = from_columns(
        frame, [(n, n) for n in LEVELS[1:]], root_name=LEVELS[0], root_code="US", source=path.name
    )
    return h
