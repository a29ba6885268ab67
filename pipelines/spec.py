"""The run spec (the cells-table product's spec): TOML files parsed into frozen, validated
dataclasses.

A spec names the data, the hierarchy, the privacy budget and its split, the queries measured
and the invariants held exact at each level, the noise law, the estimators and how to run
them (docs/design.md § Specs and runs)::

    [data]
    source = "csv"                        # "csv" | "parquet" | "nhgis" | "midwest" | "synthetic"
    path = "counties.csv"                 # relative to the spec file's directory
    cells = ["M_*", "F_*"]                # cell columns: names or glob patterns
    truth = "sf2010"                      # optional: the version (or column) holding the truth
    version_column = "version"            # optional: long files, one row per (node, version)

    [hierarchy]
    levels = ["nation", "state", "county"]
    codes = { state = "fips:2", county = "fips" }     # column[:prefix length]
    # or join zero-padded columns: county = ["state_fips", "county_fips"], or with declared
    # widths: county = { columns = ["state_fips", "county_fips"], widths = [2, 3] }

    [privacy]
    accounting = "zcdp"                   # "pure" takes epsilon, "zcdp" takes rho
    rho = 1.0
    delta = 1e-10                         # optional, zcdp only: also report (ε, δ)
    level_shares = { state = 0.5, county = 0.5 }
    query_shares = { county = { total = 0.5, age = 0.5 } }

    [queries]                             # per level: "total", "detailed" or a marginal
    state = ["total"]
    county = ["total", "age"]

    [marginals.age]                       # a marginal: one row per group of cells
    groups = { young = "*_0-4", old = "*_85+" }

    [invariants]                          # per level: released exactly
    nation = "total"
    # acknowledge_exact_release = true    # allow invariants that fix every measured value

    [mechanism]
    noise = "discrete_gaussian"           # must match the accounting

    [estimators]
    run = ["gls", "topdown"]
    integer = "round"
    mcmc = { tv_bound = 0.01, chains = 4 }

    [run]
    repetitions = 1
    seed = 12345                          # omit for a cryptographically secure key
    scheduler = "threads"

    [output]
    dir = "out/"

Every problem raises :class:`~censusdp.errors.SpecError` naming the file and the dotted key
(``privacy.level_shares.county``): unknown keys (with a close-match suggestion), wrong types,
invalid values, inconsistent sections, and TOML syntax errors (with line and column). The
seed is kept out of every ``repr`` and is redacted by :meth:`RunSpec.to_dict` by default:
seeded output is for reproduction only and the seed must never reach a manifest or log.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from censusdp.budget import (
    ACCOUNTINGS,
    SHARE_TOLERANCE,
    Accounting,
    Budget,
    PrivacyStatement,
    statement_for,
)
from censusdp.config import MAX_RHO, SpecParser, dotted_key, exact_fraction, kind_of
from censusdp.errors import SpecError

if TYPE_CHECKING:
    from censusdp.schema import Allocation

__all__ = [
    "BUILTIN_QUERIES",
    "INTEGER_MODES",
    "MAX_PARTITIONS",
    "MAX_REPETITIONS",
    "REDACTED",
    "CodeSpec",
    "DataSpec",
    "EstimatorSpec",
    "HierarchySpec",
    "MarginalSpec",
    "McmcSpec",
    "MechanismSpec",
    "OutputSpec",
    "ProductKeys",
    "ProductSpec",
    "SpecCore",
    "PrivacySpec",
    "RunOptions",
    "RunSpec",
    "RunSpecParser",
    "allocation_dict",
    "check_run_options",
    "load_product_spec",
    "open_spec",
    "relative_path",
    "zcdp_keys",
]

INTEGER_MODES = ("round", "lattice", "none")
BUILTIN_QUERIES = ("total", "detailed")
#: ``[run]`` keys on joining a Dask scheduler (see :class:`RunOptions`).
_NETWORK = ("tls_ca_file", "tls_cert", "tls_key", "allow_insecure_network")
#: What :meth:`RunSpec.to_dict` writes in place of a seed.
REDACTED = "<redacted>"
#: Upper bound of simulated or repeated releases (``[run] repetitions``, ``[report]
#: repetitions``, ``--repetitions``): each is a full release; beyond this a run would not end.
MAX_REPETITIONS = 1000
#: Upper bound of ``--partitions`` / ``[run] partitions`` (a partition per county of the
#: nation is 3,221; more only adds scheduling overhead).
MAX_PARTITIONS = 100_000


@dataclass(frozen=True)
class CodeSpec:
    """How one level's node codes are read: ``column``, ``column:prefix``, or several
    columns joined.

    Attributes
    ----------
    column : str
        Input column holding the code (e.g. ``"fips"``); for a joined code, the name of the
        joined column (``"state_fips+county_fips"``).
    prefix : int or None
        When set, the code is the first ``prefix`` characters of the column
        (``"fips:2"`` → the state FIPS of a county FIPS code); None uses the whole value.
    columns : tuple of str
        Columns whose values, each zero-padded to its width, are joined into the code
        (``county = ["state_fips", "county_fips"]`` → ``"01" + "001"``); empty for a
        single column.
    widths : tuple of int or None
        The declared width of each of ``columns``; None takes each column's widest value.
    """

    column: str
    prefix: int | None = None
    columns: tuple[str, ...] = ()
    widths: tuple[int, ...] | None = None

    def __str__(self) -> str:
        if self.columns:
            widths = self.widths or (None,) * len(self.columns)
            return "+".join(
                c if w is None else f"{c}:{w}" for c, w in zip(self.columns, widths, strict=True)
            )
        return self.column if self.prefix is None else f"{self.column}:{self.prefix}"


@dataclass(frozen=True)
class DataSpec:
    """The ``[data]`` table: where the confidential counts come from.

    Attributes
    ----------
    source : str
        Input format, a registered source (:data:`censusdp.pipelines.data.SOURCES`, checked
        by :func:`censusdp.pipelines.specs.check_spec`): ``midwest`` is the embedded demo
        table (ggplot2's ``midwest``, packaged as a CSV), ``synthetic`` is generated, the others are files.
    path : pathlib.Path or None
        Input file (required for file sources). A relative path in a spec file is resolved
        against that file's directory by :func:`load_spec`.
    cells : tuple of str
        Cell columns, as names or :mod:`fnmatch` glob patterns, in order; empty means the
        source's default cells.
    truth : str or None
        The version (long files) or column holding the confidential truth.
    version_column : str or None
        In long files, the column naming each row's version.
    encoding : str or None
        Text encoding of CSV input (None: UTF-8).
    """

    source: str
    path: Path | None = None
    cells: tuple[str, ...] = ()
    truth: str | None = None
    version_column: str | None = None
    encoding: str | None = None


@dataclass(frozen=True)
class HierarchySpec:
    """The ``[hierarchy]`` table.

    Attributes
    ----------
    levels : tuple of str
        Level names, top (root, one node) to bottom (leaves).
    codes : dict of level → CodeSpec
        How each level's codes are read; required for every level below the root when the
        source is ``csv`` or ``parquet``.
    """

    levels: tuple[str, ...]
    codes: dict[str, CodeSpec] = field(default_factory=dict)


@dataclass(frozen=True)
class MarginalSpec:
    """A ``[marginals.NAME]`` table: a 0/1 marginal query over the cells.

    Attributes
    ----------
    name : str
        The marginal's name, used in ``[queries]`` and ``[invariants]``.
    groups : dict of label → pattern or tuple of cell names
        One output row per group: the cells matching a glob pattern, or the listed cells
        (see :meth:`censusdp.mechanisms.queries.Query.marginal`).
    """

    name: str
    groups: dict[str, str | tuple[str, ...]]


@dataclass(frozen=True)
class PrivacySpec:
    """The ``[privacy]`` table: total budget and its split.

    Attributes
    ----------
    accounting : {"pure", "zcdp"}
        Pure ε-DP (Laplace laws) or ρ-zCDP (Gaussian laws).
    total : float
        Total ε (``privacy.epsilon``, pure) or ρ (``privacy.rho``, zcdp), > 0.
    delta : float or None
        δ in (0, 1) at which a zCDP budget is also reported as (ε, δ)-DP.
    level_shares : dict of level → float
        Share of the total per measured level, positive, summing to 1. May be omitted in
        the file when a single level has queries (it then gets share 1).
    query_shares : dict of level → dict of query → float
        Share of each measured level's budget per query, positive, summing to 1. A level's
        entry may be omitted in the file when it has a single query (share 1).
    """

    accounting: str
    total: float
    delta: float | None
    level_shares: dict[str, float]
    query_shares: dict[str, dict[str, float]]

    @property
    def unit(self) -> str:
        """``"epsilon"`` or ``"rho"``."""
        return ACCOUNTINGS[self.accounting]

    def budget(self) -> Budget:
        """The :class:`~censusdp.budget.Budget` (allocation and accountant)."""
        return Budget(self.accounting, self.total, self.level_shares, self.query_shares, self.delta)


@dataclass(frozen=True)
class MechanismSpec:
    """The ``[mechanism]`` table.

    Attributes
    ----------
    noise : str
        Noise law of every measurement: a name registered in
        :mod:`censusdp.mechanisms.registry`, of the spec's accounting (checked, with the
        other registered names, by :func:`censusdp.pipelines.specs.check_spec`).
    allow_floating_point : bool
        The spec acknowledges that a continuous law samples in floating point, which is
        open to floating-point attacks (Mironov 2012); required for continuous laws,
        refused for the exact integer laws (checked by ``check_spec``).
    """

    noise: str
    allow_floating_point: bool = False


@dataclass(frozen=True)
class McmcSpec:
    """The ``[estimators.mcmc]`` table: options of the conditioning (MCMC) estimator.

    Attributes
    ----------
    tv_bound : float
        Required upper bound on the total-variation distance to the target, from the
        coupling diagnostic (Biswas, Jacob & Vanetti 2019); in (0, 1). Default 0.01.
    max_iterations : int or None
        Iteration cap per chain (None: the estimator's default).
    chains : int
        Number of (coupled pairs of) chains, ≥ 2 (R̂ needs several). Default 4.
    """

    tv_bound: float = 0.01
    max_iterations: int | None = None
    chains: int = 4


@dataclass(frozen=True)
class EstimatorSpec:
    """The ``[estimators]`` table.

    Attributes
    ----------
    run : tuple of str
        Registered estimators to run, in order (default ``("gls",)``;
        :data:`censusdp.pipelines.estimators.ESTIMATORS`, checked by
        :func:`censusdp.pipelines.specs.check_spec`).
    integer : {"round", "lattice", "none"}
        Integer output. ``"round"`` (default): real releases are rounded by unbiased
        dependent rounding. ``"lattice"`` (integer subspace DP; needs an integer noise law):
        conditioning samples integer noise on the lattice of invariant-preserving vectors
        (integer moves), so its draws are integers without rounding; GLS, whose projection
        is real, is rounded as under ``"round"``. ``"none"``: real-valued output. TopDown-style
        releases are integers under every mode.
    mcmc : McmcSpec
        Options of the conditioning estimator.
    """

    run: tuple[str, ...] = ("gls",)
    integer: str = "round"
    mcmc: McmcSpec = field(default_factory=McmcSpec)


@dataclass(frozen=True)
class RunOptions:
    """The ``[run]`` table.

    Attributes
    ----------
    repetitions : int
        Independent runs of the mechanism (each with its own child key), ≥ 1.
    seed : int or None
        Non-negative seed for reproducible mode; None (the default) draws a fresh secure
        key. Never shown by ``repr`` and redacted by :meth:`RunSpec.to_dict`.
    scheduler : str
        A registered scheduler (:data:`censusdp.pipelines.execute.SCHEDULERS`; checked by
        :func:`censusdp.pipelines.specs.check_spec`); ``sync`` runs in-process.
    partitions : int or None
        Number of partitions of the work (None: the pipeline chooses). The output does not
        depend on it.
    address : str or None
        ``tls://host:port`` of a running Dask scheduler (``tcp://`` on the loopback
        interface only, unless ``allow_insecure_network``); only with ``distributed``.
    tls_ca_file, tls_cert, tls_key : pathlib.Path or None
        PEM files joining a ``tls://`` scheduler: the cluster's certificate authority, this
        client's certificate and its key (all three or none; relative paths are resolved
        against the spec file's directory). None: Dask's ``distributed.comm.tls`` config.
    allow_insecure_network : bool
        Accept a plaintext ``tcp://`` scheduler off the loopback interface, which sends the
        partitions' confidential counts and noise sub-keys unencrypted. Default false.
    """

    repetitions: int = 1
    seed: int | None = field(default=None, repr=False)
    scheduler: str = "sync"
    partitions: int | None = None
    address: str | None = None
    tls_ca_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_insecure_network: bool = False

    def network(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~censusdp.pipelines.execute.open_executor` that
        say how a scheduler address is joined (TLS files, plaintext acknowledgement)."""
        return {
            "tls_ca_file": self.tls_ca_file,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
            "allow_insecure_network": self.allow_insecure_network,
        }

    @property
    def reproducible(self) -> bool:
        """True when a seed was given (reproducible mode: not for a real release)."""
        return self.seed is not None


