"""NHGIS-style batch files in and out.

Two layouts are recognised:

* **wide** — one row per geographic unit, keyed by a GISJOIN column, with NHGIS table codes
  carrying a suffix per version: ``<code>_sf`` (Summary File: the confidential input) and
  ``<code>_dp`` (a demonstration/noisy version), as in the IPUMS NHGIS privacy-protected
  demonstration data (PPDD) files;
* **long** — one row per unit and version, with a ``version`` column (e.g. ``sf2010``,
  ``ppdd_20200527``) and one column per cell.

The output keeps the input's layout and rows. Its columns are an allow-list: the identifier
columns NHGIS defines (:data:`CONTEXT_COLUMNS`: GISJOIN, names, state and county codes, ...),
the released cells (wide: ``<code>_dp``; long: the cell columns of rows of version
``censusdp``) and their ``<cell>_se`` standard errors — nothing else. Every other column (the
confidential ``_sf`` columns however they are spelled, ``pop_sf2010``, unreleased cells,
unknown extras) is dropped, and :func:`write_batch` names the dropped columns (never their
values) in a :class:`ColumnsNotWritten` warning.

Input is refused rather than guessed at: a column name that occurs twice (pandas would read
the second as ``name.1``), two spellings of one confidential column (``H78003_sf`` and
``H78003_SF``), a cell pattern that matches an identifier column, and counts that are not
non-negative integers in the int64 range (parsed exactly, never through float64).

NHGIS extracts may be latin-1 encoded: the reader tries UTF-8 and falls back to latin-1 when
no encoding is given. A row of empty fields (the PPDD extracts put one after the header)
holds no unit and is skipped.

A file may hold rows of several summary levels (counties and the places in them), so one
person may be counted in several rows; :func:`row_geography` tells each row's level from
its GISJOIN and the file's identifier columns (``GEO_ID``, ``PLACEA``, ..., or a declared
level), for privacy statements that compose over the levels
(:func:`censusdp.hierarchy.gisjoin.row_levels`). For a hierarchy route, rows of its upper
levels are its nodes (:func:`spine_rows`, :func:`upper_rows`: each must be the sum of the
leaf rows under it).

References
----------
Van Riper, Kugler & Schroeder, IPUMS NHGIS Privacy-Protected 2010 Census Demonstration Data,
version 20200527, Minneapolis, MN: IPUMS, 2020.
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from censusdp.atomic import atomic_file
from censusdp.errors import DataError
from censusdp.hierarchy import gisjoin
from censusdp.hierarchy.core import Hierarchy
from censusdp.hierarchy.validate import parse_counts
from censusdp.spreadsheet import write_csv
from censusdp.tabular import PARQUET_SUFFIXES, read_csv_text, read_parquet_table, shown_columns

__all__ = [
    "BatchFile",
    "CONTEXT_COLUMNS",
    "ColumnsNotWritten",
    "read_batch",
    "row_geography",
    "spine_rows",
    "upper_rows",
    "write_batch",
]

_SUFFIX = re.compile(r"^(?P<code>.+)_(?P<version>sf|dp)$", re.IGNORECASE)

#: Identifier ("context") columns of NHGIS files, compared case-insensitively: the PPDD
#: codebook's context fields (gisjoin, state, name), the geographic codes of NHGIS extracts
#: (``STATEA``, ``COUNTYA``, ..., the school, legislative and congressional district codes of
#: the off-spine levels of :mod:`censusdp.hierarchy.gisjoin`) and the code columns of the
#: long files in ``../data``.
#: Only these, the released cells and their ``_se`` columns are ever written.
CONTEXT_COLUMNS = frozenset(
    {
        "gisjoin",
        "county_gisjoin",
        "year",
        "name",
        "name_e",
        "state",
        "statea",
        "stusab",
        "regiona",
        "divisiona",
        "county",
        "countya",
        "cousuba",
        "placea",
        "tracta",
        "blkgrpa",
        "blocka",
        "aianhha",
        "sdelma",
        "sdseca",
        "sdunia",
        "sldua",
        "sldla",
        "cda",
        "cdcurra",
        "cbsaa",
        "geoid",
        "geo_id",
        "sumlev",
        "fips",
    }
)


class ColumnsNotWritten(UserWarning):
    """Input columns that are neither identifiers nor released cells, hence not written."""


@dataclass(eq=False)
class BatchFile:
    """A batch file read into memory.

    Attributes
    ----------
    path : Path
    frame : pandas.DataFrame
        The file as read, every column as strings (keys keep their leading zeros).
    layout : {"wide", "long"}
    encoding : str
        The encoding the file was decoded with.
    key_columns : list of str
        Identifier columns kept in the output: the GISJOIN column and the
        :data:`CONTEXT_COLUMNS` present in the file.
    cells : list of str
        Cell names: NHGIS table codes (wide) or cell column names (long).
    gisjoin : numpy.ndarray
        The unit codes, one per unit, in output row order.
    truth : numpy.ndarray
        int64 (n_units, n_cells): the confidential input counts.
    unit_rows : numpy.ndarray
        Row positions in ``frame`` of each unit's key columns (the truth rows for long files).
    version_column : str or None
    dropped : list of str
        Input columns that are neither key columns nor released cells: never written.
    gisjoin_column : str
    """

    path: Path
    frame: pd.DataFrame
    layout: str
    encoding: str
    key_columns: list[str]
    cells: list[str]
    gisjoin: np.ndarray
    truth: np.ndarray
    unit_rows: np.ndarray
    version_column: str | None = None
    dropped: list[str] | None = None
    gisjoin_column: str = "gisjoin"


def _decode(path: Path, encoding: str | None) -> tuple[str, str]:
    raw = path.read_bytes()
    if encoding is not None:
        try:
            return raw.decode(encoding), encoding
        except (UnicodeDecodeError, LookupError) as exc:
            where = f" at byte {exc.start}" if isinstance(exc, UnicodeDecodeError) else ""
            raise DataError(
                f"{path.name}: cannot decode as {encoding!r}{where}; omit the encoding to "
                "auto-detect (UTF-8, then latin-1) or give the file's real encoding"
            ) from None
    try:
        return raw.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        return raw.decode("latin-1"), "latin-1"


def _read_frame(path: Path, encoding: str | None) -> tuple[pd.DataFrame, str]:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return _as_text(read_parquet_table(path)), "parquet"
    text, enc = _decode(path, encoding)
    return read_csv_text(text, path), enc


def _as_text(df: pd.DataFrame) -> pd.DataFrame:
    """Every column as strings (missing values as None); integers keep every digit."""
    out = {}
    for c in df.columns:
        col = df[c]
        text = col.astype(object).map(str) if col.dtype.kind in "iu" else col.astype(str)
        out[c] = text.where(col.notna(), None)
    return pd.DataFrame(out, columns=df.columns)


def _match_cells(
    available: Sequence[str],
    wanted: Sequence[str] | None,
    path: Path,
    identifiers: Sequence[str] = (),
) -> list[str]:
    for pat in wanted or ():
        codes = [c for c in identifiers if fnmatch.fnmatchcase(c, pat)]
        if codes:
            raise DataError(
                f"{path.name}: cell pattern {pat!r} matches the identifier column {codes[0]!r}; "
                "codes are not counts: name the count columns (or a pattern matching only them)"
            )
    if not wanted:
        return list(available)
    out: list[str] = []
    for pat in wanted:
        hit = [c for c in available if fnmatch.fnmatchcase(c, pat)]
        if not hit:
            raise DataError(
                f"{path.name}: cell pattern {pat!r} matches no column; available cells: {list(available)}"
            )
        out.extend(c for c in hit if c not in out)
    return out


def _to_counts(
    df: pd.DataFrame, columns: Sequence[str], rows: np.ndarray, path: Path
) -> np.ndarray:
    """Parse count columns exactly (never through float64), refusing missing, non-integer,
    negative and out-of-int64 values by data row and column."""
    out = np.empty((rows.size, len(columns)), dtype=np.int64)
    for j, col in enumerate(columns):
        raw = df[col].to_numpy(dtype=object)[rows]
        out[:, j] = parse_counts(pd.Series(raw, dtype=object), col, source=path.name, rows=rows)
    return out


def _nonblank_rows(df: pd.DataFrame) -> np.ndarray:
    """Positions of the rows with at least one non-empty field.

    NHGIS extracts may follow the header with a row of empty fields (the PPDD files do);
    such a row holds no unit and is skipped. Data row numbers in messages stay those of the
    file.
    """
    blank = df.isna().all(axis=1).to_numpy()
    return np.flatnonzero(~blank)


def _check_gisjoin(codes: np.ndarray, rows: np.ndarray, path: Path, column: str) -> None:
    missing = np.flatnonzero(pd.isna(codes) | (codes == ""))
    if missing.size:
        raise DataError(f"{path.name}, data row {int(rows[missing[0]]) + 1}: empty {column!r}")
    series = pd.Series(codes)
    dup = series.duplicated(keep=False).to_numpy()
    if dup.any():
        first = np.flatnonzero(dup)
        code = str(codes[first[0]])
        where = [int(rows[i]) + 1 for i in first if codes[i] == code][:3]
        raise DataError(
            f"{path.name}: duplicate {column} {code!r} in data rows {where}; each unit must appear "
            "once per version"
        )


def read_batch(
    path: str | Path,
    *,
    cells: Sequence[str] | None = None,
    gisjoin_column: str = "gisjoin",
    version_column: str = "version",
    truth_version: str | None = None,
    encoding: str | None = None,
) -> BatchFile:
    """Read an NHGIS-style batch file (CSV or Parquet), wide or long.

    Parameters
    ----------
    path : path-like
    cells : sequence of str, optional
        Cell names or glob patterns (table codes without suffix in wide files, e.g.
        ``["H78003", "H78024"]`` or ``["H78*"]``); default: all.
    gisjoin_column : str
    version_column : str
        Column naming the version in long files.
    truth_version : str, optional
        Long files: the version holding the confidential input (default ``sf2010`` if
        present, else the single version starting with ``sf``).
    encoding : str, optional
        Force an encoding; default: UTF-8, falling back to latin-1.

    Raises
    ------
    DataError
        Missing key column, no cells, duplicate GISJOIN, bad counts, undecodable file.
    """
    path = Path(path)
    df, enc = _read_frame(path, encoding)
    if gisjoin_column not in df.columns:
        raise DataError(
            f"{path.name}: no {gisjoin_column!r} column (columns: {shown_columns(df.columns)}); NHGIS files key "
            "units by GISJOIN"
        )
    keys = [c for c in df.columns if c.lower() in CONTEXT_COLUMNS or c == gisjoin_column]

    def batch(
        layout: str,
        chosen: list[str],
        counted: list[str],
        rows: np.ndarray,
        dropped: list[str],
        version: str | None = None,
    ) -> BatchFile:
        """The units of ``rows``: GISJOINs checked, ``counted`` columns read as counts."""
        codes = df[gisjoin_column].to_numpy(dtype=object)[rows]
        _check_gisjoin(codes, rows, path, gisjoin_column)
        truth = _to_counts(df, counted, rows, path)
        return BatchFile(path, df, layout, enc, keys, chosen, codes.astype(str), truth, rows,
                         version, dropped, gisjoin_column)  # fmt: skip

    if version_column in df.columns:
        versions = df[version_column].to_numpy(dtype=object)
        if truth_version is None:
            uniq = sorted({str(v) for v in versions})
            sf = [v for v in uniq if v.startswith("sf")]
            if len(sf) != 1:
                raise DataError(
                    f"{path.name}: cannot tell which version is the input among {uniq}; set truth_version"
                )
            truth_version = sf[0]
        rows = np.flatnonzero(versions == truth_version)
        if rows.size == 0:
            raise DataError(
                f"{path.name}: no rows of version {truth_version!r} in column {version_column!r}"
            )
        candidates = [c for c in df.columns if c not in keys and c != version_column]
        chosen = _match_cells(candidates, cells, path, [*keys, version_column])
        dropped = [c for c in candidates if c not in chosen]
        return batch("long", chosen, chosen, rows, dropped, version_column)

    versions_of: dict[str, dict[str, str]] = {}
    for c in df.columns:
        m = _SUFFIX.match(c)
        if m:
            code, version = m["code"], m["version"].lower()
            other = versions_of.setdefault(code, {}).get(version)
            if other is not None:
                raise DataError(
                    f"{path.name}: columns {other!r} and {c!r} both hold the {version!r} "
                    f"version of {code!r}; keep one of them"
                )
            versions_of[code][version] = c
    complete = [code for code, vers in versions_of.items() if "sf" in vers]
    if not complete:
        raise DataError(
            f"{path.name}: neither a {version_column!r} column (long layout) nor <code>_sf columns "
            "(wide layout) found; name the confidential columns <code>_sf"
        )
    chosen = _match_cells(complete, cells, path, keys)
    own = {col for c in chosen for col in versions_of[c].values()}
    dropped = [c for c in df.columns if c not in keys and c not in own]
    sf = [versions_of[c]["sf"] for c in chosen]
    return batch("wide", chosen, sf, _nonblank_rows(df), dropped)


def write_batch(
    batch: BatchFile,
    values: np.ndarray,
    standard_errors: np.ndarray | None,
    out: str | Path,
    *,
    version_label: str = "censusdp",
    margins_of_error: np.ndarray | None = None,
    metadata: Mapping[str, object] | None = None,
    geography: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write the release in the input's layout (atomically).

    ``values`` and ``standard_errors`` are (n_units, n_cells) in the batch's unit order.
    Wide: key columns, ``<cell>_dp`` = release, ``<cell>_se``. Long: key columns, the
    version column = ``version_label``, cell columns = release, ``<cell>_se``. With
    ``margins_of_error`` (same shape) a ``<cell>_moe`` follows each ``<cell>_se``; with
    ``metadata`` a Parquet output carries it in its key-value metadata
    (:func:`censusdp.pipelines.io.outputs.write_parquet`); ``geography`` (column → one code
    per unit, e.g. the ancestors' GISJOINs) is written after the key columns. Nothing else is
    written; the input columns left out are named in a :class:`ColumnsNotWritten` warning.
    """
    out = Path(out)
    if batch.dropped:
        warnings.warn(
            f"{batch.path.name}: not written (neither identifiers nor released cells): "
            + ", ".join(batch.dropped),
            ColumnsNotWritten,
            stacklevel=2,
        )
    n, k = batch.truth.shape
    values = np.asarray(values)
    if values.shape != (n, k):
        raise ValueError(f"values must be ({n}, {k}), got {values.shape}")
    keys = batch.frame[batch.key_columns].iloc[batch.unit_rows].reset_index(drop=True)
    for name, codes in (geography or {}).items():
        keys[name] = np.asarray(codes, dtype=object)
    cols: dict[str, np.ndarray] = {}
    for j, c in enumerate(batch.cells):
        name = f"{c}_dp" if batch.layout == "wide" else c
        cols[name] = values[:, j]
        if standard_errors is not None:
            cols[f"{c}_se"] = np.asarray(standard_errors)[:, j]
        if margins_of_error is not None:
            cols[f"{c}_moe"] = np.asarray(margins_of_error)[:, j]
    body = pd.DataFrame(cols)
    if batch.layout == "long":
        keys.insert(len(keys.columns), batch.version_column, version_label)
    table = pd.concat([keys, body], axis=1)
    with atomic_file(out) as tmp:
        if out.suffix.lower() in (".parquet", ".pq") and metadata is not None:
            from censusdp.pipelines.io.outputs import write_parquet

            write_parquet(table, tmp, metadata)
        elif out.suffix.lower() in (".parquet", ".pq"):
            table.to_parquet(tmp, index=False)
        else:
            enc = "utf-8" if batch.encoding == "parquet" else batch.encoding
            write_csv(table, tmp, index=False, encoding=enc)
    return out


