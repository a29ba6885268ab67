"""``censusdp run SPEC``: run a spec (:func:`censusdp.pipelines.runner.run_spec`)."""

from __future__ import annotations

import argparse

from censusdp.app.commands.common import add_overwrite, add_seed, count_arg, warn_seed

__all__ = ["register"]


def _cmd_run(args: argparse.Namespace) -> int:
    from censusdp.pipelines.specs import load_spec

    spec = load_spec(args.spec)
    from censusdp.pipelines.runner import run_spec  # after the spec's checks: errors come fast

    warn_seed(args.seed if args.seed is not None else spec.run.seed)
    result = run_spec(
        spec,
        data=args.data,
        out=args.out,
        seed=args.seed,
        scheduler=args.scheduler,
        partitions=args.partitions,
        overwrite=args.overwrite,
    )
    table = result.metrics.groupby(["level", "estimator"], sort=False)[
        ["total_mae", "total_rmse"]
    ].mean()
    print("errors against the confidential truth (CONFIDENTIAL, not for publication):")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    print(
        f"wrote {result.release_dir}/ (the release: estimates.parquet, privacy.md, manifest.json)"
    )
    print(
        f"wrote {result.evaluation_dir}/ (CONFIDENTIAL comparisons with the truth, not for "
        "publication: metrics, regressions, figures, report.md)"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` to the CLI."""
    run = sub.add_parser("run", help="run a spec (TOML): measure, estimate, score, write results")
    run.add_argument("spec", help="the run spec (TOML)")
    run.add_argument("--data", help="input file overriding [data] path")
    run.add_argument("--out", help="output directory (default [output] dir or results/SPEC)")
    add_seed(run)
    run.add_argument("--scheduler", help="sync, threads, distributed or tcp://HOST:PORT")
    run.add_argument(
        "--partitions",
        type=count_arg,
        help="partitions of the work, at least 1 (the output does not depend on it)",
    )
    add_overwrite(run)
    run.set_defaults(func=_cmd_run)
