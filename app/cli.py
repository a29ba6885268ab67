"""The ``censusdp`` command: :func:`main`, the console script's entry point, runs the parser of
:mod:`censusdp.app.commands` under :func:`~censusdp.app.commands.common.run_cli` (exit
statuses and error lines) with SIGTERM handled as Ctrl-C, status 143
(:func:`censusdp.pipelines.interrupts.terminate_as_interrupt`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from censusdp.app.commands import build_parser
from censusdp.app.commands.common import run_cli
from censusdp.pipelines.interrupts import terminate_as_interrupt

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (SIGTERM stops it as Ctrl-C does)."""
    with terminate_as_interrupt():
        return run_cli(build_parser, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
