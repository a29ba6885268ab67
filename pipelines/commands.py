"""The pipeline's command-line sub-commands: ``run``, ``demo`` and ``privatize``.

``censusdp run SPEC [--data PATH] [--out DIR] [--seed N] [--scheduler S] [--partitions N]``
runs a spec; ``censusdp demo`` runs the main job (the ``midwest-demo`` experiment);
``censusdp privatize FILE --spec SPEC -o OUT`` privatizes an NHGIS-style batch file and writes
it back in its own layout. Errors are :class:`censusdp.errors.CensusDPError` (exit status 2).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

from censusdp.errors import SpecError

__all__ = ["register", "privatize_file"]


def _warn_seed(seed: int | None) -> None:
    if seed is not None:
        print(
            "censusdp: warning: reproducible mode (explicit seed): for reproduction and testing, "
            "never for a real release",
            file=sys.stderr,
        )


def _cmd_run(args: argparse.Namespace) -> int:
    from censusdp.config import load_spec
    from censusdp.pipelines.runner import run_spec

    spec = load_spec(args.spec)
    _warn_seed(args.seed if args.seed is not None else spec.run.seed)
    result = run_spec(
        spec,
        data=args.data,
        out=args.out,
        seed=args.seed,
        scheduler=args.scheduler,
        partitions=args.partitions,
    )
    table = result.metrics.groupby(["level", "estimator"], sort=False)[
        ["total_mae", "total_rmse"]
    ].mean()
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    print(
        f"wrote {result.out}/ (estimates.parquet, metrics.csv, regressions.csv, manifest.json, report.md)"
    )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from censusdp.experiments.midwest_demo import print_summary
    from censusdp.experiments.registry import run_experiment

    _warn_seed(args.seed)
    out, metrics = run_experiment(
        "midwest-demo", args.out or "results/midwest-demo", quick=args.quick, seed=args.seed
    )
    print_summary(metrics)
    print(f"wrote {out}/ (report.md, figures, per-budget run folders)")
    return 0


def privatize_file(
    path: str | Path, spec_path: str | Path, out: str | Path, *, seed: int | None = None
) -> Path:
    """Privatize an NHGIS-style file with a spec and write it in the input's layout.

    The spec's first estimator produces the release (one repetition); its leaf estimates
    replace the noisy columns and their standard errors fill ``<cell>_se``.
    """
    from censusdp.config import load_spec
    from censusdp.pipelines.data import load_data
    from censusdp.pipelines.nhgis import write_batch
    from censusdp.pipelines.runner import execute_spec

    spec = load_spec(spec_path)
    if spec.data.source != "nhgis":
        raise SpecError(
            f'{spec.source}: privatize reads NHGIS-style files; set [data] source = "nhgis"'
        )
    run_data = load_data(spec, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        releases, _, _, _ = execute_spec(spec, run_data, seed=seed, progress=False)
    release = releases[spec.estimators.run[0]]
    leaf = release.hierarchy.depth - 1
    n_units = run_data.batch.truth.shape[0]
    values = np.empty((n_units, len(release.cells)), dtype=release.estimates[leaf].dtype)
    values[run_data.leaf_row] = release.estimates[leaf]
    se = release.standard_errors(leaf)
    ses = None
    if se is not None:
        ses = np.empty((n_units, len(release.cells)))
        ses[run_data.leaf_row] = se
    return write_batch(run_data.batch, values, ses, out)


def _cmd_privatize(args: argparse.Namespace) -> int:
    _warn_seed(args.seed)
    out = privatize_file(args.file, args.spec, args.output, seed=args.seed)
    print(f"wrote {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run``, ``demo`` and ``privatize`` to the CLI."""
    run = sub.add_parser("run", help="run a spec (TOML): measure, estimate, score, write results")
    run.add_argument("spec", help="the run spec (TOML)")
    run.add_argument("--data", help="input file overriding [data] path")
    run.add_argument("--out", help="output directory (default [output] dir or results/SPEC)")
    run.add_argument("--seed", type=int, help="reproducible mode (never for a real release)")
    run.add_argument("--scheduler", help="sync, threads, distributed or tcp://HOST:PORT")
    run.add_argument(
        "--partitions", type=int, help="partitions of the work (the output does not depend on it)"
    )
    run.set_defaults(func=_cmd_run)

    demo = sub.add_parser(
        "demo", help="the main job: GLS vs conditioning vs TopDown-style on the embedded data"
    )
    demo.add_argument("--out", help="output directory (default results/midwest-demo)")
    demo.add_argument("--quick", action="store_true", help="fewer repetitions")
    demo.add_argument("--seed", type=int, help="reproducible mode (never for a real release)")
    demo.set_defaults(func=_cmd_demo)

    priv = sub.add_parser("privatize", help="privatize an NHGIS-style batch file in its own layout")
    priv.add_argument("file", help="CSV or Parquet batch file (GISJOIN-keyed)")
    priv.add_argument("--spec", required=True, help='run spec with [data] source = "nhgis"')
    priv.add_argument("-o", "--output", required=True, help="output file (.csv or .parquet)")
    priv.add_argument("--seed", type=int, help="reproducible mode (never for a real release)")
    priv.set_defaults(func=_cmd_privatize)
