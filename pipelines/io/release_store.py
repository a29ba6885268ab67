"""A release written where it was computed, and read back whole.

:func:`write_release` stores a :class:`~censusdp.estimation.release.Release` or a
:class:`~censusdp.pipelines.partitioned_release.PartitionedRelease` as one directory. For a
partitioned release each partition's levels below the cut are written by a task of the
executor that holds its piece (on Dask, by the worker that computed it: the pieces never pass
through the calling process); the levels at and above the cut, which the caller holds, are
written by the caller. This is how a national run persists a release it computed partition by
partition (the shared-key setting of the subspace-DP paper, Algorithm 4). :func:`read_release`
gives back the plain release, equal to the one :meth:`PartitionedRelease.gather
<censusdp.pipelines.partitioned_release.PartitionedRelease.gather>` would have built, bit for
bit.

Layout (``format`` 3)::

    manifest.json                      estimator, cells, levels and sizes, cut, partition rows,
                                       integer, privacy statement, diagnostics, fields, sums
    <field>/<level>.npy                levels 0 .. cut, (n_nodes, n_cells[, n_cells])
    <field>/<level>/part-00007.npy     levels below the cut, partition 7's rows
    checksums.json                     SHA-256 of every file above; written last

``<field>`` is ``estimates``, ``variances`` and, when the release has them, ``covariances``;
a release with variances of tracked sums (:class:`~censusdp.estimation.release.SumVariances`,
which a rounded release carries) also has ``sums_estimator`` and ``sums_rounding``, arrays
(n_nodes, m) laid out as the other fields, and the manifest's ``sums`` holds their ``masks``
(each the list of its cells' indices) and ``labels`` (null when the release has none). Their
values are non-negative or NaN (a variance that is unknown), never ±inf.

The store is :mod:`censusdp.pipelines.io.store`'s format, written and checked by it (whole or
not at all; ``overwrite`` replaces only a release store whose every file its checksums list;
every file checked against ``checksums.json``, inside the store only). On a remote Dask
cluster the path must be on a filesystem the workers share with the caller; a store whose
pieces did not arrive there is refused before it is renamed into place. Non-finite values
are refused when written. :func:`read_release` also checks that the manifest is well formed
(``fields`` are field names, never paths; ``cut`` an integer level; partition rows that
tile each level; positive finite budgets) and every array has its exact shape, the dtype
the manifest's ``integer`` claim implies (int64 estimates when true, float64 otherwise) and
only finite values (sums: non-negative or NaN, masks of distinct in-range cells, one label
each). It is the one reader of every store: a ``pl94`` run's gives its
:class:`~censusdp.pipelines.io.pl94_store.Pl94Store`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.errors import DataError, SpecError
from censusdp.estimation.release import Release, SumVariances
from censusdp.hierarchy import Hierarchy
from censusdp.jsonable import to_jsonable
from censusdp.pipelines.io.pl94_store import FORMATS as PL94_FORMATS
from censusdp.pipelines.io.pl94_store import Pl94Store
from censusdp.pipelines.io.store import (
    MANIFEST,
    StoreWriter,
    check_array,
    check_checksum,
    check_finite,
    check_listed,
    check_tiling,
    is_int,
    load_piece,
    manifest_error,
    read_checksums,
    read_json,
    read_privacy,
    save_npy,
    store_file,
)
from censusdp.pipelines.partitioned_release import PartitionedRelease, ReleasePiece

# check_array and store_file: censusdp.pipelines.io.store's, importable from here as before
__all__ = ["check_array", "read_release", "store_file", "write_release"]

FORMAT = 3  # 3: tracked sums' variances (2 had none: a rounded release lost them)
FIELDS = ("estimates", "variances", "covariances")
SUM_FIELDS = {"sums_estimator": "estimator", "sums_rounding": "rounding"}  # SumVariances's
_KEYS = (
    "estimator",
    "cells",
    "levels",
    "sizes",
    "cut",
    "partitions",
    "fields",
    "integer",
    "privacy",
    "diagnostics",
    "sums",
)


def _check_sum_values(array: np.ndarray, where: str) -> None:
    """Refuse ±inf and negative values in variances of sums (NaN is a variance not known)."""
    if array.dtype != np.float64:
        raise DataError(f"{where}: dtype {array.dtype}, expected float64 (variances of sums)")
    inf = int(np.count_nonzero(np.isinf(array)))
    if inf:
        raise DataError(f"{where}: {inf} infinite values; a variance of a sum is finite or NaN")
    negative = int(np.count_nonzero(array < 0))
    if negative:
        raise DataError(f"{where}: {negative} negative values; a variance is non-negative")


def _check_values(name: str, array: np.ndarray, where: str) -> None:
    """Finite values; variances of sums: non-negative or NaN."""
    if name in SUM_FIELDS:
        _check_sum_values(array, where)
    else:
        check_finite(array, where)


_save = save_npy  # the name this module's writers call (a test replaces it to fail a write)


def _part_name(index: int) -> str:
    return f"part-{index:05d}.npy"


def _level_arrays(release: Release | PartitionedRelease | ReleasePiece) -> dict[str, list]:
    """The stored arrays of ``release`` (or of a partition's piece), per level, by field:
    its fields, then its variances of tracked sums (absent when it has none)."""
    out = {n: getattr(release, n) for n in FIELDS if getattr(release, n) is not None}
    su = release.sums
    if su is not None:
        if isinstance(su, SumVariances):
            out.update({n: getattr(su, a) for n, a in SUM_FIELDS.items()})
        else:  # a piece's: per level, the (estimator, rounding) pair
            out.update({n: [pair[t] for pair in su] for t, n in enumerate(SUM_FIELDS)})
    return out


def _write_piece(
    item: tuple[ReleasePiece, int],
    root: str,
    levels: Sequence[str],
    fields: Sequence[str],
    sums: bool = False,
) -> dict[str, str]:
    """Write partition ``index``'s piece under ``root`` (with its variances of tracked sums
    when ``sums``); the SHA-256 of every file written, by its path relative to ``root``."""
    piece, index = item
    if not os.path.isdir(root):
        raise DataError(
            f"{root} is not visible where partition {index}'s task runs; on a remote Dask "
            "cluster write the release to a filesystem the workers share"
        )
    if sums and piece.sums is None:
        raise DataError(
            f"partition {index}'s piece has no variances of tracked sums but the release "
            "has them; compute the pieces again (partitioned_round)"
        )
    arrays = _level_arrays(piece)
    digests = {}
    for name in [*fields, *(SUM_FIELDS if sums else ())]:
        for level, array in zip(levels, arrays[name], strict=True):
            rel = f"{name}/{level}/{_part_name(index)}"
            _check_values(name, array, f"partition {index}'s {rel}")
            digests[rel] = _save(Path(root, rel), array)
    return digests


def write_release(
    release: Release | PartitionedRelease,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> Path:
    """Store ``release`` at the directory ``path`` (see the module docstring for the layout).

    Parameters
    ----------
    release : Release or PartitionedRelease
        A partitioned release's pieces are written by its executor's tasks, where they are;
        they stay there (:meth:`~PartitionedRelease.drop` them when done).
    path : path-like
        The directory to create. Its parent is created if needed.
    overwrite : bool
        Replace an existing release store at ``path`` (only once the new store is
        complete; a directory that is not a release store, or holds a file its checksums do
        not list, is never replaced).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is false.
    SpecError
        ``overwrite`` and ``path`` is not a release store censusdp wrote.
    DataError
        A partition's files are missing after its task reported them written (the workers
        do not share the caller's filesystem).
    """
    path = Path(path)
    h = release.hierarchy
    partitioned = isinstance(release, PartitionedRelease)
    cut = release.cut if partitioned else h.depth - 1
    fields = [n for n in FIELDS if getattr(release, n) is not None]
    su = release.sums
    top = _level_arrays(release)
    below = list(h.names[cut + 1 :])
    parts = release.partitions if partitioned else ()
    if partitioned and len(release.pieces) != len(parts):
        raise ValueError("the pieces of this release were dropped; nothing to write")
    with StoreWriter(path, (FORMAT,), "release", overwrite=overwrite) as store:
        tmp = store.root
        for name, arrays in top.items():
            (tmp / name).mkdir()
            for k in range(cut + 1):
                rel = f"{name}/{h.names[k]}.npy"
                _check_values(name, arrays[k], rel)
                store.record({rel: _save(tmp / rel, arrays[k])})
            for level in below:
                (tmp / name / level).mkdir(parents=True)
        if partitioned:
            ex = release.executor
            handles = ex.submit(
                _write_piece,
                [(piece, i) for i, piece in enumerate(release.pieces)],
                str(tmp),
                below,
                fields,
                su is not None,
            )
            try:
                for written in ex.gather(handles):
                    store.record(written)
            finally:
                ex.release(handles)
            for name in top:
                for level in below:
                    missing = [
                        i
                        for i in range(len(parts))
                        if not (tmp / name / level / _part_name(i)).is_file()
                    ]
                    if missing:
                        raise DataError(
                            f"{path}: partition {missing[0]}'s {name} at level {level!r} was "
                            "written by its task but is not in the store; on a remote Dask "
                            "cluster the path must be on a filesystem the workers share"
                        )
        store.finish(
            {
                "format": FORMAT,
                "estimator": release.estimator,
                "cells": list(release.cells),
                "levels": list(h.names),
                "sizes": [int(s) for s in h.sizes],
                "cut": cut,
                "partitions": [[list(p.range(k)) for k in range(cut + 1, h.depth)] for p in parts],
                "fields": fields,
                "integer": bool(release.integer),
                "privacy": release.privacy.to_dict(),
                "diagnostics": to_jsonable(release.diagnostics),
                "sums": None
                if su is None
                else {
                    "masks": [np.flatnonzero(row).tolist() for row in np.asarray(su.masks, bool)],
                    "labels": list(su.labels),
                },
            }
        )
    return path


def _sum_spec(file: Path, d: Any, n_cells: int) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """The stored masks (m, n_cells) and labels of the tracked sums, or None."""
    if d is None:
        return None
    if not isinstance(d, dict) or set(d) != {"masks", "labels"}:
        raise manifest_error(file, "sums", "expected null or a table with 'masks' and 'labels'")
    rows, labels = d["masks"], d["labels"]
    if (
        not isinstance(rows, list)
        or not rows
        or not all(
            isinstance(r, list)
            and all(is_int(c) and 0 <= c < n_cells for c in r)
            and all(a < b for a, b in zip(r, r[1:], strict=False))
            for r in rows
        )
    ):
        raise manifest_error(
            file,
            "sums.masks",
            f"expected a non-empty list of masks, each the increasing indices of its cells "
            f"(0 to {n_cells - 1})",
        )
    masks = np.zeros((len(rows), n_cells), bool)
    for i, r in enumerate(rows):  # the manifest's few masks, not cells or nodes
        masks[i, r] = True
    if len(np.unique(masks, axis=0)) != len(rows):
        raise manifest_error(file, "sums.masks", "a mask is listed twice")
    if (
        not isinstance(labels, list)
        or len(labels) != len(rows)
        or not all(isinstance(x, str) and x for x in labels)
    ):
        raise manifest_error(
            file, "sums.labels", f"expected {len(rows)} non-empty strings, one per mask"
        )
    return masks, tuple(labels)


def _manifest(path: Path, hierarchy: Hierarchy) -> tuple[dict, dict[str, str]]:
    """The validated manifest and the checksums of the store's files."""
    file = path / MANIFEST
    if not file.is_file():
        raise DataError(f"{path} is not a release store: it has no {MANIFEST}")
    data, m = read_json(file)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataError(
            f"{file}: format {m.get('format') if isinstance(m, dict) else None!r} is not "
            f"{FORMAT}; write the release again with this version of censusdp"
        )
    sums = read_checksums(path)
    check_checksum(path, MANIFEST, data, sums)
    missing = [key for key in _KEYS if key not in m]
    if missing:
        raise DataError(f"{file}: the manifest has no {missing[0]!r}; the store is incomplete")
    h = hierarchy
    if not isinstance(m["estimator"], str) or not m["estimator"]:
        raise manifest_error(file, "estimator", "expected a non-empty string")
    cells = m["cells"]
    if (
        not isinstance(cells, list)
        or not cells
        or not all(isinstance(c, str) and c for c in cells)
        or len(set(cells)) != len(cells)
    ):
        raise manifest_error(file, "cells", "expected a non-empty list of distinct cell names")
    levels, sizes = m["levels"], m["sizes"]
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        raise manifest_error(file, "levels", "expected a list of level names")
    if not isinstance(sizes, list) or not all(is_int(x) and x >= 0 for x in sizes):
        raise manifest_error(file, "sizes", "expected a list of node counts")
    if len(levels) != len(sizes):
        raise DataError(f"{file}: the manifest has {len(levels)} levels but {len(sizes)} sizes")
    stored = list(zip(levels, sizes, strict=True))
    wanted = list(zip(h.names, (int(x) for x in h.sizes), strict=True))
    if stored != wanted:
        k = next(
            (i for i, (a, b) in enumerate(zip(stored, wanted, strict=False)) if a != b),
            min(len(stored), len(wanted)),
        )
        have = "{!r} with {} nodes".format(*stored[k]) if k < len(stored) else "no level"
        want = "{!r} with {} nodes".format(*wanted[k]) if k < len(wanted) else "no level"
        raise DataError(
            f"{file}: level {k} is {have} in the store but {want} in the hierarchy; "
            "read it with the hierarchy it was released on"
        )
    cut = m["cut"]
    if not is_int(cut) or not 0 <= cut < h.depth:
        raise manifest_error(
            file, "cut", f"expected the integer index of a level, 0 to {h.depth - 1}; got {cut!r}"
        )
    fields = m["fields"]
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise manifest_error(file, "fields", f"expected a list of field names from {list(FIELDS)}")
    for f in fields:
        if f not in FIELDS:
            raise manifest_error(
                file,
                "fields",
                f"{f!r} is not one of {list(FIELDS)} (a field names a folder of the store; "
                "paths are never followed)",
            )
    if "estimates" not in fields or len(set(fields)) != len(fields):
        raise manifest_error(file, "fields", "must list 'estimates', and each field once")
    if not isinstance(m["integer"], bool):
        raise manifest_error(file, "integer", "expected true or false")
    if not isinstance(m["diagnostics"], dict):
        raise manifest_error(file, "diagnostics", "expected a table")
    m["privacy"] = read_privacy(file, m["privacy"])
    m["sums"] = _sum_spec(file, m["sums"], len(cells))
    parts = m["partitions"]
    below = h.depth - 1 - cut
    if (
        not isinstance(parts, list)
        or (below and not parts)
        or not all(
            isinstance(p, list)
            and len(p) == below
            and all(isinstance(r, list) and len(r) == 2 and all(is_int(x) for x in r) for r in p)
            for p in parts
        )
    ):
        raise manifest_error(
            file,
            "partitions",
            f"expected one list of {below} [start, stop) node ranges per partition "
            "(one per level below the cut)",
        )
    for j, k in enumerate(range(cut + 1, h.depth)):
        check_tiling(file, h.names[k], h.sizes[k], [tuple(p[j]) for p in parts])
    return m, sums


