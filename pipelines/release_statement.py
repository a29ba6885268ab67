"""What a release's privacy statement is built from, beyond the measurements.

Three pieces the ``privatize`` routes share:

* :func:`exact_through_invariants` — areas released exactly *through* an invariant without
  being named by it: a node that is the only child of a node whose invariant statistic is
  exact has the same value (DC as the only county of its state, at standard error 0). The
  statement and the manifest name them; :func:`held_nodes` gives the same nodes (and those
  the invariants name) as masks, for the tables' ``_se`` of exactly 0.
* :func:`verify_release` — the one provenance check for a release a statement is composed
  with (``--compose-with``): its checksums (:func:`censusdp.atomic.verify_output_dir`, the
  output policy's own verifier), its kind (the ``route`` its ownership manifest and
  ``manifest.json`` record: persons ``ppmf``, units ``ppmf_units``) and its schema (a readable
  privacy statement that ``privacy.md`` carries too).
* :func:`refuse_output_in` — a folder read as an input is never an output: ``-o`` equal to
  it or inside it is refused before any work.

References
----------
Gao, J., Gong, R. & Yu, F.-Y. (2022). Subspace Differential Privacy. AAAI, Def. 6.
Bun, M. & Steinke, T. (2016). Concentrated differential privacy. TCC, Lemma 2.3.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from censusdp.atomic import verify_output_dir
from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.hierarchy import Hierarchy

__all__ = [
    "RELEASE_KINDS",
    "VerifiedRelease",
    "change_factor",
    "exact_through_invariants",
    "held_nodes",
    "refuse_output_in",
    "unit_of_universes",
    "verify_release",
]

#: The release kinds a statement can compose with: route → what it is.
RELEASE_KINDS = {"ppmf": "persons release", "ppmf_units": "housing-unit (H1) release"}


def exact_through_invariants(
    h: Hierarchy, invariants: Sequence[tuple[str, str]] | Mapping[str, str]
) -> list[str]:
    """Nodes whose ``query`` is exact because they are an exact node's only child.

    A node of level ``k`` is exact for ``query`` when ``(level, query)`` is an invariant of
    its level, or when it is the only child of a node exact for ``query``; this lists those
    of the second kind (the first are named by the invariants themselves), e.g.
    ``"county 11001 (the only child of state 11): total"``.

    Parameters
    ----------
    h : Hierarchy
    invariants : sequence of (level, query) or mapping level → query

    Returns
    -------
    list of str
        Root first, in node order within a level.
    """
    pairs = list(invariants.items()) if isinstance(invariants, Mapping) else list(invariants)
    out: list[str] = []
    for query in dict.fromkeys(q for _, q in pairs):
        held = {h.level_index(lvl) for lvl, q in pairs if q == query}
        exact = np.zeros(h.sizes[0], dtype=bool)
        for k in range(h.depth):
            if k > 0:
                up = h.levels[k - 1]
                par = h.levels[k].parent
                inherited = exact[par] & (up.child_count[par] == 1)
                if k not in held:
                    codes = np.asarray(h.levels[k].codes)[inherited]
                    pcodes = np.asarray(up.codes)[par[inherited]]
                    out += [
                        f"{h.names[k]} {c} (the only child of {h.names[k - 1]} {p}): {query}"
                        for c, p in zip(codes, pcodes, strict=True)
                    ]
                exact = inherited
            if k in held:
                exact = np.ones(h.sizes[k], dtype=bool)
    return out


def held_nodes(
    h: Hierarchy,
    held_levels: Sequence[str | int],
    level: str | int,
    lo: int = 0,
    hi: int | None = None,
) -> np.ndarray:
    """Which nodes ``lo:hi`` of ``level`` have a statistic held exactly by an invariant that
    holds it at every node of ``held_levels``.

    A node is held when (a) its level is at or above a held level (every node of a held
    level is exact, so is every sum of them: the levels above), or (b) it is the only child
    of a held node (its value is its parent's; :func:`exact_through_invariants` names these).
    The test is structural, from the hierarchy and the invariants alone: never from a
    standard error. Vectorised: one parent lookup per level between ``level`` and the
    deepest held level above it.

    Parameters
    ----------
    h : Hierarchy
    held_levels : sequence of level names or indices
        The levels an invariant holds (e.g. ``("nation", "state")`` for the state totals).
    level : str or int
    lo, hi : int
        The node range (default: the whole level).

    Returns
    -------
    (hi - lo,) bool numpy.ndarray
    """
    k = h.level_index(level)
    hi = h.sizes[k] if hi is None else hi
    held = sorted({h.level_index(x) for x in held_levels})
    if not held:
        return np.zeros(hi - lo, dtype=bool)
    if k <= held[-1]:  # a held level or a sum of one's nodes
        return np.ones(hi - lo, dtype=bool)
    ok = np.ones(hi - lo, dtype=bool)
    node = np.arange(lo, hi, dtype=np.int64)
    for j in range(k, held[-1], -1):  # only children all the way up to the held level
        node = h.levels[j].parent[node]
        ok &= h.levels[j - 1].child_count[node] == 1
    return ok


def change_factor(mechanism: str | Sequence[str]) -> float | None:
    """The loss of changing one record as a multiple of the add/remove loss, for the noise
    laws a statement names (its ``mechanism``, comma-separated, or a list of law names).

    Counting queries (non-negative 0/1 matrices, every census query) answered with additive
    noise calibrated to one record's add/remove sensitivity: a change moves one record from
    cell i to cell j. For laws the registry composes in zCDP (Gaussian-type, ρ = Δ₂²/(2σ²)),
    ‖Q(e_i − e_j)‖₂² = ‖Qe_i‖² + ‖Qe_j‖² − 2⟨Qe_i, Qe_j⟩ ≤ 2Δ₂²: factor 2. For pure laws
    ‖Q(e_i − e_j)‖₁ ≤ 2Δ₁: factor 2. Mixed (a pure law counted as ε²/2 in zCDP): None, the
    general group-privacy bound (:meth:`~censusdp.budget.PrivacyStatement.change_loss`).
    """
    from censusdp.mechanisms.registry import law_info

    names = mechanism.split(",") if isinstance(mechanism, str) else list(mechanism)
    kinds = {law_info(n.strip()).accounting for n in names if n.strip()}
    return 2.0 if len(kinds) == 1 else None


#: Census table universes (lower case, by the word that names what is counted) → privacy unit.
UNIVERSE_UNITS = (("population", "person"), ("housing unit", "housing unit"),
                  ("household", "household"))  # fmt: skip


def unit_of_universes(universes: Sequence[str]) -> str:
    """The privacy unit of tables with these universes (``"Total population"``, ``"Housing
    units"``, ...): one record of the counted thing when every universe counts the same kind
    (:data:`UNIVERSE_UNITS`), else ``""`` (the statement then says one input record)."""
    units = set()
    for u in universes:
        low = u.lower()
        hit = [unit for word, unit in UNIVERSE_UNITS if word in low]
        units.add(hit[0] if hit else "")
    return units.pop() if len(units) == 1 else ""


def refuse_output_in(out: str | os.PathLike, folder: str | os.PathLike, *, option: str) -> None:
    """:class:`SpecError` when the output ``out`` is the input folder ``folder`` (given by
    ``option``) or lies inside it: an input is never written."""
    real, src = Path(out).resolve(), Path(folder).resolve()
    if real == src or real.is_relative_to(src):
        raise SpecError(
            f"-o {os.fspath(out)!r} is {'the folder' if real == src else 'inside the folder'} "
            f"{option} {Path(folder).name!r} reads: an input is never written; name a new "
            "output directory outside it"
        )


@dataclass(frozen=True)
class VerifiedRelease:
    """A release folder whose checksums, kind and statement were verified.

    Attributes
    ----------
    path : Path
    route : str
        Its kind (a key of :data:`RELEASE_KINDS`).
    privacy : PrivacyStatement
        Its statement, as its ``manifest.json`` records it.
    manifest_sha256 : str
        The SHA-256 of its ``manifest.json`` (from its verified ownership manifest).
    """

    path: Path
    route: str
    privacy: PrivacyStatement
    manifest_sha256: str

    def label(self) -> str:
        """How a composed statement names it."""
        return (
            f"{RELEASE_KINDS[self.route]} {self.path.name!r} (manifest.json SHA-256 "
            f"{self.manifest_sha256[:16]}…)"
        )


#: Keys (and types) a release's ``manifest.json`` privacy statement must have.
_PRIVACY_KEYS = {
    "accounting": str,
    "invariants": list,
    "notes": list,
    "text": str,
    "data_dependent": bool,
}


def verify_release(folder: str | os.PathLike, *, route: str, option: str) -> VerifiedRelease:
    """The one provenance check for a release a statement is composed with.

    1. **Checksums**: :func:`censusdp.atomic.verify_output_dir` — the ownership manifest
       lists every file with its SHA-256 and nothing is changed, added or missing.
    2. **Kind**: a ``privatize`` output whose ownership manifest and ``manifest.json`` both
       record ``route`` (a units release given as the persons one is refused).
    3. **Schema**: ``manifest.json`` holds a privacy statement with the keys of
       :data:`_PRIVACY_KEYS`, readable by :meth:`PrivacyStatement.from_dict`, whose
       recorded text ``privacy.md`` carries. A release written with ``--evaluate`` is read
       from its ``release/`` folder (the confidential ``evaluation/`` beside it is never read).

    Raises
    ------
    SpecError
        One line naming the folder, the option and the first problem.
    """
    from censusdp.pipelines.runner import RELEASE_DIR

    want = RELEASE_KINDS[route]
    path = Path(folder)
    marker = verify_output_dir(path, what=f"{want} {option} names")
    # ``privatize --evaluate`` lays the release out in ``release/`` beside the confidential
    # ``evaluation/``; the checksums above cover both, the statement is the release's
    base = path
    if not (path / "manifest.json").exists() and (path / RELEASE_DIR / "manifest.json").is_file():
        base = path / RELEASE_DIR
    got = marker.get("route")
    if marker.get("command") != "privatize" or got != route:
        kind = RELEASE_KINDS.get(str(got), f"{marker.get('command') or 'unknown'} output")
        raise SpecError(
            f"{path}: {option} needs a {want} of privatize (route {route}), but this is a "
            f"{kind} (route {got}); give the folder the {want} was written to"
        )
    where = f"{base / 'manifest.json'}"
    try:
        doc = json.loads((base / "manifest.json").read_text(encoding="utf-8"))
        priv = doc["privacy"]
        if doc.get("command") != "privatize" or doc.get("route") != route:
            raise ValueError(f"command/route {doc.get('command')}/{doc.get('route')}")
        for key, typ in _PRIVACY_KEYS.items():
            if not isinstance(priv.get(key), typ):
                raise ValueError(f"privacy.{key} missing or not a {typ.__name__}")
        statement = PrivacyStatement.from_dict(priv)
        statement.budget  # noqa: B018 - validates ε / ρ (BudgetError is a ValueError)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = str(exc) if isinstance(exc, ValueError) else type(exc).__name__
        raise SpecError(
            f"{where}: not a {want}'s manifest ({reason.splitlines()[0][:120]}); give the "
            f"folder privatize wrote"
        ) from None
    md = base / "privacy.md"
    if not md.is_file() or priv["text"] not in md.read_text(encoding="utf-8"):
        raise SpecError(
            f"{md}: does not carry the statement manifest.json records; give the folder "
            "privatize wrote"
        )
    listed = (base / "manifest.json").relative_to(path).as_posix()
    return VerifiedRelease(path, route, statement, marker["files"][listed])
