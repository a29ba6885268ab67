"""Noise laws: one class per law, each a sampler, a (log-)density, a variance and a privacy
function. The same object draws unconstrained noise and serves as an MCMC target.

Continuous laws (:class:`Laplace`, :class:`Gaussian`) exist for the seeds' real-valued
mechanisms; they use floating-point sampling and are **not floating-point safe** (Mironov 2012:
the set of doubles a floating-point Laplace sampler can return depends on the value it is added
to, so some outputs reveal the input exactly). A run spec takes them only with ``[mechanism]
allow_floating_point = true``, and every privacy statement of a release made with one carries
:data:`FLOATING_POINT_NOTE` (:func:`floating_point_note`).
The exact integer laws (:class:`~censusdp.mechanisms.discrete.DiscreteLaplace`,
:class:`~censusdp.mechanisms.discrete.DiscreteGaussian`) live in
:mod:`censusdp.mechanisms.discrete`; calibration helpers in
:mod:`censusdp.mechanisms.calibration`.

References
----------
Dwork, McSherry, Nissim & Smith (2006), the Laplace mechanism.
Bun & Steinke (2016), zero-concentrated DP: a Gaussian of scale σ on a query of ℓ₂
sensitivity Δ is ρ-zCDP with ρ = Δ² / (2σ²).
Mironov (2012), "On significance of the least significant bits for differential privacy",
ACM CCS (floating-point attacks on textbook Laplace sampling).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from censusdp.budget import Accounting
from censusdp.mechanisms.registry import NOISE_LAWS, register_law

if TYPE_CHECKING:
    from censusdp.budget import PrivacyStatement

__all__ = [
    "FLOATING_POINT_NOTE",
    "NoiseLaw",
    "Laplace",
    "Gaussian",
    "floating_point_note",
]

#: What every privacy statement of a release made with floating-point noise says.
FLOATING_POINT_NOTE = (
    "floating-point noise: this implementation samples the continuous law in floating point "
    "and is not protected against floating-point attacks (Mironov 2012), so the guarantee "
    "above is that of the ideal real-valued mechanism and may not hold for these outputs; "
    "the exact discrete laws (discrete_laplace, discrete_gaussian) do not have this weakness"
)


def floating_point_note(
    statement: PrivacyStatement, *, continuous: bool | None = None
) -> PrivacyStatement:
    """``statement`` with :data:`FLOATING_POINT_NOTE` among its notes (once) when the noise
    was continuous: ``continuous``, or by default when its mechanism names a registered law
    that is not integer (:mod:`censusdp.mechanisms.registry`; a statement of several laws
    names them separated by ``", "``). Otherwise ``statement`` itself.

    References
    ----------
    Mironov (2012).
    """
    if continuous is None:
        continuous = any(
            name in NOISE_LAWS and not NOISE_LAWS.get(name).integer
            for name in statement.mechanism.split(", ")
        )
    if not continuous or FLOATING_POINT_NOTE in statement.notes:
        return statement
    return statement.with_notes(FLOATING_POINT_NOTE)


class NoiseLaw(ABC):
    """A zero-centred noise distribution used by a mechanism.

    Attributes
    ----------
    name : str
        Short identifier used in specs and manifests (``"laplace"``, ``"discrete_gaussian"``).
    is_integer : bool
        True when draws are integers (and :meth:`log_density` is a log-mass).
    accounting : Accounting
        Which accountant composes this law's privacy loss.
    """

    name: str = ""
    is_integer: bool = False
    accounting: Accounting = Accounting.PURE

    @abstractmethod
    def sample(self, stream: np.random.Generator, size: int) -> np.ndarray:
        """``size`` independent draws (float64, or int64 for integer laws)."""

    def sample_window(
        self, stream: np.random.Generator, size: int, start: int, stop: int
    ) -> np.ndarray:
        """Draws ``[start, stop)`` of ``sample(stream, size)``, bit for bit (laws whose sampler
        can start mid-stream override this to draw only those)."""
        return self.sample(stream, size)[start:stop]

    @abstractmethod
    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Normalised log-density (continuous) or log-mass (integer) at ``x``, elementwise."""

    @property
    @abstractmethod
    def variance(self) -> float:
        """Variance of one draw."""

    @abstractmethod
    def privacy(self, sensitivity: float) -> float:
        """Privacy loss for a query of the given sensitivity: ε (pure) or ρ (zCDP).

        The sensitivity is ℓ₁ for pure laws and ℓ₂ for zCDP laws.
        """

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)

    @property
    def l1_rate(self) -> float | None:
        """β when ``log_density(x) = −β |x| + const`` (Laplace-type laws), else None.

        MCMC samplers use it to draw exactly from the law's conditionals along a line
        (:mod:`censusdp.estimation.conditioning.line_conditional`).
        """
        return None

    @property
    def l2_precision(self) -> float | None:
        """p = 1/σ² when ``log_density(x) = −½ p x² + const`` (Gaussian-type laws: Gaussian,
        discrete Gaussian), else None.

        MCMC samplers use it to draw exactly from the law's conditionals along a line
        (:mod:`censusdp.estimation.conditioning.gaussian_line`).
        """
        return None


