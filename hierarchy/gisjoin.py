"""NHGIS GISJOIN codes of every summary level: layouts, parsing into FIPS parts, and which
levels nest in the census hierarchy.

A GISJOIN is ``G`` followed by the level's FIPS (or Census) codes in a fixed layout. NHGIS
pads the state and county codes with one digit (``0`` for entities that exist today; a
non-zero digit marks historical states and counties), so a county is
``G`` + state (2) + ``0`` + county (3) + ``0``: ``G1700310`` is Cook County, Illinois. Levels
and their layouts:

======================  =======================================================  ======  =======  ============
level                   layout                                                   length  SUMLEV   column
======================  =======================================================  ======  =======  ============
state                   G + state(2) + 0                                         4       040      STATEA
county                  G + state(2) + 0 + county(3) + 0                         8       050      COUNTYA
cousub                  county + county subdivision(5)                           13      060      COUSUBA
tract                   county + tract(6)                                        14      140      TRACTA
block_group             county + tract(6) + block group(1)                       15      150      BLKGRPA
block                   county + tract(6) + block(4)                             18      100/101  BLOCKA
place                   G + state(2) + 0 + place(5)                              9       160      PLACEA
aianhh                  G + AIANNH area(4)                                       5       250      AIANHHA
sdelm, sdsec, sduni     G + state(2) + 0 + school district LEA code(5)           9       950-970  SDELMA, ...
sldu, sldl              G + state(2) + 0 + legislative district(3, letters too)  7       610/620  SLDUA, SLDLA
cd                      G + state(2) + 0 + congressional district(2)             6       500      CDA
======================  =======================================================  ======  =======  ============

A place is *nine* characters, one more than a county: ``G17014000`` is Chicago (Illinois
``17``, pad ``0``, place FIPS ``14000``), as in NHGIS's place files. SUMLEV is the Census
Bureau's summary level code, the first three digits of a ``GEO_ID`` (``1600000US1714000``,
``05000US17031``); the column is the NHGIS extract column holding the level's own code.

**Telling each row's level** (:func:`row_levels`). A file may hold rows of several levels
(counties *and* the places in them): a person is then counted in one row of each, and a
privacy statement must compose over the levels. Lengths alone tell most levels; they do not
tell a place from a school district (9 characters each) or an upper from a lower legislative
district (7). In order of authority: a declared level (one for the file, or a column holding
each row's level name or SUMLEV), then a ``GEO_ID``/``GEOID`` column with summary-level
prefixes, then the layout the GISJOIN fits, resolved where several fit by the NHGIS
identifier column that is filled for the row (``PLACEA`` for a place). A row whose level
cannot be told is refused (a DataError naming the row and how to declare the level), never
guessed. Rows of one level are disjoint areas; a level whose codes carry a state lies in
that state, so two levels can share a person only where they have rows in the same state
(AIAN areas cross states and may share a person with any level):
:meth:`RowLevels.person_groups`.

State, county, county subdivision, tract, block group and block are *on the spine*: each
nests in the one above it (a county subdivision in its county, as a tract does; a county
subdivision and a tract do not nest in each other). Places, American Indian / Alaska Native
/ Native Hawaiian areas, school districts and legislative and congressional districts are
*off the spine*: they cut across counties (or states), so they cannot be levels of the
hierarchy; they are released as sums of the blocks they contain, from a block → area
equivalency file.

References
----------
Manson, S., Schroeder, J., Van Riper, D., Knowles, K., Kugler, T., Roberts, F. and
    Ruggles, S. IPUMS National Historical Geographic Information System (NHGIS),
    Minneapolis, MN: IPUMS — "GISJOIN" identifiers (G + NHGIS state code + NHGIS county
    code + ...; the extra state/county digit distinguishes historical areas).
U.S. Census Bureau. Geographic Identifiers (GEOIDs): the FIPS and Census code widths of
    each summary level (state 2, county 3, county subdivision 5, tract 6, block group 1,
    block 4, place 5, AIANNH 4, school district LEA 5, state legislative district 3,
    congressional district 2).
U.S. Census Bureau (2011). 2010 Census Summary File 1 Technical Documentation, chapter 4
    "Summary Level Sequence Chart" (SUMLEV 040 state, 050 county, 060 county subdivision,
    140 tract, 150 block group, 101 block, 160 place, 250 AIANNH, 500 congressional
    district, 610/620 state legislative districts, 950/960/970 school districts); GEO_ID
    = SUMLEV + geographic component + ``US`` + GEOID on data.census.gov (``0500000US17031``).
IPUMS NHGIS user forum, "GISJOIN field for Tracts - understanding extra 0s" (the pad digit
    after the state and county codes); NHGIS time-series place files key Chicago as
    ``G17014000``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from censusdp.errors import DataError, SpecError

__all__ = [
    "DECLARE_LEVEL",
    "LAYOUTS",
    "GisjoinLayout",
    "RowLevels",
    "check_hierarchy_levels",
    "declared_layout",
    "hint",
    "identify",
    "layout",
    "parse",
    "row_levels",
    "spine_lengths",
]


@dataclass(frozen=True)
class Part:
    """One code in a GISJOIN: a named field of ``width`` characters, or the NHGIS pad."""

    name: str  # "state", "county", ... or "pad" (NHGIS's extra '0')
    width: int
    letters: bool = False  # codes may hold capital letters (legislative districts)
    label: str = ""  # what the code is, for messages (default: the name)

    @property
    def pattern(self) -> str:
        if self.name == "pad":
            return "0"
        return f"[0-9A-Z]{{{self.width}}}" if self.letters else rf"\d{{{self.width}}}"


_PAD = Part("pad", 1)


@dataclass(frozen=True)
class GisjoinLayout:
    """The GISJOIN layout of one NHGIS summary level.

    Attributes
    ----------
    level : str
        Canonical level name (``"county"``, ``"place"``, ...).
    title : str
        What the level is, for messages.
    parts : tuple of Part
        The codes after the leading ``G``, in order.
    on_spine : bool
        Whether the level nests in state → county → tract → block group → block.
    aliases : tuple of str
        Other names accepted for the level (NHGIS file names such as ``blck_grp``).
    identifier : str
        The NHGIS extract column (lower case) holding the level's own code (``placea`` for
        places): filled in a row of that level, empty in rows of other levels.
    summary_levels : tuple of str
        The Census Bureau's three-digit summary level codes of the level (``"160"`` for
        places), the prefix of a ``GEO_ID`` such as ``1600000US1714000``.
    """

    level: str
    title: str
    parts: tuple[Part, ...]
    on_spine: bool
    aliases: tuple[str, ...] = ()
    identifier: str = ""
    summary_levels: tuple[str, ...] = ()

    @property
    def length(self) -> int:
        return 1 + sum(p.width for p in self.parts)

    @property
    def pattern(self) -> str:
        return "^G" + "".join(p.pattern for p in self.parts) + "$"

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts if p.name != "pad")

    def describe(self) -> str:
        """``"9 characters: 'G' + 2-digit state + '0' + 5-digit place"``."""
        words = ["'G'"]
        for p in self.parts:
            if p.name == "pad":
                words.append("'0'")
            else:
                kind = "character" if p.letters else "digit"
                words.append(f"{p.width}-{kind} {p.label or p.name.replace('_', ' ')}")
        return f"{self.length} characters: " + " + ".join(words)


def _state(*rest: Part) -> tuple[Part, ...]:
    return (Part("state", 2, label="state FIPS"), _PAD, *rest)


def _county(*rest: Part) -> tuple[Part, ...]:
    return _state(Part("county", 3, label="county FIPS"), _PAD, *rest)


#: Every GISJOIN layout, on-spine levels first (top to bottom).
LAYOUTS: tuple[GisjoinLayout, ...] = (
    GisjoinLayout("state", "state", _state(), True, (), "statea", ("040",)),
    GisjoinLayout("county", "county", _county(), True, (), "countya", ("050",)),
    GisjoinLayout(
        "cousub",
        "county subdivision",
        _county(Part("cousub", 5, label="county subdivision FIPS")),
        True,
        ("cty_sub", "county_subdivision"),
        "cousuba",
        ("060",),
    ),
    GisjoinLayout("tract", "census tract", _county(Part("tract", 6)), True, (), "tracta", ("140",)),
    GisjoinLayout(
        "block_group",
        "block group",
        _county(Part("tract", 6), Part("block_group", 1)),
        True,
        ("blck_grp", "bg"),
        "blkgrpa",
        ("150",),
    ),
    GisjoinLayout(
        "block",
        "block",
        _county(Part("tract", 6), Part("block", 4)),
        True,
        (),
        "blocka",
        ("100", "101", "750"),
    ),
    GisjoinLayout(
        "place",
        "place",
        _state(Part("place", 5, label="place FIPS")),
        False,
        (),
        "placea",
        ("160",),
    ),
    GisjoinLayout(
        "aianhh",
        "American Indian area / Alaska Native area / Hawaiian home land",
        (Part("aianhh", 4, label="AIANNH area code"),),
        False,
        ("aiannh",),
        "aianhha",
        ("250",),
    ),
    GisjoinLayout(
        "sdelm",
        "elementary school district",
        _state(Part("sdelm", 5, label="school district LEA code")),
        False,
        ("sd_elm",),
        "sdelma",
        ("950",),
    ),
    GisjoinLayout(
        "sdsec",
        "secondary school district",
        _state(Part("sdsec", 5, label="school district LEA code")),
        False,
        ("sd_sec",),
        "sdseca",
        ("960",),
    ),
    GisjoinLayout(
        "sduni",
        "unified school district",
        _state(Part("sduni", 5, label="school district LEA code")),
        False,
        ("sd_uni",),
        "sdunia",
        ("970",),
    ),
    GisjoinLayout(
        "sldu",
        "state legislative district (upper chamber)",
        _state(Part("sldu", 3, letters=True, label="district code")),
        False,
        ("stleg_up",),
        "sldua",
        ("610",),
    ),
    GisjoinLayout(
        "sldl",
        "state legislative district (lower chamber)",
        _state(Part("sldl", 3, letters=True, label="district code")),
        False,
        ("stleg_lo",),
        "sldla",
        ("620",),
    ),
    GisjoinLayout(
        "cd",
        "congressional district",
        _state(Part("cd", 2, label="district number")),
        False,
        ("cong_dist",),
        "cda",
        ("500",),
    ),
)
_BY_NAME: dict[str, GisjoinLayout] = {
    name: lay for lay in LAYOUTS for name in (lay.level, *lay.aliases)
}


def spine_lengths() -> dict[str, int]:
    """GISJOIN length of each on-spine level (``state`` 4 … ``block`` 18)."""
    return {lay.level: lay.length for lay in LAYOUTS if lay.on_spine}


def layout(level: str) -> GisjoinLayout:
    """The layout of ``level`` (a canonical name or an alias).

    Raises
    ------
    SpecError
        For a name that is no NHGIS summary level, listing the known ones.
    """
    lay = _BY_NAME.get(str(level).lower())
    if lay is None:
        raise SpecError(
            f"{level!r} is not a GISJOIN summary level; known levels: "
            f"{[x.level for x in LAYOUTS]} (aliases: "
            f"{sorted(a for x in LAYOUTS for a in x.aliases)})"
        )
    return lay


def identify(code: str) -> list[GisjoinLayout]:
    """The layouts a single GISJOIN fits (several share a length: place and school
    districts)."""
    arr = pa.array([str(code)])
    return [lay for lay in LAYOUTS if pc.match_substring_regex(arr, lay.pattern)[0].as_py()]


def _off_spine_message(lay: GisjoinLayout) -> str:
    return (
        f"{lay.title}s ({lay.level!r}) do not nest in the state → county → tract → block "
        "hierarchy, so they cannot be one of its levels; release them as sums of the blocks "
        f"they contain, from a block → {lay.level} equivalency file"
    )


def check_hierarchy_levels(levels: Sequence[str], where: str = "") -> list[GisjoinLayout]:
    """The layouts of hierarchy ``levels`` (top first, below the root), refusing off-spine
    areas and levels out of order.

    Raises
    ------
    SpecError
        An unknown level, an off-spine one (place, AIAN area, school or legislative
        district: they need a block → area equivalency instead), or levels whose codes do not
        get longer top to bottom.
    """
    prefix = f"{where}: " if where else ""
    out: list[GisjoinLayout] = []
    for lv in levels:
        try:
            lay = layout(lv)
        except SpecError as err:
            raise SpecError(f"{prefix}{err}") from None
        if not lay.on_spine:
            raise SpecError(f"{prefix}level {lv!r}: {_off_spine_message(lay)}")
        out.append(lay)
    for above, below in zip(out, out[1:], strict=False):
        nested = below.parts[: len(above.parts)] == above.parts
        if below.length <= above.length or not nested:
            raise SpecError(
                f"{prefix}GISJOIN level {below.level!r} does not nest in {above.level!r} "
                f"({below.describe()}; {above.describe()}); order the levels top to bottom "
                "along state → county → tract → block group → block (or county subdivision)"
            )
    return out


def parse(
    codes: Sequence[str] | np.ndarray,
    level: str,
    *,
    source: str | None = None,
    rows: np.ndarray | None = None,
    column: str = "gisjoin",
) -> dict[str, np.ndarray]:
    """Split GISJOIN codes of one level into their FIPS parts.

    Parameters
    ----------
    codes : sequence of str
    level : str
        The level the codes should be of (a name of :data:`LAYOUTS` or an alias).
    source, column : str
        File and column named in messages.
    rows : array of int, optional
        The 0-based data row of each code in the file (default: its position).

    Returns
    -------
    dict of field name → numpy.ndarray
        One array of strings per code field (``{"state": ..., "place": ...}``), in layout
        order.

    Raises
    ------
    DataError
        A code that is not a GISJOIN of ``level``, naming the file, data row, column and the
        code, and the levels whose layout it does fit (a place code given as a county, a
        county code that lost a leading zero).
    """
    lay = layout(level)
    arr = pa.array(np.asarray(codes, dtype=object).tolist(), type=pa.string())
    ok = pc.fill_null(pc.match_substring_regex(arr, lay.pattern), False)
    ok = ok.to_numpy(zero_copy_only=False)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        row = int(rows[i]) if rows is not None else i
        code = arr[i].as_py()
        raise DataError(
            f"{source + ', ' if source else ''}data row {row + 1}, column {column!r}: "
            f"{code!r} is not a GISJOIN of level {lay.level!r} ({lay.describe()}); "
            + _why(code, lay)
        )
    out: dict[str, np.ndarray] = {}
    start = 1
    for p in lay.parts:
        if p.name != "pad":
            piece = pc.utf8_slice_codeunits(arr, start, start + p.width)
            out[p.name] = np.asarray(piece.to_numpy(zero_copy_only=False), dtype=object)
        start += p.width
    return out


def hint(code: str | None, level: str) -> str:
    """Why ``code`` is not a GISJOIN of ``level`` and what to do ("" for a level that is
    no NHGIS summary level)."""
    lay = _BY_NAME.get(str(level).lower())
    return _why(code, lay) if lay is not None else ""


def _why(code: str | None, lay: GisjoinLayout) -> str:
    if not code:
        return "every unit needs a GISJOIN code"
    hints = []
    fits = identify(code)
    # one character short: a lost leading zero; other lengths of a valid code: another level
    mixed = bool(fits) and len(code) != lay.length - 1
    if len(code) < lay.length and code.startswith("G") and not mixed:
        hints.append(
            "it is shorter than the level's codes: a leading zero was probably lost (codes "
            "read as numbers); read the codes as text"
        )
    if len(code) > lay.length and not fits:
        hints.append(
            f"it has {len(code)} characters, more than the level's: is the file of a finer "
            "level than the spec's last one?"
        )
    if fits:
        names = ", ".join(f"{f.level} ({f.title})" for f in fits)
        hints.append(f"it has the layout of {names}: check the level or the file")
        if mixed:
            hints.append(
                f"if the file mixes summary levels (a {fits[0].level} row among {lay.level} "
                "rows), a person is counted in one row of each, which this release does not "
                "compose: keep the rows of one level (privatize each level separately; their "
                "privacy losses add)"
            )
        off = [f for f in fits if not f.on_spine]
        if off and lay.on_spine and len(code) >= lay.length:
            hints.append(_off_spine_message(off[0]))
    return "; ".join(hints) or "check the file's codes and the level named in the spec"


# ------------------------------------------------------------------------ levels of rows
#: How to declare the levels of a file's rows, for messages (routes pass their own words).
DECLARE_LEVEL = (
    'declare the level: [data] level = "place" (every row of one level) or [data] '
    'level_column = "COLUMN" (a column holding each row\'s level name or SUMLEV code)'
)
_GEO_ID = r"^(?P<sumlev>\d{3})(?:\d{2}|\d{4})US"
_SUMLEV: dict[str, GisjoinLayout] = {c: lay for lay in LAYOUTS for c in lay.summary_levels}


@dataclass(frozen=True, eq=False)
class RowLevels:
    """The summary level of every row of a file, and where rows can share a person.

    Attributes
    ----------
    level : numpy.ndarray
        object (n_rows,): the canonical level name of each row (``"county"``, ``"place"``).
    state : numpy.ndarray
        object (n_rows,): the row's 2-digit state FIPS, or None for a level whose areas
        cross states (AIANNH areas).
    basis : str
        How the levels were told (for messages and manifests).
    """

    level: np.ndarray
    state: np.ndarray
    basis: str

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels present, in :data:`LAYOUTS` order (top of the spine first)."""
        present = set(self.level.tolist())
        return tuple(lay.level for lay in LAYOUTS if lay.level in present)

    def counts(self) -> dict[str, int]:
        """Rows per level, in :attr:`levels` order."""
        names, n = np.unique(self.level.astype(str), return_counts=True)
        got = dict(zip(names.tolist(), n.tolist(), strict=True))
        return {lv: int(got[lv]) for lv in self.levels}

    def person_groups(self) -> list[tuple[str | None, tuple[str, ...]]]:
        """Every set of levels one person can be counted in, with its state.

        Rows of one level are disjoint areas (each person lives in at most one county, one
        place, ...), so a person is in at most one row per level. A level whose GISJOIN
        carries a state lies inside that state: a person living in state ``s`` can be in a
        row of every level with a row in ``s`` and of every level that crosses states
        (AIANNH), and in no other. So the groups are, per state with rows, those levels
        (state None: a file with no state-bound rows). Whether two levels' rows in one state
        actually intersect (a place inside a given county) would need a block equivalency
        file; without one they are taken to (the bound is tight when they do).

        Returns
        -------
        list of (state or None, tuple of level names)
            In state order; the levels of each group in :attr:`levels` order.
        """
        order = {lv: i for i, lv in enumerate(self.levels)}
        bound = np.array([s is not None for s in self.state.tolist()], dtype=bool)
        crossing = set(self.level[~bound].tolist())
        if not bound.any():
            return [(None, tuple(sorted(crossing, key=order.__getitem__)))]
        pairs = np.unique(
            np.char.add(
                np.char.add(self.state[bound].astype(str), "/"), self.level[bound].astype(str)
            )
        )
        per_state: dict[str, set[str]] = {}
        for pair in pairs.tolist():  # one per (state, level) present: at most 52 x 14
            st, lv = pair.split("/", 1)
            per_state.setdefault(st, set()).add(lv)
        return [
            (st, tuple(sorted(lvs | crossing, key=order.__getitem__)))
            for st, lvs in sorted(per_state.items())
        ]


