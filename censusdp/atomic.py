"""Write outputs atomically: into a temporary sibling path, renamed into place only when
complete, so that an error never leaves a half-written file or directory behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_dir", "atomic_file"]


@contextmanager
def atomic_dir(target: str | os.PathLike[str], *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``target`` when the block succeeds.

    On an exception the temporary directory is removed and ``target`` is left as it was.
    An existing ``target`` is replaced only after the new one is complete.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; choose another --out or remove it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_file(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary file path that is renamed to ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
