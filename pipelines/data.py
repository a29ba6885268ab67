"""Load the confidential input of a run into a :class:`~censusdp.hierarchy.table.Table`.

Sources (``[data] source``): ``midwest`` (the packaged ggplot2 table, censusdp/data/midwest.csv), ``csv`` / ``parquet``
(one row per leaf, code columns named in ``[hierarchy] codes``; long files are filtered to the
``truth`` version), ``nhgis`` (NHGIS-style batch files keyed by GISJOIN, see
:mod:`censusdp.pipelines.io.nhgis`) and ``synthetic`` (the US-shaped synthetic hierarchy).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from censusdp.errors import DataError, SpecError
from censusdp.hierarchy import gisjoin
from censusdp.hierarchy.builders import LevelSpec, from_columns, from_gisjoin
from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy
from censusdp.hierarchy.table import MIDWEST_CELLS, Table, resolve_cells
from censusdp.pipelines.io.nhgis import (
    CONTEXT_COLUMNS,
    BatchFile,
    read_batch,
    spine_rows,
    upper_rows,
)
from censusdp.pipelines.spec import CodeSpec, RunSpec
from censusdp.registry import Registry
from censusdp.tabular import parquet_columns, read_csv_text, read_parquet_table, shown_columns

__all__ = ["SOURCES", "Source", "RunData", "load_data", "read_geography"]


@dataclass(frozen=True)
class Source:
    """What a ``[data] source`` needs from a spec.

    Attributes
    ----------
    file : bool
        It reads a file: ``[data] path`` (or ``--data``) and, unless ``schema`` gives them,
        the cell columns are required.
    codes : bool
        Its levels are read from code columns: ``[hierarchy] codes`` names one for every
        level below the root.
    schema : str or None
        The histogram schema its cells come from (``ppmf``: ``pl94``), so ``[data] cells``
        is optional (default: every cell of the schema).
    """

    file: bool
    codes: bool
    schema: str | None = None


#: Every ``[data] source`` a spec can name; :func:`load_data` reads each.
SOURCES: Registry[Source] = Registry("data source")
SOURCES.add("csv", Source(file=True, codes=True))
SOURCES.add("parquet", Source(file=True, codes=True))
SOURCES.add("nhgis", Source(file=True, codes=False))  # levels from GISJOIN codes
SOURCES.add("ppmf", Source(file=True, codes=False, schema="pl94"))  # persons → blocks × pl94
SOURCES.add("midwest", Source(file=False, codes=False))
SOURCES.add("synthetic", Source(file=False, codes=False))


@dataclass(eq=False)
class RunData:
    """The confidential table of a run, and the batch file it came from (NHGIS sources)."""

    table: Table
    source: str
    batch: BatchFile | None = None
    leaf_row: np.ndarray | None = None  # batch unit row of each canonical leaf
    upper_rows: dict[int, tuple[np.ndarray, np.ndarray]] | None = None  # level → (rows, nodes)


def _read_table_file(
    path: Path, source: str, encoding: str | None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    if not path.is_file():
        raise DataError(f"{path}: no such file; check [data] path or --data")
    if source == "parquet":
        return read_parquet_table(path, columns=columns)
    return read_csv_text(_file_text(path, encoding), path, usecols=columns)


def _file_text(path: Path, encoding: str | None) -> str:
    try:
        return path.read_text(encoding=encoding or "utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path.name}: cannot decode as {encoding or 'utf-8'!r} at byte {exc.start}; set [data] encoding "
            "(e.g. 'latin-1')"
        ) from None


def _header(path: Path, source: str, encoding: str | None) -> list[str]:
    """The column names of a CSV or Parquet data file (no row is read)."""
    if source == "parquet" or path.suffix.lower() in (".parquet", ".pq"):
        return parquet_columns(path)
    text = _file_text(path, encoding).removeprefix("\ufeff")
    header = next(csv.reader(io.StringIO(text)), None)
    if not header or not any(h.strip() for h in header):
        raise DataError(f"{path.name}: empty file (no header row); give a CSV with a header line")
    return header


def _truth_rows(spec: RunSpec, df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """A long file's rows of the ``truth`` version (a wide file as is)."""
    if not spec.data.version_column:
        return df
    col = spec.data.version_column
    if col not in df.columns:
        raise DataError(f"{path.name}: no column {col!r} ([data] version_column)")
    if not spec.data.truth:
        raise SpecError(f"{spec.source}: [data] truth must name the version holding the input")
    df = df[df[col].astype(str) == spec.data.truth].reset_index(drop=True)
    if df.empty:
        raise DataError(f"{path.name}: no rows of version {spec.data.truth!r} in column {col!r}")
    return df