def check_run_options(*, seed: Any = None, partitions: Any = None, where: str = "") -> None:
    """Validate run options given outside a spec (``--seed``, ``--partitions``, Python).

    ``seed`` must be a non-negative integer and ``partitions`` a positive one (0 is an
    error, not "the default"). Messages name the option, never a seed's value.

    Raises
    ------
    SpecError
    """
    from numbers import Integral

    prefix = f"{where}: " if where else ""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0):
        raise SpecError(f"{prefix}seed must be a non-negative integer")
    if partitions is not None and (
        isinstance(partitions, bool) or not isinstance(partitions, Integral) or partitions < 1
    ):
        raise SpecError(
            f"{prefix}partitions must be a positive integer (omit it to let the pipeline choose)"
        )
    if partitions is not None and partitions > MAX_PARTITIONS:
        raise SpecError(f"{prefix}partitions: at most {MAX_PARTITIONS}")


def zcdp_keys(
    p: SpecParser, doc: Mapping[str, Any], measured_by: str, *, rho_required: bool = False
) -> tuple[float | None, float | None, int | None]:
    """``[privacy]`` (``accounting = "zcdp"``, ``rho``, ``delta``), ``[mechanism] noise``
    (``"discrete_gaussian"`` only) and ``[run] seed`` of a product spec whose strategy is
    measured with the discrete Gaussian (Canonne, Kamath & Steinke 2020): the PPMF persons
    and units routes and the codebook route. ``measured_by`` names the route in messages
    (``"the pl94 strategy"``).

    Returns
    -------
    (rho, delta, seed)
        None where not given (a ``rho`` is required with ``rho_required``).

    Raises
    ------
    SpecError
        Naming the file and the dotted key.
    """
    priv = p.table(doc, "privacy", required=True)
    p.keys(priv, "privacy", ("accounting", "rho", "delta"))
    if p.get(priv, "privacy", "accounting", str, required=True) != Accounting.ZCDP:
        raise p.fail("privacy.accounting", 'discrete Gaussian measurements compose in "zcdp"')
    rho = p.get(priv, "privacy", "rho", float, required=rho_required)
    delta = p.get(priv, "privacy", "delta", float)
    if delta is not None and not 0 < delta < 1:
        raise p.fail("privacy.delta", "must be in (0, 1)")
    mech = p.table(doc, "mechanism", required=False)
    p.keys(mech, "mechanism", ("noise",))
    if p.get(mech, "mechanism", "noise", str, default="discrete_gaussian") != "discrete_gaussian":
        raise p.fail("mechanism.noise", f'{measured_by} is measured with "discrete_gaussian"')
    run = p.table(doc, "run", required=False)
    p.keys(run, "run", ("seed",))
    seed = p.get(run, "run", "seed", int)
    if seed is not None and seed < 0:
        raise p.fail("run.seed", "must be a non-negative integer")
    return rho, delta, seed


