"""Reading tabular input files (CSV as text, Parquet) with errors a user can act on.

Every reader of user files goes through here, so an empty file, a header without rows, a
row with more fields than the header, a duplicated column name or a corrupt Parquet file is
one :class:`~censusdp.errors.DataError` naming the file (and the row or column), never a
pandas or pyarrow traceback. Values are never quoted in messages: they may be confidential.
CSV columns are read as strings, so codes keep their leading zeros and counts can be parsed
exactly afterwards.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from censusdp.errors import DataError

__all__ = [
    "PARQUET_SUFFIXES",
    "parquet_columns",
    "read_csv_text",
    "read_parquet_table",
    "refuse_cr_line_ends",
    "refuse_duplicate_columns",
    "shown_columns",
]

PARQUET_SUFFIXES = (".parquet", ".pq")

_RAGGED = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def refuse_cr_line_ends(head: str | bytes, path: Path) -> None:
    """Refuse a file whose lines end in a bare carriage return (classic Mac OS): ``head`` is
    its start (at least its first line). Such a file reads as one long line, so its header
    would hold its data rows."""
    cr, lf = ("\r", "\n") if isinstance(head, str) else (b"\r", b"\n")
    first = head.split(lf, 1)[0].rstrip(cr)
    if cr in first:
        raise DataError(
            f"{path.name}: lines end in a bare carriage return (CR, old Mac OS line ends); "
            "convert the file to LF or CRLF line ends (e.g. tr '\\r' '\\n')"
        )


_NUMBERLIKE = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")


def shown_columns(names: Sequence[object], limit: int = 30) -> str:
    """The column names of a header for a message, or only their number when the "header"
    looks like a data record (a field that is a number: a file without its header line
    starts with one person's record, which no message may quote)."""
    names = [str(n) for n in names]
    if any(_NUMBERLIKE.fullmatch(n) for n in names):
        return f"{len(names)} columns (names not shown: the first line looks like data)"
    return str(names[:limit])


def refuse_duplicate_columns(names: Sequence[str], path: Path) -> None:
    """Refuse a column name that occurs twice (pandas would silently read ``name.1``)."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            what = "a column" if shown_columns(names).endswith("data)") else f"column {name!r}"
            raise DataError(
                f"{path.name}: {what} occurs twice in the header (columns "
                f"{seen[name] + 1} and {i + 1}); each column must occur once: remove or rename "
                "the duplicate (or is the header line missing?)"
            )
        seen[name] = i


def read_csv_text(
    text: str, path: Path, *, usecols: Sequence[str] | None = None, require_rows: bool = True
) -> pd.DataFrame:
    """The CSV ``text`` of ``path`` as a frame of strings (missing fields as NaN).

    Raises
    ------
    DataError
        The file is empty, has bare-CR line ends, a duplicated column name, a row with more
        fields than the header (named by its data row and line), or, with ``require_rows``,
        no data rows.
    """
    refuse_cr_line_ends(text[: 1 << 16], path)
    header = next(csv.reader(io.StringIO(text)), None)
    if not header or not any(h.strip() for h in header):
        raise DataError(f"{path.name}: empty file (no header row); give a CSV with a header line")
    refuse_duplicate_columns(header, path)
    try:
        df = pd.read_csv(
            io.StringIO(text),
            dtype=str,
            keep_default_na=False,
            na_values=[""],
            usecols=list(usecols) if usecols is not None else None,
        )
    except pd.errors.ParserError as exc:
        m = _RAGGED.search(str(exc))
        if m:
            want, line, saw = m.groups()
            raise DataError(
                f"{path.name}: data row {int(line) - 1} (line {line}) has {saw} fields, the "
                f"header has {want}; fix the row's delimiters or quoting"
            ) from None
        raise DataError(
            f"{path.name}: malformed CSV ({type(exc).__name__}); check quoting and delimiters"
        ) from None
    if require_rows and df.empty:
        raise DataError(f"{path.name}: a header but no data rows; the file holds no units")
    return df


def parquet_columns(path: Path) -> list[str]:
    """The column names of a Parquet file (its schema alone), refusing a corrupt file."""
    import pyarrow.parquet as pq

    try:
        names = list(pq.read_schema(path).names)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(
            f"{path.name}: not a readable Parquet file ({type(exc).__name__}); check the file"
        ) from None
    refuse_duplicate_columns(names, path)
    return names


def read_parquet_table(
    path: Path, *, columns: Sequence[str] | None = None, require_rows: bool = True
) -> pd.DataFrame:
    """A Parquet file as read by pandas, refusing corrupt files and duplicated columns."""
    parquet_columns(path)
    try:
        df = pd.read_parquet(path, columns=list(columns) if columns is not None else None)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(
            f"{path.name}: not a readable Parquet file ({type(exc).__name__}); check the file "
            "or the source it was declared as"
        ) from None
    if require_rows and df.empty:
        raise DataError(f"{path.name}: no data rows; the file holds no units")
    return df