def _file_table(spec: RunSpec, path: Path) -> Table:
    df = _truth_rows(spec, _read_table_file(path, spec.data.source, spec.data.encoding), path)
    levels, identifiers = _code_levels(spec, df, path)
    cells = list(spec.data.cells) or [c for c in df.columns if c not in identifiers]
    return Table.from_frame(
        df, levels, cells, source=path.name, root_name=spec.hierarchy.levels[0], root_code="root"
    )


def _code_levels(spec: RunSpec, df: pd.DataFrame, path: Path) -> tuple[list[LevelSpec], list[str]]:
    """The levels below the root as code columns of ``df`` (joined codes added to it) and
    every identifier column (codes, their sources, context, version), checked: joined codes
    nest, prefixed codes have one width, no cell pattern names a code column."""
    levels = []
    sources: list[str] = []
    for name in spec.hierarchy.levels[1:]:
        code = spec.hierarchy.codes.get(name)
        if code is None:
            raise SpecError(f"{spec.source}: [hierarchy] codes has no entry for level {name!r}")
        column = code.column
        if code.columns:
            column = f"{name}:{code.column}"  # a new column: the inputs stay as read
            if column in df.columns:
                raise DataError(
                    f"{path.name}: the joined code of level {name!r} would be named "
                    f"{column!r}, which is already a column; rename that column"
                )
            df[column] = _joined_codes(df, code, name, path)
            sources.extend(code.columns)
        levels.append(LevelSpec(name, column, code.prefix))
    _check_joined_nesting(df, levels, spec, path)
    identifiers = [lv.column for lv in levels] + sources
    identifiers += [c for c in df.columns if str(c).lower() in CONTEXT_COLUMNS]
    if spec.data.version_column:
        identifiers.append(spec.data.version_column)
    _refuse_code_cells(spec.data.cells, identifiers, path)
    _check_code_widths(df, levels, path)
    return levels, identifiers


def _joined_codes(df: pd.DataFrame, code: CodeSpec, level: str, path: Path) -> pd.Series:
    """A level's codes joined from several columns, each zero-padded to its width (declared,
    or the column's widest value), so ``"1"`` + ``"1"`` is the county ``"01001"`` whatever
    the reader did to the leading zeros.

    Raises
    ------
    DataError
        A missing column or code, or a code longer than its declared width (file, data row,
        column and level named).
    """
    parts = []
    widths = code.widths or (None,) * len(code.columns)
    for column, declared in zip(code.columns, widths, strict=True):
        if column not in df.columns:
            raise DataError(
                f"{path.name}: no column {column!r} for level {level!r} (joined from "
                f"{list(code.columns)}); the columns are {shown_columns(df.columns)}"
            )
        values = df[column]
        missing = values.isna().to_numpy().copy()
        if values.dtype.kind in "iu":
            text = values.astype(str)
        else:
            text = values.astype("string").str.strip()
            missing |= (text == "").fillna(True).to_numpy(dtype=bool)
            if values.dtype.kind == "f":
                raise DataError(
                    f"{path.name}: column {column!r} (level {level!r}) holds decimal numbers; "
                    "codes must be read as text or integers"
                )
        if missing.any():
            r = int(np.flatnonzero(missing)[0])
            raise DataError(
                f"{path.name}, data row {r + 1}, column {column!r}: missing code for level "
                f"{level!r}; every row needs a code at every level"
            )
        length = text.str.len().to_numpy()
        width = int(length.max()) if declared is None else declared
        long = np.flatnonzero(length > width)
        if long.size:
            r = int(long[0])
            raise DataError(
                f"{path.name}, data row {r + 1}, column {column!r}: code {text.iloc[r]!r} of "
                f"level {level!r} has {int(length[r])} characters, more than the declared "
                f"width {width}; fix the code or the width in [hierarchy] codes"
            )
        parts.append(text.str.zfill(width))
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out.astype(object)


