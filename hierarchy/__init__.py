"""censusdp.hierarchy — the geography: levels, nodes, builders, validation, tables, storage.

The names below are loaded on first use (PEP 562 module ``__getattr__``): importing the
package, or a light submodule such as :mod:`censusdp.hierarchy.describe` for the command
line's parser, does not import pandas, networkx or numba until a name that needs them is used.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are the names of __all__, made from _EXPORTS)
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from censusdp.hierarchy.builders import (
        GISJOIN_LENGTHS,
        LevelAdded,
        LevelSpec,
        add_level,
        from_columns,
        from_edges,
        from_gisjoin,
        level_specs,
        parse_level_spec,
    )
    from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, Level, as_codes
    from censusdp.hierarchy.describe import describe, describe_file
    from censusdp.hierarchy.graph import to_networkx
    from censusdp.hierarchy.storage import load_hierarchy, load_table, save_hierarchy, save_table
    from censusdp.hierarchy.synthetic import (
        pl94_histogram,
        pl94_partitions,
        synthetic_state,
        synthetic_us,
    )
    from censusdp.hierarchy.table import MIDWEST_CELLS, Table, resolve_cells
    from censusdp.hierarchy.validate import check_additive, check_counts, check_leaf_data, validate

#: Public name -> the submodule defining it: the one list of the package's names (``__all__``).
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
            "GISJOIN_LENGTHS",
            "LevelAdded",
            "LevelSpec",
            "add_level",
            "from_columns",
            "from_edges",
            "from_gisjoin",
            "level_specs",
            "parse_level_spec",
        ],
        "builders",
    ),
    **dict.fromkeys(["STRING_DTYPE", "Hierarchy", "Level", "as_codes"], "core"),
    **dict.fromkeys(["describe", "describe_file"], "describe"),
    "to_networkx": "graph",
    **dict.fromkeys(["load_hierarchy", "load_table", "save_hierarchy", "save_table"], "storage"),
    **dict.fromkeys(
        ["pl94_histogram", "pl94_partitions", "synthetic_state", "synthetic_us"], "synthetic"
    ),
    **dict.fromkeys(["MIDWEST_CELLS", "Table", "resolve_cells"], "table"),
    **dict.fromkeys(["check_additive", "check_counts", "check_leaf_data", "validate"], "validate"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the submodule defining ``name`` on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """The package's module type: ``describe`` and ``validate`` stay the functions.

    Importing the submodule ``censusdp.hierarchy.validate`` (or ``.describe``) makes the
    import system set the package attribute of that name to the submodule; the eager
    package bound the function of the same name over it, so this keeps that meaning.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
