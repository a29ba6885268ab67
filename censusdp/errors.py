"""Error types of censusdp.

Every message says what is wrong, where (file, row, column, code, level or spec key) and how
to fix it. Messages never contain confidential values (counts, cell values): they name
locations, not data. The CLI maps every :class:`CensusDPError` to exit status 2.
"""

from __future__ import annotations

__all__ = [
    "CensusDPError",
    "SpecError",
    "DataError",
    "HierarchyError",
    "BudgetError",
    "ConvergenceError",
    "SolverError",
    "ExecutionError",
]


class CensusDPError(Exception):
    """Base class: a user-facing error with a clear, non-confidential message."""


class SpecError(CensusDPError, ValueError):
    """A run specification (TOML) is malformed: unknown key, wrong type, bad value."""


class DataError(CensusDPError, ValueError):
    """Input data is malformed: negative, non-integer, missing counts, bad encoding, ..."""


class HierarchyError(CensusDPError, ValueError):
    """A geography does not form a valid hierarchy (cycles, orphans, non-nesting codes, ...)."""


class BudgetError(CensusDPError, ValueError):
    """A privacy budget is invalid: non-positive, shares not summing to 1, overspent."""


class ConvergenceError(CensusDPError, RuntimeError):
    """An MCMC sampler did not reach its requested total-variation bound or R-hat."""


class SolverError(CensusDPError, RuntimeError):
    """An optimisation solver failed; the message names the node whose problem failed."""


class ExecutionError(CensusDPError, RuntimeError):
    """The machinery running the work failed, not the input: a Dask worker process died (killed,
    out of memory) or a local cluster could not start. Nothing was written; the message says
    how to retry."""
