"""A name → entry registry: the one place a family of plug-ins (noise laws, estimators,
schedulers) is listed.

Core holds only the container; each family's registry lives with the family (noise laws in
:mod:`censusdp.mechanisms.registry`, estimators and schedulers in
:mod:`censusdp.pipelines.registry`), so core never imports the layers above it. Every lookup
of an unknown name raises :class:`~censusdp.errors.SpecError` naming the name, the registered
ones and the closest match: there is no default entry to fall through to.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from censusdp.errors import SpecError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind, by name, in registration order.

    Parameters
    ----------
    kind : str
        What an entry is, for messages (``"noise law"``, ``"estimator"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; a name is registered once.

        Raises
        ------
        SpecError
            ``name`` is empty or already registered.
        """
        if not isinstance(name, str) or not name:
            raise SpecError(f"a {self.kind} needs a non-empty name to be registered")
        if name in self._entries:
            raise SpecError(
                f"{self.kind} {name!r} is registered twice; give the new one another name"
            )
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> T:
        """Unregister ``name`` (for tests that register a throwaway entry)."""
        self.get(name)
        return self._entries.pop(name)

    def get(self, name: str, where: str = "") -> T:
        """The entry registered as ``name``.

        Parameters
        ----------
        where : str
            Prefix of the error message (a spec file and key, ``"s.toml: mechanism.noise"``).

        Raises
        ------
        SpecError
            Unknown name: the message lists the registered names and the closest one.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise SpecError(self.unknown(name, where)) from None

    def unknown(self, name: object, where: str = "") -> str:
        """The message for an unknown ``name``."""
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        prefix = f"{where}: " if where else ""
        return (
            f"{prefix}unknown {self.kind} {name!r}: {name!r} is not one of "
            f"{list(self._entries)}{hint}"
        )

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    def select(self, keep: Callable[[T], bool]) -> tuple[str, ...]:
        """Names of the entries for which ``keep(entry)`` is true."""
        return tuple(n for n, e in self._entries.items() if keep(e))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {list(self._entries)})"
