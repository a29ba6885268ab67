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

Layout (``format`` 1)::

    manifest.json                      estimator, cells, levels and sizes, cut, partition rows,
                                       integer, privacy statement, diagnostics, fields
    <field>/<level>.npy                levels 0 .. cut, (n_nodes, n_cells[, n_cells])
    <field>/<level>/part-00007.npy     levels below the cut, partition 7's rows

``<field>`` is ``estimates``, ``variances`` and, when the release has them, ``covariances``.
The directory is written under a temporary name and renamed into place when every file is
complete (:func:`censusdp.atomic.atomic_dir`). On a remote Dask cluster the path must be on a
filesystem the workers share with the caller; a store whose pieces did not arrive there is
refused before it is renamed into place.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from censusdp.atomic import atomic_dir
from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.jsonable import to_jsonable
from censusdp.pipelines.partitioned_release import PartitionedRelease, ReleasePiece

__all__ = ["read_release", "write_release"]

FORMAT = 1
FIELDS = ("estimates", "variances", "covariances")
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
)


def _save(path: Path, array: np.ndarray) -> None:
    """``array`` at ``path``, through a temporary name: a task run again (Dask retries a
    task whose worker died) replaces the file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
    os.replace(tmp, path)


def _part_name(index: int) -> str:
    return f"part-{index:05d}.npy"


def _write_piece(
    item: tuple[ReleasePiece, int], root: str, levels: Sequence[str], fields: Sequence[str]
) -> int:
    """Write partition ``index``'s piece under ``root``; the number of bytes written."""
    piece, index = item
    if not os.path.isdir(root):
        raise DataError(
            f"{root} is not visible where partition {index}'s task runs; on a remote Dask "
            "cluster write the release to a filesystem the workers share"
        )
    written = 0
    for name in fields:
        for level, array in zip(levels, getattr(piece, name), strict=True):
            _save(Path(root, name, level, _part_name(index)), array)
            written += array.nbytes
    return written


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
        Replace an existing ``path`` (only once the new store is complete).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is false.
    DataError
        A partition's files are missing after its task reported them written (the workers
        do not share the caller's filesystem).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{path} exists; write the release elsewhere, remove it, or pass overwrite=True"
        )
    h = release.hierarchy
    partitioned = isinstance(release, PartitionedRelease)
    cut = release.cut if partitioned else h.depth - 1
    fields = [n for n in FIELDS if getattr(release, n) is not None]
    below = list(h.names[cut + 1 :])
    parts = release.partitions if partitioned else ()
    if partitioned and len(release.pieces) != len(parts):
        raise ValueError("the pieces of this release were dropped; nothing to write")
    with atomic_dir(path, overwrite=overwrite) as tmp:
        for name in fields:
            for k in range(cut + 1):
                (tmp / name).mkdir(exist_ok=True)
                _save(tmp / name / f"{h.names[k]}.npy", getattr(release, name)[k])
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
            )
            try:
                ex.gather(handles)
            finally:
                ex.release(handles)
            for name in fields:
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
        for stale in tmp.rglob(".*.tmp"):  # left by a task killed mid-write and run again
            stale.unlink(missing_ok=True)
        manifest = {
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
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def _manifest(path: Path, hierarchy: Hierarchy) -> dict:
    file = path / "manifest.json"
    try:
        m = json.loads(file.read_text())
    except FileNotFoundError:
        raise DataError(f"{path} is not a release store: it has no manifest.json") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{file}: cannot read the manifest ({exc})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataError(
            f"{file}: format {m.get('format') if isinstance(m, dict) else None!r} is not "
            f"{FORMAT}; write the release again with this version of censusdp"
        )
    missing = [key for key in _KEYS if key not in m]
    if missing:
        raise DataError(f"{file}: the manifest has no {missing[0]!r}; the store is incomplete")
    stored = list(zip(m["levels"], m["sizes"], strict=False))
    if len(m["levels"]) != len(m["sizes"]):
        raise DataError(
            f"{file}: the manifest has {len(m['levels'])} levels but {len(m['sizes'])} sizes"
        )
    wanted = list(zip(hierarchy.names, (int(x) for x in hierarchy.sizes), strict=True))
    if stored != wanted:
        k = next(
            (i for i, (a, b) in enumerate(zip(stored, wanted, strict=False)) if tuple(a) != b),
            min(len(stored), len(wanted)),
        )
        have = "{!r} with {} nodes".format(*stored[k]) if k < len(stored) else "no level"
        want = "{!r} with {} nodes".format(*wanted[k]) if k < len(wanted) else "no level"
        raise DataError(
            f"{file}: level {k} is {have} in the store but {want} in the hierarchy; "
            "read it with the hierarchy it was released on"
        )
    return m


def _load(file: Path, shape: tuple[int, ...]) -> np.ndarray:
    try:
        a = np.load(file, allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"{file} is missing from the release store") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{file}: not a readable .npy array ({exc})") from None
    if a.shape[: len(shape)] != shape:
        raise DataError(f"{file}: shape {a.shape}, expected {shape} (rows, cells)")
    return a


def read_release(path: str | os.PathLike[str], hierarchy: Hierarchy) -> Release:
    """The plain :class:`~censusdp.estimation.release.Release` stored at ``path``.

    Parameters
    ----------
    path : path-like
        A directory written by :func:`write_release`.
    hierarchy : Hierarchy
        The hierarchy the release was computed on (checked against the stored level names
        and sizes).

    Raises
    ------
    DataError
        Not a release store, another hierarchy, or a file missing or of the wrong shape
        (the message names the file).
    """
    path = Path(path)
    m = _manifest(path, hierarchy)
    cut, cells, h = int(m["cut"]), tuple(m["cells"]), hierarchy
    n = len(cells)
    whole: dict[str, list[np.ndarray]] = {}
    for name in m["fields"]:
        arrays = [_load(path / name / f"{h.names[k]}.npy", (h.sizes[k], n)) for k in range(cut + 1)]
        for j, k in enumerate(range(cut + 1, h.depth)):
            rows = [tuple(p[j]) for p in m["partitions"]]
            if [lo for lo, _ in rows] != [0, *(hi for _, hi in rows[:-1])] or rows[-1][
                1
            ] != h.sizes[k]:
                raise DataError(
                    f"{path / 'manifest.json'}: the partitions' rows at level {h.names[k]!r} "
                    f"do not cover its {h.sizes[k]} nodes in order"
                )
            level = path / name / h.names[k]
            arrays.append(
                np.concatenate(
                    [_load(level / _part_name(i), (hi - lo, n)) for i, (lo, hi) in enumerate(rows)],
                    axis=0,
                )
            )
        whole[name] = arrays
    return Release(
        estimator=m["estimator"],
        hierarchy=h,
        cells=cells,
        estimates=whole["estimates"],
        variances=whole.get("variances"),
        privacy=PrivacyStatement.from_dict(m["privacy"]),
        integer=bool(m["integer"]),
        diagnostics=m["diagnostics"],
        covariances=whole.get("covariances"),
    )
