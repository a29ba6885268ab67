"""Outputs: written whole or not at all, and never over anything censusdp did not write.

Two layers.

**Primitives** — :func:`atomic_dir` and :func:`atomic_file` write into a temporary sibling
with a visible name, ``NAME.censusdp-partial-PID-XXXXXX`` (files keep their extension, so
writers that choose a format by extension still can), renamed into place only when the block
succeeds. The temporary is removed on every failure, Ctrl-C included; one left by a process
that was killed (its PID no longer runs) is recognised and removed by the next write to the
same target.

**The output policy** — :func:`check_output`, :func:`output_dir` and :func:`output_file`,
used by every command that writes:

- a path that does not exist (or an empty directory) is created;
- an existing output that censusdp wrote is replaced only with ``overwrite`` (``--overwrite``).
  A directory is recognised by its ownership manifest :data:`MARKER` listing every file with
  its SHA-256; a single file by its sidecar ``NAME`` + :data:`SIDECAR_SUFFIX`. A file in it
  that the manifest does not list, or that was changed since, makes it someone else's;
- anything else is refused before any work: a directory with other files, a file of
  another kind, the input or spec itself, a directory holding them, the current directory
  (``.``, ``''``) or one of its parents, a symbolic link, an unwritable format.

Refusals are :class:`~censusdp.errors.SpecError` (exit status 2 on the command line).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from censusdp import __version__
from censusdp.errors import SpecError

__all__ = [
    "MARKER",
    "SIDECAR_SUFFIX",
    "atomic_dir",
    "atomic_file",
    "check_output",
    "output_dir",
    "output_file",
    "read_marker",
    "remove_stale",
    "verify_output_dir",
    "sidecar_path",
]

#: Ownership manifest at the root of every directory output.
MARKER = "censusdp-output.json"
#: Suffix of the ownership manifest beside a single-file output (``out.csv.censusdp.json``).
SIDECAR_SUFFIX = ".censusdp.json"
_TAG = "censusdp_output"
_PARTIAL = ".censusdp-partial-"
_OLD = ".censusdp-old-"

PathLike = str | os.PathLike[str]


# -- primitives -----------------------------------------------------------------------------


def _temp_name(target: Path, kind: str, suffix: str = "") -> Path:
    return target.with_name(f"{target.name}{kind}{os.getpid()}-{secrets.token_hex(3)}{suffix}")


def _stale_pattern(name: str) -> re.Pattern[str]:
    """Temporaries of ``name``: ours (``NAME.censusdp-partial|old-PID-hex[.ext]``) and those of
    earlier versions (hidden ``.NAME.xxxxxxxx.tmp`` and ``.NAME.old.PID``)."""
    n = re.escape(name)
    return re.compile(
        rf"^(?:{n}\.censusdp-(?:partial|old)-(?P<pid>\d+)-[0-9a-f]{{6}}(?:\.[^/]*)?"
        rf"|\.{n}\.[a-z0-9_]{{8}}\.tmp|\.{n}\.old\.(?P<oldpid>\d+))$"
    )


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, as another user
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def _uninterruptible() -> Iterator[None]:
    """Hold off Ctrl-C while a few renames or a clean-up run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def remove_stale(target: PathLike) -> list[Path]:
    """Remove the temporaries of ``target`` left by processes that no longer run.

    Returns the paths removed. A temporary of a running process (a concurrent write, or this
    process) is left alone.
    """
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = _stale_pattern(target.name)
    removed = []
    for entry in parent.iterdir():
        m = pattern.match(entry.name)
        if m is None:
            continue
        pid = m["pid"] or m["oldpid"]
        if pid is not None and _running(int(pid)):
            continue
        _remove(entry)
        removed.append(entry)
    return removed


def _commit_dir(tmp: Path, target: Path) -> None:
    old = None
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists() or target.is_symlink():
        old = _temp_name(target, _OLD)
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        _remove(old)


