"""One release store: a directory written piece by piece, checked whole when read.

Both kinds of stored release use this format and this implementation, adding only their
manifest keys and arrays: a :class:`~censusdp.estimation.release.Release`, plain or
partitioned (:mod:`censusdp.pipelines.io.release_store`; a whole release is one piece), and a
streamed ``pl94`` run written partition by partition (:mod:`censusdp.pipelines.io.pl94_store`)::

    manifest.json      the kind's keys, with its "format" (kind and version)
    <kind>/<level>...  the pieces: .npy arrays, plain or gzip-compressed (.npy.gz)
    checksums.json     {"format", "algorithm": "sha256", "files": {path: SHA-256}}: every
                       file above; written last

**Writing** (:class:`StoreWriter`): under a claimed temporary name renamed into place once
the manifest and then the checksums are written (:func:`censusdp.atomic.atomic_dir`: on any
failure, Ctrl-C and SIGTERM included, nothing is left and the temporary is removed; stale
temporaries beside the target are removed only when their claim proves them ours). Each file
goes through a temporary name of its own (:func:`save_npy`), so a task run again replaces it
whole; those a killed task left inside the store's temporary are removed before the
manifest. ``overwrite`` replaces an existing target only once the new store is complete and
only when it is a store of the same kind every file of which its checksums list
(:func:`why_not_owned`): never a file the tool cannot prove it wrote.

**Reading** trusts nothing: :func:`read_checksums`, :func:`check_listed` (exactly the files
the manifest describes), :func:`load_piece` (opened inside the store only,
:func:`store_file`; SHA-256, :func:`check_checksum`; dtype, exact shape, finiteness,
:func:`check_array`), :func:`read_privacy` and :func:`check_tiling`. Every failure is a
one-line :class:`~censusdp.errors.DataError` naming the file or manifest key, never a value
of the release. The checksums detect corruption and edits that do not also rewrite
``checksums.json``; they are not a signature. :func:`files_digest` binds the pieces'
checksums into a manifest, whose SHA-256, recorded apart from the store, then binds every
byte a reader returns (the ``pl94`` kind's release digest).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.atomic import atomic_dir
from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError

__all__ = [
    "CHECKSUMS",
    "MANIFEST",
    "StoreWriter",
    "check_array",
    "check_checksum",
    "check_finite",
    "check_listed",
    "check_tiling",
    "files_digest",
    "is_int",
    "load_array",
    "load_piece",
    "manifest_error",
    "read_bytes",
    "read_checksums",
    "read_json",
    "read_privacy",
    "save_npy",
    "sha256_hex",
    "store_file",
    "why_not_owned",
]

MANIFEST = "manifest.json"
CHECKSUMS = "checksums.json"
_HEX = re.compile(r"[0-9a-f]{64}")


# -- hashing and writing ----------------------------------------------------------------------


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, in hex."""
    return hashlib.sha256(data).hexdigest()


