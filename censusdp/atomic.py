"""Outputs: written whole or not at all, and never over anything censusdp did not write.

Two layers.

**Primitives** — :func:`atomic_dir` and :func:`atomic_file` write into a temporary sibling
with a visible name, ``NAME.censusdp-partial-PID-XXXXXX`` (files keep their extension, so
writers that choose a format by extension still can), renamed into place only when the block
succeeds. The temporary is removed on every failure, Ctrl-C and SIGTERM included.

A temporary is *claimed* before it exists: a claim (:data:`CLAIM`, JSON holding the owner's
PID, host and a 128-bit random token whose first six hex digits are in the name) is written
first inside a temporary directory, and beside a temporary file (``TMP`` +
:data:`CLAIM_SUFFIX`, created with ``O_EXCL`` before the file itself, also with ``O_EXCL``).
An earlier output moved aside while its replacement is renamed in
(``NAME.censusdp-old-PID-XXXXXX``) is claimed the same way, beside it, before the move.
:func:`remove_stale` removes a temporary only when its claim proves it ours (tag, name, PID,
token and host all agree) and its process no longer runs on this host; anything else that
merely matches the name pattern — a user's folder, a file of another tool — is left
untouched. A moved-aside earlier output is removed only once something stands at the target
again (a run killed between the two renames leaves the earlier output recoverable). Nothing
unprovable is removed: not the hidden ``.NAME.xxxxxxxx.tmp`` / ``.NAME.old.PID`` of earlier
versions, nor a temporary directory killed in the instant between shedding its claim and
its rename into place (left for the user, under its visible name).

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
import socket
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from censusdp import __version__
from censusdp.errors import SpecError

__all__ = [
    "CLAIM",
    "CLAIM_SUFFIX",
    "MARKER",
    "SIDECAR_SUFFIX",
    "atomic_dir",
    "atomic_file",
    "check_output",
    "claim_path",
    "file_sha256",
    "output_dir",
    "output_file",
    "read_claim",
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

#: The claim written first inside every temporary directory of censusdp (removed just before
#: the directory is renamed into place).
CLAIM = ".censusdp-partial.json"
#: Suffix of the claim beside a temporary file or a moved-aside earlier output.
CLAIM_SUFFIX = ".censusdp-claim.json"
_CLAIM_TAG = "censusdp_temporary"
_NEW_TRIES = 64
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _claim_text(name: str, token: str) -> bytes:
    doc = {
        _CLAIM_TAG: 1,
        "name": name,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "token": token,
        "censusdp": __version__,
    }
    return (json.dumps(doc) + "\n").encode()


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``; FileExistsError when anything (a link included) is
    there. A file this call created is removed again if writing it fails."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def claim_path(temporary: PathLike) -> Path:
    """The claim beside a temporary file (or a moved-aside earlier output)."""
    temporary = Path(temporary)
    return temporary.with_name(temporary.name + CLAIM_SUFFIX)


def _new_temp(target: Path, kind: str, *, directory: bool, suffix: str = "") -> Path:
    """Create a claimed temporary sibling of ``target``, ``NAME{kind}PID-XXXXXX{suffix}``.

    A directory is made, then its claim written inside; for a file the claim beside it is
    created first, then the (empty) file, both with ``O_EXCL``: a name already taken by
    anything is never reused, so a valid claim names only what this process created.
    """
    for _ in range(_NEW_TRIES):
        token = secrets.token_hex(16)
        tmp = target.with_name(f"{target.name}{kind}{os.getpid()}-{token[:6]}{suffix}")
        text = _claim_text(tmp.name, token)
        with _uninterruptible():
            if directory:
                try:
                    tmp.mkdir()
                except FileExistsError:
                    continue
                try:
                    _write_new(tmp / CLAIM, text)
                except BaseException:
                    _remove(tmp)
                    raise
                return tmp
            side = claim_path(tmp)
            try:
                _write_new(side, text)
            except FileExistsError:
                continue
            try:
                _write_new(tmp, b"")
            except FileExistsError:
                side.unlink(missing_ok=True)
                continue
            except BaseException:
                side.unlink(missing_ok=True)
                raise
            return tmp
    raise FileExistsError(f"{target}: no free name for a temporary beside it")


def _move_aside(target: Path) -> Path:
    """Rename ``target`` to a claimed ``NAME.censusdp-old-PID-XXXXXX`` (claim first)."""
    for _ in range(_NEW_TRIES):
        token = secrets.token_hex(16)
        old = target.with_name(f"{target.name}{_OLD}{os.getpid()}-{token[:6]}")
        if old.exists() or old.is_symlink():
            continue
        side = claim_path(old)
        try:
            _write_new(side, _claim_text(old.name, token))
        except FileExistsError:
            continue
        try:
            os.replace(target, old)
        except BaseException:
            side.unlink(missing_ok=True)
            raise
        return old
    raise FileExistsError(f"{target}: no free name to move it aside")


def _stale_pattern(name: str) -> re.Pattern[str]:
    """Names of temporaries of ``name``: ``NAME.censusdp-partial|old-PID-XXXXXX[.ext]``."""
    return re.compile(
        rf"^{re.escape(name)}\.censusdp-(?P<kind>partial|old)-(?P<pid>\d+)-"
        rf"(?P<token>[0-9a-f]{{6}})(?:\.[^/]*)?$"
    )


def read_claim(path: PathLike) -> dict[str, Any] | None:
    """A temporary's claim (see the module docstring), or None when ``path`` is not one."""
    path = Path(path)
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            return None
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get(_CLAIM_TAG) != 1:
        return None
    return doc


