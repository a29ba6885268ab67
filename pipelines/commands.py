"""The pipeline's command-line sub-commands: ``run``, ``demo`` and ``privatize``.

``censusdp run SPEC [--data PATH] [--out DIR] [--seed N] [--scheduler S] [--partitions N]``
runs a spec; ``censusdp demo`` runs the main job (the ``midwest-demo`` experiment);
``censusdp privatize FILE --spec SPEC -o OUT`` privatizes an NHGIS-style batch file and writes
it back in its own layout. Every output follows the policy of :mod:`censusdp.atomic` (a new
path, or an earlier censusdp output with ``--overwrite``; nothing else is ever replaced),
checked before any work. Errors are :class:`censusdp.errors.CensusDPError` (exit status 2).
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


#: Formats ``privatize`` writes, by extension of ``-o``.
PRIVATIZE_FORMATS = (".csv", ".parquet", ".pq")


def _cmd_run(args: argparse.Namespace) -> int:
    from censusdp.pipelines.runner import run_spec
    from censusdp.pipelines.specs import load_spec

    spec = load_spec(args.spec)
    _warn_seed(args.seed if args.seed is not None else spec.run.seed)
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


def _cmd_demo(args: argparse.Namespace) -> int:
    from censusdp.experiments.midwest_demo import print_summary
    from censusdp.experiments.registry import run_experiment

    _warn_seed(args.seed)
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


def privatize_file(
    path: str | Path,
    spec_path: str | Path,
    out: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Privatize an NHGIS-style file with a spec and write it in the input's layout.

    The spec's first estimator produces the release (one repetition); its leaf estimates
    replace the noisy columns and their standard errors fill ``<cell>_se``. ``out`` must be
    a ``.csv`` or ``.parquet`` path that is new, or an earlier censusdp output (recognised by
    its sidecar ``OUT.censusdp.json``) with ``overwrite``; it is checked before any work.

    Raises
    ------
    SpecError, DataError, HierarchyError, BudgetError
    """
    from censusdp.atomic import check_output, output_file
    from censusdp.config import check_run_options
    from censusdp.pipelines.specs import load_spec

    check_run_options(seed=seed)
    policy = {
        "overwrite": overwrite,
        "inputs": [path, spec_path],
        "formats": PRIVATIZE_FORMATS,
        "option": "-o",
    }
    check_output(out, kind="file", **policy)  # type: ignore[arg-type]
    spec = load_spec(spec_path)
    from censusdp.pipelines.data import load_data
    from censusdp.pipelines.nhgis import write_batch
    from censusdp.pipelines.runner import execute_spec

    if spec.data.source != "nhgis":
        raise SpecError(
            f'{spec.source}: privatize reads NHGIS-style files; set [data] source = "nhgis"'
        )
    run_data = load_data(spec, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        releases, _, _, manifest = execute_spec(spec, run_data, seed=seed, progress=False)
    name = spec.estimators.run[0]
    release = releases[name]
    leaf = release.hierarchy.depth - 1
    n_units = run_data.batch.truth.shape[0]
    values = np.empty((n_units, len(release.cells)), dtype=release.estimates[leaf].dtype)
    values[run_data.leaf_row] = release.estimates[leaf]
    se = release.standard_errors(leaf)
    ses = None
    if se is not None:
        ses = np.empty((n_units, len(release.cells)))
        ses[run_data.leaf_row] = se
    info = {"estimator": name, "privacy": manifest["privacy"][name]["text"]}
    with output_file(out, command="privatize", info=info, **policy) as tmp:  # type: ignore[arg-type]
        write_batch(run_data.batch, values, ses, tmp)
    return Path(out)


def _cmd_privatize(args: argparse.Namespace) -> int:
    _warn_seed(args.seed)
    out = privatize_file(
        args.file, args.spec, args.output, seed=args.seed, overwrite=args.overwrite
    )
    print(f"wrote {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run``, ``demo`` and ``privatize`` to the CLI."""
    from censusdp.cli import add_overwrite, count_arg, seed_arg

    run = sub.add_parser("run", help="run a spec (TOML): measure, estimate, score, write results")
    run.add_argument("spec", help="the run spec (TOML)")
    run.add_argument("--data", help="input file overriding [data] path")
    run.add_argument("--out", help="output directory (default [output] dir or results/SPEC)")
    run.add_argument("--seed", type=seed_arg, help="reproducible mode (never for a real release)")
    run.add_argument("--scheduler", help="sync, threads, distributed or tcp://HOST:PORT")
    run.add_argument(
        "--partitions",
        type=count_arg,
        help="partitions of the work, at least 1 (the output does not depend on it)",
    )
    add_overwrite(run)
    run.set_defaults(func=_cmd_run)

    demo = sub.add_parser(
        "demo", help="the main job: GLS vs conditioning vs TopDown-style on the embedded data"
    )
    demo.add_argument("--out", help="output directory (default results/midwest-demo)")
    demo.add_argument("--quick", action="store_true", help="fewer repetitions")
    demo.add_argument("--seed", type=seed_arg, help="reproducible mode (never for a real release)")
    add_overwrite(demo)
    demo.set_defaults(func=_cmd_demo)

    priv = sub.add_parser("privatize", help="privatize an NHGIS-style batch file in its own layout")
    priv.add_argument("file", help="CSV or Parquet batch file (GISJOIN-keyed)")
    priv.add_argument("--spec", required=True, help='run spec with [data] source = "nhgis"')
    priv.add_argument(
        "-o", "--output", required=True, help="output file (.csv or .parquet), not the input"
    )
    priv.add_argument("--seed", type=seed_arg, help="reproducible mode (never for a real release)")
    add_overwrite(priv)
    priv.set_defaults(func=_cmd_privatize)
