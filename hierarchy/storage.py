"""Save and load hierarchies and tables (``.npz`` or ``.parquet``), atomically.

Formats
-------
``.npz`` (numpy, no pickles)
    ``names`` (unicode), then per level ``k``: ``codes_k`` (unicode) and ``parent_k``
    (int64, index into level ``k-1``, ``-1`` for the root). Tables add ``cells`` (unicode)
    and ``leaf_counts`` (int64, canonical leaf order).
``.parquet``
    Hierarchy: one row per node, root first, level by level: ``level``, ``code``,
    ``parent_code`` (null for the root); the level order is in the schema metadata.
    Table: one row per leaf: a ``code:<level>`` column per level below the root, then one
    int64 column per cell; level names, root and cells in the schema metadata.

Every write goes to a temporary file renamed into place (:func:`censusdp.atomic.atomic_file`),
and every load rebuilds through :meth:`Hierarchy.from_parents` and :func:`validate`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from censusdp.atomic import atomic_file
from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy.builders import LevelSpec, from_columns
from censusdp.hierarchy.core import Hierarchy, as_codes
from censusdp.hierarchy.table import Table
from censusdp.hierarchy.validate import parse_counts, validate

__all__ = ["load_hierarchy", "load_table", "save_hierarchy", "save_table"]

_META_KEY = b"censusdp"
_CODE_PREFIX = "code:"


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".npz", ".parquet"):
        raise DataError(f"{path}: unknown format {suffix!r}; use a .npz or .parquet file")
    return suffix[1:]


def _unicode(codes: np.ndarray) -> np.ndarray:
    """Fixed-width unicode copy of a StringDType array (``.npz`` stores no StringDType)."""
    width = int(np.strings.str_len(codes).max()) if codes.size else 1
    return codes.astype(f"U{max(width, 1)}")


def _hierarchy_arrays(h: Hierarchy) -> dict[str, np.ndarray]:
    arrays = {"names": np.asarray(h.names, dtype=str)}
    for k, lv in enumerate(h.levels):
        arrays[f"codes_{k}"] = _unicode(lv.codes)
        arrays[f"parent_{k}"] = lv.parent
    return arrays


def _hierarchy_from_arrays(data: np.lib.npyio.NpzFile | dict, path: Path) -> Hierarchy:
    try:
        names = [str(x) for x in data["names"]]
        codes = [as_codes(data[f"codes_{k}"]) for k in range(len(names))]
        parents = [np.asarray(data[f"parent_{k}"], dtype=np.int64) for k in range(len(names))]
    except KeyError as exc:
        raise DataError(f"{path}: not a censusdp hierarchy file (missing {exc})") from None
    h = Hierarchy.from_parents(names, codes, parents)
    validate(h)
    return h


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _write_parquet(path: Path, table: pa.Table, meta: dict) -> None:
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)


def _read_meta(table: pa.Table, path: Path, kind: str) -> dict:
    raw = (table.schema.metadata or {}).get(_META_KEY)
    meta = json.loads(raw) if raw else {}
    if meta.get("kind") != kind:
        raise DataError(f"{path}: not a censusdp {kind} file (no censusdp metadata)")
    return meta


# ---------------------------------------------------------------------------------- hierarchy
def save_hierarchy(h: Hierarchy, path: str | os.PathLike[str]) -> Path:
    """Write ``h`` to ``path`` (``.npz`` or ``.parquet``, chosen by suffix), atomically."""
    path = Path(path)
    if _format(path) == "npz":
        _write_npz(path, _hierarchy_arrays(h))
        return path
    level = np.repeat(np.asarray(h.names, dtype=object), h.sizes)
    codes = np.concatenate([np.asarray(lv.codes, dtype=object) for lv in h.levels])
    parent_codes = np.concatenate(
        [np.array([None], dtype=object)]
        + [
            np.asarray(h.levels[k - 1].codes[lv.parent], dtype=object)
            for k, lv in enumerate(h.levels)
            if k > 0
        ]
    )
    table = pa.table(
        {
            "level": pa.array(level, pa.string()).dictionary_encode(),
            "code": pa.array(codes, pa.string()),
            "parent_code": pa.array(parent_codes, pa.string()),
        }
    )
    _write_parquet(path, table, {"kind": "hierarchy", "levels": list(h.names)})
    return path


def load_hierarchy(path: str | os.PathLike[str]) -> Hierarchy:
    """Read a hierarchy written by :func:`save_hierarchy` (validated on load)."""
    path = Path(path)
    if _format(path) == "npz":
        with np.load(path, allow_pickle=False) as data:
            return _hierarchy_from_arrays(data, path)
    table = pq.read_table(path)
    meta = _read_meta(table, path, "hierarchy")
    df = table.to_pandas()
    names = list(meta["levels"])
    level = df["level"].astype("str").to_numpy(dtype=object)
    codes: list[np.ndarray] = []
    parents: list[np.ndarray | None] = []
    for k, name in enumerate(names):
        rows = np.flatnonzero(level == name)
        c = df["code"].to_numpy(dtype=object)[rows]
        codes.append(as_codes(c))
        if k == 0:
            parents.append(None)
            continue
        pcodes = df["parent_code"].to_numpy(dtype=object)[rows]
        p = pd.Index(np.asarray(codes[k - 1], dtype=object)).get_indexer(pcodes)
        if (p < 0).any():
            j = int(np.flatnonzero(p < 0)[0])
            raise HierarchyError(
                f"{path}: node {c[j]!r} of level {name!r} names parent {pcodes[j]!r}, which "
                f"is not a node of level {names[k - 1]!r} (orphan)"
            )
        parents.append(p)
    h = Hierarchy.from_parents(names, codes, parents)
    validate(h)
    return h


# ---------------------------------------------------------------------------------- table
def save_table(t: Table, path: str | os.PathLike[str]) -> Path:
    """Write a :class:`Table` (hierarchy, cells, leaf counts) atomically."""
    path = Path(path)
    h = t.hierarchy
    if _format(path) == "npz":
        arrays = _hierarchy_arrays(h)
        arrays["cells"] = np.asarray(t.cells, dtype=str)
        arrays["leaf_counts"] = t.leaf_counts
        _write_npz(path, arrays)
        return path
    cols: dict[str, pa.Array] = {}
    for k in range(1, h.depth):
        anc = h.ancestor_index(-1, k)
        cols[_CODE_PREFIX + h.names[k]] = pa.array(
            np.asarray(h.levels[k].codes, dtype=object)[anc], pa.string()
        )
    for j, c in enumerate(t.cells):
        if c in cols:
            raise DataError(f"cell name {c!r} collides with a level column; rename it")
        cols[c] = pa.array(t.leaf_counts[:, j])
    meta = {
        "kind": "table",
        "levels": list(h.names),
        "root_code": str(h.levels[0].codes[0]),
        "cells": list(t.cells),
    }
    _write_parquet(path, pa.table(cols), meta)
    return path


def load_table(path: str | os.PathLike[str]) -> Table:
    """Read a table written by :func:`save_table`."""
    path = Path(path)
    if _format(path) == "npz":
        with np.load(path, allow_pickle=False) as data:
            h = _hierarchy_from_arrays(data, path)
            if "cells" not in data or "leaf_counts" not in data:
                raise DataError(f"{path}: a hierarchy file, not a table (no leaf_counts)")
            return Table(h, tuple(str(c) for c in data["cells"]), data["leaf_counts"])
    table = pq.read_table(path)
    meta = _read_meta(table, path, "table")
    names = list(meta["levels"])
    df = table.to_pandas()
    specs = [LevelSpec(n, _CODE_PREFIX + n) for n in names[1:]]
    h, leaf_row = from_columns(
        df, specs, root_name=names[0], root_code=meta["root_code"], source=str(path)
    )
    counts = np.column_stack(
        [parse_counts(df[c], c, source=path.name) for c in meta["cells"]]
    ).reshape(len(df), -1)
    return Table(h, tuple(meta["cells"]), counts[leaf_row])
