"""Where optional shared data lives.

The project runs without ``../shared``: code that needs its files calls
:func:`shared_data_file`, which returns None when the file is absent, and tests skip.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["repo_root", "shared_data_dir", "shared_data_file"]


def repo_root() -> Path:
    """The source checkout holding this package (editable installs)."""
    return Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """``$CENSUSDP_SHARED_DATA``, else ``<repo>/../shared/data`` or ``./../shared/data``."""
    env = os.environ.get("CENSUSDP_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [repo_root().parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    return None


def shared_data_file(name: str) -> Path | None:
    """A file of the shared data folder, or None when it is not there."""
    d = shared_data_dir()
    if d is None:
        return None
    p = d / name
    return p if p.is_file() else None
