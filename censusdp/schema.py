"""Histogram schemas: a person histogram as a product of named attributes.

A :class:`Schema` is the cross-classification behind census tables: attributes ``a = 1..k``
with labelled domains of sizes ``d_a``; a node's counts form a tensor of shape
``(d_1, …, d_k)`` (C order, so the flat cell index runs fastest over the last attribute).
Every attribute carries *recodes* — partitions of its domain, each defined over a finer one
(the detailed values or another recode), so that they nest, with "all" (the attribute
summed out) the coarsest — and *slices*, subsets of one recode's groups such as "18 years
and over" for the tables restricted to adults. Recodes, slices and attribute names are the
elements a product query picks one of per attribute (:meth:`Schema.resolve`; the query
matrices themselves live in :mod:`censusdp.mechanisms.product_query`).

Schemas are data: TOML files shipped in ``censusdp/schemas/`` (``pl94``, ``ppdd``,
``sex_age5``; :func:`available_schemas`) or any file in the same format. The OMB race
combinations of the 2010/2020 censuses (6 races, 63 combinations) are generated, not typed.
The one-attribute case ``Schema.flat(cells)`` is the flat cell list of a classic spec.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 — the histogram hhgq × votingage ×
    hispanic × cenrace and its marginal queries (Section 7; production strategy in the
    Bureau's ``DAS_2020_Redistricting_Production_Code``).
Kifer, D. et al. (2022). Bayesian and Frequentist Semantics for Common Variations of
    Differential Privacy: Applications to the 2020 Census (the histogram/query model).
Office of Management and Budget (1997). Revisions to the Standards for the Classification
    of Federal Data on Race and Ethnicity — the five races plus Some Other Race whose 63
    combinations form CENRACE.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.config import SpecParser
from censusdp.errors import SpecError

__all__ = [
    "Allocation",
    "Recode",
    "Attribute",
    "Schema",
    "available_schemas",
    "omb_race_combinations",
    "RESERVED_NAMES",
]

RESERVED_NAMES = ("total", "detailed", "all")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_COUNT_WORDS = ("One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine")


def omb_race_combinations(races: Sequence[str]) -> list[tuple[int, ...]]:
    """Every non-empty combination of ``races`` in the Census order.

    By number of races, then lexicographically in the order of ``races``: for the six
    OMB races (White, Black, AIAN, Asian, NHPI, Some Other Race) this is CENRACE 01–63 of
    the 2010 and 2020 censuses (6 single races, 15 pairs, 20 triples, 15, 6, 1).

    Returns
    -------
    list of tuple of int
        Each combination as increasing indices into ``races``.
    """
    n = len(races)
    return [c for m in range(1, n + 1) for c in itertools.combinations(range(n), m)]


@dataclass(frozen=True, eq=False)
class Recode:
    """One element of an attribute's lattice of groupings, as a 0/1 matrix on its domain.

    Attributes
    ----------
    name : str
        ``attribute`` itself for the detailed values, ``"all"`` for the attribute summed
        out, else the recode's or slice's name.
    attribute : str
    kind : {"detailed", "recode", "slice", "all"}
    labels : tuple of str
        One label per row (group).
    matrix : numpy.ndarray
        int64 (len(labels), d): row g is the indicator of group g's detailed values.
        Rows of a recode partition the domain; rows of a slice are disjoint but need not
        cover it.
    parent : str or None
        The finer element a recode or slice is defined over.
    """

    name: str
    attribute: str
    kind: str
    labels: tuple[str, ...]
    matrix: np.ndarray
    parent: str | None = None

    def __post_init__(self) -> None:
        self.matrix.setflags(write=False)  # shipped schemas are shared objects

    @property
    def n_rows(self) -> int:
        return len(self.labels)

    @property
    def is_detailed(self) -> bool:
        return self.kind == "detailed"

    @property
    def is_all(self) -> bool:
        return self.kind == "all"

    def row(self, label: str) -> int:
        """The row index of ``label``.

        Raises
        ------
        SpecError
            When the element has no such row.
        """
        try:
            return self.labels.index(label)
        except ValueError:
            raise SpecError(
                f"attribute {self.attribute!r}, {self.kind} {self.name!r}: no row {label!r}; "
                f"rows are {list(self.labels)}"
            ) from None


@dataclass(frozen=True, eq=False)
class Attribute:
    """A named attribute: its labelled domain and its recodes and slices.

    Attributes
    ----------
    name : str
    labels : tuple of str
        The detailed values, in axis order.
    elements : dict of str → Recode
        Every element by name: the attribute itself (detailed), its recodes and slices,
        and ``"all"``.
    """

    name: str
    labels: tuple[str, ...]
    elements: dict[str, Recode] = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.labels)

    @property
    def detailed(self) -> Recode:
        return self.elements[self.name]

    @property
    def all(self) -> Recode:
        return self.elements["all"]

    @property
    def recodes(self) -> dict[str, Recode]:
        return {k: v for k, v in self.elements.items() if v.kind == "recode"}

    @property
    def slices(self) -> dict[str, Recode]:
        return {k: v for k, v in self.elements.items() if v.kind == "slice"}


def _fraction(value: Any, where: str) -> Fraction:
    """A share or budget written as an integer or a ``"p/q"`` string (exact), ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SpecError(f'{where}: write the value as an integer or a fraction string "p/q"')
    try:
        f = Fraction(value)
    except (ValueError, ZeroDivisionError):
        raise SpecError(f'{where}: {value!r} is not a fraction; write it as "p/q"') from None
    if f < 0:
        raise SpecError(f"{where}: {value!r} is negative; shares and budgets are ≥ 0")
    return f


