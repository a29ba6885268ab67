"""``censusdp nmf ROOT``: a release from the 2020 Noisy Measurement File in one command.

::

    censusdp nmf ROOT --state-totals P1.csv --out DIR [--state SS ...]
                 [--areas BAF --block-column BLOCKID --area-column DISTRICT]

runs :func:`censusdp.pipelines.products.nmf_release.release_nmf`: the file is read state by state,
each state's spine estimated by the structured GLS with its published total invariant, and
P1–P5 (real-valued, with exact ``_se``) written for the spine levels, the tabulation state,
county, tract, block group and block, and the areas of a block assignment file (with the
covariance matrix of their totals). With the US level and every state of the file, one GLS
over the whole nation (the national pass). Bad input is one line naming file, row and
column (exit 2, :func:`censusdp.app.commands.common.run_cli`).

BLAS threads: ``--blas-threads N`` (default 1, or what ``OPENBLAS_NUM_THREADS`` already
says). The GLS factorises stacks of small (16 × 16) matrices, which BLAS threads slow down
on a shared machine (the benchmark measured 77.6 CPU s with OpenBLAS's default threads
against 6.9 with one, ``benchmarks/nmf_national.py``); :func:`limit_blas_threads` sets the
limit before numpy loads (the parser imports no numpy, ``benchmarks/startup.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from censusdp.app.commands.common import add_areas, add_overwrite

__all__ = ["BLAS_THREAD_VARIABLES", "limit_blas_threads", "register"]

#: The environment variables the BLAS and OpenMP libraries numpy may load read their
#: thread count from (once, when they load).
BLAS_THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def limit_blas_threads(threads: int | None) -> contextlib.AbstractContextManager:
    """Limit BLAS to ``threads`` threads (None: 1 unless the environment already sets it).

    Before numpy is loaded the limit is set in :data:`BLAS_THREAD_VARIABLES` (read once when
    the libraries load; ``threads`` overrides them, None only fills those unset); once it
    is loaded, ``threadpoolctl`` limits the loaded libraries within the returned context
    when it is installed. Returns the context to run the work in (a null one when the
    environment did it, or when numpy is loaded and ``threadpoolctl`` is missing: then
    the limit cannot change and the caller's BLAS threads stay as they are).
    """
    if "numpy" not in sys.modules:
        for var in BLAS_THREAD_VARIABLES:
            if threads is not None:
                os.environ[var] = str(int(threads))
            else:
                os.environ.setdefault(var, "1")
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    n = int(threads) if threads is not None else int(os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    return threadpool_limits(limits=n, user_api="blas")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of threads, 1 or more")
    return n


def _cmd_nmf(args: argparse.Namespace) -> int:
    limit = limit_blas_threads(args.blas_threads)  # before numpy loads (the import below)
    from censusdp.pipelines.products.nmf_release import NMFReleaseOptions, release_nmf

    options = NMFReleaseOptions(
        states=args.state,
        areas=args.areas,
        block_column=args.block_column,
        area_column=args.area_column,
        area_name=args.area_name,
        skip_blank_areas=args.skip_blank_areas,
        overwrite=args.overwrite,
        integers=args.integers,
        seed=args.seed,
        published=args.published,
    )
    with limit:
        result = release_nmf(args.root, args.state_totals, args.out, options=options)
    print(f"states: {', '.join(result.states)}")
    print(f"privacy: {result.statement}")
    print(f"wrote {result.out}/ ({', '.join(result.files)})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``nmf`` to the CLI."""
    p = sub.add_parser(
        "nmf",
        help="P1-P5 with exact standard errors from the 2020 Noisy Measurement File (GLS)",
    )
    p.add_argument("root", help="the NMF folder (State.parquet ... Block.parquet, US optional)")
    p.add_argument(
        "--state-totals",
        required=True,
        metavar="FILE",
        help="published P1 state totals (CSV or Parquet: columns state, total)",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--state",
        action="append",
        metavar="SS",
        help="release this state only (2-digit FIPS; repeat for several; default: all)",
    )
    add_areas(
        p,
        "BAF",
        "block assignment file (15-character block GEOID → area): the areas' tables, "
        "SEs and the covariance matrix of their totals (one state per run)",
        "BLOCKID",
        "DISTRICT",
        "district",
    )
    p.add_argument(
        "--integers",
        action="store_true",
        help="also write the non-negative integer product under nonnegative/ (consistent, "
        "structural zeros and state totals exact; BIASED, no standard errors)",
    )
    p.add_argument(
        "--seed",
        type=int,
        help="seed of the integer product's rounding (reproducible mode, for tests only)",
    )
    p.add_argument(
        "--published",
        metavar="FILE",
        help="a published table (CSV: GEOID, P1_001N; e.g. the state's 2020 P1): writes "
        "published_comparison.csv, the metric set by size class against it",
    )
    p.add_argument(
        "--blas-threads",
        type=_positive,
        metavar="N",
        help="BLAS threads (default 1, or the environment's OPENBLAS_NUM_THREADS): the GLS "
        "factorises many small matrices, which extra threads slow down",
    )
    add_overwrite(p)
    p.set_defaults(func=_cmd_nmf)
