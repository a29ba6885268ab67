"""Optimise the budget allocation (``censusdp allocate SPEC --target TARGETS.toml -o NEW_SPEC``,
:mod:`censusdp.app.commands.allocate`): the targets file and the new spec's text.

``SPEC`` is a predict spec (:mod:`censusdp.pipelines.predict`: schema, hierarchy *shape*,
invariants, optional ``[allocation]``, else the schema's — for ``pl94`` the 2020 production
one) or any zCDP spec of a file route, read as ``predict`` reads it
(:func:`~censusdp.pipelines.predict.load_any_spec`; ``--data FILE`` for a run spec whose data
file gives the hierarchy): a ``run`` spec, a PPMF persons or units spec, a codebook spec.
``NEW_SPEC`` is a spec of the same family holding the optimised shares where that family
keeps them (:func:`family_spec_text`): a run spec's ``[privacy] level_shares`` and
``query_shares``, a PPMF spec's ``[allocation]``, a codebook spec's ``[strategy] shares``, so
its own route runs it. A pure-DP spec is refused (the optimiser works in zCDP, where ρ is
linear in the precisions). ``TARGETS.toml`` declares the objective::

    [objective]
    kind = "sum"            # "sum" (weighted sum) or "max" (weighted maximum)
    floor = 0.01            # each measured query keeps ≥ floor × its share in SPEC (optional)
    tolerance = 1e-3        # certified relative duality gap (optional)

    [population]            # typical persons per node of a level: the relative variances'
    county = 100000         # denominators (declared, never read from data)
    tract = 4000
    block_group = 1500

    [[target]]
    level = "tract"
    table = "hispanic * cenrace"   # a product query of the schema
    weight = 1.0                   # optional (default 1)
    share = 0.008                  # optional: expected share of the node's population in one
                                   # row (default 1 / rows)

Each target's relative variance is the mean over the level's nodes and the table's rows of
``Var / (population · share)²``, predicted from the tree's shape alone
(:func:`~censusdp.estimation.gls.allocate.optimise_allocation`). The command writes ``NEW_SPEC``
— ``SPEC`` with the optimised shares (exact fractions of 2³², the same ρ) — atomically
under the output policy of :mod:`censusdp.atomic` (a new path, or an earlier output with
``--overwrite``; never an input), and prints the objective before and after, each target's
relative change and the solver's certificate. No count is read and no noise is drawn.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from censusdp.config import SpecParser, read_spec_toml
from censusdp.errors import SpecError

if TYPE_CHECKING:  # the estimation stack is imported by the functions that run it
    from censusdp.estimation.gls.allocate import Objective
    from censusdp.pipelines.predict import PredictSpec
    from censusdp.schema import Allocation

__all__ = ["Targets", "family_spec_text", "load_targets", "toml_text"]

_SECTIONS = ("objective", "population", "target")
_OBJECTIVE_KEYS = ("kind", "floor", "tolerance")
_TARGET_KEYS = ("level", "table", "weight", "share")
#: The objective's kinds: the sum or the largest of the targets' weighted variances.
_KINDS = ("sum", "max")


@dataclass(frozen=True)
class Targets:
    """A parsed targets file: the objective and the solver's floor and tolerance."""

    objective: Objective
    floor: float
    tolerance: float
    source: str


