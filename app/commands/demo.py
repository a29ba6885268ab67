"""``censusdp demo``: the main job (:mod:`censusdp.experiments.midwest_demo`)."""

from __future__ import annotations

import argparse

from censusdp.app.commands.common import add_overwrite, warn_seed

__all__ = ["register"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from censusdp.experiments.midwest_demo import print_summary
    from censusdp.experiments.registry import run_experiment

    warn_seed(args.seed)
    out, metrics = run_experiment(
        "midwest-demo",
        args.out if args.out is not None else "results/midwest-demo",
        quick=args.quick,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    print_summary(metrics)
    print(f"wrote {out}/ (report.md, figures, per-budget run folders)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``censusdp demo``: the main job, this experiment on the embedded data."""
    demo = sub.add_parser(
        "demo", help="the main job: GLS vs conditioning vs TopDown-style on the embedded data"
    )
    demo.add_argument("--out", help="output directory (default results/midwest-demo)")
    demo.add_argument("--quick", action="store_true", help="fewer repetitions")
    add_overwrite(demo, seed=True)
    demo.set_defaults(func=_cmd_demo)