def _arrow(values: Sequence[object] | np.ndarray) -> pa.Array:
    """Strings (None where missing) as an Arrow array."""
    obj = np.asarray(values, dtype=object)
    text = np.where(pd.isna(obj), None, obj.astype(str))
    return pa.array(text.tolist(), type=pa.string())


def _fits(arr: pa.Array) -> np.ndarray:
    """bool (n, len(LAYOUTS)): which layouts each code fits."""
    out = np.zeros((len(arr), len(LAYOUTS)), dtype=bool)
    for j, lay in enumerate(LAYOUTS):
        hit = pc.fill_null(pc.match_substring_regex(arr, lay.pattern), False)
        out[:, j] = hit.to_numpy(zero_copy_only=False)
    return out


def _own_field(arr: pa.Array, lay: GisjoinLayout) -> np.ndarray:
    """The level's own code (its last field) cut from each GISJOIN, as strings."""
    start = 1
    for p in lay.parts[:-1]:
        start += p.width
    last = lay.parts[-1]
    if last.name == "pad":  # state, county: the field before the pad
        start -= lay.parts[-2].width
        last = lay.parts[-2]
    piece = pc.utf8_slice_codeunits(arr, start, start + last.width)
    return np.asarray(piece.to_numpy(zero_copy_only=False), dtype=object)