@dataclass(frozen=True, kw_only=True)
class SpecCore:
    """The keys every file product's spec shares: :class:`ProductSpec` (the PPMF routes) and
    :class:`~censusdp.pipelines.products.codebook_tables.TableSpec` (the codebook route) add
    their own.

    Attributes
    ----------
    rho : Fraction, float or None
        Per-person (per-unit) ρ (zCDP); None: the schema allocation's own.
    delta : float or None
        δ at which ρ is also reported as (ε, δ).
    seed : int or None
        ``[run] seed``: reproducible mode (tests); never written to a manifest.
    source : str
        The spec file, for messages and the manifest.
    repetitions : int
        Simulated releases of the size-class report (≥ 2).
    """

    rho: Fraction | float | None = None
    delta: float | None = None
    seed: int | None = field(default=None, repr=False)  # never in a repr, log or manifest
    source: str = "<spec>"
    repetitions: int = 10


@dataclass(frozen=True, kw_only=True)
class ProductSpec(SpecCore):
    """The keys every PPMF route's spec shares (:func:`load_product_spec`): the units route's
    whole spec, the persons route's with its ``[areas]`` added
    (:class:`~censusdp.pipelines.products.ppmf_persons.PPMFSpec`): :class:`SpecCore`'s (ρ a
    Fraction, repetitions from ``[report]``), ``[hierarchy] blocks`` (the public list of
    every block) and its ``block_column``, and ``allocation``, the spec's ``[allocation]`` of
    the route's strategy (None: the schema's production one).
    """

    blocks: Path | None = None
    block_column: str | None = None
    allocation: Allocation | None = None

    def to_dict(self) -> dict:
        """The spec for the manifest, never the seed."""
        return {
            "source": self.source,
            "rho": None if self.rho is None else str(self.rho),
            "delta": self.delta,
            "repetitions": self.repetitions,
            "reproducible_mode": self.seed is not None,
            "blocks": None if self.blocks is None else self.blocks.name,
            "allocation": allocation_dict(self.allocation),
        }

    def with_cli(
        self, *, seed: int | None, repetitions: int | None, blocks: str | Path | None
    ) -> Self:
        """The spec with the command line's ``--seed``, ``--repetitions``, ``--blocks`` over it.

        Raises
        ------
        SpecError
            ``--repetitions`` outside 2 to :data:`MAX_REPETITIONS`.
        """
        spec = self
        if seed is not None:
            spec = dataclasses.replace(spec, seed=seed)
        if repetitions is not None:
            if not 2 <= repetitions <= MAX_REPETITIONS:
                raise SpecError(
                    f"--repetitions: give 2 to {MAX_REPETITIONS} (the bias has a standard "
                    "error; each is a full release)"
                )
            spec = dataclasses.replace(spec, repetitions=repetitions)
        if blocks is not None:
            spec = dataclasses.replace(spec, blocks=Path(blocks))
        return spec