@dataclass(frozen=True, eq=False)
class Allocation:
    """A budget split over levels and over a schema's strategy queries, in exact fractions.

    Query ``q`` at level ``ℓ`` gets ``ρ_{ℓ,q} = rho · levels[ℓ] · queries[ℓ][q]`` (zCDP);
    a query share of 0 means the query is not measured at that level. Level shares and
    each level's query shares sum to 1.

    Attributes
    ----------
    rho : Fraction
        Total per-person ρ.
    levels : dict of str → Fraction
        Level name → its share of ``rho`` (root first).
    queries : dict of str → tuple of Fraction
        Level name → one share per strategy query, in the strategy's order.

    References
    ----------
    Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown
        Algorithm — per-level and per-query shares of the production run.
    """

    rho: Fraction
    levels: dict[str, Fraction]
    queries: dict[str, tuple[Fraction, ...]]

    @classmethod
    def from_dict(cls, spec: Any, n_queries: int, source: str = "<dict>") -> Allocation:
        """Parse and check an ``[allocation]`` table (``rho``, ``[allocation.levels]``,
        ``[allocation.queries]``); ``n_queries`` is the strategy's length.

        Raises
        ------
        SpecError
            Naming ``source`` and the key at fault.
        """
        where = f"{source}: allocation"
        if not isinstance(spec, Mapping):
            raise SpecError(f"{where}: must be a table with rho, levels and queries")
        SpecParser(source, None).keys(spec, "allocation", ("rho", "levels", "queries"))
        for key in ("rho", "levels", "queries"):
            if key not in spec:
                raise SpecError(f"{where}: missing {key!r}")
        rho = _fraction(spec["rho"], f"{where}.rho")
        if not isinstance(spec["levels"], Mapping) or not isinstance(spec["queries"], Mapping):
            raise SpecError(f"{where}: levels and queries must be tables keyed by level name")
        levels = {str(k): _fraction(v, f"{where}.levels.{k}") for k, v in spec["levels"].items()}
        if levels and sum(levels.values()) != 1:
            raise SpecError(
                f"{where}.levels: the level shares sum to {sum(levels.values())}, not 1"
            )
        if list(spec["queries"]) != list(levels):
            raise SpecError(
                f"{where}.queries: levels {list(spec['queries'])} differ from "
                f"allocation.levels {list(levels)}; give one list of query shares per level, "
                "in the same order"
            )
        queries = {}
        for lvl, shares in spec["queries"].items():
            at = f"{where}.queries.{lvl}"
            if not isinstance(shares, list) or len(shares) != n_queries:
                raise SpecError(
                    f"{at}: give one share per strategy query ({n_queries}), 0 for a query "
                    "not measured at this level"
                )
            fr = tuple(_fraction(v, f"{at}[{i}]") for i, v in enumerate(shares))
            if sum(fr) != 1:
                raise SpecError(f"{at}: the query shares sum to {sum(fr)}, not 1")
            queries[str(lvl)] = fr
        return cls(rho=rho, levels=levels, queries=queries)

    def query_rhos(self, strategy: Sequence[str]) -> list[tuple[str, str, Fraction]]:
        """(level, query text, ρ) of every measured (level, query), root first, in the
        strategy's order; queries with a zero share are left out."""
        return [
            (lvl, text, self.rho * self.levels[lvl] * share)
            for lvl, shares in self.queries.items()
            for text, share in zip(strategy, shares, strict=True)
            if share != 0
        ]


