"""``censusdp predict SPEC``: the exact standard errors of a release before any noise is drawn.

A predict spec (TOML) names a schema, a hierarchy *shape* — a saved hierarchy of public
geography (``file``, :func:`~censusdp.hierarchy.storage.save_hierarchy` format) or a synthetic
one (``synthetic = "state"`` or ``"us"``) — the invariants' queries per level and an
allocation (the schema's own by default, e.g. ``pl94``'s 2020 production allocation)::

    [predict]
    schema = "pl94"
    invariants = { nation = ["total"], state = ["total"] }
    # tables = ["total", "hhgq"]      (default: the strategy's queries)
    # quantiles = [0.05, 0.5, 0.95]

    [hierarchy]
    synthetic = "state"
    blocks = 2000
    seed = 1

    # [allocation]                    (default: the schema's; same form as pl94.toml's)

With ``--areas FILE`` (a block → area equivalency, :mod:`censusdp.hierarchy.equivalency`:
``--block-column``, ``--area-column``, ``--area-name``, ``--gisjoin-blocks``, ``--area-list``,
``--skip-blank-areas``) the off-spine areas (places, districts) are predicted too, as sums
of their blocks (:mod:`censusdp.estimation.areas`): they follow the levels in
``summary.csv`` and ``areas.csv`` holds one row per area (code, blocks, RMS SE per table).
A malformed file exits 2 naming the file, row and column, with nothing written.

No count is read: the prediction depends on the tree's shape only
(:func:`~censusdp.estimation.predict.predict_errors`). The output directory holds
``summary.csv`` (level, table, row, label, nodes and SE mean / rms / min / quantiles / max
over the level's nodes), ``summary.json`` (the spec's plan with σ² per level and query, the
derived privacy statement, classes per level, and per level × table the RMS and largest SE)
and ``se_by_level.png`` (RMS SE by level, one line per table, log scale), written under the
output policy of :mod:`censusdp.atomic` (new path, or an earlier output with ``--overwrite``;
ownership manifest with SHA-256 of every file).
"""

from __future__ import annotations

import argparse
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from censusdp.config import read_spec_toml
from censusdp.errors import SpecError

if TYPE_CHECKING:  # imported by the functions that use them: the CLI's parser stays light
    import pandas as pd

    from censusdp.estimation.predict import Prediction
    from censusdp.hierarchy import Hierarchy
    from censusdp.hierarchy.equivalency import Equivalency
    from censusdp.schema import Allocation, Schema

__all__ = ["PredictSpec", "load_predict_spec", "predict_spec", "register"]


#: Synthetic shapes: the default number of blocks (2010 proportions) and the most a spec may
#: ask for (twice the largest state's and the nation's 2010 block counts, 710,145 and
#: 11,078,297: the tree is built in memory).
SYNTHETIC_BLOCKS = {"state": (160_000, 1_500_000), "us": (8_200_000, 22_000_000)}


@dataclass(frozen=True)
class PredictSpec:
    """A parsed predict spec (see the module docstring)."""

    source: str
    schema: Schema
    hierarchy: Hierarchy
    invariants: tuple[tuple[str, str], ...]
    allocation: Allocation
    tables: tuple[str, ...]
    quantiles: tuple[float, ...]


