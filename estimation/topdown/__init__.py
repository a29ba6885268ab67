"""The TopDown-style baseline: the U.S. Census Bureau's 2020 multi-pass algorithm with open solvers."""

from censusdp.estimation.topdown.flat import topdown

__all__ = ["topdown"]