def save_npy(path: Path, array: np.ndarray, compresslevel: int | None = None) -> str:
    """``array`` as ``.npy`` at ``path``, through a temporary name: a task run again replaces
    the file whole. Returns the file's SHA-256 (hex).

    ``compresslevel``: gzip the ``.npy`` (the same bytes every time: no time stamp). Level 1
    is what the ``pl94`` store uses: on a partition's block tables, 14.7 MB of ``.npy``,
    level 6 took 2.1 CPU s, 15% of the national run's partition time, for the same 7.0 MB as
    level 1 in 0.26 s.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    array = np.ascontiguousarray(array)
    if compresslevel is None:
        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)
        with open(tmp, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    else:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        data = gzip.compress(buf.getvalue(), compresslevel=compresslevel, mtime=0)
        tmp.write_bytes(data)
        digest = sha256_hex(data)
    os.replace(tmp, path)
    return digest


def files_digest(sums: Mapping[str, str]) -> str:
    """SHA-256 of the checksums of a store's pieces (every file but the manifest and the
    checksum file), as ``sha256sum`` lists them sorted by path: what a manifest binds."""
    lines = "".join(f"{sums[rel]}  {rel}\n" for rel in sorted(sums) if rel != MANIFEST)
    return sha256_hex(lines.encode())


def why_not_owned(path: Path, formats: Collection[Any], kind: str) -> str | None:
    """Why ``path`` is not a store of ``kind`` that a writer may replace (a directory whose
    manifest has one of ``formats`` and every file of which its checksums list), or None."""
    if path.is_symlink() or not path.is_dir():
        return "is not a directory"
    try:
        sums = read_checksums(path)
        _, manifest = read_json(path / MANIFEST)
    except DataError:
        return f"has no readable {MANIFEST} and {CHECKSUMS} of a store"
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if not isinstance(fmt, str | int) or fmt not in formats:
        return f"has a {MANIFEST} that is not a {kind} store's"
    listed = {*sums, CHECKSUMS}
    other = sorted(
        str(f.relative_to(path)) for f in path.rglob("*")
        if not f.is_dir() and str(f.relative_to(path)) not in listed
    )  # fmt: skip
    if other:
        return f"holds {other[0]!r}, which the store does not list"
    return None


class StoreWriter:
    """A store being written (the module docstring): use as a context manager and call
    :meth:`finish` inside it; on an exception, or without :meth:`finish`, nothing is left
    at ``path``. Pieces written into :attr:`root` by other processes (Dask workers sharing
    the filesystem) are recorded with :meth:`record`.

    Parameters
    ----------
    path : path-like
        The store directory (created; its parent too).
    formats : collection
        The manifest formats of this kind of store: an existing store replaced with
        ``overwrite`` must have one of them.
    kind : str
        The kind's name, in messages (``"release"``, ``"pl94"``).
    overwrite : bool
        Replace an existing store of this kind once the new one is complete.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        formats: Collection[Any],
        kind: str,
        *,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(path)
        self.formats, self.kind, self.overwrite = formats, kind, overwrite
        self.digests: dict[str, str] = {}
        self.bytes = 0
        self.root: Path | None = None
        self._lock = threading.Lock()
        self._ctx: Any = None
        self._finished = False

    def __enter__(self) -> StoreWriter:
        if self.path.exists() or self.path.is_symlink():
            if not self.overwrite:
                raise FileExistsError(
                    f"{self.path} exists; write the store elsewhere, remove it, or pass "
                    "overwrite=True"
                )
            why = why_not_owned(self.path, self.formats, self.kind)
            if why:
                raise SpecError(
                    f"{self.path} {why}: overwrite replaces only a {self.kind} store; write "
                    "the store elsewhere"
                )
        self._ctx = atomic_dir(self.path, overwrite=self.overwrite)
        self.root = self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        ctx, self._ctx = self._ctx, None
        if exc[0] is None and not self._finished:
            err = DataError(
                f"{self.path}: the store was closed before finish() wrote its manifest; "
                "nothing was kept (call finish inside the with block)"
            )
            ctx.__exit__(DataError, err, None)
            raise err
        return ctx.__exit__(*exc)

    def record(self, digests: Mapping[str, str], nbytes: int = 0) -> None:
        """Record files written into :attr:`root`: their SHA-256 by relative path, and their
        bytes (thread-safe: pieces may arrive from several threads)."""
        with self._lock:
            self.digests.update(digests)
            self.bytes += int(nbytes)

    def save(self, rel: str, array: np.ndarray, compresslevel: int | None = None) -> None:
        """Write ``array`` at ``rel`` (:func:`save_npy`, its folder created) and record it."""
        file = self.root / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        digest = save_npy(file, array, compresslevel)
        self.record({rel: digest}, file.stat().st_size)

    def finish(self, manifest: Mapping[str, Any]) -> bytes:
        """Write ``manifest`` (JSON, with the store's ``format`` among its keys), then
        ``checksums.json`` (last), once the temporaries of killed tasks are removed.

        Returns
        -------
        bytes
            The manifest's bytes (their SHA-256 names the store).
        """
        if self.root is None or self._finished:
            raise DataError(f"{self.path}: finish() is called once, inside the with block")
        for stale in self.root.rglob(".*.tmp"):  # left by a task killed mid-write, run again
            stale.unlink(missing_ok=True)
        text = (json.dumps(dict(manifest), indent=1) + "\n").encode()
        (self.root / MANIFEST).write_bytes(text)
        self.record({MANIFEST: sha256_hex(text)}, len(text))
        files = dict(sorted(self.digests.items()))
        sums = {"format": manifest["format"], "algorithm": "sha256", "files": files}
        (self.root / CHECKSUMS).write_text(json.dumps(sums, indent=1) + "\n")  # last
        self.bytes += (self.root / CHECKSUMS).stat().st_size
        self._finished = True
        return text


# -- reading ----------------------------------------------------------------------------------


def is_int(x: Any) -> bool:
    """``x`` is a Python integer (not a bool): what a JSON count or index must be."""
    return isinstance(x, int) and not isinstance(x, bool)


def manifest_error(file: Path, key: str, message: str) -> DataError:
    """The error naming the manifest ``file`` and its ``key``."""
    return DataError(f"{file}: manifest key {key!r}: {message}")


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