def _table(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: [{key}] must be a table")
    return value


def _hierarchy(h: Mapping[str, Any], where: str, base: Path) -> Hierarchy:
    from censusdp.hierarchy.storage import load_hierarchy
    from censusdp.hierarchy.synthetic import synthetic_state, synthetic_us

    known = {"file", "synthetic", "blocks", "seed"}
    if set(h) - known:
        raise SpecError(f"{where}: hierarchy: unknown keys {sorted(set(h) - known)}")
    if ("file" in h) == ("synthetic" in h):
        raise SpecError(
            f"{where}: hierarchy: give either file = PATH (a saved hierarchy of public "
            'geography) or synthetic = "state" | "us"'
        )
    if "file" in h:
        path = Path(str(h["file"]))
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise SpecError(f"{where}: hierarchy.file: no such file {str(path)!r}")
        try:
            return load_hierarchy(path)
        except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # not one
            raise SpecError(
                f"{where}: hierarchy.file: {path.name!r} is not a saved hierarchy "
                f"({type(exc).__name__}); give a file written by save_hierarchy"
            ) from None
    kind = h["synthetic"]
    if kind not in SYNTHETIC_BLOCKS:
        raise SpecError(f"{where}: hierarchy.synthetic: {kind!r} is not 'state' or 'us'")
    default, most = SYNTHETIC_BLOCKS[kind]
    seed, blocks = h.get("seed", 0), h.get("blocks", default)
    for key, value in (("seed", seed), ("blocks", blocks)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError(f"{where}: hierarchy.{key}: must be an integer")
    if not 0 <= seed < 2**63:
        raise SpecError(f"{where}: hierarchy.seed: must be an integer from 0 to 2^63 - 1")
    if not 1 <= blocks <= most:
        raise SpecError(
            f"{where}: hierarchy.blocks: must be from 1 to {most:,} for synthetic = {kind!r} "
            f"(omit it for {default:,}), got {blocks:,}"
        )
    try:
        if kind == "state":
            return synthetic_state(seed, blocks=blocks).hierarchy
        return synthetic_us(seed, blocks=blocks, block_groups=round(blocks * 0.0293)).hierarchy
    except ValueError as exc:  # a shape the generator cannot lay out (e.g. too few blocks)
        raise SpecError(f"{where}: hierarchy.blocks: {exc}") from None


def load_predict_spec(path: str | Path) -> PredictSpec:
    """Read and check a predict spec.

    Raises
    ------
    SpecError
        Unreadable file, unknown keys, unknown schema, levels, queries or allocation errors,
        each naming the file and key.
    """
    from censusdp.estimation.predict import QUANTILES
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.schema import Allocation, Schema

    p = Path(path)
    where = str(p)
    doc = read_spec_toml(p)
    unknown = set(doc) - {"predict", "hierarchy", "allocation"}
    if unknown:
        raise SpecError(f"{where}: unknown sections {sorted(unknown)}")
    pr = _table(doc, "predict", where)
    known = {"schema", "invariants", "tables", "quantiles"}
    if set(pr) - known:
        raise SpecError(f"{where}: predict: unknown keys {sorted(set(pr) - known)}")
    if "schema" not in pr:
        raise SpecError(f'{where}: predict.schema: missing; name a schema (e.g. "pl94")')
    name = str(pr["schema"])
    schema = Schema.load(p.parent / name if name.endswith(".toml") else name)
    h = _hierarchy(_table(doc, "hierarchy", where), where, p.parent)
    allocation = (
        Allocation.from_dict(doc["allocation"], len(schema.strategy), where)
        if "allocation" in doc
        else schema.allocation
    )
    if allocation is None:
        raise SpecError(f"{where}: schema {schema.name!r} has no allocation; add [allocation]")
    inv = _table(pr, "invariants", f"{where}: predict")
    invariants = []
    for lvl, texts in inv.items():
        if lvl not in h.names:
            raise SpecError(
                f"{where}: predict.invariants: unknown level {lvl!r}; levels are {list(h.names)}"
            )
        if not isinstance(texts, list):
            raise SpecError(f"{where}: predict.invariants.{lvl}: give a list of query texts")
        for t in texts:
            ProductQuery.parse(schema, str(t))
            invariants.append((str(lvl), str(t)))
    tables = tuple(str(t) for t in pr.get("tables", schema.strategy))
    for t in tables:
        ProductQuery.parse(schema, t)
    qs = pr.get("quantiles", list(QUANTILES))
    if not isinstance(qs, list) or not all(isinstance(q, float | int) and 0 <= q <= 1 for q in qs):
        raise SpecError(f"{where}: predict.quantiles: give numbers between 0 and 1")
    return PredictSpec(where, schema, h, tuple(invariants), allocation, tables, tuple(qs))


def predict_spec(
    spec: PredictSpec, areas: Equivalency | None = None
) -> tuple[Prediction, pd.DataFrame]:
    """The prediction and its summary for a parsed spec (no counts, no noise); with
    ``areas`` (read against ``spec.hierarchy``) the areas' SEs too, as one more level."""
    from censusdp.estimation.predict import allocation_plan, predict_errors
    from censusdp.mechanisms.product_query import ProductQuery

    plan = allocation_plan(spec.schema, spec.allocation, levels=spec.hierarchy.names)
    inv = [(lvl, ProductQuery.parse(spec.schema, t)) for lvl, t in spec.invariants]
    pred = predict_errors(spec.hierarchy, spec.schema, plan, inv, areas=areas)
    return pred, pred.summary(list(spec.tables), quantiles=spec.quantiles)


def area_table(pred: Prediction, tables: list[str]) -> pd.DataFrame:
    """One row per area: its code, leaves, and per table the RMS SE over the table's
    identified rows (``se_rms_TABLE``)."""
    import numpy as np
    import pandas as pd

    a = pred.areas
    assert a is not None
    cols: dict = {a.name: np.asarray(a.codes, dtype=object), "leaves": a.leaves}
    for t in tables:
        var = a.query_variances(a.name, t)
        ok = np.isfinite(var).all(axis=0)
        cols[f"se_rms_{t}"] = np.sqrt(var[:, ok].mean(axis=1)) if ok.any() else np.nan
    return pd.DataFrame(cols)


def _figure(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(dict.fromkeys(summary.level))
    # RMS over the table's rows of the per-row RMS over nodes
    rms = (
        summary.assign(v=summary.se_rms**2).groupby(["table", "level"], sort=False).v.mean() ** 0.5
    )
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, table in enumerate(dict.fromkeys(summary.table)):
        y = [rms.get((table, lvl), float("nan")) for lvl in levels]
        y = [v if v > 0 else float("nan") for v in y]  # invariant: no error, off the log scale
        ax.plot(levels, y, marker="o", label=table, color=plt.cm.tab20(i % 20))
    ax.set_yscale("log")
    ax.set_xlabel("level")
    ax.set_ylabel("predicted standard error (RMS over nodes and rows)")
    ax.set_title("Predicted SE by level and table (before any noise)")
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_prediction(
    spec: PredictSpec,
    pred: Prediction,
    summary: pd.DataFrame,
    out: str | Path,
    *,
    overwrite: bool,
    areas_path: str | Path | None = None,
) -> Path:
    """Write ``summary.csv``, ``summary.json`` and ``se_by_level.png`` into ``out`` (and
    ``areas.csv`` for a prediction with areas)."""
    from censusdp.atomic import output_dir

    groups = summary.assign(v=summary.se_rms**2).groupby(["level", "table"], sort=False)
    info = {
        "spec": spec.source,
        "schema": spec.schema.name,
        "nodes": dict(zip(spec.hierarchy.names, spec.hierarchy.sizes, strict=True)),
        "classes": pred.diagnostics["classes"],
        "rho": str(spec.allocation.rho),
        "privacy": pred.privacy.text(),
        "invariants": [f"{lvl}: {t}" for lvl, t in spec.invariants],
        "plan": [{"level": lvl, "query": q, "sigma2": v} for lvl, q, v in pred.plan],
        "levels": {
            f"{lvl} | {table}": {
                "se_rms": float(g.v.mean() ** 0.5),
                "se_max": float(g.se_max.max()),
            }
            for (lvl, table), g in groups
        },
    }
    if pred.areas is not None:
        info["areas"] = {"name": pred.areas.name, "count": pred.areas.n_areas}
    from censusdp.spreadsheet import write_csv

    inputs = [spec.source, *([] if areas_path is None else [str(areas_path)])]
    with output_dir(out, overwrite=overwrite, inputs=inputs, command="predict") as tmp:
        write_csv(summary, tmp / "summary.csv", index=False)
        if pred.areas is not None:
            write_csv(area_table(pred, list(spec.tables)), tmp / "areas.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
        _figure(summary, tmp / "se_by_level.png")
    return Path(out)


def _cmd_predict(args: argparse.Namespace) -> int:
    from censusdp.atomic import check_output
    from censusdp.hierarchy.equivalency import read_equivalency

    spec_path = Path(args.spec)
    out = args.out if args.out is not None else f"results/predict-{spec_path.stem}"
    inputs = [spec_path, *(Path(f) for f in (args.areas, args.area_list) if f is not None)]
    check_output(out, kind="dir", overwrite=args.overwrite, inputs=inputs)  # before work
    spec = load_predict_spec(spec_path)
    areas = None
    if args.areas is not None:
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
    pred, summary = predict_spec(spec, areas)
    write_prediction(spec, pred, summary, out, overwrite=args.overwrite, areas_path=args.areas)
    rho = pred.privacy.rho
    print(f"privacy: ρ = {rho:.6g} (zCDP), derived from the plan; full statement in summary.json")
    print(f"classes per level: {pred.diagnostics['classes']}")
    if areas is not None:
        print(f"areas: {areas.n_areas} {areas.name}s from {areas.source} (areas.csv)")
    print(f"wrote {out}/ (summary.csv, summary.json, se_by_level.png; no counts were read)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``predict`` to the CLI."""
    from censusdp.command_line import add_overwrite

    p = sub.add_parser(
        "predict", help="exact standard errors of a release from the spec and tree shape alone"
    )
    p.add_argument("spec", help="the predict spec (TOML)")
    p.add_argument("--out", help="output directory (default results/predict-SPEC)")
    p.add_argument(
        "--areas",
        metavar="FILE",
        help="block → area equivalency CSV (places, districts): their SEs as sums of blocks",
    )
    p.add_argument("--block-column", default="block", help="its block code column (block)")
    p.add_argument("--area-column", default="area", help="its area code column (area)")
    p.add_argument("--area-name", help="what the areas are, e.g. place (default: the column)")
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
    p.add_argument(
        "--skip-blank-areas",
        action="store_true",
        help="leave out blocks whose area code is blank (in no area) instead of refusing",
    )
    add_overwrite(p)
    p.set_defaults(func=_cmd_predict)