def _column(frame: pd.DataFrame, name: str, path: Path) -> str | None:
    """The column spelled ``name`` in any case, or None; two spellings are refused."""
    hits = [c for c in frame.columns if str(c).lower() == name]
    if len(hits) > 1:
        raise DataError(
            f"{path.name}: columns {hits[0]!r} and {hits[1]!r} both hold {name.upper()}; keep one"
        )
    return hits[0] if hits else None


def row_geography(
    batch: BatchFile,
    *,
    level: str | None = None,
    level_column: str | None = None,
    fix: str = gisjoin.DECLARE_LEVEL,
) -> gisjoin.RowLevels:
    """The summary level of every unit (row) of ``batch``.

    Parameters
    ----------
    batch : BatchFile
    level : str, optional
        Every row is of this level (a name of :data:`censusdp.hierarchy.gisjoin.LAYOUTS`,
        an alias or a SUMLEV code); checked against the codes.
    level_column : str, optional
        A column of the file holding each row's level name or SUMLEV code.
    fix : str
        How to declare the level, for the refusal.

    Returns
    -------
    censusdp.hierarchy.gisjoin.RowLevels
        In the batch's unit order.

    Raises
    ------
    DataError
        A row whose level cannot be told, or whose code does not fit its declared or
        ``GEO_ID`` level (naming the file, data row and column); ``level`` and
        ``level_column`` both given; a ``level_column`` the file lacks.
    """
    path = batch.path
    rows = batch.unit_rows
    common = {
        "source": path.name,
        "rows": rows,
        "column": batch.gisjoin_column,
        "fix": fix,
    }
    if level is not None and level_column is not None:
        raise DataError(
            f"{path.name}: give the rows' level once: a level for the whole file or a "
            "level column, not both"
        )
    if level is not None:
        return gisjoin.row_levels(batch.gisjoin, declared=str(level), **common)
    if level_column is not None:
        if level_column not in batch.frame.columns:
            raise DataError(
                f"{path.name}: no column {level_column!r} (the declared level column); "
                f"columns: {list(batch.frame.columns)}"
            )
        values = batch.frame[level_column].to_numpy(dtype=object)[rows]
        return gisjoin.row_levels(
            batch.gisjoin, declared=values, declared_column=level_column, **common
        )
    geoid = None
    for name in ("geo_id", "geoid"):
        col = _column(batch.frame, name, path)
        if col is not None:
            geoid = (col, batch.frame[col].to_numpy(dtype=object)[rows])
            break
    identifiers = {}
    for lay in gisjoin.LAYOUTS:
        col = _column(batch.frame, lay.identifier, path)
        if col is not None:
            identifiers[lay.identifier] = (col, batch.frame[col].to_numpy(dtype=object)[rows])
    return gisjoin.row_levels(batch.gisjoin, geoid=geoid, identifiers=identifiers, **common)


