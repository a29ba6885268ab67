"""The spec parser: TOML spec files read and walked with every problem named by its key.

Generic, for every spec family above core (the run spec, :mod:`censusdp.pipelines.spec`; the
PPMF, units, codebook-table, predict and allocate specs): :func:`read_spec_toml` reads a file
(UTF-8, LF/CRLF, TOML syntax errors with line and column); :class:`SpecParser` checks keys
(unknown keys with a close-match suggestion), types and choices; :func:`exact_fraction` turns a
budget or share into the exact rational the accounting uses. Every problem raises
:class:`~censusdp.errors.SpecError` on one line naming the file and the dotted key
(``privacy.level_shares.county``), never a value that may be confidential. This module keeps
no vocabulary of the layers above (their sections, keys and options).
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from censusdp.errors import SpecError

__all__ = [
    "EXACT_GRID",
    "MAX_RHO",
    "SpecParser",
    "dotted_key",
    "exact_fraction",
    "kind_of",
    "read_spec_toml",
]

#: Denominator bound of the exact rationals that budgets (ρ, shares) are kept as: a value is
#: represented to within 1/EXACT_GRID², and one that is not a positive rational of this grid
#: to within a relative 1e-6 (1e-300, or a share of 0.9999999999999999, which rounds to 1) is
#: refused rather than silently rounded to 0 or 1 (:func:`exact_fraction`).
EXACT_GRID = 10**12
#: Largest total ρ (zCDP) a spec may state: beyond it a release protects no one (ε in the
#: thousands) and the discrete Gaussian variances fall below the samplers' exact range.
MAX_RHO = 1e6


def exact_fraction(
    value: float, where: str, *, below_one: bool = False, most: float | None = None
) -> Fraction:
    """``value`` (a positive budget or a share) as the exact rational the accounting uses.

    The rational is the closest with denominator at most :data:`EXACT_GRID`; it must be
    positive (and below 1 for a share, ``below_one``; at most ``most`` when given, e.g.
    :data:`MAX_RHO`) and within a relative 1e-6 of ``value``, else the value cannot be spent
    as given.

    Raises
    ------
    SpecError
        Naming ``where`` (the file and dotted key, or the option), never a secret.
    """
    if not math.isfinite(value) or value <= 0 or (below_one and value >= 1):
        span = "in (0, 1)" if below_one else "positive and finite"
        raise SpecError(f"{where}: must be {span}")
    if most is not None and value > most:
        raise SpecError(
            f"{where}: at most {most:g} (a larger budget protects no one, and its noise would "
            "fall below the exact samplers' range)"
        )
    frac = Fraction(value).limit_denominator(EXACT_GRID)
    low, high = Fraction(1, EXACT_GRID), 1 - Fraction(1, EXACT_GRID)
    if frac <= 0 or (below_one and frac >= 1) or abs(float(frac) - value) > 1e-6 * value:
        span = (
            f"between {float(low):g} and {float(high):.12f}"
            if below_one
            else f"at least {float(low):g}"
        )
        raise SpecError(
            f"{where}: {value!r} is not representable as an exact budget (censusdp keeps "
            f"budgets as rationals with denominators up to {EXACT_GRID:.0e}); give a value "
            f"{span}"
        )
    return frac


# --------------------------------------------------------------------------------------------


def read_spec_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document of a spec file.

    Raises
    ------
    SpecError
        Missing, empty or unreadable file, text that is not UTF-8, bare-CR (old Mac) line
        ends, or a TOML syntax error (with line
        and column), naming the file.
    """
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(f"{name}: cannot read the spec file ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{name}: the spec is not valid UTF-8 text") from None
    if "\r" in text.replace("\r\n", ""):
        raise SpecError(
            f"{name}: lines end in a bare carriage return (CR, old Mac OS line ends), which "
            "TOML does not allow; save the spec with LF or CRLF line ends"
        )
    if not text.strip():
        raise SpecError(f"{name}: the spec file is empty; see the README for a spec's sections")
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{name}: TOML syntax error: {exc}") from None


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "an array",
    dict: "a table",
}


