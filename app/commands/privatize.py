"""``censusdp privatize FILE -o OUT``: the product that claims the file writes its release
(:func:`censusdp.pipelines.products.registry.privatize`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from censusdp.app.commands.common import add_overwrite, warn_seed

__all__ = ["register", "repetitions_arg"]


def repetitions_arg(text: str) -> int:
    """``--repetitions``: simulated releases for the size-class bias, 2 to
    :data:`censusdp.pipelines.spec.MAX_REPETITIONS` (each is a full release: a larger number would
    not end; the bias needs two for its standard error)."""
    from censusdp.pipelines.spec import MAX_REPETITIONS

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 2 <= value <= MAX_REPETITIONS:
        raise argparse.ArgumentTypeError(
            f"give 2 to {MAX_REPETITIONS} (each is a full simulated release), got {value}"
        )
    return value


def _cmd_privatize(args: argparse.Namespace) -> int:
    from censusdp.pipelines.products.registry import PrivatizeOptions, privatize

    warn_seed(args.seed)
    options = PrivatizeOptions(
        seed=args.seed,
        overwrite=args.overwrite,
        codebook=args.codebook,
        rho=args.rho,
        delta=args.delta,
        evaluate=args.evaluate,
        repetitions=args.repetitions,
        blocks=args.blocks or None,
        blocks_from_data=args.blocks_from_data,
        areas=args.areas or None,
        compose_with=args.compose_with,
    )
    written = privatize(args.file, args.spec, args.output, options)
    print(f"privacy: {written.statement}")
    out: Path = written.out
    if written.what is None:
        print(f"wrote {out} (privacy statement and manifest in {out}.censusdp.json)")
    elif written.evaluation:  # the release and the confidential evaluation apart, as `run`
        print(f"wrote {out}/release/ (the release: {written.what})")
        print(
            f"wrote {out}/evaluation/ (CONFIDENTIAL comparisons with the truth, not for publication)"
        )
    else:
        print(f"wrote {out}/ ({written.what})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``privatize`` to the CLI."""
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
    add_overwrite(priv, seed=True)
    priv.set_defaults(func=_cmd_privatize)
