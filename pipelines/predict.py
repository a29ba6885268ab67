"""The exact standard errors of a release before any noise is drawn (``censusdp predict SPEC``,
:mod:`censusdp.app.commands.predict`).

``SPEC`` is a predict spec (below) or any spec a file route runs (:func:`load_any_spec`,
one function per family, each reading the spec with its route's own loader): a ``run``
spec (its cells, marginals, queries, invariants and the laws ``run`` calibrates; the
hierarchy from the code columns of its data file — ``[data] path`` or ``--data FILE`` —
never its counts, or the embedded / synthetic source's), a PPMF persons or units spec of
``privatize`` (the ``pl94`` / ``h1`` production strategy, or the spec's ``[allocation]``, on
its public block list ``[hierarchy] blocks``), or a codebook spec (one area: every area of
the file has the same single-node GLS errors). What the prediction does not read is printed
in one line; a data file the hierarchy needs but that is not there is one exit-2 line.

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
of their blocks (:mod:`censusdp.estimation.gls.areas`): they follow the levels in
``summary.csv`` and ``areas.csv`` holds one row per area (code, blocks, RMS SE per table).
A malformed file exits 2 naming the file, row and column, with nothing written.

No count is read: the prediction depends on the tree's shape only
(:func:`~censusdp.estimation.gls.predict.predict_errors`). The output directory holds
``summary.csv`` (level, table, row, label, nodes and SE mean / rms / min / quantiles / max
over the level's nodes), ``summary.json`` (the spec's plan with σ² per level and query, the
derived privacy statement, classes per level, and per level × table the RMS and largest SE)
and ``se_by_level.png`` (RMS SE by level, one line per table, log scale), written under the
output policy of :mod:`censusdp.atomic` (new path, or an earlier output with ``--overwrite``;
ownership manifest with SHA-256 of every file).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from censusdp.budget import Accounting
from censusdp.config import SpecParser, read_spec_toml
from censusdp.errors import SpecError

if TYPE_CHECKING:  # imported by the functions that use them: the CLI's parser stays light
    import pandas as pd

    from censusdp.estimation.gls.predict import Prediction
    from censusdp.hierarchy import Hierarchy
    from censusdp.hierarchy.equivalency import Equivalency
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.schema import Allocation, Schema

__all__ = [
    "SPEC_FAMILIES",
    "PredictSpec",
    "load_any_spec",
    "load_predict_spec",
    "predict_spec",
    "spec_family",
]


#: Synthetic shapes: the default number of blocks (2010 proportions) and the most a spec may
#: ask for (twice the largest state's and the nation's 2010 block counts, 710,145 and
#: 11,078,297: the tree is built in memory).
SYNTHETIC_BLOCKS = {"state": (160_000, 1_500_000), "us": (8_200_000, 22_000_000)}


@dataclass(frozen=True)
class PredictSpec:
    """What a prediction needs, from any spec family (see the module docstring).

    Attributes
    ----------
    source : str
        The spec file.
    schema : Schema
        The histogram (a flat run spec's cells: a one-attribute schema whose recodes and
        slices are its marginals); its ``strategy`` lists the measured queries.
    hierarchy : Hierarchy
        Public geography only: a synthetic shape, a saved hierarchy, a public block list or
        the code columns of the data file.
    invariants : tuple of (level, query text)
    allocation : Allocation or None
        The ρ split over levels and the strategy's queries (zCDP); None for a pure-DP spec,
        which ``allocate`` cannot optimise.
    tables : tuple of str
        The tables summarised.
    quantiles : tuple of float
    family : str
        ``"predict"``, ``"run"``, ``"ppmf"``, ``"ppmf_units"`` or ``"codebook"``
        (:data:`SPEC_FAMILIES`): how ``allocate`` writes the spec back.
    plan : tuple of (level, ProductQuery, NoiseLaw), optional
        The family's own calibrated measurements (a run spec's laws, a codebook's); None:
        :func:`~censusdp.estimation.gls.predict.allocation_plan` of ``allocation``.
    delta : float or None
        δ at which a zCDP total is also stated as (ε, δ).
    ignored : str
        One line: what of the spec the prediction does not read.
    """

    source: str
    schema: Schema
    hierarchy: Hierarchy
    invariants: tuple[tuple[str, str], ...]
    allocation: Allocation | None
    tables: tuple[str, ...]
    quantiles: tuple[float, ...]
    family: str = "predict"
    plan: tuple | None = None
    delta: float | None = None
    ignored: str = ""


def _hierarchy(h: Mapping[str, Any], where: str, base: Path) -> Hierarchy:
    from censusdp.hierarchy.storage import load_hierarchy
    from censusdp.hierarchy.synthetic import synthetic_state, synthetic_us

    SpecParser(where, base).keys(h, "hierarchy", ("file", "synthetic", "blocks", "seed"))
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
    from censusdp.estimation.gls.predict import QUANTILES
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.schema import Allocation, Schema

    p = Path(path)
    where = str(p)
    doc = read_spec_toml(p)
    sp = SpecParser(where, p.parent)
    sp.keys(doc, "", ("predict", "hierarchy", "allocation"))
    pr = sp.table(doc, "predict", required=False)
    sp.keys(pr, "predict", ("schema", "invariants", "tables", "quantiles"))
    if "schema" not in pr:
        raise SpecError(f'{where}: predict.schema: missing; name a schema (e.g. "pl94")')
    name = str(pr["schema"])
    schema = Schema.load(p.parent / name if name.endswith(".toml") else name)
    h = _hierarchy(sp.table(doc, "hierarchy", required=False), where, p.parent)
    allocation = (
        Allocation.from_dict(doc["allocation"], len(schema.strategy), where)
        if "allocation" in doc
        else schema.allocation
    )
    if allocation is None:
        raise SpecError(f"{where}: schema {schema.name!r} has no allocation; add [allocation]")
    inv = sp.get(pr, "predict", "invariants", dict, default={})
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


# -- every spec family, one model ---------------------------------------------------------
#: The spec families ``predict`` and ``allocate`` read, each through its own route's loader:
#: a predict spec, the generic ``run`` spec, the PPMF persons and units specs, and the
#: codebook spec of ``privatize``.
SPEC_FAMILIES = ("predict", "run", "ppmf", "ppmf_units", "codebook")


def spec_family(path: str | Path) -> str:
    """The family of the spec at ``path`` (:data:`SPEC_FAMILIES`), told as ``privatize``
    routes it: ``[predict]``; ``[data] codebook``; ``[data] source = "ppmf"`` or
    ``"ppmf_units"``; else a run spec.

    Raises
    ------
    SpecError
        Unreadable TOML, or neither ``[predict]`` nor ``[data]``.
    """
    doc = read_spec_toml(path)
    if "predict" in doc:
        return "predict"
    data = doc.get("data")
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{path}: neither [predict] nor [data]; give a predict spec or a run spec (of "
            "run, or privatize's PPMF, units or codebook route)"
        )
    if "codebook" in data:
        return "codebook"
    if data.get("source") in ("ppmf", "ppmf_units"):
        return str(data["source"])
    return "run"


def load_any_spec(path: str | Path, *, data: str | Path | None = None) -> PredictSpec:
    """The prediction model of any spec (:data:`SPEC_FAMILIES`), read by its family's own
    loader: the schema or cells, the hierarchy from public geography (a synthetic shape, a
    saved hierarchy, a public block list, or the code columns of the data file — never its
    counts; ``data`` overrides ``[data] path``), the privacy plan, the queries per level and
    the invariants. What the prediction does not read is named in ``ignored``.

    Raises
    ------
    SpecError, DataError, HierarchyError
        The family's own refusals (file and key named), a data file that is named nowhere or
        missing when the hierarchy needs its codes, a public block list missing.
    """
    p = Path(path)
    family = spec_family(p)
    return _FAMILY_MODELS[family](p, None if data is None else Path(data))


def _ignored(doc: Mapping[str, Any], used: tuple[str, ...], extra: str = "") -> str:
    unused = [f"[{k}]" for k in doc if k not in used]
    parts = [*([extra] if extra else []), *unused]
    if not parts:
        return ""
    return "ignored (the prediction needs no counts and draws no noise): " + ", ".join(parts)


def _predict_model(path: Path, data: Path | None) -> PredictSpec:
    import dataclasses

    spec = load_predict_spec(path)
    if data is not None:
        return dataclasses.replace(spec, ignored=f"ignored: --data {Path(data).name}")
    return spec


@dataclass(frozen=True)
class _Shape:
    """The part of a table :func:`~censusdp.pipelines.runner.make_plan` reads: no counts."""

    cells: tuple[str, ...]
    hierarchy: Hierarchy


def _flat_schema(spec: Any, cells: tuple[str, ...], strategy: tuple[str, ...]) -> Schema:
    """A run spec's cells as a one-attribute schema, each ``[marginals.NAME]`` a recode of
    the cells (its groups partition them) or a slice (its groups cover part of them:
    a slice of a recode of the groups and the rest), so every query of the spec is a
    product query (:func:`~censusdp.estimation.gls.predict.predict_errors`)."""
    import numpy as np

    from censusdp.mechanisms.queries import Query
    from censusdp.schema import Schema

    attribute = "cell" if "cell" not in spec.marginals else "cells_of_the_spec"
    recodes: list[dict] = []
    slices: list[dict] = []
    for name, marginal in spec.marginals.items():
        rows = Query.marginal(name, cells, marginal.groups).matrix
        labels = list(marginal.groups)
        members = [[cells[j] for j in np.flatnonzero(r)] for r in rows]
        cover = rows.sum(axis=0)
        where = f"{spec.source}: marginals.{name}"
        if (cover > 1).any():
            raise SpecError(
                f"{where}: cell {cells[int(np.argmax(cover > 1))]!r} is in two groups; predict "
                "models a marginal as a recode of the cells, whose groups are disjoint"
            )
        if (cover == 1).all() and len(labels) < len(cells):
            recodes.append({"name": name, "groups": dict(zip(labels, members, strict=True))})
        elif all(len(g) == 1 for g in members):
            slices.append({"name": name, "groups": [g[0] for g in members]})
        else:  # a recode of the groups and the rest, the marginal its slice
            rest = "rest"
            while rest in labels:
                rest += "_"
            whole = f"{name}_and_rest"
            groups = dict(zip(labels, members, strict=True))
            groups[rest] = [cells[j] for j in np.flatnonzero(cover == 0)]
            recodes.append({"name": whole, "groups": groups})
            slices.append({"name": name, "of": whole, "groups": labels})
    doc = {
        "name": Path(spec.source).stem,
        "description": f"the cells of {spec.source}",
        "attributes": [
            {"name": attribute, "labels": list(cells), "recodes": recodes, "slices": slices}
        ],
        "strategy": list(strategy),
    }
    try:
        return Schema.from_dict(doc, source=f"{spec.source} (its cells)")
    except SpecError as err:
        raise SpecError(
            f"{spec.source}: [marginals] cannot be modelled as recodes: {err}"
        ) from None


def _product(schema: Schema, query: Any, where: str) -> ProductQuery:
    """The run query ``query`` as a product query of the flat schema, checked equal."""
    import numpy as np

    from censusdp.mechanisms.product_query import ProductQuery

    q = ProductQuery.parse(schema, query.name)
    if q.dense().shape != query.matrix.shape or not np.array_equal(q.dense(), query.matrix):
        raise SpecError(f"{where}: query {query.name!r} differs from its model; report this")
    return q


def _run_model(path: Path, data: Path | None) -> PredictSpec:
    """A ``run`` spec (:func:`censusdp.pipelines.specs.load_spec`): the hierarchy from the
    data file's code columns (:func:`~censusdp.pipelines.data.read_geography`), the plan
    calibrated exactly as ``run`` calibrates it (:func:`~censusdp.pipelines.runner.make_plan`)."""
    from fractions import Fraction

    from censusdp.config import exact_fraction
    from censusdp.estimation.gls.predict import QUANTILES
    from censusdp.pipelines.data import read_geography
    from censusdp.pipelines.runner import make_plan
    from censusdp.pipelines.specs import load_spec
    from censusdp.schema import Allocation

    spec = load_spec(path)
    h, cells = read_geography(spec, data)
    strategy = tuple(dict.fromkeys(q for qs in spec.queries.values() for q in qs))
    schema = _flat_schema(spec, tuple(cells), strategy)
    where = str(path)
    try:
        plan = make_plan(spec, _Shape(tuple(cells), h))  # type: ignore[arg-type]
    except SpecError as err:  # run's own refusal, with the spec named
        raise SpecError(f"{where}: {err}") from None
    measured = tuple(
        (h.names[m.level], _product(schema, m.query, where), m.law) for m in plan.measured
    )
    invariants = tuple((h.names[k], _product(schema, q, where).name) for k, q in plan.invariants)
    allocation = None
    if spec.privacy.accounting == Accounting.ZCDP:
        allocation = Allocation(
            rho=exact_fraction(spec.privacy.total, f"{where}: privacy.rho"),
            levels={lvl: Fraction(s) for lvl, s in spec.privacy.level_shares.items()},
            queries={
                lvl: tuple(Fraction(shares.get(t, 0.0)) for t in strategy)
                for lvl, shares in spec.privacy.query_shares.items()
            },
        )
    doc = read_spec_toml(path)
    used = ("data", "hierarchy", "privacy", "queries", "marginals", "invariants", "mechanism")
    return PredictSpec(
        source=where,
        schema=schema,
        hierarchy=h,
        invariants=invariants,
        allocation=allocation,
        tables=tuple(dict.fromkeys([*strategy, *(t for _, t in invariants)])),
        quantiles=QUANTILES,
        family="run",
        plan=measured,
        delta=spec.privacy.delta,
        ignored=_ignored(doc, used, "the counts of [data] (only its code columns are read)"),
    )


def _block_list(blocks: Path | None, column: str | None, where: str) -> Hierarchy:
    from censusdp.pipelines.io.ppmf import read_block_list

    if blocks is None:
        raise SpecError(
            f"{where}: hierarchy.blocks: missing; predict reads only public geography: give "
            'the public list of every block ([hierarchy] blocks = "FILE")'
        )
    return read_block_list(blocks, column=column)


def _ppmf_model(path: Path, data: Path | None) -> PredictSpec:
    """A PPMF persons spec (:func:`~censusdp.pipelines.products.ppmf_persons.load_ppmf_spec`):
    the ``pl94`` production strategy on the public block list, its allocation (the spec's
    ``[allocation]`` or the schema's) at the spec's ρ, the nation and state totals held."""
    import dataclasses
    from fractions import Fraction

    from censusdp.estimation.gls.predict import QUANTILES
    from censusdp.pipelines.products.ppmf_persons import INVARIANTS, load_ppmf_spec
    from censusdp.schema import Schema

    spec = load_ppmf_spec(path)
    schema = Schema.load("pl94")
    h = _block_list(spec.blocks, spec.block_column, str(path))
    alloc = schema.allocation if spec.allocation is None else spec.allocation
    total = Fraction(alloc.rho) if spec.rho is None else spec.rho
    share = None if spec.areas is None else spec.areas.share
    rho = total if share is None else total * (1 - share)  # the tree's part, as the route
    doc = read_spec_toml(path)
    areas = "" if spec.areas is None else "[areas] (predict them with --areas)"
    extra = ", ".join(x for x in ("the persons of [data]", areas) if x)
    return PredictSpec(
        source=str(path),
        schema=schema,
        hierarchy=h,
        invariants=tuple(INVARIANTS),
        allocation=dataclasses.replace(alloc, rho=rho),
        tables=schema.strategy,
        quantiles=QUANTILES,
        family="ppmf",
        delta=spec.delta,
        ignored=_ignored(
            doc, ("data", "privacy", "mechanism", "hierarchy", "allocation", "areas"), extra
        ),
    )


def _units_model(path: Path, data: Path | None) -> PredictSpec:
    """A PPMF units spec (:func:`~censusdp.pipelines.products.ppmf_units.load_units_spec`): the
    ``h1`` production strategy on the public block list, every block's housing units held
    (hence every node's)."""
    import dataclasses
    from fractions import Fraction

    from censusdp.estimation.gls.predict import QUANTILES
    from censusdp.pipelines.products.ppmf_units import INVARIANT_LEVEL, load_units_spec
    from censusdp.schema import Schema

    spec = load_units_spec(path)
    schema = Schema.load("h1")
    h = _block_list(spec.blocks, spec.block_column, str(path))
    alloc = schema.allocation if spec.allocation is None else spec.allocation
    rho = Fraction(alloc.rho) if spec.rho is None else spec.rho
    doc = read_spec_toml(path)
    return PredictSpec(
        source=str(path),
        schema=schema,
        hierarchy=h,
        invariants=((INVARIANT_LEVEL, "total"),),
        allocation=dataclasses.replace(alloc, rho=rho),
        tables=schema.strategy,
        quantiles=QUANTILES,
        family="ppmf_units",
        delta=spec.delta,
        ignored=_ignored(
            doc,
            ("data", "privacy", "mechanism", "hierarchy", "allocation"),
            "the housing units of [data]",
        ),
    )


def _codebook_model(path: Path, data: Path | None) -> PredictSpec:
    """A codebook spec (:func:`~censusdp.pipelines.products.codebook_tables.load_table_spec`): each
    area (row) of the file is its own single-node GLS with the same covariance, so one
    area — a one-node hierarchy — is predicted, with the route's own calibrated laws
    (:meth:`~censusdp.pipelines.products.codebook_tables.TablePlan.build`)."""
    import dataclasses
    from fractions import Fraction

    from censusdp.estimation.gls.predict import QUANTILES
    from censusdp.hierarchy import Hierarchy
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.pipelines.io.codebook import Codebook
    from censusdp.pipelines.products.codebook_tables import load_table_spec
    from censusdp.schema import Allocation

    spec = load_table_spec(path)
    cb = Codebook.load(spec.codebook)
    if spec.schema is not None and spec.schema != cb.schema.name:
        raise SpecError(
            f"{spec.source}: data.schema is {spec.schema!r} but codebook {cb.source} is over "
            f"schema {cb.schema.name!r}; drop data.schema or name the codebook's"
        )
    table_plan = _table_plan(spec.codebook, spec.rho, spec.strategy)
    strategy = spec.strategy or cb.strategy
    texts = tuple(t for t, _ in strategy)
    schema = dataclasses.replace(cb.schema, strategy=texts)  # the strategy allocate varies
    h = Hierarchy.from_parents(["area"], [["area"]], [None])
    plan = tuple(
        ("area", ProductQuery.parse(schema, t), law)
        for t, law in zip(texts, table_plan.laws, strict=True)
    )
    allocation = Allocation(
        rho=Fraction(spec.rho),
        levels={"area": Fraction(1)},
        queries={"area": tuple(Fraction(s) for _, s in strategy)},
    )
    doc = read_spec_toml(path)
    return PredictSpec(
        source=str(path),
        schema=schema,
        hierarchy=h,
        invariants=(),
        allocation=allocation,
        tables=texts,
        quantiles=QUANTILES,
        family="codebook",
        plan=plan,
        delta=spec.delta,
        ignored=_ignored(
            doc,
            ("data", "privacy", "strategy", "mechanism"),
            "the rows of [data] (every area has the same standard errors: one is predicted)",
        ),
    )


#: Codebook plans built in this process, by (codebook, ρ, strategy): at most a few.
_TABLE_PLANS: dict[tuple, Any] = {}


def _table_plan(codebook: str, rho: float, strategy: tuple) -> Any:
    """The codebook route's plan (:meth:`~censusdp.pipelines.products.codebook_tables.TablePlan.build`:
    its checks and calibrated laws), kept for the process: repeated predictions of one spec
    build it once (seconds for ``ppdd``'s 376 columns); a codebook file is known by its
    name, size and modification time, so an edited file is built again."""
    from censusdp.pipelines.io.codebook import Codebook
    from censusdp.pipelines.products.codebook_tables import TablePlan

    f = Path(codebook)
    stamp = (
        (f.stat().st_size, f.stat().st_mtime_ns) if f.suffix == ".toml" and f.is_file() else None
    )
    key = (codebook, stamp, rho, strategy)
    if key not in _TABLE_PLANS:
        if len(_TABLE_PLANS) >= 4:
            _TABLE_PLANS.clear()
        _TABLE_PLANS[key] = TablePlan.build(Codebook.load(codebook), rho, strategy)
    return _TABLE_PLANS[key]


_FAMILY_MODELS = {
    "predict": _predict_model,
    "run": _run_model,
    "ppmf": _ppmf_model,
    "ppmf_units": _units_model,
    "codebook": _codebook_model,
}


def predict_spec(
    spec: PredictSpec, areas: Equivalency | None = None
) -> tuple[Prediction, pd.DataFrame]:
    """The prediction and its summary for a parsed spec (no counts, no noise); with
    ``areas`` (read against ``spec.hierarchy``) the areas' SEs too, as one more level."""
    from censusdp.estimation.gls.predict import allocation_plan, predict_errors
    from censusdp.mechanisms.product_query import ProductQuery

    plan = (
        allocation_plan(spec.schema, spec.allocation, levels=spec.hierarchy.names)
        if spec.plan is None
        else list(spec.plan)
    )
    inv = [(lvl, ProductQuery.parse(spec.schema, t)) for lvl, t in spec.invariants]
    pred = predict_errors(spec.hierarchy, spec.schema, plan, inv, areas=areas, delta=spec.delta)
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
        "family": spec.family,
        "ignored": spec.ignored,
        "schema": spec.schema.name,
        "nodes": dict(zip(spec.hierarchy.names, spec.hierarchy.sizes, strict=True)),
        "classes": pred.diagnostics["classes"],
        "rho": None if spec.allocation is None else str(spec.allocation.rho),
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
