"""censusdp.hierarchy — the geography: levels, nodes, builders, validation."""

from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, Level, as_codes

__all__ = ["Hierarchy", "Level", "STRING_DTYPE", "as_codes"]
