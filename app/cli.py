"""The ``censusdp`` command: the sub-commands of every layer under one parser.

Exit statuses and error lines are those of :func:`censusdp.command_line.run_cli` (2 for a
:class:`~censusdp.errors.CensusDPError`, a bad option or an unreadable path; 130 for Ctrl-C;
143 for SIGTERM, which :func:`main` handles as Ctrl-C
(:func:`censusdp.pipelines.interrupts.terminate_as_interrupt`); 1 for a bug, named by type and
place, never by message).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from censusdp import __version__
from censusdp.command_line import CommandParser, run_cli
from censusdp.experiments.midwest_demo import register as register_demo
from censusdp.experiments.registry import register as register_experiment
from censusdp.hierarchy.describe import register as register_hierarchy
from censusdp.pipelines.allocate import register as register_allocate
from censusdp.pipelines.commands import register as register_pipelines
from censusdp.pipelines.interrupts import terminate_as_interrupt
from censusdp.pipelines.predict import register as register_predict

__all__ = ["COMMANDS", "build_parser", "main"]

#: The registrars of the sub-commands, one per owning module, in ``--help`` order; each adds
#: its sub-command(s) with ``set_defaults(func=...)``.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    register_demo,
    register_pipelines,
    register_predict,
    register_allocate,
    register_experiment,
    register_hierarchy,
    __import__("censusdp.pipelines.nmf_command", fromlist=["register"]).register,
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command."""
    parser = CommandParser(
        prog="censusdp",
        description="Census-style hierarchical disclosure avoidance (subspace DP estimators "
        "beside a TopDown-style baseline).",
    )
    parser.add_argument("--version", action="version", version=f"censusdp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (SIGTERM stops it as Ctrl-C does)."""
    with terminate_as_interrupt():
        return run_cli(build_parser, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
