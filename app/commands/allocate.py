"""``censusdp allocate SPEC --target TARGETS.toml -o NEW_SPEC``: optimise the budget shares
(:mod:`censusdp.pipelines.allocate`); no count is read, no noise drawn."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from censusdp.app.commands.common import add_data_option, add_overwrite
from censusdp.errors import SpecError

if TYPE_CHECKING:
    from censusdp.estimation.gls.allocate import AllocationResult

__all__ = ["register"]


def _report(result: AllocationResult, start: str = "production") -> list[str]:
    kind = result.objective.kind
    lines = [
        f"objective ({kind} of relative variances): {start} {result.before:.6g} → "
        f"optimised {result.after:.6g} ({-100 * result.improvement:+.1f}%)",
        f"solver: {result.iterations} iterations, {result.evaluations} predictions, "
        + (
            f"certified: relative duality gap {result.gap:.2g} ≤ {result.tolerance:g}"
            if result.certified
            else f"NOT certified: relative duality gap {result.gap:.2g} > {result.tolerance:g}"
        )
        + f"; floor {result.floor:g} × each starting share",
        "target                                   relative variance: before → after (change)",
    ]
    for t, b, a in zip(result.objective.targets, result.targets_before, result.targets_after,
                       strict=True):  # fmt: skip
        change = "held" if b == 0 else f"{100 * (a / b - 1):+.1f}%"
        lines.append(f"  {t.label:<38} {b:.4g} → {a:.4g} ({change})")
    return lines


def _cmd_allocate(args: argparse.Namespace) -> int:
    from censusdp.atomic import check_output, output_file
    from censusdp.estimation.gls.allocate import optimise_allocation
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.pipelines.allocate import family_spec_text, load_targets
    from censusdp.pipelines.predict import load_any_spec

    spec_path, target_path, out = Path(args.spec), Path(args.target), Path(args.out)
    inputs = [spec_path, target_path, *([] if args.data is None else [Path(args.data)])]
    kw = {"overwrite": args.overwrite, "inputs": inputs, "formats": (".toml",), "option": "-o"}
    check_output(out, kind="file", **kw)  # before any work
    spec = load_any_spec(spec_path, data=args.data)
    if spec.allocation is None:
        raise SpecError(
            f"{spec.source}: privacy.accounting: allocate optimises ρ shares under zCDP (the "
            "GLS variances are convex in them); this spec is pure ε-DP: set accounting = "
            '"zcdp" and a zCDP noise law (e.g. "discrete_gaussian") to optimise it'
        )
    if spec.ignored:
        print(spec.ignored)
    targets = load_targets(target_path, spec)
    inv = [(lvl, ProductQuery.parse(spec.schema, t)) for lvl, t in spec.invariants]
    result = optimise_allocation(
        spec.hierarchy,
        spec.schema,
        targets.objective,
        inv,
        start=spec.allocation,
        floor=targets.floor,
        tolerance=targets.tolerance,
    )
    production = spec.schema.allocation
    same = production is not None and (production.levels, production.queries) == (
        spec.allocation.levels,
        spec.allocation.queries,
    )
    lines = _report(result, "production" if same else "the spec's")
    header = "\n".join(
        [f"written by `censusdp allocate {spec_path.name} --target {target_path.name}`"] + lines[:2]
    )
    with output_file(out, command="allocate", **kw) as tmp:
        text = family_spec_text(spec, spec_path, out, result.allocation, header)
        tmp.write_text(text, encoding="utf-8")
    print("\n".join(lines))
    what = "[allocation]" if spec.family == "predict" else "shares"
    print(
        f"wrote {out} (the {spec.family} spec with the optimised {what}, ρ = {result.allocation.rho})"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``allocate`` to the CLI."""
    p = sub.add_parser(
        "allocate",
        help="optimise level and query shares for declared targets (predicted, no data read)",
    )
    p.add_argument(
        "spec",
        help="a predict spec or any zCDP run spec (run, PPMF, units, codebook route) whose "
        "allocation is the start",
    )
    p.add_argument("--target", required=True, help="the targets file (TOML)")
    p.add_argument("-o", "--out", required=True, help="the new spec to write (.toml): same family")
    add_data_option(p)
    add_overwrite(p)
    p.set_defaults(func=_cmd_allocate)
