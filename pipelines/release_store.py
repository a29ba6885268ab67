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
The directory is written under a temporary name and renamed into place when every file is
complete (:func:`censusdp.atomic.atomic_dir`). On a remote Dask cluster the path must be on a
filesystem the workers share with the caller; a store whose pieces did not arrive there is
refused before it is renamed into place. Non-finite values are refused when written.

:func:`read_release` trusts nothing it reads. It verifies every file against
``checksums.json`` (a changed, damaged or missing file, or a missing checksum file, is refused)
and, independently, that the manifest is well formed (``fields`` are field names, never
paths; ``cut`` an integer level; partition rows that tile each level; a privacy statement with
positive finite budgets) and that every array has its exact shape, the dtype the manifest's
``integer`` claim implies (int64 estimates when true, float64 otherwise; float64 variances
and covariances) and only finite values (sums: non-negative or NaN, and masks of distinct
in-range cell indices, one label each); every file is read inside the store only
(:func:`store_file`: no ``..``, absolute path or symbolic link leading out). The checksums
detect corruption and edits that do not also rewrite ``checksums.json``; they are not a
signature (authenticity needs the publisher to sign ``checksums.json``).

The checks are public, for the other stores to reuse (:mod:`censusdp.pipelines.pl94_store`):
:func:`check_array` (dtype, shape, finiteness), :func:`check_finite`, :func:`store_file`,
:func:`read_json`, :func:`read_checksums`, :func:`check_checksum`, :func:`read_privacy`,
:func:`save_npy` and :func:`sha256_hex`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.atomic import atomic_dir
from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError
from censusdp.estimation.release import Release, SumVariances
from censusdp.hierarchy import Hierarchy
from censusdp.jsonable import to_jsonable
from censusdp.pipelines.partitioned_release import PartitionedRelease, ReleasePiece

__all__ = [
    "check_array",
    "check_checksum",
    "check_finite",
    "read_checksums",
    "read_json",
    "read_privacy",
    "read_release",
    "save_npy",
    "sha256_hex",
    "store_file",
    "write_release",
]

FORMAT = 3  # 3: tracked sums' variances (2 had none: a rounded release lost them)
FIELDS = ("estimates", "variances", "covariances")
SUM_FIELDS = {"sums_estimator": "estimator", "sums_rounding": "rounding"}  # SumVariances's
MANIFEST = "manifest.json"
CHECKSUMS = "checksums.json"
_HEX = re.compile(r"[0-9a-f]{64}")
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


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, in hex."""
    return hashlib.sha256(data).hexdigest()


def check_finite(array: np.ndarray, where: str) -> None:
    """Refuse NaN or ±inf (their count is not confidential; the values are never shown)."""
    if array.dtype.kind == "f":
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise DataError(f"{where}: {bad} non-finite values (NaN or inf); a release is finite")


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


def save_npy(path: Path, array: np.ndarray) -> str:
    """``array`` at ``path``, through a temporary name: a task run again (Dask retries a
    task whose worker died) replaces the file whole. Returns the file's SHA-256 (hex)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
    with open(tmp, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    os.replace(tmp, path)
    return digest


_save = save_npy  # the name this module's writers call (a test replaces it to fail a write)


def _part_name(index: int) -> str:
    return f"part-{index:05d}.npy"


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
    digests = {}
    for name in fields:
        for level, array in zip(levels, getattr(piece, name), strict=True):
            rel = f"{name}/{level}/{_part_name(index)}"
            check_finite(array, f"partition {index}'s {rel}")
            digests[rel] = _save(Path(root, rel), array)
    if sums:
        if piece.sums is None:
            raise DataError(
                f"partition {index}'s piece has no variances of tracked sums but the release "
                "has them; compute the pieces again (partitioned_round)"
            )
        for t, name in enumerate(SUM_FIELDS):
            for level, pair in zip(levels, piece.sums, strict=True):
                rel = f"{name}/{level}/{_part_name(index)}"
                _check_sum_values(pair[t], f"partition {index}'s {rel}")
                digests[rel] = _save(Path(root, rel), pair[t])
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
    su = release.sums
    top = {n: getattr(release, n) for n in fields}
    if su is not None:
        top.update({n: getattr(su, a) for n, a in SUM_FIELDS.items()})
    below = list(h.names[cut + 1 :])
    parts = release.partitions if partitioned else ()
    if partitioned and len(release.pieces) != len(parts):
        raise ValueError("the pieces of this release were dropped; nothing to write")
    digests: dict[str, str] = {}
    with atomic_dir(path, overwrite=overwrite) as tmp:
        for name, arrays in top.items():
            (tmp / name).mkdir()
            for k in range(cut + 1):
                rel = f"{name}/{h.names[k]}.npy"
                if name in SUM_FIELDS:
                    _check_sum_values(arrays[k], rel)
                else:
                    check_finite(arrays[k], rel)
                digests[rel] = _save(tmp / rel, arrays[k])
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
                    digests.update(written)
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
            "sums": None
            if su is None
            else {
                "masks": [np.flatnonzero(row).tolist() for row in np.asarray(su.masks, bool)],
                "labels": list(su.labels),
            },
        }
        text = (json.dumps(manifest, indent=1) + "\n").encode()
        (tmp / MANIFEST).write_bytes(text)
        digests[MANIFEST] = sha256_hex(text)
        sums = {"format": FORMAT, "algorithm": "sha256", "files": dict(sorted(digests.items()))}
        (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=1) + "\n")  # last
    return path


