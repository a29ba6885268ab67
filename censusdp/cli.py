"""The ``censusdp`` command line.

Every :class:`censusdp.errors.CensusDPError` becomes a one-line message on stderr and exit
status 2; nothing is half-written (outputs go through :mod:`censusdp.atomic`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from censusdp import __version__
from censusdp.errors import CensusDPError

__all__ = ["main", "build_parser"]


def _cmd_experiment(args: argparse.Namespace) -> int:
    from censusdp.experiments.registry import available, run_experiment
    from censusdp.jsonable import to_jsonable

    if args.list or not args.name:
        print("\n".join(available()))
        return 0
    out, metrics = run_experiment(
        args.name,
        args.out,
        quick=args.quick,
        data=args.data,
        seed=args.seed,
        all_units=args.all_units,
    )
    summary = {k: v for k, v in metrics.items() if not isinstance(v, dict | list)}
    print(json.dumps(to_jsonable(summary), indent=2))
    print(f"wrote {out}/ (metrics.json, report.md, figures)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="censusdp",
        description="Census-style hierarchical disclosure avoidance (subspace DP estimators "
        "beside a TopDown-style baseline).",
    )
    parser.add_argument("--version", action="version", version=f"censusdp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    exp = sub.add_parser("experiment", help="run a reproduced study (see --list)")
    exp.add_argument("name", nargs="?", help="experiment name, e.g. laplace-conditioning")
    exp.add_argument("--list", action="store_true", help="list the experiments")
    exp.add_argument("--quick", action="store_true", help="small settings (≤ 60 s)")
    exp.add_argument("--data", help="input file overriding the default in ../shared/data")
    exp.add_argument("--out", help="output directory (default results/NAME)")
    exp.add_argument("--seed", type=int, help="reproducible mode (never for a real release)")
    exp.add_argument(
        "--all",
        dest="all_units",
        action="store_true",
        help="every unit the study covers (e.g. all states) instead of its default one",
    )
    exp.set_defaults(func=_cmd_experiment)

    _register_extra_commands(sub)
    return parser


def _register_extra_commands(sub: argparse._SubParsersAction) -> None:
    """Commands implemented in other modules register themselves here."""
    from censusdp import commands

    for register in commands.REGISTRARS:
        register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except CensusDPError as exc:
        print(f"censusdp: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"censusdp: error: file not found: {exc.filename}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
