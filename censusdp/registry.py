"""A name → entry registry: the one place a family of plug-ins (noise laws, estimators,
schedulers) is listed.

Core holds only the container; each family's registry lives with the family (noise laws in
:mod:`censusdp.mechanisms.registry`, estimators in :mod:`censusdp.pipelines.estimators`,
schedulers in :mod:`censusdp.pipelines.execute`, file products in
:mod:`censusdp.pipelines.products.registry`), so core never imports the layers above it. Every lookup
of an unknown name raises :class:`~censusdp.errors.SpecError` naming the name, the registered
ones and the closest match: there is no default entry to fall through to.

**Plug-ins from other packages.** A registry made with ``entry_points="censusdp.GROUP"``
also lists what installed distributions declare in that entry-point group (the packaging
standard's ``[project.entry-points."censusdp.noise_laws"]`` table of a ``pyproject.toml``;
``importlib.metadata.entry_points``). They are loaded lazily, once, on the registry's first
lookup (:meth:`Registry.get`, ``in``, iteration, :meth:`Registry.names`): building the command
line's parser looks nothing up, so ``censusdp --help`` imports no plug-in. Each entry point
names the object to register (``toy_laws:Staircase``); importing it may register it already
(a ``@register_law`` class), otherwise the family's ``register(name, obj)`` does. An entry
point that fails to load, or that registers nothing under its own name, is a
:class:`~censusdp.errors.SpecError` naming the entry point and its distribution.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from censusdp.errors import SpecError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind, by name, in registration order.

    Parameters
    ----------
    kind : str
        What an entry is, for messages (``"noise law"``, ``"estimator"``).
    entry_points : str, optional
        An entry-point group (``"censusdp.noise_laws"``) whose entry points are loaded on the
        first lookup (module docstring); None for an in-process registry only.
    register : callable, optional
        ``register(name, obj)``: registers an object an entry point loaded that its import did
        not register itself (a family checks its kind here, e.g. ``register_law``); default
        :meth:`add`.
    """

    def __init__(
        self,
        kind: str,
        *,
        entry_points: str | None = None,
        register: Callable[[str, Any], object] | None = None,
    ) -> None:
        self.kind = kind
        self.group = entry_points
        self._register = register
        self._entries: dict[str, T] = {}
        self._plugins_loaded = entry_points is None
        self._plugin_error: str | None = None
        #: Entry-point name → ``"distribution version"`` of each plug-in loaded.
        self.plugins: dict[str, str] = {}

    def load_plugins(self) -> None:
        """Load the entry points of :attr:`group` (once; every lookup calls it first).

        Raises
        ------
        SpecError
            An entry point that fails to import, takes a registered name, or after which no
            entry of its name is registered: the message names it, its distribution and how
            to fix it (and every later lookup raises it again).
        """
        if self._plugin_error is not None:
            raise SpecError(self._plugin_error)
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # first: a plug-in's import may look this registry up
        try:
            self._load_entry_points()
        except SpecError as exc:  # every later lookup says the same, none half-succeeds
            self._plugin_error = str(exc)
            raise

    def _load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group):
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown"
            where = (
                f"{self.kind} plug-in {ep.name!r} (entry point {ep.value!r} in group "
                f"{self.group!r} of the installed package {dist})"
            )
            if ep.name in self._entries:
                raise SpecError(
                    f"{where} takes the name of a {self.kind} registered already; rename it "
                    "in that package's entry points"
                )
            try:
                obj = ep.load()
            except Exception as exc:  # a third party's import: any error is its package's
                raise SpecError(
                    f"{where} failed to load ({type(exc).__name__}: {exc}); fix or uninstall "
                    "that package"
                ) from None
            if ep.name not in self._entries:
                try:
                    (self._register or self.add)(ep.name, obj)
                except SpecError as exc:  # the family refused it (not a noise law, ...)
                    raise SpecError(f"{where}: {exc}") from None
            if ep.name not in self._entries:
                raise SpecError(
                    f"{where} registered no {self.kind} named {ep.name!r}; the entry point's "
                    f"name must be the name the {self.kind} registers under"
                )
            self.plugins[ep.name] = dist

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
        self.load_plugins()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise SpecError(self.unknown(name, where)) from None

    def unknown(self, name: object, where: str = "") -> str:
        """The message for an unknown ``name``."""
        self.load_plugins()
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        prefix = f"{where}: " if where else ""
        return (
            f"{prefix}unknown {self.kind} {name!r}: {name!r} is not one of "
            f"{list(self._entries)}{hint}"
        )

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        self.load_plugins()
        return tuple(self._entries)

    def select(self, keep: Callable[[T], bool]) -> tuple[str, ...]:
        """Names of the entries for which ``keep(entry)`` is true."""
        self.load_plugins()
        return tuple(n for n, e in self._entries.items() if keep(e))

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self.load_plugins()
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        self.load_plugins()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {list(self._entries)})"