@contextmanager
def atomic_dir(target: PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``target`` when the block succeeds.

    On an exception (Ctrl-C included) the temporary directory is removed and ``target`` is
    left as it was. An existing ``target`` is replaced only after the new one is complete,
    and only when ``overwrite``; no copy of it is left behind. This primitive does not ask
    whose ``target`` is: commands go through :func:`output_dir`.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise FileExistsError(f"{target} exists; choose another --out or remove it")
    remove_stale(target)
    tmp = _temp_name(target, _PARTIAL)
    tmp.mkdir()
    try:
        yield tmp
        with _uninterruptible():
            _commit_dir(tmp, target)
    except BaseException:
        with _uninterruptible():
            _remove(tmp)
        raise


@contextmanager
def atomic_file(target: PathLike) -> Iterator[Path]:
    """Yield a temporary file path (created empty, same extension as ``target``) that is
    renamed to ``target`` when the block succeeds and removed when it fails."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = _temp_name(target, _PARTIAL, target.suffix)
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with _uninterruptible():
            _remove(tmp)
        raise


# -- ownership manifests --------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sidecar_path(target: PathLike) -> Path:
    """The ownership manifest beside a single-file output."""
    target = Path(target)
    return target.with_name(target.name + SIDECAR_SUFFIX)


def read_marker(path: PathLike) -> dict[str, Any] | None:
    """An ownership manifest's contents, or None when ``path`` is not one."""
    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 26:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get(_TAG) != 1 or not isinstance(doc.get("files"), dict):
        return None
    return doc


def _marker(kind: str, files: Mapping[str, str], command: str, info: Mapping | None) -> str:
    doc = {
        _TAG: 1,
        "kind": kind,
        "censusdp": __version__,
        "command": command,
        **dict(info or {}),
        "files": dict(files),
    }
    return json.dumps(doc, indent=1) + "\n"


def _walk(root: Path) -> Iterator[tuple[str, bool]]:
    """``(relative path, is a regular file)`` of everything under ``root`` but directories
    (symbolic links to directories included, never followed)."""
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            p = d / name
            yield p.relative_to(root).as_posix(), p.is_file() and not p.is_symlink()


def _tree(root: Path) -> tuple[list[str], list[str]]:
    """Relative paths of the regular files under ``root``, and of everything else (symbolic
    links, sockets, ...), directories excluded."""
    files, other = [], []
    for rel, regular in _walk(root):
        (files if regular else other).append(rel)
    return sorted(files), sorted(other)


def _first(names: Sequence[str], k: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def _foreign_in_dir(target: Path) -> str | None:
    """Why the directory ``target`` is not (wholly) a censusdp output, or None."""
    doc = read_marker(target / MARKER)
    if doc is None or doc.get("kind") != "directory":
        seen = [rel for rel, _ in itertools.islice(_walk(target), 4)]
        if not seen:
            return None  # empty (or empty folders only)
        return f"holds {_first(seen)}, not a censusdp output (no {MARKER})"
    files, other = _tree(target)
    listed = doc["files"]
    foreign = [f for f in files if f != MARKER and f not in listed] + other
    if foreign:
        return f"holds {_first(foreign)}, which censusdp did not write"
    changed = [f for f in files if f != MARKER and _sha256(target / f) != listed[f]]
    if changed:
        return f"{_first(changed)} changed since censusdp wrote it"
    return None


def verify_output_dir(path: PathLike, *, what: str = "directory") -> dict[str, Any]:
    """The ownership manifest of a censusdp output directory read as an *input*, verified.

    The check the output policy applies before replacing a directory (:data:`MARKER` present,
    every file listed with its SHA-256 and unchanged, nothing else in it), for a command that
    reads an earlier output (``--compose-with``); a listed file that is missing is refused
    too. The checksums detect edits and damage that
    do not also rewrite :data:`MARKER`; they are not a signature.

    Raises
    ------
    SpecError
        One line naming the directory, ``what`` it should be and the first problem.
    """
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        raise SpecError(f"{path}: not a directory; name the {what}")
    doc = read_marker(path / MARKER)
    problem = _foreign_in_dir(path)
    if doc is None or doc.get("kind") != "directory":
        problem = f"has no {MARKER} (not a censusdp output)"
    elif problem is None:
        missing = [f for f in doc["files"] if not (path / f).is_file()]
        if missing:
            problem = f"lacks {_first(missing)}, which censusdp wrote there"
    if problem is not None:
        raise SpecError(
            f"{path} {problem}: its checksums do not verify, so it cannot be trusted as the "
            f"{what}; give the unchanged folder censusdp wrote"
        )
    return doc


def _foreign_file(target: Path) -> str | None:
    """Why the file ``target`` is not a censusdp output, or None."""
    doc = read_marker(sidecar_path(target))
    if doc is None or doc.get("kind") != "file":
        return f"is not a censusdp output (no {sidecar_path(target).name} beside it)"
    if doc["files"].get(target.name) != _sha256(target):
        return "changed since censusdp wrote it"
    return None


# -- the policy -----------------------------------------------------------------------------


def check_output(
    target: PathLike,
    *,
    kind: Literal["dir", "file"],
    overwrite: bool = False,
    inputs: Iterable[PathLike | None] = (),
    formats: Sequence[str] | None = None,
    option: str = "--out",
) -> Path:
    """Apply the output policy to ``target`` before any work; return it as a Path.

    Parameters
    ----------
    target : path-like
    kind : {"dir", "file"}
        A directory output or a single file.
    overwrite : bool
        Replace an earlier censusdp output (``--overwrite``).
    inputs : paths
        The run's inputs (data, spec): never the output, never inside it.
    formats : sequence of str, optional
        Extensions a single-file output may have (e.g. ``(".csv", ".parquet")``).
    option : str
        The option the path came from, for messages (``--out``, ``-o``, ``[output] dir``).

    Raises
    ------
    SpecError
        When the target may not be written; nothing has been touched.
    """
    text = os.fspath(target)
    where = f"{option} {text!r}"
    if not text.strip():
        raise SpecError(f"{option}: empty path; name a new {_what(kind)}")
    path = Path(text)
    if path.name in ("", ".", ".."):
        raise SpecError(f"{where}: name a new {_what(kind)}, not the current or a parent one")
    real = path.resolve()
    cwd = Path.cwd().resolve()
    if cwd.is_relative_to(real):
        raise SpecError(f"{where} is the current directory or holds it; name a new {_what(kind)}")
    for given in inputs:
        if given is None:
            continue
        inp = Path(given).resolve()
        if inp == real:
            raise SpecError(
                f"{where} is the input {Path(given).name!r}; censusdp never writes over its inputs"
            )
        if inp.is_relative_to(real):
            raise SpecError(
                f"{where} holds the input {Path(given).name!r}; choose a new {_what(kind)}"
            )
    if formats is not None and path.suffix.lower() not in formats:
        raise SpecError(
            f"{where}: cannot write {path.suffix or 'a file without extension'!r}; "
            f"name the output with one of {', '.join(formats)}"
        )
    if path.parent.exists() and not path.parent.is_dir():
        raise SpecError(f"{where}: {str(path.parent)!r} is not a directory")
    if path.is_symlink():
        raise SpecError(f"{where} is a symbolic link; name a new {_what(kind)}")
    remove_stale(path)
    if kind == "file":
        side = sidecar_path(path)
        if (side.exists() or side.is_symlink()) and read_marker(side) is None:
            raise SpecError(f"{where}: {side.name!r} exists and censusdp did not write it")
    if not path.exists():
        return path
    if kind == "dir" and not path.is_dir():
        raise SpecError(f"{where} is a file; {option} names a directory")
    if kind == "file" and not path.is_file():
        raise SpecError(
            f"{where} is {'a directory' if path.is_dir() else 'not a regular file'}; {option} names a file"
        )
    problem = _foreign_in_dir(path) if kind == "dir" else _foreign_file(path)
    if problem is not None:
        raise SpecError(
            f"{where} {problem}; censusdp replaces only its own outputs: choose a new {_what(kind)}"
        )
    empty = kind == "dir" and next(_walk(path), None) is None
    if not empty and not overwrite:
        raise SpecError(f"{where} holds an earlier censusdp output; pass --overwrite to replace it")
    return path


def _what(kind: str) -> str:
    return "directory" if kind == "dir" else "file"


@contextmanager
def output_dir(
    target: PathLike,
    *,
    overwrite: bool = False,
    inputs: Iterable[PathLike | None] = (),
    command: str = "",
    option: str = "--out",
    info: Mapping[str, Any] | None = None,
) -> Iterator[Path]:
    """Yield a temporary directory that becomes the output ``target`` under the policy.

    The policy is checked on entry and again just before the rename; the ownership
    manifest (every file with its SHA-256, plus ``info``) is written last.
    """
    inputs = list(inputs)
    args = {"kind": "dir", "overwrite": overwrite, "inputs": inputs, "option": option}
    target = check_output(target, **args)  # type: ignore[arg-type]
    with atomic_dir(target, overwrite=True) as tmp:
        yield tmp
        check_output(target, **args)  # type: ignore[arg-type]
        files, other = _tree(tmp)
        if other:
            raise SpecError(f"{target}: refusing to publish non-regular files {_first(other)}")
        digests = {f: _sha256(tmp / f) for f in files if f != MARKER}
        (tmp / MARKER).write_text(_marker("directory", digests, command, info), encoding="utf-8")


@contextmanager
def output_file(
    target: PathLike,
    *,
    overwrite: bool = False,
    inputs: Iterable[PathLike | None] = (),
    formats: Sequence[str] | None = None,
    command: str = "",
    option: str = "-o",
    info: Mapping[str, Any] | None = None,
) -> Iterator[Path]:
    """Yield a temporary file path (with ``target``'s extension) that becomes the output
    ``target`` under the policy, with its sidecar ownership manifest."""
    inputs = list(inputs)
    args = {
        "kind": "file",
        "overwrite": overwrite,
        "inputs": inputs,
        "formats": formats,
        "option": option,
    }
    target = check_output(target, **args)  # type: ignore[arg-type]
    with atomic_file(target) as tmp:
        yield tmp
        check_output(target, **args)  # type: ignore[arg-type]
        text = _marker("file", {target.name: _sha256(tmp)}, command, info)
        with atomic_file(sidecar_path(target)) as side:
            side.write_text(text, encoding="utf-8")
