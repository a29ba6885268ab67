"""Privacy budgets, accounting and the privacy statement every release carries.

Two accountants: pure ε (Laplace, discrete Laplace; sequential composition adds ε) and
ρ-zCDP (Gaussian, discrete Gaussian; ρ adds). With invariants the guarantee is *induced
subspace DP* (Gao, Gong & Yu 2022, Def. 6), equivalently DP over databases that share the
invariants (Dharangutte et al., integer subspace DP, Def. 2): never plain ε-DP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["PrivacyStatement"]


@dataclass(frozen=True)
class PrivacyStatement:
    """An honest statement of what a release guarantees.

    Parameters
    ----------
    accounting : {"pure", "zcdp"}
        Pure ε-DP composition or ρ-zCDP composition.
    epsilon : float or None
        Total ε for pure accounting.
    rho : float or None
        Total ρ for zCDP accounting.
    delta : float or None
        δ at which a zCDP budget is also reported as (ε, δ).
    invariants : tuple of str
        Human-readable names of the statistics released exactly, e.g. ``"state: total"``.
    geometry : str
        ``"euclidean"`` (the projection Π_N of the subspace-DP paper) or ``"weighted"``
        (Σ⁻¹-weighted GLS projection: subspace DP in the weighted geometry).
    data_dependent : bool
        True when a data-dependent step (e.g. non-negativity conditioning in MCMC) was used:
        the plain DP argument then no longer covers the output.
    mechanism : str
        The noise law / mechanism, e.g. ``"discrete_gaussian"``.
    notes : tuple of str
        Further qualifications (MCMC total-variation bound, ...).
    """

    accounting: str
    epsilon: float | None = None
    rho: float | None = None
    delta: float | None = None
    invariants: tuple[str, ...] = ()
    geometry: str = "euclidean"
    data_dependent: bool = False
    mechanism: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.accounting not in ("pure", "zcdp"):
            raise ValueError("accounting must be 'pure' or 'zcdp'")
        if self.accounting == "pure" and self.epsilon is None:
            raise ValueError("pure accounting needs epsilon")
        if self.accounting == "zcdp" and self.rho is None:
            raise ValueError("zcdp accounting needs rho")

    @property
    def guarantee(self) -> str:
        """The kind of guarantee: plain DP only when nothing is held invariant."""
        if self.invariants:
            return "induced subspace differential privacy"
        return "differential privacy"

    def with_notes(self, *notes: str, data_dependent: bool | None = None) -> PrivacyStatement:
        """A copy with extra notes (and optionally the data-dependence flag set)."""
        return PrivacyStatement(
            accounting=self.accounting,
            epsilon=self.epsilon,
            rho=self.rho,
            delta=self.delta,
            invariants=self.invariants,
            geometry=self.geometry,
            data_dependent=self.data_dependent if data_dependent is None else data_dependent,
            mechanism=self.mechanism,
            notes=self.notes + tuple(notes),
        )

    def budget_text(self) -> str:
        if self.accounting == "pure":
            return f"ε = {self.epsilon:g} (pure)"
        text = f"ρ = {self.rho:g} (zCDP)"
        if self.delta is not None:
            eps = self.rho + 2.0 * math.sqrt(self.rho * math.log(1.0 / self.delta))
            text += f", implying (ε = {eps:.4g}, δ = {self.delta:g})"
        return text

    def text(self) -> str:
        """One paragraph for reports and manifests."""
        parts = [f"{self.guarantee}, {self.budget_text()}"]
        if self.mechanism:
            parts.append(f"mechanism: {self.mechanism}")
        if self.invariants:
            inv = "; ".join(self.invariants)
            parts.append(
                f"invariants released exactly: {inv}; the guarantee holds for databases "
                "that share these invariants (induced subspace DP), not plain DP"
            )
            if self.geometry == "weighted":
                parts.append("projection in the Σ⁻¹-weighted geometry (subspace DP in that metric)")
        if self.data_dependent:
            parts.append(
                "a data-dependent step was used (e.g. non-negativity): the plain DP "
                "argument does not cover this output"
            )
        parts.extend(self.notes)
        return ". ".join(parts) + "."

    def to_dict(self) -> dict:
        return {
            "guarantee": self.guarantee,
            "accounting": self.accounting,
            "epsilon": self.epsilon,
            "rho": self.rho,
            "delta": self.delta,
            "invariants": list(self.invariants),
            "geometry": self.geometry,
            "data_dependent": self.data_dependent,
            "mechanism": self.mechanism,
            "notes": list(self.notes),
            "text": self.text(),
        }