@dataclass(frozen=True, eq=False)
class Schema:
    """A histogram schema: the product of its attributes' domains.

    Attributes
    ----------
    name : str
    attributes : tuple of Attribute
        In axis order.
    description : str
    source : str
        Where the schema came from (a file path, ``"<dict>"`` or ``"<flat>"``), for messages.
    separator : str
        Joins attribute labels into flat cell names (:attr:`cells`).
    strategy : tuple of str
        The schema's reference strategy, query texts measured at every geounit (``pl94``:
        the 11 queries of the 2020 production run); empty when it has none.
    allocation : Allocation or None
        The reference split of a budget over levels and the strategy's queries (``pl94``:
        the 2020 production allocation); None when the schema has none.
    """

    name: str
    attributes: tuple[Attribute, ...]
    description: str = ""
    source: str = "<dict>"
    separator: str = "_"
    strategy: tuple[str, ...] = ()
    allocation: Allocation | None = None

    # -- shape ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.attributes)

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    @property
    def cells(self) -> tuple[str, ...]:
        """Flat cell names, C order (the last attribute varies fastest)."""
        return tuple(
            self.separator.join(p) for p in itertools.product(*(a.labels for a in self.attributes))
        )

    def attribute(self, name: str) -> Attribute:
        for a in self.attributes:
            if a.name == name:
                return a
        raise SpecError(
            f"schema {self.name!r} ({self.source}): no attribute {name!r}; "
            f"attributes are {list(self.names)}"
        )

    def axis(self, name: str) -> int:
        return self.names.index(self.attribute(name).name)

    # -- element lookup -------------------------------------------------------------------
    def element(self, name: str) -> tuple[int, Recode]:
        """The axis and element called ``name`` (an attribute, recode or slice name)."""
        for i, a in enumerate(self.attributes):
            e = a.elements.get(name)
            if e is not None and e.kind != "all":
                return i, e
        raise SpecError(
            f"schema {self.name!r} ({self.source}): unknown query element {name!r}; "
            f"elements are {self.element_names()} (or 'total', 'detailed')"
        )

    def element_names(self) -> list[str]:
        return [n for a in self.attributes for n, e in a.elements.items() if e.kind != "all"]

    def resolve(self, text: str) -> tuple[Recode, ...]:
        """Parse a product query ``"votingage * hispanic * cenrace"`` into one element per axis.

        ``"total"`` sums every attribute out, ``"detailed"`` keeps every one; otherwise the
        named elements (at most one per attribute) are kept and every other attribute is
        summed out.

        Raises
        ------
        SpecError
            For an empty term, an unknown element or two elements of one attribute.
        """
        terms = [t.strip() for t in str(text).split("*")]
        if terms == ["total"]:
            return tuple(a.all for a in self.attributes)
        if terms == ["detailed"]:
            return tuple(a.detailed for a in self.attributes)
        chosen: dict[int, Recode] = {}
        for t in terms:
            if not t or t in ("total", "detailed"):
                raise SpecError(
                    f"schema {self.name!r}: query {text!r}: term {t!r} is not an element; write "
                    "'total', 'detailed' or elements joined by '*' such as 'votingage * cenrace'"
                )
            ax, e = self.element(t)
            if ax in chosen:
                raise SpecError(
                    f"schema {self.name!r}: query {text!r} names two elements of attribute "
                    f"{self.attributes[ax].name!r} ({chosen[ax].name!r} and {t!r}); name one"
                )
            chosen[ax] = e
        return tuple(chosen.get(i, a.all) for i, a in enumerate(self.attributes))

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def flat(cls, cells: Sequence[str], name: str = "flat", attribute: str = "cell") -> Schema:
        """The one-attribute schema of a flat cell list (no recodes)."""
        spec = {"name": name, "attributes": [{"name": attribute, "labels": list(cells)}]}
        return cls.from_dict(spec, source="<flat>")

    @classmethod
    def load(cls, name_or_path: str | Path) -> Schema:
        """A shipped schema by name (``"pl94"``) or a schema TOML file by path.

        A shipped schema is built once and shared (its matrices are read-only), so queries
        parsed from two loads combine.

        Raises
        ------
        SpecError
            When the name is neither shipped nor an existing file, or the file is invalid.
        """
        p = Path(name_or_path)
        shipped = resources.files("censusdp") / "schemas" / f"{name_or_path}.toml"
        if p.suffix != ".toml" and shipped.is_file():
            if str(name_or_path) not in _SHIPPED:  # one object per shipped schema
                text = shipped.read_text(encoding="utf-8")
                spec = _parse_toml(text, f"censusdp/schemas/{p.name}.toml")
                _SHIPPED[str(name_or_path)] = cls.from_dict(spec, f"censusdp/schemas/{p.name}.toml")
            return _SHIPPED[str(name_or_path)]
        if p.is_file():
            text, source = p.read_text(encoding="utf-8"), str(p)
        else:
            raise SpecError(
                f"schema {str(name_or_path)!r}: not a shipped schema ({available_schemas()}) "
                "and no such file; pass a shipped name or the path of a schema TOML"
            )
        return cls.from_dict(_parse_toml(text, source), source=source)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], source: str = "<dict>") -> Schema:
        """Build and validate a schema from its TOML form (see ``censusdp/schemas/pl94.toml``).

        Raises
        ------
        SpecError
            Naming ``source``, the attribute and the recode or slice at fault.
        """
        known = ("name", "description", "separator", "attributes", "references", "strategy")
        SpecParser(source, None).keys(spec, "", (*known, "allocation"))
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{source}: the schema needs a 'name' string")
        attrs = spec.get("attributes")
        if not isinstance(attrs, list) or not attrs:
            raise SpecError(f"{source}: the schema needs at least one [[attributes]] table")
        built = [_build_attribute(a, i, source) for i, a in enumerate(attrs)]
        seen: dict[str, str] = {}
        for a in built:
            for n, e in a.elements.items():
                if e.kind == "all":
                    continue
                if n in seen:
                    raise SpecError(
                        f"{source}: attribute {a.name!r}: name {n!r} is already used by "
                        f"attribute {seen[n]!r}; element names are unique across a schema "
                        "(queries name them without their attribute)"
                    )
                seen[n] = a.name
        strategy = spec.get("strategy", [])
        if not isinstance(strategy, list) or not all(isinstance(t, str) for t in strategy):
            raise SpecError(f"{source}: 'strategy' must be a list of query texts")
        schema = cls(
            name=name,
            attributes=tuple(built),
            description=str(spec.get("description", "")),
            source=source,
            separator=str(spec.get("separator", "_")),
            strategy=tuple(strategy),
            allocation=(
                None
                if "allocation" not in spec
                else Allocation.from_dict(spec["allocation"], len(strategy), source)
            ),
        )
        for text in strategy:
            schema.resolve(text)  # SpecError naming the unknown element
        return schema


