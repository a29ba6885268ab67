"""The noise-law registry: the one place that knows which noise laws exist.

Every law class registers itself with :func:`register_law` where it is defined; everything
that maps a noise name to a law, to its accounting, to its calibration or to its
capabilities asks this registry (:func:`law_info`). An unknown name is a
:class:`~censusdp.errors.SpecError` listing the registered laws; there is no default law.

A law's accounting fixes how its ``privacy`` and calibration read a budget and a
sensitivity: a ``"pure"`` law spends ε = f(Δ₁) and is calibrated by ``from_epsilon``; a
``"zcdp"`` law spends ρ = f(Δ₂) and is calibrated by ``from_rho``. So a pure-ε law never
reads ε as ρ: the registry refuses to register a law whose calibration is missing.

Adding a law: define its class (a :class:`~censusdp.mechanisms.laws.NoiseLaw` with ``name``,
``accounting``, ``is_integer``, ``sample``, ``log_density``, ``variance``, ``privacy`` and the
calibration classmethod of its accounting) decorated with ``@register_law``; specs, plans,
statements and the contract tests pick it up from here. A law in another package is
declared in its ``pyproject.toml``::

    [project.entry-points."censusdp.noise_laws"]
    staircase = "my_laws:Staircase"     # the law's name = its class's ``name``

and is loaded on the registry's first lookup (:class:`censusdp.registry.Registry`), checked
by :func:`register_law` like a built-in law: its privacy is still derived from its own
``privacy(sensitivity)``, never stated by the package.

References
----------
Dwork & Roth (2014), Thm. 3.6 (Laplace: ε = Δ₁/b); Bun & Steinke (2016), Prop. 1.6
(Gaussian: ρ = Δ₂²/(2σ²)); Canonne, Kamath & Steinke (2020), Thm. 14 (discrete Gaussian).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from censusdp.budget import ACCOUNTINGS, Accounting
from censusdp.errors import SpecError
from censusdp.registry import Registry

if TYPE_CHECKING:
    from censusdp.mechanisms.laws import NoiseLaw

__all__ = [
    "CAPABILITIES",
    "LawInfo",
    "NOISE_LAWS",
    "calibrate",
    "gaussian_conditionable",
    "law_info",
    "noise_names",
    "register_law",
]

#: The sensitivity norm each accounting's privacy function and calibration read.
SENSITIVITY_NORM = {Accounting.PURE: 1, Accounting.ZCDP: 2}

#: The calibration classmethod each accounting requires: budget, sensitivity → law.
CALIBRATION = {Accounting.PURE: "from_epsilon", Accounting.ZCDP: "from_rho"}

#: Optional law properties that, when not None, give a sampler exact line conditionals:
#: ``l1_rate`` (Laplace-type, log-density −β|x|) and ``l2_precision`` (Gaussian-type,
#: −½px²).
CAPABILITIES = ("l1_rate", "l2_precision")

#: Every registered noise law, by name (built-in laws register on import; other packages'
#: through the ``censusdp.noise_laws`` entry points, loaded on the first lookup).
NOISE_LAWS: Registry[LawInfo] = Registry(
    "noise law",
    entry_points="censusdp.noise_laws",
    register=lambda name, cls: register_law(cls),
)


@dataclass(frozen=True)
class LawInfo:
    """What the registry knows of one noise law.

    Attributes
    ----------
    name : str
        The name used in specs, manifests and statements.
    law : type
        The :class:`~censusdp.mechanisms.laws.NoiseLaw` subclass.
    accounting : Accounting
        The accountant that composes its privacy loss.
    integer : bool
        True when its draws are integers (exact sampling, no floating-point weakness).
    capabilities : frozenset of str
        Those of :data:`CAPABILITIES` the class provides.
    """

    name: str
    law: type
    accounting: Accounting
    integer: bool
    capabilities: frozenset[str]

    @property
    def norm(self) -> int:
        """The sensitivity norm its privacy function reads: 1 (pure) or 2 (zCDP)."""
        return SENSITIVITY_NORM[self.accounting]

    @property
    def unit(self) -> str:
        """``"epsilon"`` or ``"rho"``."""
        return ACCOUNTINGS[self.accounting]

    def has(self, capability: str) -> bool:
        """True when the law provides ``capability`` (one of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise SpecError(
                f"unknown noise-law capability {capability!r}; known: {list(CAPABILITIES)}"
            )
        return capability in self.capabilities

    def calibrate(self, budget: float, sensitivity: float) -> NoiseLaw:
        """The law spending ``budget`` (ε or ρ, by its accounting) on a query of the given
        sensitivity (ℓ₁ or ℓ₂, by its accounting)."""
        return getattr(self.law, CALIBRATION[self.accounting])(budget, sensitivity)


def register_law(cls: type) -> type:
    """Class decorator: register a :class:`~censusdp.mechanisms.laws.NoiseLaw` subclass.

    Raises
    ------
    SpecError
        No name, a name already taken, an accounting other than ``"pure"``/``"zcdp"``, or no
        calibration classmethod for its accounting.
    """
    from censusdp.mechanisms.laws import NoiseLaw

    if not (isinstance(cls, type) and issubclass(cls, NoiseLaw)):
        raise SpecError(f"{cls!r} is not a NoiseLaw subclass; only noise laws are registered")
    accounting = cls.accounting
    if accounting not in SENSITIVITY_NORM:
        raise SpecError(
            f"noise law {cls.name!r} declares accounting {accounting!r}; it must be one of "
            f"{list(SENSITIVITY_NORM)}"
        )
    # The law's declaration is read once here: a third-party law may still declare the
    # string; the registry and the class hold the member from now on.
    accounting = cls.accounting = Accounting(accounting)
    method = CALIBRATION[accounting]
    if not callable(getattr(cls, method, None)):
        raise SpecError(
            f"noise law {cls.name!r} is accounted under {accounting!r} and needs a "
            f"{method}(budget, sensitivity) classmethod"
        )
    caps = frozenset(c for c in CAPABILITIES if getattr(cls, c) is not getattr(NoiseLaw, c))
    NOISE_LAWS.add(cls.name, LawInfo(cls.name, cls, accounting, bool(cls.is_integer), caps))
    return cls


def law_info(law: str | NoiseLaw, where: str = "") -> LawInfo:
    """The registry entry of a noise name or of a law object.

    Raises
    ------
    SpecError
        An unknown name (the message lists the registered laws), prefixed by ``where``.
    """
    return NOISE_LAWS.get(law if isinstance(law, str) else law.name, where)


def calibrate(noise: str, budget: float, sensitivity: float, where: str = "") -> NoiseLaw:
    """The law named ``noise`` calibrated to spend ``budget`` at ``sensitivity``."""
    return law_info(noise, where).calibrate(budget, sensitivity)


def noise_names(
    *, integer: bool | None = None, accounting: Accounting | str | None = None
) -> tuple[str, ...]:
    """Registered law names, optionally only integer (or continuous) ones or one accounting."""
    return NOISE_LAWS.select(
        lambda e: (
            (integer is None or e.integer == integer)
            and (accounting is None or e.accounting == accounting)
        )
    )


def gaussian_conditionable(law: NoiseLaw) -> bool:
    """True when conditioning ``law``'s noise on linear constraints is Gaussian in closed
    form: a real-valued (not integer) law with a Gaussian density (``l2_precision``). The
    conditioning estimators then draw exactly, without MCMC (the conditioned law of a
    Gaussian vector on an affine subspace is the law of its GLS projection; Rao 1973, §8a).
    """
    return law.l2_precision is not None and not law.is_integer