def declared_layout(value: object) -> GisjoinLayout | None:
    """The layout a declared level names: a level name, an alias or a SUMLEV code
    (``"160"``, ``160``); None for anything else."""
    text = "" if value is None else str(value).strip()
    return _SUMLEV.get(text.zfill(3) if text.isdigit() else text) or _BY_NAME.get(text.lower())


def row_levels(
    codes: Sequence[str] | np.ndarray,
    *,
    declared: str | Sequence[object] | np.ndarray | None = None,
    declared_column: str | None = None,
    geoid: tuple[str, Sequence[object] | np.ndarray] | None = None,
    identifiers: dict[str, tuple[str, Sequence[object] | np.ndarray]] | None = None,
    source: str | None = None,
    rows: np.ndarray | None = None,
    column: str = "gisjoin",
    fix: str = DECLARE_LEVEL,
) -> RowLevels:
    """The summary level of every GISJOIN in ``codes`` (see the module notes).

    Parameters
    ----------
    codes : sequence of str
        One GISJOIN per row.
    declared : str or sequence, optional
        The level of every row (one name), or of each row (level names, aliases or SUMLEV
        codes, e.g. from a ``SUMLEV`` column named ``declared_column``). Overrides the rest;
        each code must fit its declared level's layout.
    geoid : (column name, values), optional
        A ``GEO_ID``/``GEOID`` column; used when every non-empty value starts with a
        summary level (``1600000US…`` or ``16000US…``), else ignored (a bare FIPS GEOID).
    identifiers : mapping of lower-case column → (column name, values), optional
        NHGIS identifier columns (``placea``, ``sdunia``, ...) that tell apart the levels a
        code's length leaves open: a row is of the level whose column holds the code's own
        field.
    source, rows, column
        File, 0-based data rows and column named in messages.
    fix : str
        How to declare the level, appended to a refusal.

    Returns
    -------
    RowLevels

    Raises
    ------
    DataError
        A row whose level cannot be told (no layout fits, several fit and nothing tells
        them apart), an unknown declared level or SUMLEV, or a code that does not fit its
        declared or GEO_ID level — naming the file, data row, column and code.
    """
    arr = _arrow(np.asarray(codes, dtype=object).tolist())
    n = len(arr)
    t = _Rows(
        arr, np.arange(n) if rows is None else np.asarray(rows), _fits(arr),
        f"{source}, " if source else "", column,
    )  # fmt: skip
    if declared is not None:
        level_idx, basis = _declared_levels(t, declared, declared_column)
    else:
        level_idx = np.full(n, -1, dtype=np.int64)
        basis = "GISJOIN layout"
        if geoid is not None and _geoid_levels(t, level_idx, geoid, fix):
            basis = f"{geoid[0]} summary levels"
        several = _layout_levels(t, level_idx)
        if several.size and identifiers:
            _identifier_levels(t, level_idx, several, identifiers)
            basis += " and NHGIS identifier columns"
        _refuse_untold(t, level_idx, fix)
    level = np.array([LAYOUTS[j].level for j in range(len(LAYOUTS))], dtype=object)[level_idx]
    has_state = np.array(["state" in lay.fields for lay in LAYOUTS], dtype=bool)[level_idx]
    state = np.full(n, None, dtype=object)
    if has_state.any():
        st = pc.utf8_slice_codeunits(arr, 1, 3).to_numpy(zero_copy_only=False)
        state[has_state] = np.asarray(st, dtype=object)[has_state]
    return RowLevels(level, state, basis)