_SHIPPED: dict[str, Schema] = {}


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{source}: not valid TOML ({err})") from None


def available_schemas() -> list[str]:
    """Names of the schemas shipped in ``censusdp/schemas/``."""
    d = resources.files("censusdp") / "schemas"
    return sorted(p.name[: -len(".toml")] for p in d.iterdir() if p.name.endswith(".toml"))


# ---------------------------------------------------------------------------------------------
# building and validating attributes


def _number_of_races(combos: list[tuple[int, ...]], n: int) -> tuple[list[str], np.ndarray]:
    labels = [f"{_COUNT_WORDS[m - 1]} race" + ("s" if m > 1 else "") for m in range(1, n + 1)]
    return labels, np.array([len(c) - 1 for c in combos], dtype=np.int64)


def _alone_or_two_or_more(
    combos: list[tuple[int, ...]], races: Sequence[str]
) -> tuple[list[str], np.ndarray]:
    labels = [f"{r} alone" for r in races] + ["Two or More Races"]
    return labels, np.array([c[0] if len(c) == 1 else len(races) for c in combos], dtype=np.int64)


_RULES: dict[str, Callable[[list[tuple[int, ...]], Sequence[str]], tuple[list[str], np.ndarray]]]
_RULES = {
    "number_of_races": lambda combos, races: _number_of_races(combos, len(races)),
    "alone_or_two_or_more": _alone_or_two_or_more,
}


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"{where}: name {name!r} must be an identifier (letters, digits, _)")
    if name in RESERVED_NAMES:
        raise SpecError(f"{where}: {name!r} is reserved (total, detailed, all); rename it")
    return name