def _proves(claim: Path, name: str, m: re.Match[str]) -> bool:
    """Whether ``claim`` proves the temporary ``name`` (matched by ``m``) is censusdp's,
    written on this host by process ``m["pid"]``."""
    doc = read_claim(claim)
    token = doc.get("token") if doc else None
    return (
        doc is not None
        and doc.get("name") == name
        and doc.get("pid") == int(m["pid"])
        and doc.get("host") == socket.gethostname()
        and isinstance(token, str)
        and re.fullmatch(r"[0-9a-f]{32}", token) is not None
        and token[:6] == m["token"]
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


def _remove_claimed(entry: Path, claim: Path) -> bool:
    """Remove a proven temporary, its claim last (an interrupted removal stays provable);
    whether it is gone."""
    try:
        if claim.parent == entry:
            for child in entry.iterdir():
                if child.name != CLAIM:
                    _remove(child)
            if any(c.name != CLAIM for c in entry.iterdir()):
                return False
            claim.unlink(missing_ok=True)
            entry.rmdir()
        else:
            _remove(entry)
            if entry.exists() or entry.is_symlink():
                return False
            claim.unlink(missing_ok=True)
    except OSError:
        return False
    return True


@contextmanager
def _uninterruptible() -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM while a few renames or a clean-up run (main thread only;
    a signal arriving meanwhile is ignored, as if it had come just after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set in C


def remove_stale(target: PathLike) -> list[Path]:
    """Remove the temporaries of ``target`` that censusdp's dead processes left.

    A temporary is removed only when its claim proves it censusdp's (see the module
    docstring) and the process that wrote it no longer runs on this host; a moved-aside
    earlier output only when something stands at ``target`` again. Anything else that
    matches the name pattern is left untouched, and so is a temporary of a running process
    (a concurrent write, or this process).

    Returns
    -------
    list of Path
        The temporaries removed (their claims go with them) and the claims whose temporary
        was already gone.
    """
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = _stale_pattern(target.name)
    removed = []
    entries = sorted(parent.iterdir())
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or entry.name.endswith(CLAIM_SUFFIX):
            continue
        inside = m["kind"] == "partial" and entry.is_dir() and not entry.is_symlink()
        claim = entry / CLAIM if inside else claim_path(entry)
        if not _proves(claim, entry.name, m) or _running(int(m["pid"])):
            continue
        if m["kind"] == "old" and not (target.exists() or target.is_symlink()):
            continue  # the replacement never landed: the earlier output stays recoverable
        if _remove_claimed(entry, claim):
            removed.append(entry)
    for entry in entries:
        if not entry.name.endswith(CLAIM_SUFFIX):
            continue
        subject = entry.with_name(entry.name.removesuffix(CLAIM_SUFFIX))
        m = pattern.match(subject.name)
        if m is None or subject.exists() or subject.is_symlink():
            continue
        if _proves(entry, subject.name, m) and not _running(int(m["pid"])):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _commit_dir(tmp: Path, target: Path) -> None:
    (tmp / CLAIM).unlink(missing_ok=True)  # from here on the output, not a temporary
    old = None
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists() or target.is_symlink():
        old = _move_aside(target)
    try:
        os.replace(tmp, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
            claim_path(old).unlink(missing_ok=True)
        raise
    if old is not None:
        _remove_claimed(old, claim_path(old))


@contextmanager
def atomic_dir(target: PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``target`` when the block succeeds.

    On an exception (Ctrl-C and SIGTERM included) the temporary directory is removed and
    ``target`` is left as it was. An existing ``target`` is replaced only after the new one
    is complete, and only when ``overwrite``; no copy of it is left behind. This primitive
    does not ask whose ``target`` is: commands go through :func:`output_dir`.

    The directory holds its claim, :data:`CLAIM`, until it is renamed into place; writers
    that list what they wrote leave it out.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise FileExistsError(f"{target} exists; choose another --out or remove it")
    remove_stale(target)
    tmp = _new_temp(target, _PARTIAL, directory=True)
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
    tmp = _new_temp(target, _PARTIAL, directory=False, suffix=target.suffix)
    claim = claim_path(tmp)
    try:
        yield tmp
        with _uninterruptible():
            os.replace(tmp, target)
    except BaseException:
        with _uninterruptible():
            _remove(tmp)
            claim.unlink(missing_ok=True)
        raise
    claim.unlink(missing_ok=True)


# -- ownership manifests --------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex, read in blocks (``hashlib.file_digest``)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"  # written as UTF-8


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
    changed = [f for f in files if f != MARKER and file_sha256(target / f) != listed[f]]
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
    if doc["files"].get(target.name) != file_sha256(target):
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
        files = [f for f in files if f != CLAIM]
        if other:
            raise SpecError(f"{target}: refusing to publish non-regular files {_first(other)}")
        digests = {f: file_sha256(tmp / f) for f in files if f != MARKER}
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
        text = _marker("file", {target.name: file_sha256(tmp)}, command, info)
        with atomic_file(sidecar_path(target)) as side:
            side.write_text(text, encoding="utf-8")