def read_checksums(path: Path) -> dict[str, str]:
    """``checksums.json`` of the store ``path``: SHA-256 (hex) by relative file path.

    The entries are not checked to be paths inside the store: a reader opens them through
    :func:`store_file`, or checks them against the files its manifest describes
    (:func:`check_listed`).

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


def check_listed(path: Path, sums: Mapping[str, str], wanted: set[str]) -> None:
    """Refuse checksums that list a file the manifest does not describe, or miss one.

    Raises
    ------
    DataError
        Naming the first such file (a path, never data).
    """
    extra, absent = sorted(set(sums) - wanted), sorted(wanted - set(sums))
    if extra:
        raise DataError(
            f"{path / CHECKSUMS} lists {extra[0]}, which the manifest does not describe; "
            "the store was altered, write it again"
        )
    if absent:
        raise DataError(
            f"{path / CHECKSUMS} has no checksum for {absent[0]}; the store is incomplete, "
            "write it again"
        )


def check_checksum(path: Path, rel: str, data: bytes, sums: Mapping[str, str]) -> None:
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


def read_bytes(root: Path, rel: str) -> bytes:
    """The bytes of the store's file ``rel``, opened inside the store only
    (:func:`store_file`)."""
    file = store_file(root, rel)
    try:
        return file.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{file} is missing: the store is incomplete; write it again") from None
    except OSError as exc:
        raise DataError(f"{file}: cannot read it ({exc.strerror or exc})") from None


def load_array(file: Path, data: bytes) -> np.ndarray:
    """The array in ``data`` (the bytes of ``file``: ``.npy``, or ``.npy`` gzipped when the
    name ends in ``.gz``); never unpickles."""
    try:
        if file.name.endswith(".gz"):
            data = gzip.decompress(data)
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{file}: not a readable .npy array ({exc})") from None


def check_finite(array: np.ndarray, where: str) -> None:
    """Refuse NaN or ±inf (their count is not confidential; the values are never shown)."""
    if array.dtype.kind == "f":
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise DataError(f"{where}: {bad} non-finite values (NaN or inf); a release is finite")


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


def load_piece(
    root: Path,
    rel: str,
    sums: Mapping[str, str],
    dtype: np.dtype | str | Sequence[np.dtype | str],
    shape: Sequence[int | None],
    why: str,
    axes: str,
    finite: bool = True,
) -> np.ndarray:
    """The array at ``root / rel``, every check of a reader made first: inside the store
    (:func:`store_file`), its SHA-256 (:func:`check_checksum`), a ``.npy`` array, then
    :func:`check_array` (``dtype``, exact ``shape``, finite when ``finite``)."""
    data = read_bytes(root, rel)
    check_checksum(root, rel, data, sums)
    file = root / rel
    return check_array(load_array(file, data), file, dtype, shape, why, axes, finite)


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
        raise manifest_error(file, "privacy", "expected a table")
    for key in ("epsilon", "rho"):
        if d.get(key) is not None and not _positive(d[key]):
            raise manifest_error(file, f"privacy.{key}", "must be a positive finite number")
    delta = d.get("delta")
    if delta is not None and not (_positive(delta) and delta < 1):
        raise manifest_error(file, "privacy.delta", "must lie strictly between 0 and 1")
    for key in ("invariants", "notes"):
        if not isinstance(d.get(key, []), list) or not all(isinstance(x, str) for x in d[key]):
            raise manifest_error(file, f"privacy.{key}", "expected a list of strings")
    for key in ("geometry", "mechanism"):
        if not isinstance(d.get(key, ""), str):
            raise manifest_error(file, f"privacy.{key}", "expected a string")
    try:
        return PrivacyStatement.from_dict(d)
    except (KeyError, ValueError, TypeError) as exc:
        raise manifest_error(file, "privacy", f"not a privacy statement ({exc})") from None


def check_tiling(file: Path, level: str, size: int, rows: Sequence[tuple[int, int]]) -> None:
    """Refuse node ranges ``rows`` (``[start, stop)``, in the order their pieces are read)
    unless they tile the ``size`` nodes of ``level`` in that order, without gap or overlap.

    Raises
    ------
    DataError
        Naming the manifest ``file``, its key ``partitions`` and the level.
    """
    at, ok = 0, bool(rows)
    for lo, hi in rows:
        ok, at = ok and lo == at and hi >= lo, hi
    if not ok or at != size:
        raise manifest_error(
            file,
            "partitions",
            f"the pieces of level {level!r} do not tile its {size} nodes in order",
        )