def _labels(values: Any, where: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise SpecError(f"{where}: 'labels' must be a non-empty list of strings")
    dup = sorted({v for v in values if values.count(v) > 1})
    if dup:
        raise SpecError(f"{where}: duplicate labels {dup}")
    return tuple(values)


def _build_attribute(spec: Any, index: int, source: str) -> Attribute:
    where = f"{source}: attributes[{index}]"
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: each [[attributes]] entry must be a table")
    name = _check_name(spec.get("name"), where)
    where = f"{source}: attribute {name!r}"
    known = ("name", "labels", "generate", "races", "recodes", "slices", "description")
    SpecParser(source, None).keys(spec, f"attributes[{index}]", known)
    combos: list[tuple[int, ...]] | None = None
    races: list[str] = []
    if "generate" in spec:
        if spec["generate"] != "omb_race_combinations" or "labels" in spec:
            raise SpecError(
                f"{where}: 'generate' supports only \"omb_race_combinations\" (with 'races', "
                "instead of 'labels')"
            )
        races = list(_labels(spec.get("races"), f"{where} (races)"))
        combos = omb_race_combinations(races)
        labels = tuple(
            f"{races[c[0]]} alone" if len(c) == 1 else "; ".join(races[i] for i in c)
            for c in combos
        )
    else:
        labels = _labels(spec.get("labels"), where)
    d = len(labels)
    elements: dict[str, Recode] = {
        name: Recode(name, name, "detailed", labels, np.eye(d, dtype=np.int64))
    }
    for j, r in enumerate(_table_list(spec.get("recodes", []), f"{where}: recodes")):
        rname = _check_name(
            r.get("name") if isinstance(r, Mapping) else None, f"{where}: recodes[{j}]"
        )
        rwhere = f"{where}, recode {rname!r}"
        if rname in elements:
            raise SpecError(f"{rwhere}: the name is used twice in this attribute")
        elements[rname] = _build_recode(r, rname, name, elements, combos, races, rwhere)
    for j, s in enumerate(_table_list(spec.get("slices", []), f"{where}: slices")):
        sname = _check_name(
            s.get("name") if isinstance(s, Mapping) else None, f"{where}: slices[{j}]"
        )
        swhere = f"{where}, slice {sname!r}"
        if sname in elements:
            raise SpecError(f"{swhere}: the name is used twice in this attribute")
        elements[sname] = _build_slice(s, sname, name, elements, swhere)
    elements["all"] = Recode("all", name, "all", ("total",), np.ones((1, d), dtype=np.int64))
    return Attribute(name, labels, elements)


def _table_list(value: Any, where: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise SpecError(f"{where}: must be an array of tables ([[...]])")
    return value


def _parent(spec: Mapping[str, Any], attr: str, elements: dict[str, Recode], where: str) -> Recode:
    parent = spec.get("of", attr)
    p = elements.get(parent)
    if p is None or p.kind == "slice":
        choices = [n for n, e in elements.items() if e.kind != "slice"]
        raise SpecError(
            f"{where}: 'of' = {parent!r} is not the attribute or an earlier recode of it; "
            f"choose one of {choices}"
        )
    return p


def _build_recode(
    spec: Mapping[str, Any],
    name: str,
    attr: str,
    elements: dict[str, Recode],
    combos: list[tuple[int, ...]] | None,
    races: Sequence[str],
    where: str,
) -> Recode:
    SpecParser(where, None).keys(spec, "", ("name", "of", "groups", "rule", "description"))
    if ("groups" in spec) == ("rule" in spec):
        raise SpecError(f"{where}: give exactly one of 'groups' (label → members) or 'rule'")
    if "rule" in spec:
        rule = spec["rule"]
        if combos is None or rule not in _RULES or "of" in spec:
            raise SpecError(
                f"{where}: rule {rule!r} needs an attribute generated by omb_race_combinations "
                f"and no 'of'; rules are {sorted(_RULES)}"
            )
        labels, group_of = _RULES[rule](combos, races)
        matrix = (np.arange(len(labels))[:, None] == group_of[None, :]).astype(np.int64)
        return Recode(name, attr, "recode", tuple(labels), matrix, attr)
    parent = _parent(spec, attr, elements, where)
    groups = spec["groups"]
    if not isinstance(groups, Mapping) or not groups:
        raise SpecError(
            f"{where}: 'groups' must be a table: group label → list of {parent.name!r} rows"
        )
    rows = np.zeros((len(groups), parent.n_rows), dtype=np.int64)
    for g, (label, members) in enumerate(groups.items()):
        if not isinstance(members, list) or not members:
            raise SpecError(f"{where}, group {label!r}: members must be a non-empty list of labels")
        for m in members:
            if m not in parent.labels:
                raise SpecError(
                    f"{where}, group {label!r}: {m!r} is not a row of {parent.name!r}; rows are "
                    f"{list(parent.labels)}"
                )
            rows[g, parent.labels.index(m)] += 1
    counts = rows.sum(axis=0)
    if (counts > 1).any():
        twice = [parent.labels[i] for i in np.flatnonzero(counts > 1)]
        raise SpecError(f"{where}: {twice} are in two groups; a recode is a partition")
    if (counts == 0).any():
        missing = [parent.labels[i] for i in np.flatnonzero(counts == 0)]
        raise SpecError(
            f"{where}: {missing} are in no group; a recode partitions all of {parent.name!r} "
            "(use a slice for a subset)"
        )
    if len(groups) >= parent.n_rows:
        raise SpecError(
            f"{where}: {len(groups)} groups over the {parent.n_rows} rows of {parent.name!r} "
            "is not coarser; a recode merges some rows"
        )
    return Recode(name, attr, "recode", tuple(groups), rows @ parent.matrix, parent.name)


def _build_slice(
    spec: Mapping[str, Any], name: str, attr: str, elements: dict[str, Recode], where: str
) -> Recode:
    SpecParser(where, None).keys(spec, "", ("name", "of", "groups", "description"))
    parent = _parent(spec, attr, elements, where)
    groups = spec.get("groups")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, str) for g in groups):
        raise SpecError(f"{where}: 'groups' must be a non-empty list of {parent.name!r} rows")
    idx = []
    for g in groups:
        if g not in parent.labels:
            raise SpecError(
                f"{where}: {g!r} is not a row of {parent.name!r}; rows are {list(parent.labels)}"
            )
        if parent.labels.index(g) in idx:
            raise SpecError(f"{where}: {g!r} is listed twice")
        idx.append(parent.labels.index(g))
    if len(idx) == parent.n_rows:
        raise SpecError(
            f"{where}: the slice keeps every row of {parent.name!r}; use {parent.name!r} itself"
        )
    return Recode(name, attr, "slice", tuple(groups), parent.matrix[idx], parent.name)
