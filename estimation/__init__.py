"""censusdp.estimation — projection (GLS), conditioning (MCMC), TopDown-style baseline,
unbiased rounding and uncertainty."""

from censusdp.estimation.release import Release

__all__ = ["Release"]