#: Position of each level's layout in :data:`LAYOUTS`.
_INDEX = {lay.level: j for j, lay in enumerate(LAYOUTS)}


@dataclass(frozen=True, eq=False)
class _Rows:
    """The codes :func:`row_levels` reads: as Arrow strings, their 0-based data rows, which
    layouts each fits (:func:`_fits`), and the file (``where``, a prefix) and column named
    in messages."""

    arr: pa.Array
    rows: np.ndarray
    fits: np.ndarray
    where: str
    column: str

    def unfit(self, i: int, lay: GisjoinLayout, why: str) -> DataError:
        """The refusal of code ``i``, which does not fit ``lay``, the level ``why`` gives."""
        return DataError(
            f"{self.where}data row {int(self.rows[i]) + 1}, column {self.column!r}: "
            f"{self.arr[i].as_py()!r} is not a GISJOIN of level {lay.level!r} "
            f"({lay.describe()}), the level {why} gives the row; check the file or the "
            "declaration"
        )


def _declared_levels(
    t: _Rows, declared: str | Sequence[object] | np.ndarray, declared_column: str | None
) -> tuple[np.ndarray, str]:
    """Levels as declared (one for every row, or per row: names, aliases or SUMLEV codes),
    each code checked against its level's layout; the layouts' positions and the basis."""
    n = len(t.arr)
    labels = np.full(n, declared, dtype=object) if isinstance(declared, str) else declared
    labels = np.asarray(_arrow(np.asarray(labels, dtype=object)).fill_null(""), dtype=object)
    uniq, inv = np.unique(labels.astype(str), return_inverse=True)
    lays = [declared_layout(u) for u in uniq.tolist()]
    for k, lay in enumerate(lays):
        if lay is None:
            i = int(np.flatnonzero(inv == k)[0])
            what = f"column {declared_column!r}" if declared_column else "the declared level"
            raise DataError(
                f"{t.where}data row {int(t.rows[i]) + 1}: {what} holds {str(uniq[k])!r}, which "
                f"is no summary level; give a level name ({[x.level for x in LAYOUTS]}) or a "
                f"SUMLEV code ({sorted(_SUMLEV)})"
            )
    level_idx = np.array([_INDEX[lay.level] for lay in lays], dtype=np.int64)[inv]
    bad = np.flatnonzero(~t.fits[np.arange(n), level_idx])
    if bad.size:
        i = int(bad[0])
        who = f"column {declared_column!r}" if declared_column else "the declaration"
        raise t.unfit(i, LAYOUTS[level_idx[i]], who)
    basis = f"declared in column {declared_column!r}" if declared_column else "declared"
    return level_idx, basis


