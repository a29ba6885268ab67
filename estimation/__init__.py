"""censusdp.estimation — projection (GLS), conditioning (MCMC), the conditioned mechanism
ℳ_MH, TopDown-style baseline, unbiased rounding and uncertainty.

Layout: :mod:`~censusdp.estimation.release` and :mod:`~censusdp.estimation.covariance` (one
``Release`` family over one ``Covariance``), :mod:`~censusdp.estimation.uncertainty`;
``gls/`` (the public two-pass kernel, its flat ``tree`` and ``structured`` front ends,
prediction before noise, areas, allocation), ``integer/`` (laminar, controlled and dependent
rounding, the non-negative product, the lattice release policy), ``topdown/`` (the Bureau's
multi-pass baseline), ``conditioning/`` (MCMC and the conditioned mechanism).

Every estimator takes ``(hierarchy, cells, measurements, invariants, privacy)``; ``privacy``
None derives the statement from the measurements, and a statement that claims less than they
spend is refused (:mod:`censusdp.mechanisms.privacy`)."""

from censusdp.estimation.conditioning.estimator import condition
from censusdp.estimation.conditioning.mechanism import conditioned_mechanism
from censusdp.estimation.gls.sparse import general_gls, hierarchy_to_sparse
from censusdp.estimation.gls.structured import StructuredRelease, structured_gls
from censusdp.estimation.gls.tree import NodeVarianceMeasurement, tree_gls
from censusdp.estimation.integer.laminar import (
    pipage_round,
    round_bipartite,
    round_release,
    round_tree,
    rounding_variance,
)
from censusdp.estimation.release import Release, ReleaseProtocol
from censusdp.estimation.uncertainty import coverage, lattice_intervals

__all__ = [
    "Release",
    "ReleaseProtocol",
    "tree_gls",
    "condition",
    "conditioned_mechanism",
    "NodeVarianceMeasurement",
    "general_gls",
    "hierarchy_to_sparse",
    "pipage_round",
    "round_tree",
    "round_bipartite",
    "round_release",
    "rounding_variance",
    "coverage",
    "structured_gls",
    "StructuredRelease",
    "lattice_intervals",
]
