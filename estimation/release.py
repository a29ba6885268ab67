"""The :class:`Release` every estimator returns: estimates for every level and cell, their
exact (or Monte Carlo) variances, diagnostics and the privacy statement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import floating_point_note

__all__ = ["Release"]


@dataclass(eq=False)
class Release:
    """A consistent, invariant-respecting release.

    Attributes
    ----------
    estimator : str
        ``"gls"``, ``"conditioning"``, ``"topdown"``, ``"lattice"``, ...
    hierarchy : Hierarchy
    cells : tuple of str
    estimates : list of numpy.ndarray
        Per level (root first), shape (n_nodes, n_cells); float64, or int64 when ``integer``.
    variances : list of numpy.ndarray or None
        Per level, per node and cell, the variance of the estimate's error (exact for GLS;
        Monte Carlo for averaged MCMC output); None where not defined (TopDown-style).
    privacy : PrivacyStatement
    integer : bool
        True when the estimates are integers.
    diagnostics : dict
        Estimator-specific facts (TV bound, R-hat, solver status, timings...).
    covariances : list of numpy.ndarray or None
        Optional per-node covariance, per level (n_nodes, n_cells, n_cells).
    """

    estimator: str
    hierarchy: Hierarchy
    cells: tuple[str, ...]
    estimates: list[np.ndarray]
    variances: list[np.ndarray] | None
    privacy: PrivacyStatement
    integer: bool = False
    diagnostics: dict = field(default_factory=dict)
    covariances: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        self.cells = tuple(self.cells)
        self.privacy = floating_point_note(self.privacy)  # continuous laws: Mironov (2012)
        if len(self.estimates) != self.hierarchy.depth:
            raise ValueError("a Release needs one estimate array per level")
        for lv, est in zip(self.hierarchy.levels, self.estimates, strict=True):
            if est.shape != (lv.size, len(self.cells)):
                raise ValueError(
                    f"level {lv.name!r}: estimates must be ({lv.size}, {len(self.cells)})"
                )

    def level(self, level: str | int) -> np.ndarray:
        """Estimates at one level, (n_nodes, n_cells)."""
        return self.estimates[self.hierarchy.level_index(level)]

    def standard_errors(self, level: str | int) -> np.ndarray | None:
        """Standard errors at one level, or None when the estimator has none."""
        if self.variances is None:
            return None
        return np.sqrt(self.variances[self.hierarchy.level_index(level)])

    def totals(self, level: str | int) -> np.ndarray:
        """Node totals (sum over cells) at one level."""
        return self.level(level).sum(axis=1)

    def to_frame(self, levels: Sequence[str | int] | None = None) -> pd.DataFrame:
        """Long table: level, code, cell, estimator, value, se (se NaN where undefined)."""
        ks = (
            range(self.hierarchy.depth)
            if levels is None
            else [self.hierarchy.level_index(k) for k in levels]
        )
        frames = []
        n_cells = len(self.cells)
        for k in ks:
            lv = self.hierarchy.levels[k]
            est = self.estimates[k]
            se = self.standard_errors(k)
            frames.append(
                pd.DataFrame(
                    {
                        "level": np.repeat(lv.name, lv.size * n_cells),
                        "code": np.repeat(lv.codes.astype(object), n_cells),
                        "cell": np.tile(np.asarray(self.cells, dtype=object), lv.size),
                        "estimator": self.estimator,
                        "value": est.reshape(-1).astype(np.float64),
                        "se": np.full(est.size, np.nan) if se is None else se.reshape(-1),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)
