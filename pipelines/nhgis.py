"""NHGIS-style batch files in and out.

Two layouts are recognised:

* **wide** — one row per geographic unit, keyed by a GISJOIN column, with NHGIS table codes
  carrying a suffix per version: ``<code>_sf`` (Summary File: the confidential input) and
  ``<code>_dp`` (a demonstration/noisy version), as in the IPUMS NHGIS privacy-protected
  demonstration data (PPDD) files;
* **long** — one row per unit and version, with a ``version`` column (e.g. ``sf2010``,
  ``ppdd_20200527``) and one column per cell.

The output keeps the input's layout, rows and key columns, puts the release in place of the
noisy (``_dp``) columns (long: rows of version ``censusdp``), and adds ``<cell>_se`` standard
error columns. The confidential (``_sf`` / truth-version) values are never written out.

NHGIS extracts may be latin-1 encoded: the reader tries UTF-8 and falls back to latin-1 when
no encoding is given.

References
----------
Van Riper, Kugler & Schroeder, IPUMS NHGIS Privacy-Protected 2010 Census Demonstration Data,
version 20200527, Minneapolis, MN: IPUMS, 2020.
"""

from __future__ import annotations

import fnmatch
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.atomic import atomic_file
from censusdp.errors import DataError

__all__ = ["BatchFile", "read_batch", "write_batch", "GISJOIN_COUNTY"]

#: County GISJOIN: ``G`` + 2-digit state FIPS + ``0`` + 3-digit county FIPS + ``0``.
GISJOIN_COUNTY = re.compile(r"^G\d{2}0\d{3}0$")
_SUFFIX = re.compile(r"^(?P<code>.+)_(?P<version>sf|dp)$")


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
        Non-cell columns kept in the output (GISJOIN, name, state, fips, ...).
    cells : list of str
        Cell names: NHGIS table codes (wide) or cell column names (long).
    gisjoin : numpy.ndarray
        The unit codes, one per unit, in output row order.
    truth : numpy.ndarray
        int64 (n_units, n_cells): the confidential input counts.
    unit_rows : numpy.ndarray
        Row positions in ``frame`` of each unit's key columns (the truth rows for long files).
    version_column : str or None
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
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise DataError(
                f"{path.name}: not a readable Parquet file ({type(exc).__name__})"
            ) from None
        return df.astype(str).where(df.notna(), None), "parquet"
    text, enc = _decode(path, encoding)
    try:
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    except pd.errors.ParserError as exc:
        raise DataError(
            f"{path.name}: malformed CSV ({exc}); check quoting and delimiters"
        ) from None
    return df, enc


def _match_cells(available: Sequence[str], wanted: Sequence[str] | None, path: Path) -> list[str]:
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
    """Parse count columns, refusing missing, non-integer and negative values by row/column."""
    out = np.empty((rows.size, len(columns)), dtype=np.int64)
    for j, col in enumerate(columns):
        raw = df[col].to_numpy(dtype=object)[rows]
        num = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(num)
        if bad.any():
            i = int(rows[np.flatnonzero(bad)[0]])
            raise DataError(
                f"{path.name}, data row {i + 1}, column {col!r}: missing or non-numeric count"
            )
        frac = num != np.round(num)
        if frac.any():
            i = int(rows[np.flatnonzero(frac)[0]])
            raise DataError(
                f"{path.name}, data row {i + 1}, column {col!r}: count is not an integer"
            )
        neg = num < 0
        if neg.any():
            i = int(rows[np.flatnonzero(neg)[0]])
            raise DataError(f"{path.name}, data row {i + 1}, column {col!r}: count is negative")
        out[:, j] = num.astype(np.int64)
    return out


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
            f"{path.name}: no {gisjoin_column!r} column (columns: {list(df.columns)}); NHGIS files key "
            "units by GISJOIN"
        )
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
        keys = [
            c
            for c in df.columns
            if c in (gisjoin_column, "fips", "county_gisjoin", "name", "state")
        ]
        candidates = [c for c in df.columns if c not in keys and c != version_column]
        chosen = _match_cells(candidates, cells, path)
        codes = df[gisjoin_column].to_numpy(dtype=object)[rows]
        _check_gisjoin(codes, rows, path, gisjoin_column)
        truth = _to_counts(df, chosen, rows, path)
        return BatchFile(
            path, df, "long", enc, keys, chosen, codes.astype(str), truth, rows, version_column
        )

    pairs: dict[str, set[str]] = {}
    for c in df.columns:
        m = _SUFFIX.match(c)
        if m:
            pairs.setdefault(m["code"], set()).add(m["version"])
    complete = [code for code, vers in pairs.items() if "sf" in vers]
    if not complete:
        raise DataError(
            f"{path.name}: neither a {version_column!r} column (long layout) nor <code>_sf columns "
            "(wide layout) found; name the confidential columns <code>_sf"
        )
    chosen = _match_cells(complete, cells, path)
    keys = [c for c in df.columns if not _SUFFIX.match(c)]
    rows = np.arange(len(df))
    codes = df[gisjoin_column].to_numpy(dtype=object)
    _check_gisjoin(codes, rows, path, gisjoin_column)
    truth = _to_counts(df, [f"{c}_sf" for c in chosen], rows, path)
    return BatchFile(path, df, "wide", enc, keys, chosen, codes.astype(str), truth, rows)


def write_batch(
    batch: BatchFile,
    values: np.ndarray,
    standard_errors: np.ndarray | None,
    out: str | Path,
    *,
    version_label: str = "censusdp",
) -> Path:
    """Write the release in the input's layout (atomically).

    ``values`` and ``standard_errors`` are (n_units, n_cells) in the batch's unit order.
    Wide: key columns, ``<cell>_dp`` = release, ``<cell>_se``. Long: key columns, the
    version column = ``version_label``, cell columns = release, ``<cell>_se``.
    """
    out = Path(out)
    n, k = batch.truth.shape
    values = np.asarray(values)
    if values.shape != (n, k):
        raise ValueError(f"values must be ({n}, {k}), got {values.shape}")
    keys = batch.frame[batch.key_columns].iloc[batch.unit_rows].reset_index(drop=True)
    cols: dict[str, np.ndarray] = {}
    for j, c in enumerate(batch.cells):
        name = f"{c}_dp" if batch.layout == "wide" else c
        cols[name] = values[:, j]
        if standard_errors is not None:
            cols[f"{c}_se"] = np.asarray(standard_errors)[:, j]
    body = pd.DataFrame(cols)
    if batch.layout == "long":
        keys.insert(len(keys.columns), batch.version_column, version_label)
    table = pd.concat([keys, body], axis=1)
    with atomic_file(out) as tmp:
        if out.suffix.lower() in (".parquet", ".pq"):
            table.to_parquet(tmp, index=False)
        else:
            enc = "utf-8" if batch.encoding == "parquet" else batch.encoding
            table.to_csv(tmp, index=False, encoding=enc)
    return out