def allocation_dict(allocation: Allocation | None) -> dict | None:
    """An allocation's exact shares as text, for manifests (None: the schema's own)."""
    if allocation is None:
        return None
    return {
        "rho": str(allocation.rho),
        "levels": {lvl: str(s) for lvl, s in allocation.levels.items()},
        "queries": {lvl: [str(s) for s in v] for lvl, v in allocation.queries.items()},
    }


def relative_path(spec: Path, name: str) -> Path:
    """``name`` as given in the spec file ``spec``: relative to its folder unless absolute."""
    q = Path(name)
    return q if q.is_absolute() else spec.parent / q


@dataclass(frozen=True)
class ProductKeys:
    """What a PPMF route's spec says about itself, for :func:`load_product_spec`.

    Attributes
    ----------
    source : str
        The one ``[data] source`` it takes (``"ppmf"``).
    reads : str
        What that input is, for the message refusing another source.
    strategy : str
        The schema whose strategy it measures (``"pl94"``), named in messages; its
        ``[allocation]`` is read against it.
    levels : tuple of str
        The hierarchy's levels, those an ``[allocation]`` may name.
    data_keys : tuple of str
        The keys ``[data]`` takes.
    more_tables : tuple of str
        The route's own top-level tables, beyond the shared ones.
    """

    source: str
    reads: str
    strategy: str
    levels: tuple[str, ...]
    data_keys: tuple[str, ...] = ("source",)
    more_tables: tuple[str, ...] = ()


def open_spec(
    path: Path, tables: tuple[str, ...], data_keys: tuple[str, ...], *, data_required: bool = False
) -> tuple[SpecParser, dict[str, Any], Mapping[str, Any]]:
    """A product spec's parser, document and ``[data]`` table, its top-level ``tables`` and
    ``[data]``'s ``data_keys`` checked (SpecError naming the file and the key)."""
    from censusdp.config import read_spec_toml

    doc = read_spec_toml(path)
    p = SpecParser(str(path), path.parent)
    p.keys(doc, "", tables)
    data = p.table(doc, "data", required=data_required)
    p.keys(data, "data", data_keys)
    return p, doc, data


def load_product_spec(
    path: str | Path, keys: ProductKeys
) -> tuple[SpecParser, dict[str, Any], ProductSpec]:
    """Open a PPMF route's spec and read the keys every route shares.

    The top-level tables (``data``, ``privacy``, ``mechanism``, ``hierarchy``, ``report``,
    ``run``, ``allocation`` and ``keys.more_tables``), ``[data] source`` (which must be
    ``keys.source``), ``[privacy]`` (zCDP ρ, δ), ``[mechanism]`` (discrete Gaussian only),
    ``[run] seed``, ``[hierarchy] blocks, block_column``, ``[report] repetitions`` and
    ``[allocation]``.

    Returns
    -------
    (SpecParser, dict, ProductSpec)
        The parser and document, for the route's own tables, and the shared keys.

    Raises
    ------
    SpecError
        Naming the file and the dotted key.
    """
    from censusdp.schema import Allocation, Schema

    path = Path(path)
    tables = ("data", "privacy", "mechanism", "hierarchy", *keys.more_tables, "report", "run")
    p, doc, data = open_spec(path, (*tables, "allocation"), keys.data_keys)
    given = p.get(data, "data", "source", str, default=keys.source)
    if given != keys.source:
        raise p.fail(
            "data.source", f'the input is {keys.reads}, not {given!r}: set source = "{keys.source}"'
        )
    rho, delta, seed = zcdp_keys(p, doc, f"the {keys.strategy} strategy")
    if rho is not None:
        rho = exact_fraction(rho, f"{path}: privacy.rho", most=MAX_RHO)
    hier = p.table(doc, "hierarchy", required=False)
    p.keys(hier, "hierarchy", ("blocks", "block_column"))
    blocks = p.get(hier, "hierarchy", "blocks", str)
    rep = p.table(doc, "report", required=False)
    p.keys(rep, "report", ("repetitions",))
    repetitions = p.get(rep, "report", "repetitions", int, default=10)
    if not 2 <= repetitions <= MAX_REPETITIONS:
        raise p.fail(
            "report.repetitions",
            f"give 2 to {MAX_REPETITIONS} (the bias has a standard error; each is a release)",
        )
    allocation = None
    if "allocation" in doc:  # the strategy's shares (censusdp allocate writes them)
        n_queries = len(Schema.load(keys.strategy).strategy)
        allocation = Allocation.from_dict(doc["allocation"], n_queries, str(path))
        unknown = [lvl for lvl in allocation.levels if lvl not in keys.levels]
        if unknown:
            raise p.fail(
                "allocation.levels", f"unknown level(s) {unknown}; levels are {list(keys.levels)}"
            )
    spec = ProductSpec(
        rho=rho,
        delta=delta,
        seed=seed,
        source=str(path),
        blocks=None if blocks is None else relative_path(path, blocks),
        block_column=p.get(hier, "hierarchy", "block_column", str),
        repetitions=repetitions,
        allocation=allocation,
    )
    return p, doc, spec


