"""Describe a hierarchy: nodes and fan-out per level (``censusdp hierarchy describe``,
:mod:`censusdp.app.commands.hierarchy`).

Fan-out of a level = number of children per node of that level (in the level below).
Leaves have no level below, so their ``fanout`` is ``None`` (JSON ``null``), not zeros: a
zero would read as "childless nodes", which :func:`~censusdp.hierarchy.validate.validate`
refuses above the leaves.

The module is light at import (the command line imports it): numpy, pandas and the
builders are imported by the functions that use them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from censusdp.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

    from censusdp.hierarchy.builders import LevelSpec
    from censusdp.hierarchy.core import Hierarchy

__all__ = ["describe", "describe_file", "format_description"]


def describe(h: Hierarchy) -> dict[str, Any]:
    """``{"levels": [{"name", "nodes", "fanout": {"min", "median", "max"} | None}, ...]}``.

    The median of an even number of fan-outs is the mean of the middle two (a float);
    min and max are ints.
    """
    import numpy as np

    levels = []
    for k, lv in enumerate(h.levels):
        fanout = None
        if k < h.depth - 1:
            c = lv.child_count
            fanout = {"min": int(c.min()), "median": _num(np.median(c)), "max": int(c.max())}
        levels.append({"name": lv.name, "nodes": lv.size, "fanout": fanout})
    return {"levels": levels}


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def _read_code_columns(path: Path, columns: list[str]) -> pd.DataFrame:
    """Read only ``columns`` of a CSV or Parquet file, as strings (leading zeros kept)."""
    from censusdp.tabular import (
        PARQUET_SUFFIXES,
        parquet_columns,
        read_csv_text,
        read_parquet_table,
    )

    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        available = parquet_columns(path)
    elif suffix in (".csv", ".txt"):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path.name}: cannot decode as UTF-8 at byte {exc.start}; re-save it as UTF-8"
            ) from None
        frame = read_csv_text(text, path, require_rows=False)
        available = list(frame.columns)
    else:
        raise DataError(f"{path}: unknown file type {suffix!r}; use a .csv or .parquet file")
    missing = [c for c in columns if c not in available]
    if missing:
        raise DataError(f"{path.name}: no column {missing[0]!r}; the columns are {available[:30]}")
    if suffix in PARQUET_SUFFIXES:
        return read_parquet_table(path, columns=columns).astype("str")
    return read_csv_text(text, path, usecols=columns)


def describe_file(
    path: str | Path, levels: list[LevelSpec], *, duplicates: str = "error"
) -> dict[str, Any]:
    """Build the hierarchy of a CSV/Parquet file from ``levels`` and :func:`describe` it."""
    from censusdp.hierarchy.builders import from_columns

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    columns = list(dict.fromkeys(s.column for s in levels))
    df = _read_code_columns(path, columns)
    h, _ = from_columns(df, levels, source=path.name, duplicates=duplicates)  # type: ignore[arg-type]
    return describe(h)


def format_description(d: dict[str, Any]) -> str:
    """A plain-text table of :func:`describe`'s output."""
    rows = [("level", "nodes", "fanout min", "median", "max")]
    for lv in d["levels"]:
        f = lv["fanout"]
        rows.append(
            (lv["name"], f"{lv['nodes']:,}")
            + ((str(f["min"]), str(f["median"]), str(f["max"])) if f else ("-", "-", "-"))
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join(lines)
