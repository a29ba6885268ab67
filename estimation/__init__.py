"""censusdp.estimation — projection (GLS), conditioning (MCMC), the conditioned mechanism
ℳ_MH, TopDown-style baseline, unbiased rounding and uncertainty.

Every estimator takes ``(hierarchy, cells, measurements, invariants, privacy)``; ``privacy``
None derives the statement from the measurements, and a statement that claims less than they
spend is refused (:mod:`censusdp.mechanisms.privacy`)."""

from censusdp.estimation.conditioned_mechanism import conditioned_mechanism
from censusdp.estimation.conditioning import condition
from censusdp.estimation.gls import NodeVarianceMeasurement, tree_gls
from censusdp.estimation.gls_sparse import general_gls, hierarchy_to_sparse
from censusdp.estimation.release import Release, ReleaseProtocol
from censusdp.estimation.rounding import (
    pipage_round,
    round_bipartite,
    round_release,
    round_tree,
    rounding_variance,
)
from censusdp.estimation.structured_gls import StructuredRelease, structured_gls
from censusdp.estimation.topdown import topdown
from censusdp.estimation.uncertainty import (
    coverage,
    intervals,
    lattice_intervals,
    standard_errors,
)

__all__ = [
    "Release",
    "ReleaseProtocol",
    "tree_gls",
    "condition",
    "conditioned_mechanism",
    "topdown",
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
    "lattice_intervals",
]
