"""censusdp.hierarchy — the geography: levels, nodes, builders, validation, tables, storage."""

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

__all__ = [
    "GISJOIN_LENGTHS",
    "Hierarchy",
    "Level",
    "LevelAdded",
    "LevelSpec",
    "MIDWEST_CELLS",
    "STRING_DTYPE",
    "Table",
    "add_level",
    "as_codes",
    "check_additive",
    "check_counts",
    "check_leaf_data",
    "describe",
    "describe_file",
    "from_columns",
    "from_edges",
    "from_gisjoin",
    "level_specs",
    "load_hierarchy",
    "load_table",
    "parse_level_spec",
    "resolve_cells",
    "save_hierarchy",
    "save_table",
    "synthetic_us",
    "synthetic_state",
    "pl94_histogram",
    "pl94_partitions",
    "to_networkx",
    "validate",
]