def _check_joined_nesting(
    df: pd.DataFrame, levels: Sequence[LevelSpec], spec: RunSpec, path: Path
) -> None:
    """A joined code must extend its parent level's code (a county ``"01001"`` extends its
    state ``"01"``); otherwise its columns are listed in the wrong order or miss the
    parent's."""
    for above, below in zip(levels, levels[1:], strict=False):
        code = spec.hierarchy.codes[below.name]
        if not code.columns or above.column not in df.columns:
            continue
        parent = df[above.column].astype("string")
        if above.prefix is not None:
            parent = parent.str.slice(0, above.prefix)
        child = np.asarray(df[below.column].to_numpy(dtype=str), dtype=STRING_DTYPE)
        ok = np.strings.startswith(child, np.asarray(parent.to_numpy(dtype=str), STRING_DTYPE))
        if not ok.all():
            r = int(np.flatnonzero(~ok)[0])
            raise DataError(
                f"{path.name}, data row {r + 1}, columns {list(code.columns)}: the code "
                f"{str(child[r])!r} of level {below.name!r} does not extend the code "
                f"{str(parent.iloc[r])!r} of level {above.name!r} (column {above.column!r}); "
                "list the parent's columns first in [hierarchy] codes"
            )


def _refuse_code_cells(patterns: Sequence[str], identifiers: Sequence[str], path: Path) -> None:
    """A cell name or pattern that matches a code (identifier) column is refused: codes are
    not counts, and privatizing one would publish a noisy code as if it were a count."""
    for pat in patterns:
        hit = [c for c in dict.fromkeys(identifiers) if fnmatch.fnmatchcase(str(c), pat)]
        if hit:
            raise DataError(
                f"{path.name}: cell pattern {pat!r} matches the code column {hit[0]!r}; codes "
                "are not counts: name the count columns (or a pattern matching only them)"
            )


def _check_code_widths(df: pd.DataFrame, levels: Sequence[LevelSpec], path: Path) -> None:
    """Refuse code columns cut into levels by prefix whose codes differ in width.

    A prefix (state = the first 2 characters of a 5-character county FIPS) only means
    something when every code of the column has the same width; a code that lost a leading
    zero (``1001`` for ``01001``, a FIPS or GISJOIN read as a number) would otherwise nest
    under the wrong parent (state ``10``) without any error.
    """
    for column in dict.fromkeys(lv.column for lv in levels if lv.prefix is not None):
        if column not in df.columns or pd.api.types.is_numeric_dtype(df[column].dtype):
            continue  # missing or numeric columns are refused by the hierarchy builder
        width = df[column].astype("string").str.len().to_numpy(dtype=float, na_value=np.nan)
        known = width[~np.isnan(width)]
        if known.size == 0:
            continue
        values, counts = np.unique(known, return_counts=True)
        if values.size > 1:
            common = int(values[np.argmax(counts)])
            r = int(np.flatnonzero(~np.isnan(width) & (width != common))[0])
            raise _width_error(path, r, column, str(df[column].iloc[r]), common)


def _width_error(path: Path, row: int, column: str, code: str, width: int) -> DataError:
    return DataError(
        f"{path.name}, data row {row + 1}, column {column!r}: code {code!r} has {len(code)} "
        f"characters where the column's codes have {width}; a leading zero was probably lost "
        f"(codes read as numbers): read the codes as text and zero-pad them to {width} "
        "characters"
    )


def load_data(spec: RunSpec, data: str | Path | None = None) -> RunData:
    """The run's confidential table; ``data`` overrides ``[data] path``.

    Raises
    ------
    DataError, HierarchyError, SpecError
        Missing or malformed files, levels that do not nest, specs that do not fit the data.
    """
    source = spec.data.source
    path = Path(data) if data is not None else spec.data.path
    levels = spec.hierarchy.levels
    if source == "midwest":
        if len(levels) != 3:
            raise SpecError(
                f"{spec.source}: the midwest data has three levels (root, state, county), "
                f"[hierarchy] levels has {len(levels)}"
            )
        table = Table.from_midwest()
        cells = list(spec.data.cells) or list(MIDWEST_CELLS)
        if cells != list(table.cells):
            table = table.subset_cells(cells)
        return RunData(_renamed(table, levels), source)
    if source == "synthetic":
        from censusdp.hierarchy.synthetic import synthetic_us

        return RunData(_renamed(synthetic_us(0), levels), source)
    if path is None:
        raise SpecError(
            f"{spec.source}: [data] path is required for source {source!r} (or pass --data)"
        )
    if source == "ppmf":
        return RunData(_ppmf_table(spec, path), source)
    if source == "nhgis":
        batch = read_batch(
            path,
            cells=list(spec.data.cells) or None,
            version_column=spec.data.version_column or "version",
            truth_version=spec.data.truth,
            encoding=spec.data.encoding,
        )
        below = levels[1:]
        layouts = gisjoin.check_hierarchy_levels(below, f"{spec.source}: hierarchy.levels")
        # rows of upper levels (state rows beside county rows) are nodes of the hierarchy
        by_level = spine_rows(batch, below)
        leaf = by_level[below[-1]]
        if leaf.size == 0:
            raise DataError(f"{path.name}: no row is a {below[-1]} (the hierarchy's leaf level)")
        gisjoin.parse(
            batch.gisjoin[leaf],
            below[-1],
            source=path.name,
            rows=batch.unit_rows[leaf],
            column=batch.gisjoin_column,
        )
        h, leaf_row = from_gisjoin(
            batch.gisjoin[leaf],
            [(lv, lay.length) for lv, lay in zip(below, layouts, strict=True)],
            root_name=levels[0],
            root_code="root",
            source=path.name,
        )
        leaf_row = leaf[leaf_row]
        counts = batch.truth[leaf_row]
        upper = upper_rows(batch, h, counts, by_level)
        return RunData(Table(h, tuple(batch.cells), counts), source, batch, leaf_row, upper)
    return RunData(_file_table(spec, path), source)