@dataclass(frozen=True)
class OutputSpec:
    """The ``[output]`` table.

    Attributes
    ----------
    dir : pathlib.Path or None
        Output directory (as written: relative to the working directory of the run). None:
        the command line decides (``--out``).
    """

    dir: Path | None = None


@dataclass(frozen=True)
class RunSpec:
    """A validated run specification (docs/design.md § Specs and runs).

    Attributes
    ----------
    source : str
        Where the spec came from (file name, or ``<name>`` given to :func:`parse_spec`).
    data : DataSpec
    hierarchy : HierarchySpec
    privacy : PrivacySpec
    queries : dict of level → tuple of str
        The queries measured at each level (``"total"``, ``"detailed"`` or a marginal), in
        level order; levels without queries are absent.
    invariants : dict of level → tuple of str
        The queries released exactly at each level, in level order.
    marginals : dict of name → MarginalSpec
    mechanism : MechanismSpec
    estimators : EstimatorSpec
    run : RunOptions
    output : OutputSpec
    acknowledge_exact_release : bool
        ``[invariants] acknowledge_exact_release``: the invariants may determine every
        measured value (releasing it exactly, with no privacy protection; the privacy
        statement then says so). Refused otherwise
        (:func:`~censusdp.mechanisms.queries.guard_exact_release`).

    Notes
    -----
    Instances are immutable by convention; the dict fields must not be mutated.
    """

    source: str
    data: DataSpec
    hierarchy: HierarchySpec
    privacy: PrivacySpec
    queries: dict[str, tuple[str, ...]]
    invariants: dict[str, tuple[str, ...]]
    marginals: dict[str, MarginalSpec]
    mechanism: MechanismSpec
    estimators: EstimatorSpec = field(default_factory=EstimatorSpec)
    run: RunOptions = field(default_factory=RunOptions)
    output: OutputSpec = field(default_factory=OutputSpec)
    acknowledge_exact_release: bool = False

    @property
    def levels(self) -> tuple[str, ...]:
        """Level names, top to bottom."""
        return self.hierarchy.levels

    def budget(self) -> Budget:
        """The privacy budget and its split."""
        return self.privacy.budget()

    def allocation(self) -> dict[tuple[str, str], float]:
        """ε or ρ of every measured (level, query)."""
        return self.budget().allocation()

    def statement(self, geometry: str = "euclidean") -> PrivacyStatement:
        """The privacy statement of a release made under this spec (before estimation
        adds its notes, e.g. a data-dependent step)."""
        return statement_for(
            self.privacy.accounting,
            self.privacy.total,
            self.privacy.delta,
            [f"{lvl}: {q}" for lvl, qs in self.invariants.items() for q in qs],
            self.mechanism.noise,
            geometry,
        )

    def to_dict(self, redact_seed: bool = True) -> dict[str, Any]:
        """The spec as a TOML-shaped dict (for manifests), with every default filled in.

        Keys whose value is None are omitted; paths become strings. With ``redact_seed``
        (the default) a given seed is **replaced** by the string ``"<redacted>"`` (so a
        manifest still shows that the run was seeded, i.e. not a real release) and an
        absent seed stays absent. With ``redact_seed=False`` the dict parses back into an
        equal spec with :func:`parse_spec` (paths as resolved); never write that form out.
        """
        d = self.data
        privacy: dict[str, Any] = {
            "accounting": self.privacy.accounting,
            self.privacy.unit: self.privacy.total,
            "delta": self.privacy.delta,
            "level_shares": dict(self.privacy.level_shares),
            "query_shares": {k: dict(v) for k, v in self.privacy.query_shares.items()},
        }
        seed: Any = self.run.seed
        if redact_seed and seed is not None:
            seed = REDACTED
        out = {
            "data": {
                "source": d.source,
                "path": None if d.path is None else str(d.path),
                "cells": list(d.cells),
                "truth": d.truth,
                "version_column": d.version_column,
                "encoding": d.encoding,
            },
            "hierarchy": {
                "levels": list(self.hierarchy.levels),
                "codes": {k: str(v) for k, v in self.hierarchy.codes.items()},
            },
            "privacy": privacy,
            "queries": {k: list(v) for k, v in self.queries.items()},
            "invariants": {
                **{k: list(v) for k, v in self.invariants.items()},
                **({"acknowledge_exact_release": True} if self.acknowledge_exact_release else {}),
            },
            "marginals": {
                name: {
                    "groups": {g: p if isinstance(p, str) else list(p) for g, p in m.groups.items()}
                }
                for name, m in self.marginals.items()
            },
            "mechanism": {
                "noise": self.mechanism.noise,
                "allow_floating_point": self.mechanism.allow_floating_point or None,
            },
            "estimators": {
                "run": list(self.estimators.run),
                "integer": self.estimators.integer,
                "mcmc": {
                    "tv_bound": self.estimators.mcmc.tv_bound,
                    "max_iterations": self.estimators.mcmc.max_iterations,
                    "chains": self.estimators.mcmc.chains,
                },
            },
            "run": {
                "repetitions": self.run.repetitions,
                "seed": seed,
                "scheduler": self.run.scheduler,
                "partitions": self.run.partitions,
                "address": self.run.address,
                **{
                    k: None if v is None else str(v)
                    for k, v in self.run.network().items()
                    if k.startswith("tls_")
                },
                "allow_insecure_network": self.run.allow_insecure_network or None,
            },
            "output": {"dir": None if self.output.dir is None else str(self.output.dir)},
        }
        return _drop_none(out)


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    return obj