def spine_rows(batch: BatchFile, levels: Sequence[str]) -> dict[str, np.ndarray]:
    """The rows of each hierarchy level in a file that may hold several nested levels.

    A file for a ``state → county`` hierarchy may hold state rows beside its county rows.
    Every row is given to the level (of ``levels``, on-spine, top first) whose GISJOIN
    layout it fits (their lengths differ); a row that fits none goes with the last (leaf)
    level, whose parse names what is wrong with it.

    Parameters
    ----------
    batch : BatchFile
    levels : sequence of str
        The hierarchy's levels below the root (checked by
        :func:`censusdp.hierarchy.gisjoin.check_hierarchy_levels`).

    Returns
    -------
    dict of level → numpy.ndarray
        Positions (in the batch's unit order) of each level's rows, every level present.
    """
    arr = pa.array(np.asarray(batch.gisjoin, dtype=object).tolist(), type=pa.string())
    owner = np.full(len(arr), len(levels) - 1, dtype=np.int64)
    for k, lv in enumerate(levels[:-1]):
        hit = pc.fill_null(pc.match_substring_regex(arr, gisjoin.layout(lv).pattern), False)
        owner[hit.to_numpy(zero_copy_only=False)] = k
    return {lv: np.flatnonzero(owner == k) for k, lv in enumerate(levels)}


