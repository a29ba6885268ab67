"""``censusdp experiment [NAME] [--list]``: run a reproduced study
(:func:`censusdp.experiments.registry.run_experiment`) or list them."""

from __future__ import annotations

import argparse
import json

from censusdp.app.commands.common import add_overwrite

__all__ = ["register"]


def _cmd_experiment(args: argparse.Namespace) -> int:
    from censusdp.experiments.registry import listing, run_experiment
    from censusdp.jsonable import to_jsonable

    if args.list or not args.name:
        print(listing())
        return 0
    out, metrics = run_experiment(
        args.name,
        args.out,
        quick=args.quick,
        data=args.data,
        seed=args.seed,
        all_units=args.all_units,
        overwrite=args.overwrite,
        options=dict(args.opt or []),
    )
    summary = {k: v for k, v in metrics.items() if not isinstance(v, dict | list)}
    print(json.dumps(to_jsonable(summary), indent=2))
    print(f"wrote {out}/ (metrics.json, report.md, figures)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``censusdp experiment [NAME] [--list] [--quick] [--data F] [--out D] [--seed N]``."""
    exp = sub.add_parser("experiment", help="run a reproduced study (see --list)")
    exp.add_argument("name", nargs="?", help="experiment name, e.g. laplace-conditioning")
    exp.add_argument("--list", action="store_true", help="list the experiments")
    exp.add_argument("--quick", action="store_true", help="small settings (≤ 60 s)")
    exp.add_argument(
        "--data", help="the experiment's public input file (--list names it; IPUMS NHGIS, Census)"
    )
    exp.add_argument("--out", help="output directory (default results/NAME)")
    add_overwrite(exp, seed=True)
    exp.add_argument(
        "--all",
        dest="all_units",
        action="store_true",
        help="every unit the study covers (e.g. all states) instead of its default one",
    )
    exp.add_argument(
        "--opt",
        action="append",
        type=_option_arg,
        metavar="KEY=VALUE",
        help="an option of the experiment (repeatable; its module's OPTIONS lists them)",
    )
    exp.set_defaults(func=_cmd_experiment)


def _option_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--opt {text!r}: expected KEY=VALUE")
    return key, value
