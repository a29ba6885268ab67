"""The pipeline's command-line sub-commands: ``run`` and ``privatize``.

``censusdp run SPEC [--data PATH] [--out DIR] [--seed N] [--scheduler S] [--partitions N]``
runs a spec;
``censusdp privatize FILE --spec SPEC -o OUT`` privatizes an NHGIS-style batch file and writes
it back in its own layout, or a PPMF (spec ``[data] source = "ppmf"``, or a PPMF header) into
a directory of both products (:mod:`censusdp.pipelines.privatize_ppmf`), or a PPMF units file
(``HH_STATUS`` in the header, or spec ``[data] source = "ppmf_units"``) into the H1 tables
(:mod:`censusdp.pipelines.privatize_units`); ``censusdp privatize FILE --codebook ppdd --rho R -o OUT`` (or a spec
with ``[data] codebook``) releases overlapping tables from one estimate. Every output follows the policy of :mod:`censusdp.atomic` (a new
path, or an earlier censusdp output with ``--overwrite``; nothing else is ever replaced),
checked before any work. Errors are :class:`censusdp.errors.CensusDPError` (exit status 2).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from censusdp.command_line import add_overwrite, count_arg, seed_arg, warn_seed
from censusdp.errors import SpecError

__all__ = ["register", "privatize_file"]


#: Formats ``privatize`` writes, by extension of ``-o``.
PRIVATIZE_FORMATS = (".csv", ".parquet", ".pq")


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
    """Privatize an NHGIS-style file and write it in the input's layout.

    Two routes:

    * **codebook** (``codebook`` given, or the spec's ``[data] codebook``): the columns are
      overlapping tables described by a codebook; a strategy of marginals is measured per
      area, one GLS estimate writes every column as integers that keep every identity among
      them (:mod:`censusdp.pipelines.privatize_tables`), with ρ derived from the queries.
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


def _table_spec(
    spec_path: str | Path | None,
    codebook: str | None,
    rho: float | None,
    delta: float | None,
    seed: int | None,
):
    """The codebook route's spec: the spec file's, with the command line's options."""
    from dataclasses import replace

    from censusdp.pipelines.privatize_tables import TableSpec, load_table_spec, spec_uses_codebook

    if spec_path is None:
        if rho is None:
            raise SpecError(
                f"--codebook {codebook}: state the budget with --rho R (the per-person ρ, zCDP, "
                "that the strategy spends in every area) or give a spec with [privacy] rho"
            )
        return TableSpec(codebook=str(codebook), rho=float(rho), delta=delta, seed=seed)
    if not spec_uses_codebook(spec_path):
        raise SpecError(
            f"{spec_path}: --codebook needs a codebook spec ([data] codebook = ..., [privacy] "
            "rho; [hierarchy], [invariants] and [evaluate] optional, no [queries]) or none; "
            "this spec describes disjoint cells"
        )
    spec = load_table_spec(spec_path)
    for flag, given, stated in (
        ("--codebook", codebook, spec.codebook),
        ("--rho", rho, spec.rho),
        ("--delta", delta, spec.delta),
    ):
        if given is not None and stated is not None and given != stated:
            raise SpecError(
                f"{spec_path}: {flag} {given} contradicts the spec's value; give it in one place"
            )
    return replace(
        spec,
        delta=spec.delta if delta is None else delta,
        seed=spec.seed if seed is None else seed,
    )


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
    from censusdp.atomic import check_output, output_file
    from censusdp.config import check_run_options
    from censusdp.pipelines.privatize_tables import (
        privatize_tables,
        refuse_overlapping_columns,
        spec_uses_codebook,
    )
    from censusdp.pipelines.specs import load_spec

    check_run_options(seed=seed)
    from censusdp.pipelines.privatize_ppmf import is_ppmf, privatize_ppmf, spec_reads_ppmf
    from censusdp.pipelines.privatize_units import privatize_units, units_route

    if units_route(path, spec_path):
        opts = ppmf or {}
        given = [name for name, v in (("--codebook", codebook), ("--rho", rho), ("--delta", delta),
                 ("--areas", opts.get("areas"))) if v]  # fmt: skip
        if given:
            raise SpecError(
                f"{Path(path).name} is a PPMF units file (H1): {', '.join(given)} do not apply "
                "to it; its budget is the units spec's [privacy] rho (and delta)"
            )
        res = privatize_units(
            path,
            spec_path,
            out,
            seed=seed,
            overwrite=overwrite,
            blocks=opts.get("blocks"),
            blocks_from_data=bool(opts.get("blocks_from_data")),
            compose_with=compose_with,
            evaluate=evaluate,
            repetitions=repetitions,
        )
        return res.out, res.privacy.text()
    if compose_with is not None:
        raise SpecError(
            "--compose-with belongs to the units route (a PPMF units file with HH_STATUS): it "
            "names the persons release whose statement the H1 release composes with"
        )
    if (spec_path is not None and spec_reads_ppmf(spec_path)) or is_ppmf(path):
        if codebook is not None or rho is not None or delta is not None:
            raise SpecError(
                f"{Path(path).name} is a PPMF: its budget is the PPMF spec's [privacy] rho "
                "(and delta); --codebook, --rho and --delta belong to the NHGIS routes"
            )
        if spec_path is None:
            raise SpecError(
                f"{Path(path).name} is a PPMF: give a spec (--spec SPEC) with [data] source = "
                '"ppmf" and [privacy] accounting = "zcdp" (rho: the budget)'
            )
        res = privatize_ppmf(
            path,
            spec_path,
            out,
            seed=seed,
            overwrite=overwrite,
            evaluate=evaluate,
            repetitions=repetitions,
            **(ppmf or {}),
        )
        return res.out, res.privacy.text()
    if evaluate or repetitions is not None or any((ppmf or {}).values()):
        raise SpecError(
            "--evaluate, --repetitions, --blocks, --blocks-from-data and --areas belong to the "
            "PPMF route (a PPMF input); a codebook file over a hierarchy is evaluated by its "
            "spec's [evaluate] section"
        )
    if codebook is not None or (spec_path is not None and spec_uses_codebook(spec_path)):
        tspec = _table_spec(spec_path, codebook, rho, delta, seed)
        written, rel = privatize_tables(
            path, tspec, out, spec_path=spec_path, overwrite=overwrite, formats=PRIVATIZE_FORMATS
        )
        return written, rel.privacy.text()
    if spec_path is None:
        raise SpecError(
            "privatize needs a spec (--spec SPEC) or, for overlapping tables, a codebook "
            "(--codebook NAME --rho R)"
        )
    if rho is not None or delta is not None:
        raise SpecError(
            f"{spec_path}: --rho and --delta state the budget of the codebook route; without "
            "a codebook the spec's [privacy] section states it"
        )
    policy = {
        "overwrite": overwrite,
        "inputs": [path, spec_path],
        "formats": PRIVATIZE_FORMATS,
        "option": "-o",
    }
    check_output(out, kind="file", **policy)  # type: ignore[arg-type]
    spec = load_spec(spec_path)
    import numpy as np

    from censusdp.pipelines.data import load_data
    from censusdp.pipelines.nhgis import read_batch, write_batch
    from censusdp.pipelines.runner import execute_spec
    from censusdp.progress import show_progress

    if spec.data.source != "nhgis":
        raise SpecError(
            f'{spec.source}: privatize reads NHGIS-style files; set [data] source = "nhgis"'
        )
    # before the hierarchy and any noise: overlapping columns would understate the loss
    cols = read_batch(
        path,
        cells=list(spec.data.cells) or None,
        version_column=spec.data.version_column or "version",
        truth_version=spec.data.truth,
        encoding=spec.data.encoding,
    )
    refuse_overlapping_columns(cols.cells, cols.truth, Path(path).name)
    run_data = load_data(spec, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        releases, _, _, manifest = execute_spec(
            spec, run_data, seed=seed, progress=show_progress(False)
        )
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
    for k, (rows, nodes) in (run_data.upper_rows or {}).items():  # state rows beside counties
        values[rows] = release.estimates[k][nodes]
        if ses is not None:
            ses[rows] = release.standard_errors(k)[nodes]
    text = manifest["privacy"][name]["text"]
    info = {"estimator": name, "privacy": text}
    with output_file(out, command="privatize", info=info, **policy) as tmp:  # type: ignore[arg-type]
        write_batch(run_data.batch, values, ses, tmp)
    return Path(out), text


def _cmd_privatize(args: argparse.Namespace) -> int:
    warn_seed(args.seed)
    out, privacy = _privatize(
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
    print(f"privacy: {privacy}")
    from censusdp.pipelines.privatize_tables import spec_uses_codebook
    from censusdp.pipelines.privatize_units import units_route
    from censusdp.pipelines.runner import EVALUATION_DIR

    if units_route(args.file, args.spec):
        what = (
            "H1 tables h1_<level>.csv and h1_long.csv, nonnegative/, size_classes.md, "
            "manifest.json, privacy.md"
        )
        _print_written(out, what, args.evaluate)
    elif out.is_dir() and (args.codebook or (args.spec and spec_uses_codebook(args.spec))):
        what = (  # the codebook route over a hierarchy
            "unbiased/ and nonnegative/ tables of every level, the file's rows in its layout, "
            "manifest.json, privacy.md"
        )
        _print_written(out, what, (out / EVALUATION_DIR).is_dir())
    elif out.is_dir():  # the PPMF route writes a directory
        what = (
            "unbiased/ and nonnegative/ P1-P5 tables, nonnegative/microdata.csv, manifest.json, "
            "size_classes.md"
        )
        _print_written(out, what, args.evaluate)
    else:
        print(f"wrote {out} (privacy statement and manifest in {out}.censusdp.json)")
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