def _ppmf_table(spec: RunSpec, path: Path) -> Table:
    """A PPMF's block × ``pl94`` table (dense: 2,016 int64 per block, 16 KB; a county of a
    few thousand blocks is tens of MB, a large state several GB — for those, use
    :func:`censusdp.pipelines.io.ppmf.read_ppmf`'s sparse histogram partition by partition)."""
    from censusdp.pipelines.io.ppmf import read_ppmf

    got = read_ppmf(path)
    n = got.hierarchy.leaves.size
    table = Table(got.hierarchy, got.schema.cells, got.dense().reshape(n, -1))
    table = _renamed(table, spec.hierarchy.levels)
    if spec.data.cells:
        table = table.subset_cells(list(spec.data.cells))
    return table


def _renamed(table: Table, levels: tuple[str, ...]) -> Table:
    """The table with the spec's level names (the data fixes the shape, the spec the names)."""
    h = table.hierarchy
    if len(levels) != h.depth:
        raise SpecError(
            f"the data has {h.depth} levels {list(h.names)}, the spec names {len(levels)}"
        )
    if tuple(levels) == h.names:
        return table
    from censusdp.hierarchy.core import Hierarchy, Level

    renamed = Hierarchy(
        [
            Level(n, lv.codes, lv.parent, lv.child_start, lv.child_count)
            for n, lv in zip(levels, h.levels, strict=True)
        ]
    )
    return Table(renamed, table.cells, table.leaf_counts)


#: An NHGIS wide file's confidential column of a cell: ``<code>_sf``.
_SF_COLUMN = re.compile(r"^(?P<code>.+)_sf$", re.IGNORECASE)


def read_geography(
    spec: RunSpec, data: str | Path | None = None
) -> tuple[Hierarchy, tuple[str, ...]]:
    """The run's hierarchy and cell names from its public geography alone: the header and
    the code columns of the data file (``data`` overrides ``[data] path``), never a count;
    the embedded (``midwest``) and generated (``synthetic``) sources' own. What
    ``censusdp predict`` and ``allocate`` need to choose a budget before spending it.

    Raises
    ------
    SpecError
        No data file named, or a source whose geography is not in code columns (``ppmf``:
        its spec route reads a public block list).
    DataError, HierarchyError
        No such file, missing or malformed code columns, levels that do not nest (file,
        data row and column named, as :func:`load_data`).
    """
    source = spec.data.source
    if not SOURCES.get(source).file:  # embedded or generated: the table itself is public
        table = load_data(spec).table
        return table.hierarchy, table.cells
    path = Path(data) if data is not None else spec.data.path
    if path is None:
        raise SpecError(
            f"{spec.source}: data.path: missing; the hierarchy is read from the code columns "
            "of the data file (never its counts): give [data] path or --data FILE"
        )
    if not path.is_file():
        raise DataError(
            f"{path}: no such file; the hierarchy is read from its code columns (never its "
            "counts): check [data] path or --data"
        )
    if source == "ppmf":
        raise SpecError(
            f"{spec.source}: data.source: a PPMF's geography comes from a public block list; "
            'write the spec for the PPMF route (its [hierarchy] blocks = "FILE")'
        )
    header = _header(path, source, spec.data.encoding)
    if source == "nhgis":
        return _gisjoin_geography(spec, path, header)
    wanted = {c for code in spec.hierarchy.codes.values() for c in code.columns or (code.column,)}
    wanted |= {spec.data.version_column} if spec.data.version_column else set()
    wanted |= {c for c in header if c.lower() in CONTEXT_COLUMNS}
    df = _read_table_file(path, source, spec.data.encoding, [c for c in header if c in wanted])
    df = _truth_rows(spec, df, path)
    levels, identifiers = _code_levels(spec, df, path)
    available = [c for c in header if c not in identifiers]
    cells = (
        resolve_cells(spec.data.cells, available, source=path.name)
        if spec.data.cells
        else available
    )

    h, _ = from_columns(
        df, levels, root_name=spec.hierarchy.levels[0], root_code="root", source=path.name
    )
    return h, tuple(cells)