def _geoid_levels(
    t: _Rows,
    level_idx: np.ndarray,
    geoid: tuple[str, Sequence[object] | np.ndarray],
    fix: str,
) -> bool:
    """Levels from a ``GEO_ID`` column's summary levels into ``level_idx``, when every
    non-empty value has one (else nothing: a bare FIPS GEOID); whether it was used. A
    summary level of no known layout, or a code that does not fit it, is refused."""
    gname, gvals = geoid
    g = _arrow(np.asarray(gvals, dtype=object).tolist())
    present = pc.fill_null(pc.not_equal(g, ""), False).to_numpy(zero_copy_only=False)
    sumlev = pc.extract_regex(g, _GEO_ID)
    ok = pc.is_valid(sumlev).to_numpy(zero_copy_only=False)
    if not (present.any() and (ok | ~present).all()):
        return False
    prefix = np.asarray(
        pc.struct_field(sumlev, "sumlev").to_numpy(zero_copy_only=False), dtype=object
    )
    for code in sorted(set(prefix[ok].tolist())):
        lay = _SUMLEV.get(code)
        sel = np.flatnonzero(ok & (prefix == code))
        if lay is None:
            raise DataError(
                f"{t.where}data row {int(t.rows[sel[0]]) + 1}, column {gname!r}: summary "
                f"level {code} ({g[int(sel[0])].as_py()!r}) is none of "
                f"{sorted(_SUMLEV)}, so the areas it may share persons with cannot "
                f"be told; drop those rows or {fix}"
            )
        level_idx[sel] = _INDEX[lay.level]
        bad = sel[~t.fits[sel, _INDEX[lay.level]]]
        if bad.size:
            raise t.unfit(int(bad[0]), lay, f"{gname}'s summary level {code}")
    return True