def _load(
    path: Path, rel: str, shape: tuple[int, ...], name: str, integer: bool, sums: dict[str, str]
) -> np.ndarray:
    """The array of field ``name`` at ``path / rel``: checksum, dtype, exact shape and values
    verified (:func:`~censusdp.pipelines.io.store.load_piece`; variances of sums: non-negative
    or NaN)."""
    if name in SUM_FIELDS:
        dtype, why = "float64", "variances of sums"
    elif name == "estimates":
        dtype, why = ("int64", "integer: true") if integer else ("float64", "integer: false")
    else:
        dtype, why = "float64", name
    nan = name in SUM_FIELDS
    a = load_piece(
        path, rel, sums, dtype, shape, why, "rows, sums" if nan else "rows, cells", not nan
    )
    if nan:
        _check_sum_values(a, str(path / rel))
    return a


def _is_pl94(path: Path) -> bool:
    """Whether ``path`` holds a manifest of the ``pl94`` kind (checked again when read)."""
    try:
        _, m = read_json(path / MANIFEST)
    except DataError:
        return False
    return isinstance(m, dict) and isinstance(m.get("format"), str) and m["format"] in PL94_FORMATS


def read_release(
    path: str | os.PathLike[str],
    hierarchy: Hierarchy | None = None,
    *,
    expected_digest: str | None = None,
) -> Release | Pl94Store:
    """The release stored at ``path``: the plain
    :class:`~censusdp.estimation.release.Release` of a store written by
    :func:`write_release`, or the :class:`~censusdp.pipelines.io.pl94_store.Pl94Store` of a
    streamed ``pl94`` run's store (read piece by piece; the same as ``Pl94Store(path,
    expected_digest)``).

    Parameters
    ----------
    path : path-like
        A store directory.
    hierarchy : Hierarchy
        The hierarchy the release was computed on (checked against the stored level names
        and sizes); needed for a release store, not for a ``pl94`` store (which names its
        levels and sizes itself).
    expected_digest : str, optional
        A ``pl94`` store's release digest, printed by its run (:class:`Pl94Store`).

    Raises
    ------
    DataError
        Not a release store, another hierarchy, a file changed or missing, a missing or
        damaged ``checksums.json``, a malformed manifest (the key is named), or an array of
        the wrong dtype or shape or with non-finite values (the file is named).
    SpecError
        A release store read without its hierarchy, or with ``expected_digest``.
    """
    path = Path(path)
    if _is_pl94(path):
        return Pl94Store(path, expected_digest)
    if hierarchy is None:
        raise SpecError(
            f"{path}: a release store is read with the hierarchy it was released on; pass it"
        )
    if expected_digest is not None:
        raise SpecError(
            f"{path}: expected_digest: a release store of format {FORMAT} records no release "
            "digest (only a pl94 store does); read it without one"
        )
    m, sums = _manifest(path, hierarchy)
    cut, cells, h = m["cut"], tuple(m["cells"]), hierarchy
    n = len(cells)
    names = [*m["fields"], *(SUM_FIELDS if m["sums"] is not None else ())]
    files = {f"{name}/{h.names[k]}.npy" for name in names for k in range(cut + 1)} | {
        f"{name}/{h.names[k]}/{_part_name(i)}"
        for name in names
        for k in range(cut + 1, h.depth)
        for i in range(len(m["partitions"]))
    }
    check_listed(path, sums, files | {MANIFEST})
    whole: dict[str, list[np.ndarray]] = {}
    for name in names:
        tail = (n, n) if name == "covariances" else (n,)
        if name in SUM_FIELDS:
            tail = (len(m["sums"][1]),)
        arrays = [
            _load(path, f"{name}/{h.names[k]}.npy", (h.sizes[k], *tail), name, m["integer"], sums)
            for k in range(cut + 1)
        ]
        for j, k in enumerate(range(cut + 1, h.depth)):
            rel = f"{name}/{h.names[k]}/"
            pieces = [
                _load(path, rel + _part_name(i), (p[j][1] - p[j][0], *tail), name, m["integer"],
                      sums)
                for i, p in enumerate(m["partitions"])
            ]  # fmt: skip
            arrays.append(np.concatenate(pieces, axis=0))
        whole[name] = arrays
    tracked = None
    if m["sums"] is not None:
        masks, labels = m["sums"]
        tracked = SumVariances(masks, labels, whole["sums_estimator"], whole["sums_rounding"])
    try:
        return Release(
            estimator=m["estimator"],
            hierarchy=h,
            cells=cells,
            estimates=whole["estimates"],
            variances=whole.get("variances"),
            privacy=m["privacy"],
            integer=m["integer"],
            diagnostics=m["diagnostics"],
            covariances=whole.get("covariances"),
            sums=tracked,
        )
    except ValueError as exc:
        raise DataError(f"{path}: not a consistent release ({exc})") from None
