"""The geographic spine of the 2020 Noisy Measurement File (NMF) as a :class:`Hierarchy`.

The Census Bureau's 2020 TopDown run did not measure tabulation geography. Its tree is a
*spine*: the nation; each state split in two parts, ``0ss`` (state ``ss`` outside American
Indian / Alaska Native areas) and ``1ss`` (its AIAN part); spine counties, tracts and block
groups (which are *not* tabulation counties, tracts or block groups); and tabulation blocks.
A geocode's parent is its prefix (docs/design.md § The Noisy Measurement File): state part 3 characters, county 9, tract 13,
block group 15, block 31, of which the last 16 are the block's tabulation GEOID (state 2,
county 3, tract 6, block group 1, block 4).

State totals are invariant in the production run but a state is two parts, so the spine
adds a *virtual* state level between the nation and the parts (no measurements; it carries
the state-total invariant, tying ``0ss`` and ``1ss``)::

    nation → state (virtual, ``ss``) → state_part (``0ss``/``1ss``) → county → tract
           → block_group → block

Codes are the file's geocodes (the nation ``"US"``, a virtual state its two FIPS digits), so
a node's children are the geocodes it prefixes; node order is the canonical order of
:class:`~censusdp.hierarchy.core.Hierarchy` (states, then parts within a state, then each
level lexicographically within its parent).

References
----------
U.S. Census Bureau (2023). 2020 Census Redistricting Data (P.L. 94-171) Noisy Measurement
    File, README (the spine, the AIAN split of each state, the geocodes).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 — Section 5 (the spine, "on-spine" AIAN
    geography).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from censusdp.errors import HierarchyError
from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, as_codes

__all__ = [
    "SPINE_LEVELS",
    "PART_LEVELS",
    "GEOCODE_LENGTHS",
    "TABULATION_GEOID_LENGTH",
    "NMFSpine",
    "nmf_spine",
    "tabulation_geoids",
    "code_index",
]

#: Spine level names, root first.
SPINE_LEVELS = ("nation", "state", "state_part", "county", "tract", "block_group", "block")
#: The levels the file measures below the nation (the parts and their descendants).
PART_LEVELS = SPINE_LEVELS[2:]
#: Geocode length of every measured level below the nation.
GEOCODE_LENGTHS = {"state_part": 3, "county": 9, "tract": 13, "block_group": 15, "block": 31}
#: A block geocode ends with its tabulation block GEOID (2 + 3 + 6 + 1 + 4 characters).
TABULATION_GEOID_LENGTH = 16


def code_index(codes: object, queries: object) -> np.ndarray:
    """Index of each query code in ``codes`` (unique), -1 where absent: a hash lookup.

    (``numpy.searchsorted`` on ``StringDType`` arrays gives wrong positions in numpy 2.4.6
    for strings of 16 or more characters — NMF geocodes have up to 31 — so no sorted search
    is used on codes.)
    """
    index = pd.Index(np.asarray(as_codes(codes), dtype=object))
    return index.get_indexer(np.asarray(as_codes(queries), dtype=object)).astype(np.int64)


def tabulation_geoids(block_geocodes: object) -> np.ndarray:
    """The 16-character tabulation block GEOID of each 31-character spine block geocode."""
    codes = as_codes(block_geocodes)
    return np.strings.slice(codes, -TABULATION_GEOID_LENGTH, None)


@dataclass(frozen=True, eq=False)
class NMFSpine:
    """The NMF spine: a :class:`Hierarchy` with levels :data:`SPINE_LEVELS`.

    Attributes
    ----------
    hierarchy : Hierarchy
        Codes are geocodes (virtual states: two FIPS digits; the nation ``"US"``).
    orders : dict of str → numpy.ndarray
        Per measured level (:data:`PART_LEVELS`), ``order`` such that canonical node ``i`` is
        input geocode ``order[i]`` of :func:`nmf_spine`'s argument (align data rows with it).
    """

    hierarchy: Hierarchy
    orders: dict[str, np.ndarray]

    @property
    def tabulation_geoids(self) -> np.ndarray:
        """(n_blocks,) tabulation block GEOID of every block, in spine order."""
        return tabulation_geoids(self.hierarchy["block"].codes)

    def state_of_part(self) -> np.ndarray:
        """(n_parts,) index of each state part's virtual state."""
        return self.hierarchy["state_part"].parent


