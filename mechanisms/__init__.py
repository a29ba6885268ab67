"""censusdp.mechanisms — noise laws, exact samplers, calibration, subspace mechanisms,
lattice, matrix masking and Blowfish."""

from censusdp.mechanisms.laws import Gaussian, Laplace, NoiseLaw
from censusdp.mechanisms.queries import Invariant, Measurement, Query, invariant, measure

__all__ = [
    "NoiseLaw",
    "Laplace",
    "Gaussian",
    "Query",
    "Measurement",
    "Invariant",
    "measure",
    "invariant",
]
