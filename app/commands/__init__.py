"""The ``censusdp`` sub-commands: the only place argparse is used.

One module per sub-command holds its parser (``register(sub)``, which adds it with
``set_defaults(func=...)``) and the thin glue that turns the parsed arguments into a call of
a typed library function and prints what it wrote; :mod:`~censusdp.app.commands.common`
holds what they share (one-line errors, argument types, ``-q`` / ``-v``, and ``run_cli``,
the one error policy: exit 2 for bad input). The library holds typed functions only (a
test walks its syntax trees). Every module here is light at import; a command imports what
it runs (numpy, pandas, Dask, ...) inside its function, so ``censusdp --help`` answers in a
fraction of a second (``benchmarks/startup.py``; a test checks the parser imports none).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from censusdp import __version__
from censusdp.app.commands import (
    allocate,
    demo,
    experiment,
    hierarchy,
    nmf,
    notebooks,
    predict,
    privatize,
    run,
    spec,
)
from censusdp.app.commands.common import CommandParser, add_verbosity

__all__ = ["COMMANDS", "build_parser"]

#: The registrars of the sub-commands, in ``--help`` order.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    demo.register,
    run.register,
    privatize.register,
    predict.register,
    allocate.register,
    experiment.register,
    hierarchy.register,
    nmf.register,
    spec.register,
    notebooks.register,
)


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every sub-command's parser below ``parser``, nested ones included."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += [child, *_subparsers(child)]
    return found


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command (``-q`` / ``-v`` accepted before or after it)."""
    parser = CommandParser(
        prog="censusdp",
        description="Census-style hierarchical disclosure avoidance (subspace DP estimators "
        "beside a TopDown-style baseline).",
    )
    parser.add_argument("--version", action="version", version=f"censusdp {__version__}")
    add_verbosity(parser, default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    for child in _subparsers(parser):  # after the command: does not reset a flag given before
        add_verbosity(child, default=argparse.SUPPRESS)
    return parser
