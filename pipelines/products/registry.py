"""The file products of ``censusdp privatize``, in a registry: which product reads a file, what
it can do, and running it.

A *product* is one way a confidential file becomes a release: the cells table route (a run
spec over an NHGIS-style file, :mod:`censusdp.pipelines.runner`), NHGIS codebook tables
(:mod:`censusdp.pipelines.products.codebook_tables`, :mod:`censusdp.pipelines.products.codebook_hierarchy`),
PPMF persons (:mod:`censusdp.pipelines.products.ppmf_persons`), PPMF housing units
(:mod:`censusdp.pipelines.products.ppmf_units`) and the 2020 Noisy Measurement File
(:mod:`censusdp.pipelines.products.nmf_release`). Each follows the :class:`Product` protocol — a name,
what it reads, a table of :data:`CAPABILITIES` (each ``True`` or the reason the combination
does not exist), ``claims(path, spec, options)``, a typed spec loader and ``run`` — and is
registered in :data:`PRODUCTS`. The classes here are thin adapters around the route
functions, which keep their own reading, estimation and writing.

:func:`privatize` asks every registered product whether it claims the file (its own evidence
only: the spec's ``[data]``, the file's header, the command line's flags, a folder's layout);
exactly one must. None, or more than one, is one exit-2 :class:`~censusdp.errors.SpecError`
naming every product and why. The capabilities the request asks for (``--evaluate`` or
``[evaluate]``) are then checked against the product's table before anything is read, so an
impossible combination is refused by name rather than by an unknown option deep in a route.

Products of other packages register through the ``censusdp.products`` entry-point group
(:class:`censusdp.registry.Registry`): an object (or class) following :class:`Product`.

The contract test (``tests/contracts/test_products.py``) runs every registered product × every
capability (issue 34).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from censusdp.errors import SpecError
from censusdp.registry import Registry

__all__ = [
    "CAPABILITIES",
    "PRODUCTS",
    "PRIVATIZE_FORMATS",
    "PrivatizeOptions",
    "Product",
    "Written",
    "choose_product",
    "privatize",
    "register_product",
    "require",
    "requested_capabilities",
]

#: What a product may offer, and what each promises (the contract test checks the promise).
CAPABILITIES: dict[str, str] = {
    "hierarchy_from_codes": "its geographic levels built from the file's own code columns",
    "invariants": "totals held exactly (==): those of the spec's [invariants] where the "
    "product lets the spec choose, else the product's own (the PPMF's nation and state "
    "totals, the units' block totals, the NMF's published state totals)",
    "unbiased": "an unbiased product with standard errors",
    "nonnegative": "a product with no negative cell",
    "evaluate": "a confidential evaluation written apart from the release (release/, evaluation/)",
    "predict": "`censusdp predict` reads its spec: standard errors before any noise",
}

#: Formats the file-out products write, by extension of ``-o``.
PRIVATIZE_FORMATS = (".csv", ".parquet", ".pq")


@dataclass(frozen=True)
class PrivatizeOptions:
    """What the command line says beside the file and the spec (``censusdp privatize``).

    Attributes
    ----------
    seed : int or None
        Reproducible mode (never for a real release).
    overwrite : bool
        Replace an earlier censusdp output.
    codebook, rho, delta
        The codebook product's ``--codebook``, ``--rho``, ``--delta``.
    evaluate : bool
        ``--evaluate``.
    repetitions : int or None
        ``--repetitions`` of the size-class report.
    blocks, blocks_from_data, areas
        The PPMF products' block list, its acknowledged absence and an area equivalency.
    compose_with : path or None
        The units product's persons release.
    state_totals : path or None
        The NMF product's published state totals.
    """

    seed: int | None = None
    overwrite: bool = False
    codebook: str | None = None
    rho: float | None = None
    delta: float | None = None
    evaluate: bool = False
    repetitions: int | None = None
    blocks: str | Path | None = None
    blocks_from_data: bool = False
    areas: str | Path | None = None
    compose_with: str | Path | None = None
    state_totals: str | Path | None = None

    #: The command-line flag of each field, for refusals.
    FLAGS: ClassVar[dict[str, str]] = {
        "codebook": "--codebook",
        "rho": "--rho",
        "delta": "--delta",
        "evaluate": "--evaluate",
        "repetitions": "--repetitions",
        "blocks": "--blocks",
        "blocks_from_data": "--blocks-from-data",
        "areas": "--areas",
        "compose_with": "--compose-with",
        "state_totals": "--state-totals",
    }

    def given(self, *names: str) -> list[str]:
        """The flags among ``names`` (field names) that were given."""
        return [self.FLAGS[n] for n in names if getattr(self, n) not in (None, False)]


@dataclass(frozen=True)
class Written:
    """What a product wrote.

    Attributes
    ----------
    product : str
        The product's name.
    out : Path
        The output (a file, or a folder).
    statement : str
        The privacy statement's text, derived from the measurements.
    what : str or None
        What the folder holds (one phrase); None for a file with its ``.censusdp.json``.
    evaluation : bool
        True when ``out/release/`` and ``out/evaluation/`` (CONFIDENTIAL) were written apart.
    """

    product: str
    out: Path
    statement: str
    what: str | None = None
    evaluation: bool = False


@runtime_checkable
class Product(Protocol):
    """One way a confidential file becomes a release (module docstring).

    Attributes
    ----------
    name : str
        The registry's name (``"cells"``, ``"codebook"``, ``"ppmf"``...).
    reads : str
        What input it reads, for messages.
    capabilities : mapping
        Every key of :data:`CAPABILITIES` → ``True``, or the reason (a sentence) the
        combination does not exist.
    """

    name: str
    reads: str
    capabilities: Mapping[str, bool | str]

    def claims(self, path: Path, spec: Path | None, options: PrivatizeOptions) -> bool | str:
        """True when this product reads ``path``; otherwise why not (one phrase)."""

    def load_spec(self, spec: Path | None, options: PrivatizeOptions) -> Any:
        """The product's typed spec (its route's own loader; errors name file and key)."""

    def run(
        self, path: Path, spec: Path | None, out: str | Path, options: PrivatizeOptions
    ) -> Written:
        """Release ``path`` into ``out`` (as given on the command line; atomically) and
        return what was written."""


def register_product(product: Any) -> Any:
    """Register a :class:`Product` instance (or class, instantiated) under its name.

    Raises
    ------
    SpecError
        Not a product, or a capability table that misses a capability, names an unknown one,
        or refuses one without a reason.
    """
    obj = product() if isinstance(product, type) else product
    if not isinstance(obj, Product):
        raise SpecError(f"{product!r} does not follow the Product protocol (pipelines.products)")
    caps = dict(obj.capabilities)
    if set(caps) != set(CAPABILITIES):
        missing = sorted(set(CAPABILITIES) - set(caps))
        extra = sorted(set(caps) - set(CAPABILITIES))
        raise SpecError(
            f"product {obj.name!r}: its capabilities must list each of {list(CAPABILITIES)} "
            f"as True or a reason (missing {missing}, unknown {extra})"
        )
    for cap, value in caps.items():
        if value is not True and not (isinstance(value, str) and value.strip()):
            raise SpecError(
                f"product {obj.name!r}: capability {cap!r} is {value!r}; give True or the "
                "reason the combination does not exist"
            )
    PRODUCTS.add(obj.name, obj)
    return product


#: Every product ``privatize`` can run, by name (other packages' through the
#: ``censusdp.products`` entry points).
PRODUCTS: Registry[Product] = Registry(
    "product",
    entry_points="censusdp.products",
    register=lambda name, obj: register_product(obj),
)


def require(product: Product, capability: str, where: str = "") -> None:
    """Refuse, by name, a capability the product does not have.

    Raises
    ------
    SpecError
        ``WHERE: the P product (reads ...) has no CAPABILITY (promise): REASON``.
    """
    if capability not in CAPABILITIES:
        raise SpecError(f"unknown product capability {capability!r}; known: {list(CAPABILITIES)}")
    value = product.capabilities[capability]
    if value is not True:
        prefix = f"{where}: " if where else ""
        raise SpecError(
            f"{prefix}the {product.name} product ({product.reads}) has no {capability} "
            f"({CAPABILITIES[capability]}): {value}"
        )


def _spec_doc(spec: Path | None) -> Mapping[str, Any]:
    """The spec's TOML document, or empty (a spec that does not parse is its loader's to
    refuse, with file and key)."""
    if spec is None:
        return {}
    from censusdp.config import read_spec_toml

    try:
        return read_spec_toml(spec)
    except SpecError:
        return {}


def _data(spec: Path | None) -> Mapping[str, Any]:
    data = _spec_doc(spec).get("data")
    return data if isinstance(data, Mapping) else {}


def requested_capabilities(spec: Path | None, options: PrivatizeOptions) -> tuple[str, ...]:
    """The capabilities a request asks for: ``evaluate`` (``--evaluate``, or ``[evaluate]``
    in the spec). The other sections are each product's loader's to accept or refuse (file
    and key named)."""
    asked = []
    if options.evaluate or "evaluate" in _spec_doc(spec):
        asked.append("evaluate")
    return tuple(asked)


def choose_product(path: str | Path, spec: str | Path | None, options: PrivatizeOptions) -> Product:
    """The one registered product that claims ``path``.

    Raises
    ------
    SpecError
        No product claims it, or more than one: one line naming every product and why.
    """
    p, s = Path(path), None if spec is None else Path(spec)
    if s is not None:  # a spec that cannot be read decides nothing: its own error, file named
        from censusdp.config import read_spec_toml

        read_spec_toml(s)
    answers = {name: PRODUCTS.get(name).claims(p, s, options) for name in PRODUCTS}
    claimed = [name for name, a in answers.items() if a is True]
    if len(claimed) == 1:
        return PRODUCTS.get(claimed[0])
    if not claimed:
        why = "; ".join(f"{name}: {a}" for name, a in answers.items())
        raise SpecError(f"{p.name}: no product of privatize reads it ({why})")
    raise SpecError(
        f"{p.name}: more than one product claims it ({', '.join(claimed)}); give the spec or "
        "the flags of one of them (each reads: "
        + "; ".join(f"{n}: {PRODUCTS.get(n).reads}" for n in claimed)
        + ")"
    )


def privatize(
    path: str | Path, spec: str | Path | None, out: str | Path, options: PrivatizeOptions
) -> Written:
    """``censusdp privatize``: choose the product, check the capabilities asked, run it.

    Raises
    ------
    SpecError, DataError, HierarchyError, BudgetError
    """
    from censusdp.pipelines.spec import check_run_options

    check_run_options(seed=options.seed)
    product = choose_product(path, spec, options)
    where = Path(path).name
    for capability in requested_capabilities(None if spec is None else Path(spec), options):
        flag = {"evaluate": "--evaluate" if options.evaluate else "[evaluate]"}.get(capability)
        require(product, capability, f"{where}: {flag}" if flag else where)
    # ``out`` as given: an empty -o is refused as empty, not read as the current folder
    return product.run(Path(path), None if spec is None else Path(spec), out, options)


# -- the adapters ---------------------------------------------------------------------------------
def _refuse(name: str, flags: list[str], why: str) -> None:
    if flags:
        raise SpecError(f"{name}: {', '.join(flags)} do not apply to it; {why}")


def _ppmf_header(path: Path) -> str | None:
    """``"units"`` for a PPMF units header (``HH_STATUS``), ``"persons"`` for a persons
    header, else None."""
    from censusdp.pipelines.products.ppmf_persons import csv_header, is_ppmf

    header = csv_header(path)
    if header is None:
        return None
    if "HH_STATUS" in header:
        return "units"
    return "persons" if is_ppmf(path) else None


class CellsProduct:
    """A run spec's disjoint cells over an NHGIS-style file (GISJOIN-keyed rows): the spec's
    first estimator's release, its leaf estimates in the file's own layout with ``_se``
    (:func:`censusdp.pipelines.runner.execute_spec`)."""

    name = "cells"
    reads = 'an NHGIS-style file of disjoint cells with a run spec ([data] source = "nhgis")'
    capabilities: Mapping[str, bool | str] = {
        "hierarchy_from_codes": True,  # the GISJOIN codes' summary levels
        "invariants": True,
        "unbiased": True,  # [estimators] run = ["gls"]
        "nonnegative": True,  # [estimators] run = ["topdown"]: non-negative integers
        "evaluate": "it writes one file in the input's layout; the PPMF, units and codebook "
        "products over a hierarchy evaluate against the truth, and `censusdp run SPEC` "
        "evaluates a run spec (release/ beside evaluation/)",
        "predict": True,
    }

    def claims(self, path: Path, spec: Path | None, options: PrivatizeOptions) -> bool | str:
        if options.codebook is not None:
            return "--codebook names overlapping tables"
        if spec is None:
            return 'needs a run spec (--spec SPEC, [data] source = "nhgis")'
        data = _data(spec)
        if "codebook" in data:
            return "its spec names a codebook"
        header = _ppmf_header(path)
        if header is not None:
            return f"the file's header is a PPMF {header} file's"
        if data.get("source") != "nhgis":
            return (
                f"its spec's [data] source is {data.get('source')!r}: privatize reads "
                'NHGIS-style files; set [data] source = "nhgis"'
            )
        return True

    def load_spec(self, spec: Path | None, options: PrivatizeOptions) -> Any:
        from censusdp.pipelines.specs import load_spec

        if spec is None:
            raise SpecError("the cells product needs a run spec (--spec SPEC)")
        return load_spec(spec)

    def run(
        self, path: Path, spec: Path | None, out: str | Path, options: PrivatizeOptions
    ) -> Written:
        import numpy as np

        from censusdp.atomic import check_output, output_file
        from censusdp.pipelines.data import load_data
        from censusdp.pipelines.io.nhgis import read_batch, write_batch
        from censusdp.pipelines.io.outputs import margin_of_error, significant
        from censusdp.pipelines.products.codebook_tables import refuse_overlapping_columns
        from censusdp.pipelines.runner import execute_spec
        from censusdp.progress import show_progress

        _refuse(path.name, options.given("compose_with"), "--compose-with belongs to the "
                "units product (a PPMF units file with HH_STATUS)")  # fmt: skip
        _refuse(path.name, options.given("repetitions", "blocks", "blocks_from_data", "areas"),
                "they belong to the PPMF products (a PPMF input)")  # fmt: skip
        _refuse(path.name, options.given("rho", "delta"), "--rho and --delta state the budget "
                "of the codebook product; without a codebook the spec's [privacy] states it")  # fmt: skip
        policy = {
            "overwrite": options.overwrite,
            "inputs": [path, spec],
            "formats": PRIVATIZE_FORMATS,
            "option": "-o",
        }
        check_output(out, kind="file", **policy)  # type: ignore[arg-type]
        rspec = self.load_spec(spec, options)
        if rspec.data.source != "nhgis":
            raise SpecError(
                f'{rspec.source}: privatize reads NHGIS-style files; set [data] source = "nhgis"'
            )
        # before the hierarchy and any noise: overlapping columns would understate the loss
        cols = read_batch(
            path,
            cells=list(rspec.data.cells) or None,
            version_column=rspec.data.version_column or "version",
            truth_version=rspec.data.truth,
            encoding=rspec.data.encoding,
        )
        refuse_overlapping_columns(cols.cells, cols.truth, path.name)
        run_data = load_data(rspec, path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            releases, _, _, manifest = execute_spec(
                rspec, run_data, seed=options.seed, progress=show_progress(False)
            )
        name = rspec.estimators.run[0]
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
        moes = None
        if ses is not None:  # as every table route: a 90% margin beside each SE, 6-digit SEs
            moes = margin_of_error(ses, integer=release.integer)
            ses = significant(ses)
        with output_file(out, command="privatize", info=info, **policy) as tmp:  # type: ignore[arg-type]
            write_batch(run_data.batch, values, ses, tmp, margins_of_error=moes)
        return Written(self.name, Path(out), text)


class CodebookProduct:
    """Overlapping tables of an NHGIS-style file described by a codebook (``--codebook`` or
    ``[data] codebook``): one GLS estimate of the strategy's marginals writes every column
    as integers keeping every identity (:func:`~censusdp.pipelines.products.codebook_tables.privatize_tables`;
    over ``[hierarchy]`` both products in a folder,
    :mod:`~censusdp.pipelines.products.codebook_hierarchy`)."""

    name = "codebook"
    reads = (
        "an NHGIS-style file of overlapping tables with a codebook (--codebook or [data] codebook)"
    )
    capabilities: Mapping[str, bool | str] = {
        "hierarchy_from_codes": True,  # [hierarchy] levels from the GISJOIN summary levels
        "invariants": True,  # with [hierarchy]
        "unbiased": True,
        "nonnegative": True,  # with [hierarchy]: nonnegative/
        "evaluate": True,  # [evaluate], with [hierarchy]
        "predict": True,
    }

    def claims(self, path: Path, spec: Path | None, options: PrivatizeOptions) -> bool | str:
        if options.codebook is None and "codebook" not in _data(spec):
            return "neither --codebook nor a spec with [data] codebook"
        header = _ppmf_header(path)
        if header is not None:
            return f"the file's header is a PPMF {header} file's"
        return True

    def load_spec(self, spec: Path | None, options: PrivatizeOptions) -> Any:
        from dataclasses import replace

        from censusdp.pipelines.products.codebook_tables import TableSpec, load_table_spec

        if spec is None:
            if options.rho is None:
                raise SpecError(
                    f"--codebook {options.codebook}: state the budget with --rho R (the "
                    "per-person ρ, zCDP, that the strategy spends in every area) or give a "
                    "spec with [privacy] rho"
                )
            return TableSpec(
                codebook=str(options.codebook),
                rho=float(options.rho),
                delta=options.delta,
                seed=options.seed,
            )
        if "codebook" not in _data(spec):
            raise SpecError(
                f"{spec}: --codebook needs a codebook spec ([data] codebook = ..., [privacy] "
                "rho; [hierarchy], [invariants] and [evaluate] optional, no [queries]) or none; "
                "this spec describes disjoint cells"
            )
        tspec = load_table_spec(spec)
        for flag, given, stated in (
            ("--codebook", options.codebook, tspec.codebook),
            ("--rho", options.rho, tspec.rho),
            ("--delta", options.delta, tspec.delta),
        ):
            if given is not None and stated is not None and given != stated:
                raise SpecError(
                    f"{spec}: {flag} {given} contradicts the spec's value; give it in one place"
                )
        return replace(
            tspec,
            delta=tspec.delta if options.delta is None else options.delta,
            seed=tspec.seed if options.seed is None else options.seed,
        )

    def run(
        self, path: Path, spec: Path | None, out: str | Path, options: PrivatizeOptions
    ) -> Written:
        from dataclasses import replace

        from censusdp.pipelines.products.codebook_tables import privatize_tables
        from censusdp.pipelines.runner import EVALUATION_DIR

        _refuse(path.name, options.given("compose_with"), "--compose-with belongs to the "
                "units product (a PPMF units file with HH_STATUS)")  # fmt: skip
        _refuse(path.name, options.given("blocks", "blocks_from_data", "areas"),
                "they belong to the PPMF products (a PPMF input)")  # fmt: skip
        tspec = self.load_spec(spec, options)
        if (options.evaluate or options.repetitions is not None) and not tspec.levels:
            raise SpecError(
                f"{path.name}: --evaluate and --repetitions need a codebook spec with [hierarchy] "
                "levels (the size-class report is over a hierarchy's levels)"
            )
        if options.evaluate or options.repetitions is not None:
            tspec = replace(
                tspec,
                evaluate=tspec.evaluate or options.evaluate,
                repetitions=tspec.repetitions
                if options.repetitions is None
                else options.repetitions,
            )
        written, rel = privatize_tables(
            path, tspec, out, spec_path=spec, overwrite=options.overwrite, formats=PRIVATIZE_FORMATS
        )
        if not Path(written).is_dir():
            return Written(self.name, Path(written), rel.privacy.text())
        what = (
            "unbiased/ and nonnegative/ tables of every level, the file's rows in its layout, "
            "manifest.json, privacy.md"
        )
        evaluation = (Path(written) / EVALUATION_DIR).is_dir()
        return Written(self.name, Path(written), rel.privacy.text(), what, evaluation)


class _PPMFRoute:
    """What the PPMF persons and units products share: every capability (their levels from
    the geography columns, their own invariants: the nation and state totals, the block
    housing units), and a claim on their ``[data] source`` or header, refusing the other's."""

    capabilities: Mapping[str, bool | str] = dict.fromkeys(CAPABILITIES, True)
    name: str
    header: str  # the kind _ppmf_header tells
    other: tuple[str, str]  # the other route's source, and why it is not this one's
    neither: str

    def claims(self, path: Path, spec: Path | None, options: PrivatizeOptions) -> bool | str:
        source = _data(spec).get("source")
        if source == self.other[0]:
            return self.other[1]
        return source == self.name or _ppmf_header(path) == self.header or self.neither


