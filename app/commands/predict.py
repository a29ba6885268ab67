"""``censusdp predict SPEC``: exact standard errors from the spec and the tree's shape alone
(:mod:`censusdp.pipelines.predict`); no count is read."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from censusdp.app.commands.common import add_areas, add_data_option, add_overwrite
from censusdp.timing import stage

log = logging.getLogger(__name__)

__all__ = ["register"]


def _cmd_predict(args: argparse.Namespace) -> int:
    from censusdp.atomic import check_output
    from censusdp.hierarchy.equivalency import read_equivalency
    from censusdp.pipelines.predict import load_any_spec, predict_spec, write_prediction

    spec_path = Path(args.spec)
    out = args.out if args.out is not None else f"results/predict-{spec_path.stem}"
    inputs = [spec_path, *(Path(f) for f in (args.areas, args.area_list) if f is not None)]
    if args.data is not None:
        inputs.append(Path(args.data))
    check_output(out, kind="dir", overwrite=args.overwrite, inputs=inputs)  # before work
    clock: dict[str, float] = {}
    with stage(clock, "read"):
        log.info("reading the spec (%s) and its public geography", spec_path.name)
        spec = load_any_spec(spec_path, data=args.data)
        log.info(
            "a %s spec, %s schema; nodes per level: %s",
            spec.family,
            spec.schema.name,
            ", ".join(
                f"{n} {k}" for n, k in zip(spec.hierarchy.names, spec.hierarchy.sizes, strict=True)
            ),
        )
        if spec.ignored:
            print(spec.ignored)
        areas = None
        if args.areas is not None:
            log.info("reading the areas (%s)", Path(args.areas).name)
            areas = read_equivalency(
                args.areas,
                spec.hierarchy,
                block_column=args.block_column,
                area_column=args.area_column,
                name=args.area_name,
                gisjoin=args.gisjoin_blocks,
                areas_path=args.area_list,
                skip_blank_areas=args.skip_blank_areas,
            )
    log.info("predicting the standard errors (%.1f s so far)", clock["read"])
    with stage(clock, "predict"):
        pred, summary = predict_spec(spec, areas)
    log.info("writing %s/ (%.1f s so far)", out, clock["read"] + clock["predict"])
    write_prediction(spec, pred, summary, out, overwrite=args.overwrite, areas_path=args.areas)
    loss = (
        f"ε = {pred.privacy.epsilon:.6g} (pure DP)"
        if pred.privacy.rho is None
        else f"ρ = {pred.privacy.rho:.6g} (zCDP)"
    )
    print(f"privacy: {loss}, derived from the plan; full statement in summary.json")
    print(f"classes per level: {pred.diagnostics['classes']}")
    if areas is not None:
        print(f"areas: {areas.n_areas} {areas.name}s from {areas.source} (areas.csv)")
    print(f"wrote {out}/ (summary.csv, summary.json, se_by_level.png; no counts were read)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``predict`` to the CLI."""
    p = sub.add_parser(
        "predict", help="exact standard errors of a release from the spec and tree shape alone"
    )
    p.add_argument(
        "spec", help="a predict spec or any run spec: run, PPMF, units or codebook route (TOML)"
    )
    p.add_argument("--out", help="output directory (default results/predict-SPEC)")
    add_data_option(p)
    add_areas(
        p,
        "FILE",
        "block → area equivalency CSV (places, districts): their SEs as sums of blocks",
        "block",
        "area",
        "place",
    )
    p.add_argument(
        "--gisjoin-blocks",
        action="store_true",
        help="the file's block codes are NHGIS GISJOINs, the hierarchy's 15-digit GEOIDs",
    )
    p.add_argument(
        "--area-list",
        metavar="FILE",
        help="CSV listing the areas (column --area-column): each must contain a block",
    )
    add_overwrite(p)
    p.set_defaults(func=_cmd_predict)