_GOT_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "an array",
    dict: "a table",
}


def _is(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is dict:
        return isinstance(value, Mapping)
    return isinstance(value, kind)


def kind_of(value: Any) -> str:
    """The TOML type of ``value``, for messages (never the value: it may be confidential)."""
    for kind, name in _GOT_NAMES.items():
        if _is(value, kind):
            return name
    return type(value).__name__


def dotted_key(path: str, key: str) -> str:
    """``key`` under the dotted ``path`` (``"privacy"``, ``"rho"`` → ``"privacy.rho"``)."""
    return f"{path}.{key}" if path else key


class SpecParser:
    """Walks the document, naming every problem by its dotted key."""

    def __init__(self, source: str, base_dir: Path | None) -> None:
        self.source = source
        self.base_dir = base_dir

    # -- helpers -----------------------------------------------------------------------------

    def fail(self, where: str, message: str) -> SpecError:
        prefix = f"{self.source}: " + (f"{where}: " if where else "")
        return SpecError(prefix + message)

    def keys(self, table: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
        """Refuse keys not in ``allowed``, suggesting the closest allowed key."""
        for key in table:
            if key not in allowed:
                raise self.unknown(key, path, allowed, "key")

    def unknown(
        self, key: str, path: str, allowed: tuple[str, ...], what: str, known: str = ""
    ) -> SpecError:
        """``unknown <what> '<path.key>'`` with ``known`` (what is allowed) and a close match."""
        close = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1)
        msg = f"{self.source}: unknown {what} '{dotted_key(path, key)}'"
        if known:
            msg += f" ({known})"
        if close:
            msg += f"; did you mean '{dotted_key(path, close[0])}'?"
        elif allowed and not known:
            msg += f"; expected one of {list(allowed)}"
        return SpecError(msg)

    def get(
        self,
        table: Mapping[str, Any],
        path: str,
        key: str,
        kind: type,
        *,
        required: bool = False,
        default: Any = None,
    ) -> Any:
        dotted = dotted_key(path, key)
        if key not in table:
            if required and not path:
                raise self.fail("", f"missing section [{key}]")
            if required:
                raise self.fail(dotted, f"missing; add '{key} = ...' to [{path}]")
            return default
        value = table[key]
        if not _is(value, kind):
            raise self.fail(dotted, f"expected {_TYPE_NAMES[kind]}, got {kind_of(value)}")
        if kind is float:
            value = float(value)
            if not math.isfinite(value):
                raise self.fail(dotted, "expected a finite number")
        return value

    def table(self, doc: Mapping[str, Any], key: str, *, required: bool) -> Mapping[str, Any]:
        return self.get(doc, "", key, dict, required=required, default={})

    def choice(self, value: str, dotted: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            close = difflib.get_close_matches(value, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise self.fail(dotted, f"{value!r} is not one of {list(allowed)}{hint}")
        return value

    def str_list(self, value: Any, dotted: str, *, allow_str: bool = False) -> tuple[str, ...]:
        if allow_str and isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            expected = "a string or an array of strings" if allow_str else "an array of strings"
            raise self.fail(dotted, f"expected {expected}, got {kind_of(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.fail(f"{dotted}[{i}]", "expected a non-empty string")
        if len(set(value)) != len(value):
            dup = next(v for i, v in enumerate(value) if v in value[:i])
            raise self.fail(dotted, f"{dup!r} is listed twice")
        return tuple(value)

    def positive_int(self, table: Mapping[str, Any], path: str, key: str, **kw: Any) -> Any:
        value = self.get(table, path, key, int, **kw)
        if value is not None and value < 1:
            raise self.fail(dotted_key(path, key), f"must be at least 1, got {value}")
        return value

    # -- sections ----------------------------------------------------------------------------