def _layout_levels(t: _Rows, level_idx: np.ndarray) -> np.ndarray:
    """Rows still open whose code fits one layout take its level (in ``level_idx``); the
    open rows it fits several of."""
    open_ = np.flatnonzero(level_idx < 0)
    one = t.fits[open_].sum(axis=1) == 1
    level_idx[open_[one]] = np.argmax(t.fits[open_[one]], axis=1)
    return open_[t.fits[open_].sum(axis=1) > 1]


def _identifier_levels(
    t: _Rows,
    level_idx: np.ndarray,
    several: np.ndarray,
    identifiers: dict[str, tuple[str, Sequence[object] | np.ndarray]],
) -> None:
    """Rows ``several`` (fitting several layouts) whose code's own field one layout's
    NHGIS identifier column holds (zero-padded back) take that level (in ``level_idx``)."""
    claims = np.zeros((several.size, len(LAYOUTS)), dtype=bool)
    for j, lay in enumerate(LAYOUTS):
        if lay.identifier not in identifiers:
            continue
        vals = _arrow(np.asarray(identifiers[lay.identifier][1], dtype=object)[several])
        vals = pc.utf8_trim_whitespace(vals)
        width = lay.parts[-1 if lay.parts[-1].name != "pad" else -2].width
        padded = pc.utf8_lpad(vals, width=width, padding="0")
        own = pa.array(_own_field(t.arr.take(pa.array(several)), lay).tolist(), pa.string())
        filled = pc.fill_null(pc.not_equal(vals, ""), False)
        same = pc.fill_null(pc.equal(padded, own), False)
        filled = filled.to_numpy(zero_copy_only=False)
        same = same.to_numpy(zero_copy_only=False)
        claims[:, j] = t.fits[several, j] & filled & same
    told = claims.sum(axis=1) == 1
    level_idx[several[told]] = np.argmax(claims[told], axis=1)