def read_json(file: Path) -> tuple[bytes, Any]:
    """The bytes of a JSON file and what they parse to.

    Raises
    ------
    DataError
        The file is missing, unreadable or not JSON (named; the parser's position, no
        content).
    """
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise DataError(
            f"{file} is missing: the store is incomplete or was written without checksums; "
            "write the release again"
        ) from None
    except OSError as exc:
        raise DataError(f"{file}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data, json.loads(data)
    except ValueError as exc:
        raise DataError(f"{file}: not valid JSON ({exc})") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_checksums(path: Path) -> dict[str, str]:
    """``checksums.json`` of the store ``path``: SHA-256 (hex) by relative file path.

    The entries are not checked to be paths inside the store: a reader opens them through
    :func:`store_file`, or checks them against the files its manifest describes.

    Raises
    ------
    DataError
        Missing, not JSON, not ``{"algorithm": "sha256", "files": {path: digest}}``, or a
        digest that is not 64 hex digits.
    """
    file = path / CHECKSUMS
    _, sums = read_json(file)
    files = sums.get("files") if isinstance(sums, dict) else None
    if (
        not isinstance(sums, dict)
        or sums.get("algorithm") != "sha256"
        or not isinstance(files, dict)
    ):
        raise DataError(
            f"{file}: expected {{'algorithm': 'sha256', 'files': {{path: digest}}}}; "
            "the checksum file is damaged"
        )
    for rel, digest in files.items():
        if not isinstance(digest, str) or not _HEX.fullmatch(digest):
            raise DataError(f"{file}: the checksum of {rel!r} is not a SHA-256 hex digest")
    return files


def check_checksum(path: Path, rel: str, data: bytes, sums: dict[str, str]) -> None:
    """Refuse ``data`` (the bytes read from ``path / rel``) unless ``sums`` lists ``rel``
    with their SHA-256.

    Raises
    ------
    DataError
        ``rel`` has no checksum, or another one (the file is named).
    """
    if rel not in sums:
        raise DataError(f"{path / CHECKSUMS} has no checksum for {rel}; the store is incomplete")
    if sha256_hex(data) != sums[rel]:
        raise DataError(
            f"{path / rel}: its SHA-256 does not match {CHECKSUMS}; the file was changed or "
            "damaged after the store was written"
        )


def store_file(root: Path, rel: str) -> Path:
    """``root / rel``, refused unless it lies inside the store ``root``.

    ``rel`` must be a relative POSIX path of plain names (no ``..``, ``.``, empty or absolute
    part, no backslash), and the file it names, symbolic links followed, must resolve inside
    ``root`` (a link leaving the store is refused). A store's manifest or checksums naming a
    file elsewhere is how a tampered store would read (or check) a file it does not hold.

    Raises
    ------
    DataError
        Naming the store and the entry (a path, never data).
    """
    parts = rel.split("/")
    if (
        not rel
        or "\\" in rel
        or "\0" in rel
        or rel.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise DataError(
            f"{root}: the entry {rel!r} is not a relative path inside the store (an absolute "
            "path, '..' or an empty part); the store was altered, write it again"
        )
    file = root / rel
    try:
        inside = file.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise DataError(
            f"{file}: a symbolic link leading out of the store {root}; a store holds its files, "
            "copy the file in (not a link) or write the store again"
        )
    return file


def check_array(
    a: object,
    file: Path | str,
    dtype: np.dtype | str | Sequence[np.dtype | str],
    shape: Sequence[int | None],
    why: str,
    axes: str,
    finite: bool = True,
) -> np.ndarray:
    """``a``, refused unless it is an array of ``dtype`` (one, or any of a sequence), of
    ``shape`` (``None``: any length on that axis) and, when floating and ``finite``, finite.

    Parameters
    ----------
    a : object
        What was read from ``file``.
    file : path or str
        Named in the messages.
    dtype : dtype or sequence of dtypes
    shape : sequence of int or None
    why : str
        Why that dtype (in the message).
    axes : str
        What the axes are, e.g. ``"rows, cells"`` (in the message).
    finite : bool
        Refuse NaN and ±inf (:func:`check_finite`).

    Raises
    ------
    DataError
        One line naming ``file`` and what is wrong (the dtype, the shape, the number of
        non-finite values; never a value).
    """
    wanted = [np.dtype(dtype)] if isinstance(dtype, str | np.dtype) else [*map(np.dtype, dtype)]
    if not isinstance(a, np.ndarray) or a.dtype not in wanted:
        got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
        expected = " or ".join(str(d) for d in wanted)
        raise DataError(f"{file}: dtype {got}, expected {expected} ({why})")
    if a.ndim != len(shape) or any(
        w is not None and n != w for n, w in zip(a.shape, shape, strict=True)
    ):
        want = ", ".join("any" if w is None else str(w) for w in shape)
        want = f"({want},)" if len(shape) == 1 else f"({want})"
        raise DataError(f"{file}: shape {a.shape}, expected {want} ({axes})")
    if finite:
        check_finite(a, str(file))
    return a


def _fail(file: Path, key: str, message: str) -> DataError:
    return DataError(f"{file}: manifest key {key!r}: {message}")


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def read_privacy(file: Path, d: Any) -> PrivacyStatement:
    """The privacy statement stored as ``d`` in the manifest ``file``, with its budget
    checked (a positive finite ε or ρ; δ in (0, 1)) and its lists and strings typed.

    Raises
    ------
    DataError
        Naming ``file`` and the key (``privacy.rho``, ...).
    """
    if not isinstance(d, dict):
        raise _fail(file, "privacy", "expected a table")
    for key in ("epsilon", "rho"):
        if d.get(key) is not None and not _positive(d[key]):
            raise _fail(file, f"privacy.{key}", "must be a positive finite number")
    delta = d.get("delta")
    if delta is not None and not (_positive(delta) and delta < 1):
        raise _fail(file, "privacy.delta", "must lie strictly between 0 and 1")
    for key in ("invariants", "notes"):
        if not isinstance(d.get(key, []), list) or not all(isinstance(x, str) for x in d[key]):
            raise _fail(file, f"privacy.{key}", "expected a list of strings")
    for key in ("geometry", "mechanism"):
        if not isinstance(d.get(key, ""), str):
            raise _fail(file, f"privacy.{key}", "expected a string")
    try:
        return PrivacyStatement.from_dict(d)
    except (KeyError, ValueError, TypeError) as exc:
        raise _fail(file, "privacy", f"not a privacy statement ({exc})") from None


def _sum_spec(file: Path, d: Any, n_cells: int) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """The stored masks (m, n_cells) and labels of the tracked sums, or None."""
    if d is None:
        return None
    if not isinstance(d, dict) or set(d) != {"masks", "labels"}:
        raise _fail(file, "sums", "expected null or a table with 'masks' and 'labels'")
    rows, labels = d["masks"], d["labels"]
    if (
        not isinstance(rows, list)
        or not rows
        or not all(
            isinstance(r, list)
            and all(_is_int(c) and 0 <= c < n_cells for c in r)
            and all(a < b for a, b in zip(r, r[1:], strict=False))
            for r in rows
        )
    ):
        raise _fail(
            file,
            "sums.masks",
            f"expected a non-empty list of masks, each the increasing indices of its cells "
            f"(0 to {n_cells - 1})",
        )
    masks = np.zeros((len(rows), n_cells), bool)
    for i, r in enumerate(rows):  # the manifest's few masks, not cells or nodes
        masks[i, r] = True
    if len(np.unique(masks, axis=0)) != len(rows):
        raise _fail(file, "sums.masks", "a mask is listed twice")
    if (
        not isinstance(labels, list)
        or len(labels) != len(rows)
        or not all(isinstance(x, str) and x for x in labels)
    ):
        raise _fail(file, "sums.labels", f"expected {len(rows)} non-empty strings, one per mask")
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
        raise _fail(file, "estimator", "expected a non-empty string")
    cells = m["cells"]
    if (
        not isinstance(cells, list)
        or not cells
        or not all(isinstance(c, str) and c for c in cells)
        or len(set(cells)) != len(cells)
    ):
        raise _fail(file, "cells", "expected a non-empty list of distinct cell names")
    levels, sizes = m["levels"], m["sizes"]
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        raise _fail(file, "levels", "expected a list of level names")
    if not isinstance(sizes, list) or not all(_is_int(x) and x >= 0 for x in sizes):
        raise _fail(file, "sizes", "expected a list of node counts")
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
    if not _is_int(cut) or not 0 <= cut < h.depth:
        raise _fail(
            file, "cut", f"expected the integer index of a level, 0 to {h.depth - 1}; got {cut!r}"
        )
    fields = m["fields"]
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise _fail(file, "fields", f"expected a list of field names from {list(FIELDS)}")
    for f in fields:
        if f not in FIELDS:
            raise _fail(
                file,
                "fields",
                f"{f!r} is not one of {list(FIELDS)} (a field names a folder of the store; "
                "paths are never followed)",
            )
    if "estimates" not in fields or len(set(fields)) != len(fields):
        raise _fail(file, "fields", "must list 'estimates', and each field once")
    if not isinstance(m["integer"], bool):
        raise _fail(file, "integer", "expected true or false")
    if not isinstance(m["diagnostics"], dict):
        raise _fail(file, "diagnostics", "expected a table")
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
            and all(isinstance(r, list) and len(r) == 2 and all(_is_int(x) for x in r) for r in p)
            for p in parts
        )
    ):
        raise _fail(
            file,
            "partitions",
            f"expected one list of {below} [start, stop) node ranges per partition "
            "(one per level below the cut)",
        )
    for j, k in enumerate(range(cut + 1, h.depth)):
        rows = [tuple(p[j]) for p in parts]
        if (
            [lo for lo, _ in rows] != [0, *(hi for _, hi in rows[:-1])]
            or rows[-1][1] != h.sizes[k]
            or any(hi < lo for lo, hi in rows)
        ):
            raise _fail(
                file,
                "partitions",
                f"the rows at level {h.names[k]!r} do not cover its {h.sizes[k]} nodes in order",
            )
    return m, sums