class PPMFProduct(_PPMFRoute):
    """PPMF persons (one row per person, 2020 layout): P1–P5 at every level in both products
    (unbiased with ``_se``, non-negative with microdata),
    :func:`~censusdp.pipelines.products.ppmf_persons.privatize_ppmf`."""

    name = "ppmf"
    reads = 'a PPMF persons file (its geography columns, or [data] source = "ppmf")'
    header = "persons"
    other = ("ppmf_units", 'its spec says [data] source = "ppmf_units"')
    neither = 'neither a PPMF persons header nor a spec with [data] source = "ppmf"'

    def load_spec(self, spec: Path | None, options: PrivatizeOptions) -> Any:
        from censusdp.pipelines.products.ppmf_persons import load_ppmf_spec

        if spec is None:
            raise SpecError(
                'a PPMF needs a spec (--spec SPEC) with [data] source = "ppmf" and [privacy] '
                'accounting = "zcdp" (rho: the budget)'
            )
        return load_ppmf_spec(spec)

    def run(
        self, path: Path, spec: Path | None, out: str | Path, options: PrivatizeOptions
    ) -> Written:
        from censusdp.pipelines.products.ppmf_persons import privatize_ppmf

        _refuse(path.name, options.given("compose_with"), "--compose-with belongs to the "
                "units product (a PPMF units file with HH_STATUS)")  # fmt: skip
        if options.given("codebook", "rho", "delta"):
            raise SpecError(
                f"{path.name} is a PPMF: its budget is the PPMF spec's [privacy] rho "
                "(and delta); --codebook, --rho and --delta belong to the NHGIS routes"
            )
        if spec is None:
            self.load_spec(spec, options)
        res = privatize_ppmf(
            path,
            spec,
            out,
            seed=options.seed,
            overwrite=options.overwrite,
            evaluate=options.evaluate,
            repetitions=options.repetitions,
            blocks=options.blocks,
            blocks_from_data=options.blocks_from_data,
            areas=options.areas,
        )
        what = (
            "unbiased/ and nonnegative/ P1-P5 tables, nonnegative/microdata.csv, manifest.json, "
            "size_classes.md"
        )
        return Written(self.name, res.out, res.privacy.text(), what, options.evaluate)


