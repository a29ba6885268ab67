"""The ``censusdp`` command: :func:`main`, the console script's entry point.

The parser is :func:`censusdp.app.commands.build_parser` (one module per sub-command under
:mod:`censusdp.app.commands`). Exit statuses and error lines are those of
:func:`censusdp.app.commands.common.run_cli` (2 for a :class:`~censusdp.errors.CensusDPError`,
a bad option or an unreadable path; 130 for Ctrl-C; 143 for SIGTERM, which :func:`main`
handles as Ctrl-C (:func:`censusdp.pipelines.interrupts.terminate_as_interrupt`); 1 for a
bug, named by type and place, never by message).

Global flags ``-q`` / ``-v`` (before or after the command) set what a command says on
stderr while it works (:mod:`censusdp.progress`): ``-q`` warnings only and no progress bars,
default progress bars on a terminal, ``-v`` bars wherever stderr goes and a line per stage,
``-vv`` debug lines too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from censusdp.app.commands import COMMANDS, build_parser
from censusdp.app.commands.common import run_cli
from censusdp.pipelines.interrupts import terminate_as_interrupt

__all__ = ["COMMANDS", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (SIGTERM stops it as Ctrl-C does)."""
    with terminate_as_interrupt():
        return run_cli(build_parser, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