def _check_lengths(level: str, codes: np.ndarray) -> None:
    want = GEOCODE_LENGTHS[level]
    bad = np.flatnonzero(np.strings.str_len(codes) != want)
    if bad.size:
        raise HierarchyError(
            f"NMF spine, level {level!r}: geocode {str(codes[bad[0]])!r} has the wrong length "
            f"(a {level} geocode has {want} characters); give the file's geocodes unchanged"
        )


def _parent_index(level: str, codes: np.ndarray, up_level: str, up_codes: np.ndarray) -> np.ndarray:
    prefix = np.strings.slice(codes, 0, GEOCODE_LENGTHS[up_level])
    pos = code_index(up_codes, prefix)
    bad = np.flatnonzero(pos < 0)
    if bad.size:
        raise HierarchyError(
            f"NMF spine, level {level!r}: geocode {str(codes[bad[0]])!r} has no parent in level "
            f"{up_level!r} (no geocode there is its prefix); every node's parent must be present"
        )
    return pos


def nmf_spine(geocodes: Mapping[str, object]) -> NMFSpine:
    """The spine hierarchy of the given geocodes.

    Parameters
    ----------
    geocodes : mapping of level name → array-like of str
        The geocodes of every level of :data:`PART_LEVELS` (state parts ``0ss``/``1ss``,
        spine counties, tracts, block groups, blocks), each level's unique, in any order.
        The virtual states and the nation are added.

    Returns
    -------
    NMFSpine

    Raises
    ------
    HierarchyError
        A missing level, a geocode of the wrong length, a state part not starting with 0 or
        1, a duplicate geocode, or a geocode whose prefix is not a node of the level above.
    """
    missing = [lvl for lvl in PART_LEVELS if lvl not in geocodes]
    if missing:
        raise HierarchyError(
            f"NMF spine: no geocodes for levels {missing}; give all of {PART_LEVELS}"
        )
    codes = {lvl: as_codes(geocodes[lvl]) for lvl in PART_LEVELS}
    for lvl, c in codes.items():
        if c.size == 0:
            raise HierarchyError(f"NMF spine, level {lvl!r}: no geocodes; every level needs nodes")
        _check_lengths(lvl, c)
        dups = pd.Index(np.asarray(c, dtype=object)).duplicated()
        if dups.any():
            dup = c[np.flatnonzero(dups)[0]]
            raise HierarchyError(
                f"NMF spine, level {lvl!r}: geocode {str(dup)!r} appears twice; give each once"
            )
    parts = codes["state_part"]
    first = np.strings.slice(parts, 0, 1)
    bad = np.flatnonzero((first != "0") & (first != "1"))
    if bad.size:
        raise HierarchyError(
            f"NMF spine, level 'state_part': geocode {str(parts[bad[0]])!r} does not start with "
            "0 (outside AIAN areas) or 1 (AIAN part)"
        )
    state_of_part = np.strings.slice(parts, 1, 3)
    states, state_parent = np.unique(np.asarray(state_of_part, dtype=object), return_inverse=True)
    names = list(SPINE_LEVELS)
    level_codes: list[object] = [as_codes(["US"]), states.astype(STRING_DTYPE), parts]
    parents: list[np.ndarray | None] = [
        None,
        np.zeros(states.size, np.int64),
        state_parent.astype(np.int64),
    ]
    for up, lvl in zip(PART_LEVELS[:-1], PART_LEVELS[1:], strict=True):
        level_codes.append(codes[lvl])
        parents.append(_parent_index(lvl, codes[lvl], up, codes[up]))
    h, orders = Hierarchy.from_parents(names, level_codes, parents, return_order=True)
    return NMFSpine(h, {lvl: orders[k + 2] for k, lvl in enumerate(PART_LEVELS)})