class UnitsProduct(_PPMFRoute):
    """PPMF housing units (one row per unit or group-quarters facility): H1 at every level,
    the block totals invariant, both products,
    :func:`~censusdp.pipelines.products.ppmf_units.privatize_units`."""

    name = "ppmf_units"
    reads = 'a PPMF units file (HH_STATUS in its header, or [data] source = "ppmf_units")'
    header = "units"
    other = ("ppmf", 'its spec says [data] source = "ppmf" (persons)')
    neither = 'neither HH_STATUS in its header nor a spec with [data] source = "ppmf_units"'

    def load_spec(self, spec: Path | None, options: PrivatizeOptions) -> Any:
        from censusdp.pipelines.products.ppmf_units import load_units_spec

        return None if spec is None else load_units_spec(spec)

    def run(
        self, path: Path, spec: Path | None, out: str | Path, options: PrivatizeOptions
    ) -> Written:
        from censusdp.pipelines.products.ppmf_units import privatize_units

        given = options.given("codebook", "rho", "delta", "areas")
        if given:
            raise SpecError(
                f"{path.name} is a PPMF units file (H1): {', '.join(given)} do not apply "
                "to it; its budget is the units spec's [privacy] rho (and delta)"
            )
        res = privatize_units(
            path,
            spec,
            out,
            seed=options.seed,
            overwrite=options.overwrite,
            blocks=options.blocks,
            blocks_from_data=options.blocks_from_data,
            compose_with=options.compose_with,
            evaluate=options.evaluate,
            repetitions=options.repetitions,
        )
        what = (
            "H1 tables h1_<level>.csv and h1_long.csv, nonnegative/, size_classes.md, "
            "manifest.json, privacy.md"
        )
        return Written(self.name, res.out, res.privacy.text(), what, options.evaluate)


