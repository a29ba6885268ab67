"""The ``censusdp`` command: the sub-commands of every layer under one parser.

Exit statuses and error lines are those of :func:`censusdp.command_line.run_cli` (2 for a
:class:`~censusdp.errors.CensusDPError`, a bad option or an unreadable path; 130 for Ctrl-C;
143 for SIGTERM, which :func:`main` handles as Ctrl-C
(:func:`censusdp.pipelines.interrupts.terminate_as_interrupt`); 1 for a bug, named by type and
place, never by message).

Start-up is kept light: every registrar's module imports only the standard library and
censusdp's light core at import, and a command imports what it runs (numpy, pandas, scipy,
numba, Dask, cvxpy, matplotlib) inside its function, so ``censusdp --help`` or a spec
refused by the parser answers in a fraction of a second (``benchmarks/startup.py``
measures it; a test checks that building the parser imports none of those).

Global flags ``-q`` / ``-v`` (before or after the command) set what a command says on
stderr while it works (:mod:`censusdp.progress`): ``-q`` warnings only and no progress bars,
default progress bars on a terminal, ``-v`` bars wherever stderr goes and a line per stage,
``-vv`` debug lines too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from censusdp import __version__
from censusdp.app.notebooks import register as register_notebooks
from censusdp.app.specs import register as register_spec
from censusdp.command_line import CommandParser, run_cli
from censusdp.experiments.midwest_demo import register as register_demo
from censusdp.experiments.registry import register as register_experiment
from censusdp.hierarchy.describe import register as register_hierarchy
from censusdp.pipelines.allocate import register as register_allocate
from censusdp.pipelines.commands import register as register_pipelines
from censusdp.pipelines.interrupts import terminate_as_interrupt
from censusdp.pipelines.nmf_command import register as register_nmf
from censusdp.pipelines.predict import register as register_predict
from censusdp.progress import verbosity

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
    register_nmf,
    register_spec,
    register_notebooks,
)


def _add_verbosity(parser: argparse.ArgumentParser, *, default: object) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        dest="verbose",
        action="count",
        default=default,
        help="say more on stderr while working: -v progress bars (also off a terminal) and "
        "a line per stage, -vv debug lines too",
    )
    group.add_argument(
        "-q",
        "--quiet",
        dest="verbose",
        action="store_const",
        const=-1,
        default=default,
        help="only warnings and errors on stderr, no progress bars",
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
    _add_verbosity(parser, default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    for child in _subparsers(parser):  # after the command: does not reset a flag given before
        _add_verbosity(child, default=argparse.SUPPRESS)
    return parser


def _run(args: argparse.Namespace) -> int:
    """Run the chosen command at the verbosity its flags set."""
    with verbosity(int(args.verbose)):
        return int(args.command_func(args) or 0)


def _wrapped_parser() -> argparse.ArgumentParser:
    """:func:`build_parser` whose commands run under :func:`_run` (the verbosity set)."""
    parser = build_parser()
    for child in _subparsers(parser):
        func = child.get_default("func")
        if func is not None:
            child.set_defaults(func=_run, command_func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (SIGTERM stops it as Ctrl-C does)."""
    with terminate_as_interrupt():
        return run_cli(_wrapped_parser, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