def upper_rows(
    batch: BatchFile, hierarchy: Hierarchy, leaf_counts: np.ndarray, rows: dict[str, np.ndarray]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The hierarchy nodes that a file's rows of upper levels are, checked against the leaves.

    Parameters
    ----------
    batch : BatchFile
    hierarchy : Hierarchy
        Built from the leaf rows.
    leaf_counts : numpy.ndarray
        The leaves' counts, in the hierarchy's leaf order.
    rows : dict of level → positions
        From :func:`spine_rows`; the leaf level's entry is ignored.

    Returns
    -------
    dict of level index → (positions, nodes)
        For each upper level with rows: the rows' positions in the batch's unit order and
        the node (index into that level of ``hierarchy``) each row is.

    Raises
    ------
    DataError
        A row of an upper level with no leaf row under it, or whose counts are not the sum
        of the leaf rows under it (the file lacks some of its parts, or the row counts
        others) — naming the data row and code, never a count.
    """
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    leaf = hierarchy.depth - 1
    for name, pos in rows.items():
        k = hierarchy.level_index(name)
        if k == leaf or pos.size == 0:
            continue
        below = hierarchy.levels[leaf].name
        codes = hierarchy.levels[k].codes.astype(object)
        nodes = pd.Index(codes).get_indexer(batch.gisjoin[pos].astype(object))
        where = batch.path.name
        if (nodes < 0).any():
            i = int(pos[np.flatnonzero(nodes < 0)[0]])
            raise DataError(
                f"{where}, data row {int(batch.unit_rows[i]) + 1}: {name} "
                f"{str(batch.gisjoin[i])!r} has no {below} row under it in the file, so the "
                f"hierarchy has no such node; add the {below} rows it holds or drop the row"
            )
        counts = leaf_counts
        for j in range(leaf, k, -1):
            counts = hierarchy.aggregate_up(j, counts, cells=batch.cells)
        bad = np.flatnonzero((batch.truth[pos] != counts[nodes]).any(axis=1))
        if bad.size:
            i = int(pos[bad[0]])
            raise DataError(
                f"{where}, data row {int(batch.unit_rows[i]) + 1}: the {name} row "
                f"{str(batch.gisjoin[i])!r} is not the sum of the {below} rows under it in the "
                f"file (some are missing, or the row counts others), so it is not the "
                f"hierarchy's {name} node; keep the rows of one level or add the missing ones"
            )
        out[k] = (pos, nodes)
    return out