# --------------------------------------------------------------------------------------------
# Reading


class RunSpecParser(SpecParser):
    """The run spec's sections, walked by :class:`~censusdp.config.SpecParser`'s checks."""

    def level_key(self, key: str, path: str, levels: tuple[str, ...]) -> None:
        if key not in levels:
            raise self.unknown(key, path, levels, "level", f"hierarchy.levels is {list(levels)}")

    def spec(self, doc: Mapping[str, Any]) -> RunSpec:
        if not isinstance(doc, Mapping):
            raise self.fail("", "a spec must be a table of sections")
        self.keys(
            doc,
            "",
            (
                "data",
                "hierarchy",
                "privacy",
                "queries",
                "marginals",
                "invariants",
                "mechanism",
                "estimators",
                "run",
                "output",
            ),
        )
        data = self.data(self.table(doc, "data", required=True))
        hierarchy = self.hierarchy(self.table(doc, "hierarchy", required=True), data)
        levels = hierarchy.levels
        marginals = self.marginals(self.table(doc, "marginals", required=False))
        known = BUILTIN_QUERIES + tuple(marginals)
        queries = self.per_level(
            self.table(doc, "queries", required=True), "queries", levels, known
        )
        if not queries:
            raise self.fail("queries", "no level has a query; measure at least one")
        inv_table = dict(self.table(doc, "invariants", required=False))
        acknowledge = inv_table.pop("acknowledge_exact_release", False)
        if not isinstance(acknowledge, bool):
            raise self.fail(
                "invariants.acknowledge_exact_release",
                f"expected true or false, got {kind_of(acknowledge)}",
            )
        invariants = self.per_level(inv_table, "invariants", levels, known)
        mechanism = self.mechanism(self.table(doc, "mechanism", required=True))
        privacy = self.privacy(self.table(doc, "privacy", required=True), levels, queries)
        estimators = self.estimators(self.table(doc, "estimators", required=False))
        return RunSpec(
            source=self.source,
            data=data,
            hierarchy=hierarchy,
            privacy=privacy,
            queries=queries,
            invariants=invariants,
            marginals=marginals,
            mechanism=mechanism,
            acknowledge_exact_release=acknowledge,
            estimators=estimators,
            run=self.run(self.table(doc, "run", required=False)),
            output=self.output(self.table(doc, "output", required=False)),
        )

    def data(self, t: Mapping[str, Any]) -> DataSpec:
        p = "data"
        self.keys(t, p, ("source", "path", "cells", "truth", "version_column", "encoding"))
        source = self.get(t, p, "source", str, required=True)
        if not source:
            raise self.fail("data.source", "must not be empty")
        # a file source may leave the path to the command line (--data, privatize FILE);
        # the pipeline refuses to run when neither gives one
        path = self.get(t, p, "path", str)
        if path is not None:
            if not path:
                raise self.fail("data.path", "must not be empty")
            path = Path(path)
            if self.base_dir is not None and not path.is_absolute():
                path = self.base_dir / path
        cells = self.get(t, p, "cells", list, default=[])
        cells = self.str_list(cells, "data.cells")
        out = {k: self.get(t, p, k, str) for k in ("truth", "version_column", "encoding")}
        for k, v in out.items():
            if v is not None and not v:
                raise self.fail(f"data.{k}", "must not be empty")
        if out["encoding"] is not None:
            try:
                codecs.lookup(out["encoding"])
            except LookupError:
                raise self.fail("data.encoding", f"unknown encoding {out['encoding']!r}") from None
        return DataSpec(source=source, path=path, cells=cells, **out)

    def hierarchy(self, t: Mapping[str, Any], data: DataSpec) -> HierarchySpec:
        p = "hierarchy"
        self.keys(t, p, ("levels", "codes"))
        levels = self.str_list(self.get(t, p, "levels", list, required=True), "hierarchy.levels")
        if not levels:
            raise self.fail("hierarchy.levels", "needs at least one level")
        raw = self.get(t, p, "codes", dict, default={})
        codes: dict[str, CodeSpec] = {}
        for level in levels:
            if level not in raw:
                continue
            dotted = f"hierarchy.codes.{level}"
            text = raw[level]
            if isinstance(text, list | dict):
                codes[level] = self.joined_code(text, dotted)
                continue
            if not isinstance(text, str) or not text:
                raise self.fail(
                    dotted,
                    "expected a string 'column' or 'column:prefix', a list of columns to "
                    f"join, or {{ columns = [...], widths = [...] }}, got {kind_of(text)}",
                )
            column, sep, prefix = text.rpartition(":")
            if not sep:
                codes[level] = CodeSpec(text)
            elif column and prefix.isdigit() and int(prefix) > 0:
                codes[level] = CodeSpec(column, int(prefix))
            else:
                raise self.fail(
                    dotted, f"{text!r} is not 'column' or 'column:prefix' with a positive prefix"
                )
        for key in raw:
            self.level_key(key, "hierarchy.codes", levels)
        return HierarchySpec(levels=levels, codes=codes)

    def joined_code(self, value: list | dict, dotted: str) -> CodeSpec:
        """``["state_fips", "county_fips"]`` or ``{ columns = [...], widths = [2, 3] }``."""
        widths: tuple[int, ...] | None = None
        if isinstance(value, dict):
            self.keys(value, dotted, ("columns", "widths"))
            raw = self.get(value, dotted, "columns", list, required=True)
            if "widths" in value:
                w = self.get(value, dotted, "widths", list)
                if len(w) != len(raw) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in w
                ):
                    raise self.fail(
                        f"{dotted}.widths",
                        f"give one positive integer width per column ({len(raw)}), got {w!r}",
                    )
                widths = tuple(w)
        else:
            raw = value
        columns = self.str_list(raw, f"{dotted}.columns" if isinstance(value, dict) else dotted)
        if not columns or any(not c for c in columns):
            raise self.fail(dotted, "list the (non-empty) column names whose codes are joined")
        if len(set(columns)) != len(columns):
            raise self.fail(dotted, f"a column is listed twice in {list(columns)}")
        return CodeSpec("+".join(columns), None, columns, widths)

    def marginals(self, t: Mapping[str, Any]) -> dict[str, MarginalSpec]:
        out: dict[str, MarginalSpec] = {}
        for name, body in t.items():
            path = f"marginals.{name}"
            if name in BUILTIN_QUERIES:
                raise self.fail(path, f"{name!r} is a built-in query; choose another name")
            if not isinstance(body, Mapping):
                raise self.fail(path, f"expected a table, got {kind_of(body)}")
            self.keys(body, path, ("groups",))
            groups = self.get(body, path, "groups", dict, required=True)
            if not groups:
                raise self.fail(f"{path}.groups", "needs at least one group")
            parsed: dict[str, str | tuple[str, ...]] = {}
            for label, pat in groups.items():
                dotted = f"{path}.groups.{label}"
                if isinstance(pat, str) and pat:
                    parsed[label] = pat
                elif isinstance(pat, list):
                    cells = self.str_list(pat, dotted)
                    if not cells:
                        raise self.fail(dotted, "needs at least one cell")
                    parsed[label] = cells
                else:
                    raise self.fail(
                        dotted,
                        f"expected a glob pattern or an array of cell names, got {kind_of(pat)}",
                    )
            out[name] = MarginalSpec(name, parsed)
        return out

    def per_level(
        self,
        t: Mapping[str, Any],
        path: str,
        levels: tuple[str, ...],
        known: tuple[str, ...],
    ) -> dict[str, tuple[str, ...]]:
        for key in t:
            self.level_key(key, path, levels)
        out: dict[str, tuple[str, ...]] = {}
        for level in levels:
            if level not in t:
                continue
            dotted = f"{path}.{level}"
            names = self.str_list(t[level], dotted, allow_str=True)
            for i, name in enumerate(names):
                if name not in known:
                    close = difflib.get_close_matches(name, known, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    raise self.fail(
                        f"{dotted}[{i}]",
                        f"unknown query {name!r}; {hint}queries are 'total', 'detailed' or a "
                        f"marginal defined under [marginals.NAME] (defined: {list(known)})",
                    )
            if names:
                out[level] = names
        return out

    def shares(
        self, t: Any, dotted: str, names: tuple[str, ...], what: str, remedy: str
    ) -> dict[str, float]:
        if not isinstance(t, Mapping):
            raise self.fail(dotted, f"expected a table of shares, got {kind_of(t)}")
        for key in t:
            if key not in names:
                raise self.unknown(key, dotted, names, what, f"shares go to {list(names)}")
        out: dict[str, float] = {}
        for key in names:
            if key not in t:
                raise self.fail(
                    dotted, f"no share for {what} {key!r}; give a share for each of {list(names)}"
                )
            share = self.get(t, dotted, key, float)
            if share <= 0:
                raise self.fail(
                    dotted_key(dotted, key),
                    f"share must be positive, got {share:g} ({remedy} instead of giving it "
                    "no budget)",
                )
            out[key] = share
        total = math.fsum(out.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise self.fail(
                dotted,
                f"shares sum to {total:.12g}; they must sum to 1 (tolerance {SHARE_TOLERANCE:g})",
            )
        return out

    def privacy(
        self,
        t: Mapping[str, Any],
        levels: tuple[str, ...],
        queries: dict[str, tuple[str, ...]],
    ) -> PrivacySpec:
        p = "privacy"
        self.keys(t, p, ("accounting", "epsilon", "rho", "delta", "level_shares", "query_shares"))
        accounting = self.choice(
            self.get(t, p, "accounting", str, required=True), "privacy.accounting", ("pure", "zcdp")
        )
        unit = ACCOUNTINGS[accounting]
        other = "rho" if unit == "epsilon" else "epsilon"
        if other in t:
            raise self.fail(
                f"privacy.{other}",
                f"{accounting!r} accounting takes a total '{unit}', not '{other}'",
            )
        total = self.get(t, p, unit, float, required=True)
        if total <= 0:
            raise self.fail(f"privacy.{unit}", f"must be positive, got {total:g}")
        delta = self.get(t, p, "delta", float)
        if delta is not None:
            if accounting != "zcdp":
                raise self.fail(
                    "privacy.delta", "pure accounting has no delta; remove it or use 'zcdp'"
                )
            if not 0 < delta < 1:
                raise self.fail(
                    "privacy.delta", f"must lie strictly between 0 and 1, got {delta:g}"
                )
        measured = tuple(queries)
        if "level_shares" in t:
            level_shares = self.shares(
                t["level_shares"],
                "privacy.level_shares",
                measured,
                "measured level",
                "remove the level's queries",
            )
        elif len(measured) == 1:
            level_shares = {measured[0]: 1.0}
        else:
            raise self.fail(
                "privacy.level_shares",
                f"missing; several levels have queries ({list(measured)}): give each a share",
            )
        raw_q = self.get(t, p, "query_shares", dict, default={})
        for key in raw_q:
            if key not in measured:
                raise self.unknown(
                    key,
                    "privacy.query_shares",
                    measured,
                    "measured level",
                    f"levels with queries: {list(measured)}",
                )
        query_shares: dict[str, dict[str, float]] = {}
        for level in measured:
            dotted = f"privacy.query_shares.{level}"
            if level in raw_q:
                query_shares[level] = self.shares(
                    raw_q[level], dotted, queries[level], "query", "remove the query"
                )
            elif len(queries[level]) == 1:
                query_shares[level] = {queries[level][0]: 1.0}
            else:
                raise self.fail(
                    dotted,
                    f"missing; level {level!r} has several queries ({list(queries[level])}): "
                    "give each a share",
                )
        return PrivacySpec(accounting, total, delta, level_shares, query_shares)

    def mechanism(self, t: Mapping[str, Any]) -> MechanismSpec:
        self.keys(t, "mechanism", ("noise", "allow_floating_point"))
        noise = self.get(t, "mechanism", "noise", str, required=True)
        if not noise:
            raise self.fail("mechanism.noise", "must not be empty")
        allow = self.get(t, "mechanism", "allow_floating_point", bool, default=False)
        return MechanismSpec(noise, allow)

    def estimators(self, t: Mapping[str, Any]) -> EstimatorSpec:
        p = "estimators"
        self.keys(t, p, ("run", "integer", "mcmc"))
        run = self.str_list(self.get(t, p, "run", list, default=["gls"]), "estimators.run")
        if not run:
            raise self.fail("estimators.run", "needs at least one estimator")
        integer = self.choice(
            self.get(t, p, "integer", str, default="round"), "estimators.integer", INTEGER_MODES
        )
        m = self.get(t, p, "mcmc", dict, default={})
        mp = "estimators.mcmc"
        self.keys(m, mp, ("tv_bound", "max_iterations", "chains"))
        tv = self.get(m, mp, "tv_bound", float, default=0.01)
        if not 0 < tv < 1:
            raise self.fail(f"{mp}.tv_bound", f"must lie strictly between 0 and 1, got {tv:g}")
        max_it = self.positive_int(m, mp, "max_iterations")
        chains = self.get(m, mp, "chains", int, default=4)
        if chains < 2:
            raise self.fail(
                f"{mp}.chains", f"must be at least 2 (R-hat compares chains), got {chains}"
            )
        return EstimatorSpec(run, integer, McmcSpec(tv, max_it, chains))

    def run(self, t: Mapping[str, Any]) -> RunOptions:
        p = "run"
        self.keys(t, p, ("repetitions", "seed", "scheduler", "partitions", "address", *_NETWORK))
        repetitions = self.positive_int(t, p, "repetitions", default=1)
        if repetitions > MAX_REPETITIONS:
            raise self.fail(
                "run.repetitions", f"at most {MAX_REPETITIONS} (each is a full release)"
            )
        seed = self.get(t, p, "seed", int)  # errors name the type, never the value
        if seed is not None and seed < 0:
            raise self.fail("run.seed", "must be a non-negative integer")
        scheduler = self.get(t, p, "scheduler", str, default="sync")
        if not scheduler:
            raise self.fail("run.scheduler", "must not be empty")
        partitions = self.positive_int(t, p, "partitions")
        if partitions is not None and partitions > MAX_PARTITIONS:
            raise self.fail("run.partitions", f"at most {MAX_PARTITIONS}")
        address = self.get(t, p, "address", str)
        if address is not None:
            if not address.startswith(("tcp://", "tls://")) or len(address) <= len("tcp://"):
                raise self.fail("run.address", "expected 'tcp://host:port' (or 'tls://...')")
        network = self.network(t)
        return RunOptions(repetitions, seed, scheduler, partitions, address, **network)

    def network(self, t: Mapping[str, Any]) -> dict[str, Any]:
        """``[run]``'s TLS files (all or none, resolved against the spec's directory) and
        ``allow_insecure_network``."""
        files = {k: self.get(t, "run", k, str) for k in _NETWORK[:3]}
        given = [k for k, v in files.items() if v is not None]
        if given and len(given) < 3:
            missing = [k for k in files if files[k] is None]
            raise self.fail(
                f"run.{missing[0]}",
                f"missing; TLS needs all of {list(files)} (the cluster's CA, this client's "
                "certificate and key)",
            )
        out: dict[str, Any] = {}
        for k, v in files.items():
            if v is not None:
                if not v:
                    raise self.fail(f"run.{k}", "must not be empty")
                path = Path(v)
                if self.base_dir is not None and not path.is_absolute():
                    path = self.base_dir / path
                out[k] = path
        out["allow_insecure_network"] = self.get(
            t, "run", "allow_insecure_network", bool, default=False
        )
        return out

    def output(self, t: Mapping[str, Any]) -> OutputSpec:
        self.keys(t, "output", ("dir",))
        d = self.get(t, "output", "dir", str)
        if d is not None and not d:
            raise self.fail("output.dir", "must not be empty")
        return OutputSpec(None if d is None else Path(d))
