"""NHGIS GISJOIN codes of every summary level: layouts, parsing into FIPS parts, and which
levels nest in the census hierarchy.

A GISJOIN is ``G`` followed by the level's FIPS (or Census) codes in a fixed layout. NHGIS
pads the state and county codes with one digit (``0`` for entities that exist today; a
non-zero digit marks historical states and counties), so a county is
``G`` + state (2) + ``0`` + county (3) + ``0``: ``G1700310`` is Cook County, Illinois. Levels
and their layouts:

======================  =======================================================  ======
level                   layout                                                   length
======================  =======================================================  ======
state                   G + state(2) + 0                                         4
county                  G + state(2) + 0 + county(3) + 0                         8
cousub                  county + county subdivision(5)                           13
tract                   county + tract(6)                                        14
block_group             county + tract(6) + block group(1)                       15
block                   county + tract(6) + block(4)                             18
place                   G + state(2) + 0 + place(5)                              9
aianhh                  G + AIANNH area(4)                                       5
sdelm, sdsec, sduni     G + state(2) + 0 + school district LEA code(5)           9
sldu, sldl              G + state(2) + 0 + legislative district(3, letters too)  7
cd                      G + state(2) + 0 + congressional district(2)             6
======================  =======================================================  ======

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from censusdp.errors import DataError, SpecError

__all__ = [
    "LAYOUTS",
    "GisjoinLayout",
    "check_hierarchy_levels",
    "hint",
    "identify",
    "layout",
    "parse",
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
    """

    level: str
    title: str
    parts: tuple[Part, ...]
    on_spine: bool
    aliases: tuple[str, ...] = ()

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
    GisjoinLayout("state", "state", _state(), True),
    GisjoinLayout("county", "county", _county(), True),
    GisjoinLayout(
        "cousub",
        "county subdivision",
        _county(Part("cousub", 5, label="county subdivision FIPS")),
        True,
        ("cty_sub", "county_subdivision"),
    ),
    GisjoinLayout("tract", "census tract", _county(Part("tract", 6)), True),
    GisjoinLayout(
        "block_group",
        "block group",
        _county(Part("tract", 6), Part("block_group", 1)),
        True,
        ("blck_grp", "bg"),
    ),
    GisjoinLayout("block", "block", _county(Part("tract", 6), Part("block", 4)), True),
    GisjoinLayout("place", "place", _state(Part("place", 5, label="place FIPS")), False),
    GisjoinLayout(
        "aianhh",
        "American Indian area / Alaska Native area / Hawaiian home land",
        (Part("aianhh", 4, label="AIANNH area code"),),
        False,
        ("aiannh",),
    ),
    GisjoinLayout(
        "sdelm",
        "elementary school district",
        _state(Part("sdelm", 5, label="school district LEA code")),
        False,
        ("sd_elm",),
    ),
    GisjoinLayout(
        "sdsec",
        "secondary school district",
        _state(Part("sdsec", 5, label="school district LEA code")),
        False,
        ("sd_sec",),
    ),
    GisjoinLayout(
        "sduni",
        "unified school district",
        _state(Part("sduni", 5, label="school district LEA code")),
        False,
        ("sd_uni",),
    ),
    GisjoinLayout(
        "sldu",
        "state legislative district (upper chamber)",
        _state(Part("sldu", 3, letters=True, label="district code")),
        False,
        ("stleg_up",),
    ),
    GisjoinLayout(
        "sldl",
        "state legislative district (lower chamber)",
        _state(Part("sldl", 3, letters=True, label="district code")),
        False,
        ("stleg_lo",),
    ),
    GisjoinLayout(
        "cd",
        "congressional district",
        _state(Part("cd", 2, label="district number")),
        False,
        ("cong_dist",),
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
    if len(code) < lay.length and code.startswith("G"):
        hints.append(
            "it is shorter than the level's codes: a leading zero was probably lost (codes "
            "read as numbers); read the codes as text"
        )
    fits = identify(code)
    if len(code) > lay.length and not fits:
        hints.append(
            f"it has {len(code)} characters, more than the level's: is the file of a finer "
            "level than the spec's last one?"
        )
    if fits:
        names = ", ".join(f"{f.level} ({f.title})" for f in fits)
        hints.append(f"it has the layout of {names}: check the level or the file")
        off = [f for f in fits if not f.on_spine]
        if off and lay.on_spine and len(code) >= lay.length:
            hints.append(_off_spine_message(off[0]))
    return "; ".join(hints) or "check the file's codes and the level named in the spec"
