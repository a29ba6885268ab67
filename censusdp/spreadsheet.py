"""CSV output that a spreadsheet opens as text: no formula injection from user strings.

A CSV cell that begins with ``=``, ``+``, ``-``, ``@`` (or a tab or carriage return) is read
by Excel, LibreOffice and Google Sheets as a formula, so an area code or name such as
``=HYPERLINK(...)`` or ``=cmd|' /C calc'!A0`` copied from an input file into an output would
run when the output is opened (OWASP, "CSV Injection"; CWE-1236). Every censusdp writer of a
CSV holding strings that came from a user (codes, names, column names, level and estimator
names from a spec) writes it with :func:`write_csv`, which escapes such a text cell as the
spreadsheet tools expect: a leading apostrophe (``'=1+1``, shown as the text ``=1+1``), and
the file's text cells quoted. Only text cells are touched: numeric columns are written as
they are (``-5`` stays the number -5), and a text cell that is a plain decimal number
(``-5``, ``+3.2e4``) is not a formula and stays as it is. A file with nothing to escape is
byte for byte what :meth:`pandas.DataFrame.to_csv` writes.

The escape is vectorised (one regular-expression match per text column) and reversible:
:func:`unescape_cell` removes it.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["FORMULA_START", "escape_cell", "spreadsheet_safe", "unescape_cell", "write_csv"]

#: Characters that make a spreadsheet read a cell as a formula when they begin it.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")

_TRIGGER = re.compile(r"[=+\-@\t\r]")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def escape_cell(text: str) -> str:
    """``text`` with a leading apostrophe when a spreadsheet would read it as a formula
    (it begins with one of :data:`FORMULA_START` and is not a plain number)."""
    if text[:1] in FORMULA_START and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def unescape_cell(text: str) -> str:
    """The inverse of :func:`escape_cell` on the cells it escaped."""
    if text[:1] == "'" and text[1:2] in FORMULA_START and not _NUMBER.fullmatch(text[1:]):
        return text[1:]
    return text


def spreadsheet_safe(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``frame`` with every text cell (and column name) that a spreadsheet would read as a
    formula escaped by :func:`escape_cell`, and the number of cells escaped.

    Only object / string columns are looked at; numeric, boolean and categorical-of-number
    columns are returned as they are. The input is not modified (a copy is made only when
    something is escaped).
    """
    escaped = 0
    out = frame
    text = [
        j
        for j, dtype in enumerate(frame.dtypes)
        if pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype)
    ]  # the dtypes first: a wide numeric table costs no column extraction
    for j in text:
        col = frame.iloc[:, j]
        s = col.astype("string")
        hit = s.str.match(_TRIGGER.pattern) & ~s.str.fullmatch(_NUMBER.pattern)
        hit = hit.fillna(False).to_numpy(dtype=bool)
        if hit.any():
            if out is frame:
                out = frame.copy()
            fixed = col.astype(object).to_numpy(copy=True)
            fixed[hit] = np.char.add("'", fixed[hit].astype(str)).astype(object)
            out.iloc[:, j] = pd.Series(fixed, index=col.index, dtype=object)
            escaped += int(hit.sum())
    names = [escape_cell(c) if isinstance(c, str) else c for c in frame.columns]
    if names != list(frame.columns):
        if out is frame:
            out = frame.copy()
        out.columns = names
        escaped += sum(a != b for a, b in zip(names, frame.columns, strict=True))
    return out, escaped


def write_csv(frame: pd.DataFrame, path: str | Path | Any, **to_csv: Any) -> int:
    """Write ``frame`` as CSV with :func:`spreadsheet_safe` cells; returns the number of cells
    escaped.

    ``to_csv`` are :meth:`pandas.DataFrame.to_csv`'s keywords (``index=False`` by default).
    When a cell was escaped, the file's text cells are quoted (``csv.QUOTE_NONNUMERIC``), so
    a spreadsheet's import keeps the apostrophe's meaning; otherwise the file is exactly
    what ``to_csv`` writes.
    """
    safe, escaped = spreadsheet_safe(frame)
    to_csv.setdefault("index", False)
    if escaped and "quoting" not in to_csv:
        to_csv["quoting"] = csv.QUOTE_NONNUMERIC
    safe.to_csv(path, **to_csv)
    return escaped