def _refuse_untold(t: _Rows, level_idx: np.ndarray, fix: str) -> None:
    """Refuse the first row whose level nothing told, saying which layouts it fits, which
    columns could tell, and the levels of the file's other rows."""
    unknown = np.flatnonzero(level_idx < 0)
    if not unknown.size:
        return
    i = int(unknown[0])
    code = t.arr[i].as_py()
    fit = [LAYOUTS[j] for j in np.flatnonzero(t.fits[i])]
    if not fit:
        why = "it is no GISJOIN of any NHGIS summary level"
    else:
        cols = [lay.identifier.upper() for lay in fit]
        why = (
            f"it has the layout of {', '.join(lay.level for lay in fit)} "
            f"({fit[0].describe()}) and no filled identifier column ({', '.join(cols)}) "
            "or GEO_ID tells which"
        )
    known = level_idx[level_idx >= 0]
    others = ", ".join(LAYOUTS[j].level for j in np.unique(known))
    also = f" (the file's other rows include {others})" if known.size else ""
    raise DataError(
        f"{t.where}data row {int(t.rows[i]) + 1}, column {t.column!r}: the summary level of "
        f"{code!r} cannot be told: {why}{also}; rows of different levels can count the "
        f"same person, so the privacy loss cannot be derived; {fix}"
    )