def _gisjoin_geography(
    spec: RunSpec, path: Path, header: list[str]
) -> tuple[Hierarchy, tuple[str, ...]]:
    """An NHGIS batch file's hierarchy from its ``gisjoin`` column (the leaf rows: rows of
    upper levels are not leaves) and its cells from the header (``<code>_sf`` of a wide
    file, the non-key columns of a long one)."""
    column, version = "gisjoin", spec.data.version_column or "version"
    if column not in header:
        raise DataError(
            f"{path.name}: no {column!r} column (columns: {shown_columns(header)}); NHGIS "
            "files key units by GISJOIN"
        )
    long = version in header
    keys = [c for c in header if c.lower() in CONTEXT_COLUMNS or c == column]
    if path.suffix.lower() in (".parquet", ".pq"):
        df = read_parquet_table(path, columns=[column, *([version] if long else [])])
    else:
        raw = path.read_bytes()
        try:
            text = raw.decode(spec.data.encoding or "utf-8-sig")
        except (UnicodeDecodeError, LookupError):
            if spec.data.encoding is not None:
                raise DataError(
                    f"{path.name}: cannot decode as {spec.data.encoding!r}; set [data] encoding "
                    "to the file's real encoding"
                ) from None
            text = raw.decode("latin-1")
        df = read_csv_text(text, path, usecols=[column, *([version] if long else [])])
    if long:
        versions = df[version].astype(str).to_numpy(dtype=object)
        truth = spec.data.truth
        if truth is None:
            sf = sorted({v for v in versions if v.startswith("sf")})
            if len(sf) != 1:
                raise DataError(
                    f"{path.name}: cannot tell which version is the input among "
                    f"{sorted(set(versions))[:10]}; set [data] truth"
                )
            truth = sf[0]
        df = df[versions == truth].reset_index(drop=True)
        if df.empty:
            raise DataError(f"{path.name}: no rows of version {truth!r} in column {version!r}")
        available = [c for c in header if c not in keys and c != version]
    else:
        available = [m["code"] for c in header if (m := _SF_COLUMN.match(c))]
    cells = (
        resolve_cells(spec.data.cells, available, source=path.name)
        if spec.data.cells
        else available
    )
    codes = df[column]
    blank = np.flatnonzero(codes.isna().to_numpy() | (codes.astype(str).str.strip() == ""))
    if blank.size:
        raise DataError(
            f"{path.name}, data row {int(blank[0]) + 1}, column {column!r}: missing GISJOIN; "
            "every row needs its unit's code"
        )
    codes = codes.astype(str).to_numpy(dtype=object)
    below = spec.hierarchy.levels[1:]
    layouts = gisjoin.check_hierarchy_levels(below, f"{spec.source}: hierarchy.levels")
    arr = pa.array(codes.tolist(), type=pa.string())
    upper = np.zeros(codes.size, dtype=bool)  # rows of upper levels (states beside counties)
    for lay in layouts[:-1]:
        hit = pc.fill_null(pc.match_substring_regex(arr, lay.pattern), False)
        upper |= hit.to_numpy(zero_copy_only=False)
    leaf = np.flatnonzero(~upper)
    if leaf.size == 0:
        raise DataError(f"{path.name}: no row is a {below[-1]} (the hierarchy's leaf level)")
    gisjoin.parse(codes[leaf], below[-1], source=path.name, rows=leaf, column=column)
    h, _ = from_gisjoin(
        codes[leaf],
        [(lv, lay.length) for lv, lay in zip(below, layouts, strict=True)],
        root_name=spec.hierarchy.levels[0],
        root_code="root",
        source=path.name,
    )
    return h, tuple(cells)