@register_law
class Laplace(NoiseLaw):
    """Laplace(0, b): density exp(−|x|/b) / (2b); ε = Δ₁ / b.

    Parameters
    ----------
    scale : float
        b > 0.
    """

    name = "laplace"
    is_integer = False
    accounting = Accounting.PURE

    def __init__(self, scale: float) -> None:
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError("Laplace scale must be a positive finite number")
        self.scale = float(scale)

    @classmethod
    def from_epsilon(cls, epsilon: float, sensitivity: float = 1.0) -> Laplace:
        """b = Δ₁ / ε (:func:`censusdp.mechanisms.calibration.laplace_scale`: ε and b in range)."""
        from censusdp.mechanisms.calibration import laplace_scale

        if not epsilon > 0 or not sensitivity > 0:
            raise ValueError("epsilon and sensitivity must be positive")
        return cls(laplace_scale(epsilon, sensitivity))

    @classmethod
    def from_epsilon_delta(cls, epsilon: float, delta: float, sensitivity: float = 1.0) -> Laplace:
        """The pure mechanism ignores δ: b = Δ₁/ε (ε-DP implies (ε, δ)-DP)."""
        return cls.from_epsilon(epsilon, sensitivity)

    def sample(self, stream: np.random.Generator, size: int) -> np.ndarray:
        return stream.laplace(0.0, self.scale, size=size)

    def log_density(self, x: np.ndarray) -> np.ndarray:
        return -np.abs(x) / self.scale - math.log(2.0 * self.scale)

    @property
    def l1_rate(self) -> float:
        return 1.0 / self.scale

    @property
    def variance(self) -> float:
        return 2.0 * self.scale**2

    def privacy(self, sensitivity: float) -> float:
        return float(sensitivity) / self.scale

    def __repr__(self) -> str:
        return f"Laplace(scale={self.scale:g})"


@register_law
class Gaussian(NoiseLaw):
    """N(0, σ²); ρ = Δ₂² / (2σ²) (zCDP).

    Parameters
    ----------
    sigma : float
        Standard deviation σ > 0.
    """

    name = "gaussian"
    is_integer = False
    accounting = Accounting.ZCDP

    def __init__(self, sigma: float) -> None:
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError("Gaussian sigma must be a positive finite number")
        self.sigma = float(sigma)

    @classmethod
    def from_rho(cls, rho: float, sensitivity: float = 1.0) -> Gaussian:
        """σ = Δ₂ / √(2ρ) (:func:`censusdp.budget.gaussian_sigma`: ρ and σ in range)."""
        from censusdp.budget import gaussian_sigma

        if not rho > 0 or not sensitivity > 0:
            raise ValueError("rho and sensitivity must be positive")
        return cls(gaussian_sigma(rho, sensitivity))

    @classmethod
    def from_epsilon_delta(
        cls,
        epsilon: float,
        delta: float,
        sensitivity: float = 1.0,
        method: str = "analytic",
    ) -> Gaussian:
        """σ for (ε, δ)-DP: ``"analytic"`` (Balle & Wang 2018; the default, exact),
        ``"classical"`` σ = c(ε, δ)·Δ₂ with c = (1 + √(1 + ln(1/δ)))/ε (the seeds' Lemma 13,
        for reproducing the papers), or ``"zcdp"`` / ``"zcdp_cks"`` (through ρ); see
        :func:`censusdp.mechanisms.calibration.gaussian_sigma_for`.
        """
        from censusdp.mechanisms.calibration import gaussian_sigma_for

        return cls(gaussian_sigma_for(epsilon, delta, sensitivity, method))

    def sample(self, stream: np.random.Generator, size: int) -> np.ndarray:
        return stream.normal(0.0, self.sigma, size=size)

    def log_density(self, x: np.ndarray) -> np.ndarray:
        return -0.5 * (np.asarray(x) / self.sigma) ** 2 - math.log(
            self.sigma * math.sqrt(2 * math.pi)
        )

    @property
    def l2_precision(self) -> float:
        return 1.0 / self.sigma**2

    @property
    def variance(self) -> float:
        return self.sigma**2

    def privacy(self, sensitivity: float) -> float:
        return float(sensitivity) ** 2 / (2.0 * self.sigma**2)

    def __repr__(self) -> str:
        return f"Gaussian(sigma={self.sigma:g})"
