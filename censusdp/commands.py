"""Registry of CLI sub-commands beyond ``experiment``.

Each entry is ``register(subparsers)``: it adds one sub-command with ``set_defaults(func=...)``.
Keep command implementations in the module that owns the feature; list the registrar here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = []


def _register_hierarchy(sub: argparse._SubParsersAction) -> None:
    """``censusdp hierarchy describe`` (implemented in :mod:`censusdp.hierarchy.describe`)."""
    from censusdp.hierarchy.describe import register

    register(sub)


REGISTRARS.append(_register_hierarchy)


def _register_pipelines(sub: argparse._SubParsersAction) -> None:
    """``censusdp run``, ``demo`` and ``privatize`` (in :mod:`censusdp.pipelines.commands`)."""
    from censusdp.pipelines.commands import register

    register(sub)


REGISTRARS.append(_register_pipelines)


def _register_predict(sub: argparse._SubParsersAction) -> None:
    """``censusdp predict`` (in :mod:`censusdp.pipelines.predict`)."""
    from censusdp.pipelines.predict import register

    register(sub)


REGISTRARS.append(_register_predict)