#: The levels of the NMF folder whose presence marks one (``<Level>.parquet`` folders).
NMF_MARKERS = ("State.parquet", "Block.parquet")


class NMFProduct:
    """The 2020 Noisy Measurement File (a folder of ``<Level>.parquet``): its published
    measurements re-estimated by the structured GLS with the published state totals held,
    P1–P5 with exact ``_se`` (:func:`~censusdp.pipelines.products.nmf_release.release_nmf`; also
    ``censusdp nmf ROOT --state-totals FILE --out DIR``)."""

    name = "nmf"
    reads = "a Noisy Measurement File folder (State.parquet ... Block.parquet)"
    capabilities: Mapping[str, bool | str] = {
        "hierarchy_from_codes": True,  # the measurements' GEOCODEs
        "invariants": True,  # the published state totals (--state-totals)
        "unbiased": True,
        "nonnegative": "the file's noise is already drawn and published: the GLS release is "
        "real-valued with exact standard errors, and no non-negative product is derived from it",
        "evaluate": "it has no confidential input to compare with (`censusdp nmf-evaluate` "
        "needs the truth from elsewhere)",
        "predict": "its noise is already drawn with the Bureau's budget; there is no budget "
        "left to choose (the release's _se are exact)",
    }

    def claims(self, path: Path, spec: Path | None, options: PrivatizeOptions) -> bool | str:
        if path.is_dir() and any((path / m).is_dir() for m in NMF_MARKERS):
            return True
        return "not a folder holding State.parquet ... Block.parquet"

    def load_spec(self, spec: Path | None, options: PrivatizeOptions) -> Any:
        if spec is not None:
            raise SpecError(
                f"{spec}: the nmf product takes no spec (its measurements and budget are "
                "published); give --state-totals FILE"
            )
        if options.state_totals is None:
            raise SpecError(
                "the nmf product needs the published P1 state totals: run `censusdp nmf ROOT "
                "--state-totals P1.csv --out DIR`"
            )
        return options.state_totals

    def run(
        self, path: Path, spec: Path | None, out: str | Path, options: PrivatizeOptions
    ) -> Written:
        from censusdp.pipelines.products.nmf_release import NMFReleaseOptions, release_nmf

        flags = [
            f.name for f in fields(options) if f.name not in ("seed", "overwrite", "state_totals")
        ]
        _refuse(path.name, options.given(*flags), "the nmf product reads only the folder and "
                "its published state totals")  # fmt: skip
        totals = self.load_spec(spec, options)
        res = release_nmf(path, totals, out, options=NMFReleaseOptions(overwrite=options.overwrite))
        return Written(self.name, Path(res.out), str(res.statement), ", ".join(res.files))


for _product in (CellsProduct, CodebookProduct, PPMFProduct, UnitsProduct, NMFProduct):
    register_product(_product)
