"""The pipeline's command-line sub-commands: ``run`` and ``privatize``.

``censusdp run SPEC [--data PATH] [--out DIR] [--seed N] [--scheduler S] [--partitions N]``
runs a spec;
``censusdp privatize FILE --spec SPEC -o OUT`` runs the one product of
:data:`censusdp.pipelines.products.registry.PRODUCTS` that claims the file (none, or several, is one
exit-2 line naming every product and why): an NHGIS-style batch file written back in its
own layout, or a PPMF (spec ``[data] source = "ppmf"``, or a PPMF header) into
a directory of both products (:mod:`censusdp.pipelines.products.ppmf_persons`), or a PPMF units file
(``HH_STATUS`` in the header, or spec ``[data] source = "ppmf_units"``) into the H1 tables
(:mod:`censusdp.pipelines.products.ppmf_units`); ``censusdp privatize FILE --codebook ppdd --rho R -o OUT`` (or a spec
with ``[data] codebook``) releases overlapping tables from one estimate. Every output follows the policy of :mod:`censusdp.atomic` (a new
path, or an earlier censusdp output with ``--overwrite``; nothing else is ever replaced),
checked before any work. Errors are :class:`censusdp.errors.CensusDPError` (exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from censusdp.command_line import add_overwrite, count_arg, seed_arg, warn_seed

__all__ = ["register", "privatize_file"]


def repetitions_arg(text: str) -> int:
    """``--repetitions``: simulated releases for the size-class bias, 2 to
    :data:`censusdp.config.MAX_REPETITIONS` (each is a full release: a larger number would
    not end; the bias needs two for its standard error)."""
    from censusdp.config import MAX_REPETITIONS

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 2 <= value <= MAX_REPETITIONS:
        raise argparse.ArgumentTypeError(
            f"give 2 to {MAX_REPETITIONS} (each is a full simulated release), got {value}"
        )
    return value


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


def privatize_file(
    path: str | Path,
    spec_path: str | Path | None,
    out: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    codebook: str | None = None,
    rho: float | None = None,
    delta: float | None = None,
) -> Path:
    """Privatize a file with the one registered product that claims it
    (:mod:`censusdp.pipelines.products.registry`) and write it.

    The NHGIS-style products, for example:

    * **codebook** (``codebook`` given, or the spec's ``[data] codebook``): the columns are
      overlapping tables described by a codebook; a strategy of marginals is measured per
      area, one GLS estimate writes every column as integers that keep every identity among
      them (:mod:`censusdp.pipelines.products.codebook_tables`), with ρ derived from the queries.
      ``rho`` (and ``delta``) state the budget when no spec does.
    * **cells** (a run spec without codebook): the spec's first estimator produces the
      release (one repetition); its leaf estimates replace the noisy columns and their
      standard errors fill ``<cell>_se``. Columns that overlap (a shipped codebook's tables,
      or an exact identity among them in the data) are refused: as disjoint cells they would
      understate the privacy loss.

    ``out`` must be a ``.csv`` or ``.parquet`` path that is new, or an earlier censusdp output
    (recognised by its sidecar ``OUT.censusdp.json``) with ``overwrite``; it is checked before
    any work. The sidecar holds the privacy statement.

    Raises
    ------
    SpecError, DataError, HierarchyError, BudgetError
    """
    return _privatize(
        path,
        spec_path,
        out,
        seed=seed,
        overwrite=overwrite,
        codebook=codebook,
        rho=rho,
        delta=delta,
    )[0]


def _privatize(
    path: str | Path,
    spec_path: str | Path | None,
    out: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    codebook: str | None = None,
    rho: float | None = None,
    delta: float | None = None,
    evaluate: bool = False,
    repetitions: int | None = None,
    ppmf: dict | None = None,
    compose_with: str | Path | None = None,
) -> tuple[Path, str]:
    """:func:`privatize_file`, also returning the privacy statement's text."""
    written = _written(
        path,
        spec_path,
        out,
        seed=seed,
        overwrite=overwrite,
        codebook=codebook,
        rho=rho,
        delta=delta,
        evaluate=evaluate,
        repetitions=repetitions,
        ppmf=ppmf,
        compose_with=compose_with,
    )
    return written.out, written.statement


def _written(path, spec_path, out, *, ppmf: dict | None = None, **options):
    """The product's :class:`~censusdp.pipelines.products.registry.Written` (dispatch through the
    registry: exactly one product claims the file)."""
    from censusdp.pipelines.products.registry import PrivatizeOptions, privatize

    opts = PrivatizeOptions(**options, **{k: v for k, v in (ppmf or {}).items() if v})
    return privatize(path, spec_path, out, opts)


def _cmd_privatize(args: argparse.Namespace) -> int:
    warn_seed(args.seed)
    written = _written(
        args.file,
        args.spec,
        args.output,
        seed=args.seed,
        overwrite=args.overwrite,
        codebook=args.codebook,
        rho=args.rho,
        delta=args.delta,
        evaluate=args.evaluate,
        repetitions=args.repetitions,
        ppmf={
            "blocks": args.blocks,
            "blocks_from_data": args.blocks_from_data,
            "areas": args.areas,
        },
        compose_with=args.compose_with,
    )
    print(f"privacy: {written.statement}")
    out = written.out
    if written.what is None:
        print(f"wrote {out} (privacy statement and manifest in {out}.censusdp.json)")
    else:
        _print_written(out, written.what, written.evaluation)
    return 0


def _print_written(out: Path, what: str, evaluate: bool) -> None:
    """Say where a directory route wrote: with ``--evaluate`` the release and the
    confidential evaluation are two sibling folders, as ``run`` writes them."""
    if evaluate:
        print(f"wrote {out}/release/ (the release: {what})")
        print(
            f"wrote {out}/evaluation/ (CONFIDENTIAL comparisons with the truth, not for publication)"
        )
    else:
        print(f"wrote {out}/ ({what})")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` and ``privatize`` to the CLI."""

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

    priv = sub.add_parser("privatize", help="privatize an NHGIS-style batch file in its own layout")
    priv.add_argument("file", help="CSV or Parquet batch file (GISJOIN-keyed)")
    priv.add_argument(
        "--spec",
        help='run spec with [data] source = "nhgis" (and [data] codebook for overlapping tables)',
    )
    priv.add_argument(
        "--codebook",
        help="the columns are overlapping tables described by this codebook: a shipped name "
        "(ppdd) or a codebook TOML",
    )
    priv.add_argument(
        "--rho", type=float, help="codebook route: per-person ρ (zCDP) spent in every area"
    )
    priv.add_argument("--delta", type=float, help="codebook route: also report (ε, δ) at this δ")
    priv.add_argument(
        "-o",
        "--output",
        required=True,
        help="output file (.csv or .parquet), not the input; a directory for a PPMF input",
    )
    priv.add_argument(
        "--evaluate",
        action="store_true",
        help="PPMF: also write errors against the confidential input (evaluation/, CONFIDENTIAL)",
    )
    priv.add_argument(
        "--repetitions",
        type=repetitions_arg,
        help="PPMF: simulated releases for the size-class bias (default: the spec's, 10)",
    )
    priv.add_argument(
        "--blocks",
        help="PPMF: the public list of every block (overrides [hierarchy] blocks)",
    )
    priv.add_argument(
        "--blocks-from-data",
        action="store_true",
        help="PPMF without a block list: build the blocks from the file's rows, releasing "
        "which blocks are occupied (said in the privacy statement)",
    )
    priv.add_argument(
        "--areas",
        help="PPMF: block -> area equivalency file (places; overrides [areas] file)",
    )
    priv.add_argument(
        "--compose-with",
        help="PPMF units file: the persons release directory of the same census; the H1 "
        "release's privacy statement then covers both (rho adds)",
    )
    priv.add_argument("--seed", type=seed_arg, help="reproducible mode (never for a real release)")
    add_overwrite(priv)
    priv.set_defaults(func=_cmd_privatize)