def _load(
    path: Path,
    rel: str,
    shape: tuple[int, ...],
    dtype: str,
    why: str,
    sums: dict[str, str],
    nan: bool = False,
) -> np.ndarray:
    """The array at ``path / rel``: checksum, dtype, exact shape and finiteness verified
    (``nan``: variances of sums, non-negative or NaN)."""
    file = store_file(path, rel)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{file} is missing from the release store") from None
    except OSError as exc:
        raise DataError(f"{file}: cannot read it ({exc.strerror or exc})") from None
    check_checksum(path, rel, data, sums)
    try:
        a = np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{file}: not a readable .npy array ({exc})") from None
    check_array(a, file, dtype, shape, why, "rows, sums" if nan else "rows, cells", not nan)
    if nan:
        _check_sum_values(a, str(file))
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
        Not a release store, another hierarchy, a file changed or missing, a missing or
        damaged ``checksums.json``, a malformed manifest (the key is named), or an array of
        the wrong dtype or shape or with non-finite values (the file is named).
    """
    path = Path(path)
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
    extra = sorted(set(sums) - files - {MANIFEST})
    if extra:
        raise DataError(
            f"{path / CHECKSUMS} lists {extra[0]}, which the manifest does not describe; "
            "the store was altered"
        )
    whole: dict[str, list[np.ndarray]] = {}
    for name in names:
        if name in SUM_FIELDS:
            dtype, why = "float64", "variances of sums"
        elif name == "estimates":
            dtype, why = (
                ("int64", "integer: true") if m["integer"] else ("float64", "integer: false")
            )
        else:
            dtype, why = "float64", name
        tail = (n, n) if name == "covariances" else (n,)
        if name in SUM_FIELDS:
            tail = (len(m["sums"][1]),)
        arrays = [
            _load(
                path,
                f"{name}/{h.names[k]}.npy",
                (h.sizes[k], *tail),
                dtype,
                why,
                sums,
                name in SUM_FIELDS,
            )
            for k in range(cut + 1)
        ]
        for j, k in enumerate(range(cut + 1, h.depth)):
            arrays.append(
                np.concatenate(
                    [
                        _load(
                            path,
                            f"{name}/{h.names[k]}/{_part_name(i)}",
                            (p[j][1] - p[j][0], *tail),
                            dtype,
                            why,
                            sums,
                            name in SUM_FIELDS,
                        )
                        for i, p in enumerate(m["partitions"])
                    ],
                    axis=0,
                )
            )
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
