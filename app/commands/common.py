"""What every sub-command shares: a parser with one-line errors, argument types, the
argument groups several commands take (``--seed``, ``--overwrite``, ``--data``, the areas
of an equivalency file), the one error policy (exit statuses and stderr lines) every command
runs under.

Exit status and stderr, whatever goes wrong (:func:`run_cli`, the one place that maps an
error to a status: no command catches its own):

- a :class:`censusdp.errors.CensusDPError`, a bad option or an unreadable path: one line
  ``censusdp: error: ...`` and status 2;
- Ctrl-C: one line ``censusdp: interrupted ...`` and status 130, with no output written and
  no temporary left (outputs go through :mod:`censusdp.atomic`; Dask clusters are closed by
  their context managers on the way out); a :class:`KeyboardInterrupt` that carries ``what``
  and ``exit_status`` (SIGTERM's, raised by the application layer) names those instead;
- anything else is a bug: one line naming the exception type and where it was raised
  (never its message, which could hold data) and status 1; ``CENSUSDP_DEBUG=1`` shows the
  traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from censusdp.errors import CensusDPError

__all__ = [
    "CommandParser",
    "EXIT_INTERRUPTED",
    "add_areas",
    "add_data_option",
    "add_overwrite",
    "add_seed",
    "add_verbosity",
    "count_arg",
    "run_cli",
    "seed_arg",
    "warn_seed",
]

#: Exit status of a run stopped by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


class CommandParser(argparse.ArgumentParser):
    """argparse with errors on one line (no usage block) and status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("censusdp").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"censusdp: error: {where}{message} (see {self.prog} --help)\n")


def seed_arg(text: str) -> int:
    """``--seed``: a non-negative integer (the value is never echoed: seeds are secret)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a non-negative integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be a non-negative integer")
    return value


def count_arg(text: str) -> int:
    """``--partitions`` and other counts: a positive integer (0 is not "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1, got {value} (omit the option to let the pipeline choose)"
        )
    return value


def warn_seed(seed: int | None) -> None:
    """Say on stderr that an explicit seed means reproducible mode (never its value)."""
    if seed is not None:
        print(
            "censusdp: warning: reproducible mode (explicit seed): for reproduction and testing, "
            "never for a real release",
            file=sys.stderr,
        )


def add_verbosity(parser: argparse.ArgumentParser, *, default: object) -> None:
    """``-v`` / ``-q``: what a command says on stderr while it works (:mod:`censusdp.progress`)."""
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


def add_overwrite(parser: argparse.ArgumentParser, *, seed: bool = False) -> None:
    """``--overwrite``: replace an earlier censusdp output (never anything else); with
    ``seed``, :func:`add_seed` first."""
    if seed:
        add_seed(parser)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier output of censusdp at the output path (nothing else is ever "
        "replaced)",
    )


def add_seed(parser: argparse.ArgumentParser) -> None:
    """``--seed N``: reproducible mode (:func:`seed_arg`; say it with :func:`warn_seed`)."""
    parser.add_argument(
        "--seed", type=seed_arg, help="reproducible mode (never for a real release)"
    )


def add_data_option(parser: argparse.ArgumentParser) -> None:
    """``--data FILE``: the data file whose code columns give a run spec's hierarchy."""
    parser.add_argument(
        "--data",
        metavar="FILE",
        help="a run spec's data file (overrides [data] path); only its header and code "
        "columns are read, never its counts",
    )


def add_areas(
    parser: argparse.ArgumentParser, metavar: str, help: str, block: str, area: str, example: str
) -> None:
    """``--areas FILE`` (a block → area equivalency file,
    :func:`censusdp.hierarchy.equivalency.read_equivalency`), its ``--block-column`` and
    ``--area-column`` (defaults ``block`` and ``area``), ``--area-name`` (``example``) and
    ``--skip-blank-areas``."""
    parser.add_argument("--areas", metavar=metavar, help=help)
    parser.add_argument("--block-column", default=block, help=f"its block column ({block})")
    parser.add_argument("--area-column", default=area, help=f"its area column ({area})")
    parser.add_argument(
        "--area-name", help=f"what the areas are, e.g. {example} (default: the column)"
    )
    parser.add_argument(
        "--skip-blank-areas",
        action="store_true",
        help="leave out blocks whose area code is blank (in no area) instead of refusing",
    )


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of censusdp's own code in ``exc``'s traceback
    (else the innermost frame), for bug reports."""
    from censusdp.paths import repo_root

    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return "unknown location"
    root = str(repo_root())
    ours = [f for f in tb if f.filename.startswith(root)]
    frame = (ours or tb)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def run_cli(
    build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None = None
) -> int:
    """Parse ``argv`` with ``build_parser()`` and run the chosen command's ``func`` at the
    verbosity ``-q`` / ``-v`` set (:func:`censusdp.progress.verbosity`); returns the exit
    status (see the module docstring)."""
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version and option errors
            return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
        from censusdp.progress import verbosity

        with verbosity(int(getattr(args, "verbose", 0))):
            return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C, or a signal raised as one (SIGTERM: 143)
        what = getattr(exc, "what", "interrupted")
        print(f"censusdp: {what}; nothing was written", file=sys.stderr)
        return int(getattr(exc, "exit_status", EXIT_INTERRUPTED))
    except CensusDPError as exc:
        print(f"censusdp: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"censusdp: error: file not found: {exc.filename}", file=sys.stderr)
        return 2
    except OSError as exc:
        what = exc.strerror or type(exc).__name__
        where = f": {exc.filename}" if exc.filename else ""
        print(f"censusdp: error: {what}{where}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("CENSUSDP_DEBUG"):
            traceback.print_exc()
        print(
            f"censusdp: internal error: {type(exc).__name__} at {_where(exc)}; this is a bug, "
            "please report it (CENSUSDP_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line(text: str) -> str:
    return " ".join(text.split())