def _number(value: Any, where: str, *, fraction: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{where}: give a number, not {type(value).__name__}")
    v = float(value)
    if not v > 0 or (fraction and not v < 1):
        raise SpecError(f"{where}: must be {'in (0, 1)' if fraction else 'positive'}")
    return v


def load_targets(path: str | Path, spec: PredictSpec) -> Targets:
    """Read and check a targets file against a predict spec's schema and levels.

    Raises
    ------
    SpecError
        Naming the file, the key and the fix: unknown sections or keys (with the allowed
        ones), unknown levels or tables (with the known ones), missing populations, bad
        numbers, an unknown objective kind.
    """
    from censusdp.estimation.gls.allocate import Objective, Target
    from censusdp.mechanisms.product_query import ProductQuery

    where = str(path)
    doc = read_spec_toml(path)
    p = SpecParser(where, None)
    p.keys(doc, "", _SECTIONS)
    obj = p.table(doc, "objective", required=False)
    p.keys(obj, "objective", _OBJECTIVE_KEYS)
    kind = p.choice(p.get(obj, "objective", "kind", str, default="sum"), "objective.kind", _KINDS)
    floor = _number(obj.get("floor", 0.01), f"{where}: objective.floor", fraction=True)
    tol = _number(obj.get("tolerance", 1e-3), f"{where}: objective.tolerance", fraction=True)
    levels = list(spec.hierarchy.names)
    pop = p.table(doc, "population", required=False)
    for lvl, v in pop.items():
        if lvl not in levels:
            raise SpecError(f"{where}: population.{lvl}: unknown level; levels are {levels}")
        _number(v, f"{where}: population.{lvl}")
    raw = doc.get("target")
    if not isinstance(raw, list) or not raw:
        raise SpecError(
            f"{where}: no [[target]]; give at least one with level and table "
            '(e.g. level = "tract", table = "total")'
        )
    targets = []
    for i, t in enumerate(raw):
        at = f"{where}: target[{i}]"
        if not isinstance(t, Mapping):
            raise SpecError(f"{at}: must be a table ([[target]])")
        p.keys(t, f"target[{i}]", _TARGET_KEYS)
        for key in ("level", "table"):
            if key not in t:
                raise SpecError(f"{at}: missing {key!r}")
        lvl = str(t["level"])
        if lvl not in levels:
            raise SpecError(f"{at}.level: unknown level {lvl!r}; levels are {levels}")
        try:
            q = ProductQuery.parse(spec.schema, str(t["table"]))
        except SpecError as err:
            raise SpecError(
                f"{at}.table: {err}; the schema's strategy tables are {list(spec.schema.strategy)}"
            ) from None
        if lvl not in pop:
            raise SpecError(
                f"{at}: no [population] entry for level {lvl!r}; add {lvl} = N (typical "
                "persons per node) to [population]"
            )
        weight = _number(t.get("weight", 1.0), f"{at}.weight")
        share = _number(t["share"], f"{at}.share") if "share" in t else 1.0 / q.n_rows
        if share > 1:
            raise SpecError(f"{at}.share: {share} is above 1; give a fraction of the population")
        targets.append(Target(lvl, q.name, weight, float(pop[lvl]) * share))
    return Targets(Objective(tuple(targets), kind), floor, tol, where)


# -- writing the new spec ------------------------------------------------------------------
def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise SpecError(f"cannot write a value of type {type(v).__name__} into a spec")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _value(k)


def _allocation_table(a: Allocation) -> dict:
    return {
        "rho": str(a.rho),
        "levels": {lvl: str(s) for lvl, s in a.levels.items()},
        "queries": {lvl: [0 if s == 0 else str(s) for s in v] for lvl, v in a.queries.items()},
    }


def toml_text(doc: Mapping[str, Any], header: str) -> str:
    """A TOML document: ``header`` as comments, top-level values, then one ``[section]`` per
    table with its keys (nested tables inline)."""
    lines = [f"# {line}" for line in header.splitlines()]
    tops = [(k, v) for k, v in doc.items() if not isinstance(v, Mapping)]
    if tops:
        lines += [""] + [f"{_key(k)} = {_value(v)}" for k, v in tops]
    for section, body in doc.items():
        if isinstance(body, Mapping):
            lines += ["", f"[{_key(section)}]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def _rebased(doc: dict, keys: tuple[str, ...], spec_path: Path, out: Path, only: str = "") -> None:
    """Re-express the relative file names at ``keys`` (``"data.path"``) of a spec read from
    ``spec_path`` relative to ``out``'s folder (``only``: just names ending so)."""
    for dotted in keys:
        section, key = dotted.split(".")
        table = doc.get(section)
        if not isinstance(table, Mapping) or not isinstance(table.get(key), str):
            continue
        name = table[key]
        if Path(name).is_absolute() or not name.endswith(only):
            continue
        target = (spec_path.parent / name).resolve()
        doc[section] = {**table, key: os.path.relpath(target, out.resolve().parent)}


def family_spec_text(
    spec: PredictSpec, spec_path: Path, out: Path, allocation: Allocation, header: str
) -> str:
    """The spec at ``spec_path`` — of ``spec.family`` — with ``allocation``'s shares in that
    family's own keys, for writing at ``out`` so that its route runs it: a predict spec's
    ``[allocation]``; a run spec's ``[privacy] level_shares`` and ``query_shares``; a PPMF
    persons or units spec's ``[allocation]`` (of the ``pl94`` or ``h1`` strategy); a
    codebook spec's ``[strategy] shares``. The total ρ is the spec's; relative file names
    are re-expressed relative to ``out``'s folder.

    Raises
    ------
    SpecError
        A family whose spec cannot hold the allocation.
    """
    import dataclasses

    from censusdp.config import exact_fraction

    doc = dict(read_spec_toml(spec_path))
    strategy = spec.schema.strategy
    if spec.family == "predict":
        doc["allocation"] = _allocation_table(allocation)
        _rebased(doc, ("hierarchy.file",), spec_path, out)
    elif spec.family == "run":
        privacy = dict(doc["privacy"])
        privacy["level_shares"] = {lvl: float(s) for lvl, s in allocation.levels.items()}
        privacy["query_shares"] = {
            lvl: {t: float(s) for t, s in zip(strategy, shares, strict=True) if s != 0}
            for lvl, shares in allocation.queries.items()
        }
        doc["privacy"] = privacy
        _rebased(doc, ("data.path",), spec_path, out)
    elif spec.family in ("ppmf", "ppmf_units"):
        rho = allocation.rho
        if spec.family == "ppmf" and isinstance(doc.get("areas"), Mapping):
            share = doc["areas"].get("share")
            if share is not None:  # the tree's part was optimised; the spec states the total
                rho = rho / (1 - exact_fraction(share, f"{spec.source}: areas.share"))
        doc["allocation"] = _allocation_table(dataclasses.replace(allocation, rho=rho))
        _rebased(doc, ("hierarchy.blocks", "areas.file", "areas.list", "data.path"), spec_path, out)
    elif spec.family == "codebook":
        doc["strategy"] = {
            "queries": list(strategy),
            "shares": [float(s) for s in allocation.queries["area"]],
        }
        _rebased(doc, ("data.path",), spec_path, out)
        _rebased(doc, ("data.codebook",), spec_path, out, only=".toml")
    else:
        raise SpecError(f"{spec.source}: allocate cannot write a {spec.family!r} spec")
    return toml_text(doc, header)
