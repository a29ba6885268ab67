"""censusdp.estimation — projection (GLS), conditioning (MCMC), TopDown-style baseline,
unbiased rounding and uncertainty."""

from censusdp.estimation.gls import NodeVarianceMeasurement, tree_gls
from censusdp.estimation.gls_sparse import general_gls, hierarchy_to_sparse
from censusdp.estimation.release import Release
from censusdp.estimation.rounding import (
    pipage_round,
    round_bipartite,
    round_release,
    round_tree,
    rounding_variance,
)
from censusdp.estimation.structured_gls import StructuredRelease, structured_gls
from censusdp.estimation.uncertainty import coverage, intervals, standard_errors

__all__ = [
    "Release",
    "tree_gls",
    "NodeVarianceMeasurement",
    "general_gls",
    "hierarchy_to_sparse",
    "pipage_round",
    "round_tree",
    "round_bipartite",
    "round_release",
    "rounding_variance",
    "standard_errors",
    "intervals",
    "coverage",
    "structured_gls",
    "StructuredRelease",
]
