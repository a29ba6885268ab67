"""Privacy budgets, accounting and the privacy statement every release carries.

Two accountants: pure ε (Laplace, discrete Laplace; sequential composition adds ε) and
ρ-zCDP (Gaussian, discrete Gaussian; ρ adds). With invariants the guarantee is *induced
subspace DP* (Gao, Gong & Yu 2022, Def. 6), equivalently DP over databases that share the
invariants (Dharangutte et al., integer subspace DP, Def. 2): never plain ε-DP.

Contents: the typed accounting :class:`Accounting` (``PURE``/``ZCDP``, each its wire
string; the library compares members, strings are parsed once at the edge); conversions
between pure DP, zCDP and (ε, δ)-DP (:func:`zcdp_to_dp`, :func:`zcdp_to_dp_cks`,
:func:`dp_to_zcdp`, :func:`pure_to_zcdp`, :func:`gaussian_rho`, :func:`gaussian_sigma`);
typed losses (:class:`PureDP`, :class:`ZCDP`: ``+`` composes, ``split`` divides, ``covers``
checks a claim; :func:`compose`); accountants (:class:`PureAccountant`, :class:`ZCDPAccountant`);
the split of a total budget per level and query (:func:`allocate`); and
:class:`PrivacyStatement` with its builder :func:`statement_for`.

References
----------
Bun & Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower
Bounds", TCC 2016 (Prop. 1.3: ρ-zCDP ⇒ (ρ + 2√(ρ ln(1/δ)), δ)-DP; Prop. 1.4: ε-DP ⇒
(ε²/2)-zCDP; Prop. 1.6: Gaussian ρ = Δ²/(2σ²); Lemma 2.3: composition adds ρ).
Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020
(Prop. 12 and Cor. 13: the tighter zCDP → (ε, δ) conversion).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self

from censusdp.errors import BudgetError

__all__ = [
    "ACCOUNTINGS",
    "Accounting",
    "EPSILON_RANGE",
    "RHO_RANGE",
    "SCALE_RANGE",
    "SHARE_TOLERANCE",
    "SPEND_TOLERANCE",
    "Budget",
    "PrivacyLoss",
    "PureDP",
    "ZCDP",
    "compose",
    "loss",
    "Accountant",
    "LedgerEntry",
    "NEIGHBOURS",
    "POST_PROCESSING_READS",
    "PrivacyStatement",
    "Product",
    "PureAccountant",
    "Step",
    "ZCDPAccountant",
    "accountant_for",
    "allocate",
    "check_delta",
    "check_epsilon",
    "check_rho",
    "check_scale",
    "dp_to_zcdp",
    "gaussian_rho",
    "gaussian_sigma",
    "invariant_labels",
    "pure_to_zcdp",
    "statement_for",
    "with_invariants",
    "with_products",
    "zcdp_to_dp",
    "zcdp_to_dp_cks",
]


class Accounting(StrEnum):
    """The two accountants, typed: every library comparison and every law's
    ``accounting`` uses these members; the strings exist only at the edge (specs, CLI,
    JSON), where :meth:`parse` reads them once.

    A member *is* its wire string (``Accounting.ZCDP == "zcdp"``, ``str``, ``format`` and
    JSON give ``"zcdp"``, and it hashes as the string), so manifests written from a member
    are byte-identical to those written from the old strings, and a mapping keyed by the
    strings (:data:`ACCOUNTINGS`) is read with a member. ``repr`` is the string's too, so
    a message that quotes an accounting reads as before.

    ``PURE``: pure ε-DP, ε adds (Dwork & Roth 2014, Thm. 3.16); ``ZCDP``: ρ-zCDP, ρ adds
    (Bun & Steinke 2016, Lemma 2.3).
    """

    PURE = "pure"
    ZCDP = "zcdp"

    def __repr__(self) -> str:
        return repr(self.value)

    @property
    def unit(self) -> str:
        """The unit of this accounting's budget: ``"epsilon"`` or ``"rho"``."""
        return ACCOUNTINGS[self]

    @classmethod
    def parse(cls, value: object, where: str = "accounting") -> Accounting:
        """The member named by ``value`` (a member or its string), read once at the edge.

        Raises
        ------
        BudgetError
            One line naming ``where`` and the accepted names, when ``value`` names neither.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        names = " or ".join(repr(m.value) for m in cls)
        raise BudgetError(f"{where} must be {names}, got {value!r}")


#: The two accounting modes and the unit of their budget.
ACCOUNTINGS = {"pure": "epsilon", "zcdp": "rho"}

# --------------------------------------------------------------------------------------------
# Conversions


def check_positive(name: str, value: float) -> float:
    """``value`` as a float, or :class:`BudgetError` unless positive and finite."""
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise BudgetError(f"{name} must be a positive finite number, got {value!r}")
    return value


#: Supported ranges of the privacy parameters and noise scales (data units). Outside them the
#: conversions overflow, underflow or lose all precision (e^ε beyond ε ≈ 709, ρ·ln(1/δ) in
#: double precision), or the exact samplers' int64 noise could overflow; no census release
#: needs values outside them.
EPSILON_RANGE = (1e-12, 1e4)
RHO_RANGE = (1e-24, 1e12)
SCALE_RANGE = (1e-6, 1e12)


def _check_range(name: str, value: float, bounds: tuple[float, float], fix: str) -> float:
    value = float(value)
    lo, hi = bounds
    if not (value > 0 and math.isfinite(value)):  # NaN, ≤ 0 (or underflowed), inf
        raise BudgetError(
            f"{name} must be a positive finite number within the supported range "
            f"[{lo:g}, {hi:g}], got {value!r}"
        )
    if not lo <= value <= hi:
        raise BudgetError(
            f"{name} = {value:g} is outside the supported range [{lo:g}, {hi:g}]; {fix}"
        )
    return value


def check_epsilon(value: float, name: str = "epsilon") -> float:
    """ε as a float, or :class:`BudgetError` naming :data:`EPSILON_RANGE`."""
    return _check_range(
        name,
        value,
        EPSILON_RANGE,
        "beyond ε = 1e4 a guarantee means nothing (and e^ε overflows past 709); below 1e-12 "
        "the noise scale exceeds every supported scale",
    )


def check_rho(value: float, name: str = "rho") -> float:
    """ρ as a float, or :class:`BudgetError` naming :data:`RHO_RANGE`."""
    return _check_range(
        name, value, RHO_RANGE, "give ρ (zCDP) within it (σ = Δ₂/√(2ρ) must be a usable scale)"
    )


def check_scale(value: float, name: str = "noise scale") -> float:
    """A noise scale (σ, b, t) as a float, or :class:`BudgetError` naming :data:`SCALE_RANGE`."""
    return _check_range(
        name,
        value,
        SCALE_RANGE,
        "noise scales must keep the exact samplers' integer noise within int64 and above "
        "the rational grid; check the budget and sensitivity that produced it",
    )


def check_delta(delta: float) -> float:
    """``delta`` as a float, or :class:`BudgetError` unless 0 < δ < 1."""
    delta = float(delta)
    if not 0 < delta < 1:
        raise BudgetError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    return delta


def zcdp_to_dp(rho: float, delta: float) -> float:
    """ε of the (ε, δ)-DP guarantee implied by ρ-zCDP (the simple bound).

    ε = ρ + 2√(ρ ln(1/δ)).

    Parameters
    ----------
    rho : float
        ρ ≥ 0.
    delta : float
        δ in (0, 1).

    Returns
    -------
    float
        ε ≥ 0.

    References
    ----------
    Bun & Steinke (2016), Proposition 1.3.
    """
    rho = float(rho)
    if rho != 0:
        rho = check_rho(rho)
    delta = check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * -math.log(delta))


def zcdp_to_dp_cks(rho: float, delta: float) -> float:
    """ε of the (ε, δ)-DP guarantee implied by ρ-zCDP (the tighter CKS conversion).

    ρ-zCDP gives (α, αρ)-Rényi DP for every α > 1, and (α, τ)-RDP gives (ε, δ)-DP with
    δ = exp((α−1)(τ−ε)) / (α−1) · (1 − 1/α)^α. Solving for ε with τ = αρ,

        ε(α) = αρ + (ln(1/δ) − ln α) / (α−1) + ln(1 − 1/α),

    and ε = inf over α > 1 of ε(α). Writing x = α − 1, dε/dα = ρ − (ln(1/δ) − ln α) / x²,
    so the infimum is attained at the unique root of g(x) = ρx² + ln(1+x) − ln(1/δ) on
    (0, √(ln(1/δ)/ρ)] (g < 0 at 0, g > 0 at the right end), found with Brent's method. At
    the root ε = ρ(1 + 2x) + ln(x / (1+x)). The result is clipped below at 0 (a negative ε
    carries no meaning; ε = 0 is the weaker, still valid, claim). It never exceeds
    :func:`zcdp_to_dp`, the α-wise minimum of the same bound without the last two terms.

    Parameters
    ----------
    rho : float
        ρ ≥ 0.
    delta : float
        δ in (0, 1).

    Returns
    -------
    float
        ε ≥ 0.

    References
    ----------
    Canonne, Kamath & Steinke (2020), Proposition 12 and Corollary 13.
    """
    rho = float(rho)
    if rho != 0:
        rho = check_rho(rho)
    delta = check_delta(delta)
    if rho == 0:
        return 0.0
    log_inv_delta = -math.log(delta)

    def g(x: float) -> float:
        return rho * x * x + math.log1p(x) - log_inv_delta

    from scipy.optimize import brentq  # here, not at import: the CLI's start stays light

    hi = math.sqrt(log_inv_delta / rho)
    x = brentq(g, 0.0, hi, xtol=1e-300, rtol=1e-15, maxiter=500)
    eps = rho * (1.0 + 2.0 * x) + math.log(x / (1.0 + x))
    # ε(α) is flat at its minimum, so the root's error barely moves ε; never report less
    # than the bound evaluated directly at that α.
    alpha = 1.0 + x
    direct = alpha * rho + (log_inv_delta - math.log(alpha)) / x + math.log(x / alpha)
    return max(0.0, eps, direct)


def dp_to_zcdp(eps: float, delta: float, *, tight: bool = False) -> float:
    """The largest ρ whose (ε, δ) conversion does not exceed ``eps``.

    The inverse of :func:`zcdp_to_dp` (closed form ρ = (√(ln(1/δ) + ε) − √ln(1/δ))²), or of
    :func:`zcdp_to_dp_cks` when ``tight`` (Brent's method on ρ; the CKS bound is increasing
    in ρ). The result is rounded in the privacy-safe direction: converting it back gives an
    ε that is at most ``eps``.

    Parameters
    ----------
    eps : float
        Target ε > 0.
    delta : float
        δ in (0, 1).
    tight : bool
        Invert the CKS conversion (larger ρ for the same ε) instead of the simple bound.

    Returns
    -------
    float
        ρ > 0.

    References
    ----------
    Bun & Steinke (2016), Proposition 1.3; Canonne, Kamath & Steinke (2020), Corollary 13.
    """
    eps = check_epsilon(eps)
    delta = check_delta(delta)
    forward = zcdp_to_dp_cks if tight else zcdp_to_dp
    log_inv_delta = -math.log(delta)
    # stable form of (√(L+ε) − √L)²
    rho = (eps / (math.sqrt(log_inv_delta + eps) + math.sqrt(log_inv_delta))) ** 2
    check_rho(rho, f"the rho that (ε = {eps:g}, δ = {delta:g}) converts to")
    if tight:
        from scipy.optimize import brentq  # here, not at import: the CLI's start stays light

        lo, hi = rho, 2.0 * rho
        while forward(hi, delta) < eps:
            lo, hi = hi, 2.0 * hi
        rho = brentq(lambda r: forward(r, delta) - eps, lo, hi, xtol=1e-300, rtol=1e-15)
    step = 0
    while forward(rho, delta) > eps:
        rho = check_rho(rho * (1.0 - 2.0**-53 * 2.0**step), "the converted rho")
        step += 1
    return rho


def pure_to_zcdp(eps: float) -> float:
    """ρ = ε²/2: an ε-DP mechanism is (ε²/2)-zCDP.

    References
    ----------
    Bun & Steinke (2016), Proposition 1.4.
    """
    eps = check_epsilon(eps)
    return eps * eps / 2.0


def gaussian_rho(sigma: float, sensitivity: float = 1.0) -> float:
    """ρ = Δ₂² / (2σ²) of the (continuous or discrete) Gaussian mechanism.

    References
    ----------
    Bun & Steinke (2016), Proposition 1.6; Canonne, Kamath & Steinke (2020), Theorem 14
    (the same ρ for the discrete Gaussian with integer-valued queries).
    """
    sigma = check_scale(sigma, "sigma")
    sensitivity = check_positive("sensitivity", sensitivity)
    return check_rho(sensitivity * sensitivity / (2.0 * sigma * sigma), "the resulting rho")


def gaussian_sigma(rho: float, sensitivity: float = 1.0) -> float:
    """σ = Δ₂ / √(2ρ): the Gaussian scale that spends exactly ρ (inverse of :func:`gaussian_rho`).

    References
    ----------
    Bun & Steinke (2016), Proposition 1.6.
    """
    rho = check_rho(rho)
    sensitivity = check_positive("sensitivity", sensitivity)
    return check_scale(sensitivity / math.sqrt(2.0 * rho), "the resulting sigma")


# --------------------------------------------------------------------------------------------
# Typed privacy losses


class _Loss:
    """What both typed losses do alike: scale, split and compose by ``+``."""

    amount: float

    def scaled(self, factor: float) -> Self:
        """The amount (ε or ρ) × ``factor`` (a share of this budget, or k repetitions)."""
        return type(self)(self.amount * check_positive("factor", factor))

    def split(self, shares: Mapping[str, float]) -> dict[str, Self]:
        """This budget cut into named pieces that compose back to it (shares sum to 1)."""
        _check_shares(shares, "budget shares")
        return {name: self.scaled(float(share)) for name, share in shares.items()}

    def __add__(self, other: PureDP | ZCDP) -> PureDP | ZCDP:
        return compose([self, other])  # type: ignore[list-item]


@dataclass(frozen=True)
class PureDP(_Loss):
    """A pure ε-DP privacy loss (Dwork & Roth 2014, Def. 2.4).

    Losses compose by ``+`` (sequential composition adds ε, Dwork & Roth 2014, Thm. 3.16;
    with a :class:`ZCDP` loss the sum is zCDP through ε-DP ⇒ (ε²/2)-zCDP, Bun & Steinke
    2016, Prop. 1.4) and split by :meth:`split`; :meth:`covers` says whether a claim of this
    loss is honest for a computation that spends another.

    Parameters
    ----------
    epsilon : float
        ε within :data:`EPSILON_RANGE`.
    """

    epsilon: float

    accounting = Accounting.PURE
    unit = "epsilon"
    symbol = "ε"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    @property
    def amount(self) -> float:
        """ε."""
        return self.epsilon

    def to_zcdp(self) -> ZCDP:
        """The zCDP loss an ε-DP mechanism also has: ρ = ε²/2 (Bun & Steinke 2016, Prop. 1.4)."""
        return ZCDP(pure_to_zcdp(self.epsilon))

    def covers(self, spent: PureDP | ZCDP) -> bool:
        """True when a claim of ε-DP is honest for a computation that spends ``spent``: a
        pure spend of at most ε (relative slack :data:`SPEND_TOLERANCE`); never a zCDP
        spend, which gives no pure guarantee."""
        if isinstance(spent, ZCDP):
            return False
        return spent.epsilon <= self.epsilon * (1.0 + SPEND_TOLERANCE)

    def __str__(self) -> str:
        return f"ε = {self.epsilon:g} (pure)"


@dataclass(frozen=True)
class ZCDP(_Loss):
    """A ρ-zCDP privacy loss (Bun & Steinke 2016, Def. 1.1).

    Losses compose by ``+`` (ρ adds, Bun & Steinke 2016, Lemma 2.3), split by
    :meth:`split`, and convert to (ε, δ)-DP by :meth:`approx_dp` (Canonne, Kamath & Steinke
    2020, Cor. 13).

    Parameters
    ----------
    rho : float
        ρ within :data:`RHO_RANGE`.
    """

    rho: float

    accounting = Accounting.ZCDP
    unit = "rho"
    symbol = "ρ"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check_rho(self.rho))

    @property
    def amount(self) -> float:
        """ρ."""
        return self.rho

    def to_zcdp(self) -> ZCDP:
        """This loss."""
        return self

    def covers(self, spent: PureDP | ZCDP) -> bool:
        """True when a claim of ρ-zCDP is honest for a computation that spends ``spent``
        (a pure spend counts ε²/2; relative slack :data:`SPEND_TOLERANCE`)."""
        return spent.to_zcdp().rho <= self.rho * (1.0 + SPEND_TOLERANCE)

    def approx_dp(self, delta: float, *, tight: bool = True) -> float:
        """The ε of the (ε, δ)-DP this loss implies (:func:`zcdp_to_dp_cks` when ``tight``,
        else :func:`zcdp_to_dp`)."""
        return (zcdp_to_dp_cks if tight else zcdp_to_dp)(self.rho, delta)

    def __str__(self) -> str:
        return f"ρ = {self.rho:g} (zCDP)"


#: A typed privacy loss.
PrivacyLoss = PureDP | ZCDP


def loss(accounting: str, amount: float) -> PrivacyLoss:
    """The typed loss of an ``accounting`` name (``"pure"``/``"zcdp"``) and its amount."""
    return (PureDP if Accounting.parse(accounting) is Accounting.PURE else ZCDP)(amount)


def compose(losses: Sequence[PrivacyLoss]) -> PrivacyLoss:
    """Sequential composition: ε adds when every loss is pure (Dwork & Roth 2014, Thm. 3.16),
    else ρ adds with each pure ε counted as ε²/2 (Bun & Steinke 2016, Prop. 1.4 and
    Lemma 2.3). Compensated summation, so the order does not matter.

    Raises
    ------
    BudgetError
        No losses, or an item that is not a :class:`PureDP` or :class:`ZCDP`.
    """
    items = list(losses)
    if not items:
        raise BudgetError("nothing to compose: give at least one privacy loss")
    bad = [x for x in items if not isinstance(x, PureDP | ZCDP)]
    if bad:
        raise BudgetError(f"only PureDP and ZCDP losses compose, got {bad[0]!r}")
    if all(isinstance(x, PureDP) for x in items):
        return PureDP(math.fsum(x.epsilon for x in items))
    return ZCDP(math.fsum(x.to_zcdp().rho for x in items))


# --------------------------------------------------------------------------------------------
# The privacy statement


#: How a statement names one privacy unit's change, by neighbour relation (``{unit}`` filled in).
NEIGHBOURS = {
    "add/remove": "adding or removing one {unit}'s record",
    "change": "changing one {unit}'s record",
}
#: At most this many exact areas are listed in a statement's text (all are in ``to_dict``).
EXACT_SHOWN = 20


@dataclass(frozen=True)
class PrivacyStatement:
    """An honest statement of what a release guarantees.

    Parameters
    ----------
    accounting : Accounting (or its string, ``"pure"``/``"zcdp"``, read once here)
        Pure ε-DP composition or ρ-zCDP composition; held as an :class:`Accounting`.
    epsilon : float or None
        Total ε for pure accounting: what the measurements spend.
    rho : float or None
        Total ρ for zCDP accounting: what the measurements spend.
    delta : float or None
        δ at which a zCDP budget is also reported as (ε, δ).
    invariants : tuple of str
        Human-readable names of the statistics released exactly, e.g. ``"state: total"``.
    geometry : str
        ``"euclidean"`` (the projection Π_N of the subspace-DP paper) or ``"weighted"``
        (Σ⁻¹-weighted GLS projection: subspace DP in the weighted geometry).
    data_dependent : bool
        True when a step that is not post-processing was used (one that read confidential
        data beyond the measurements and invariants); ``reveals`` says what it discloses.
    mechanism : str
        The noise law / mechanism, e.g. ``"discrete_gaussian"``.
    notes : tuple of str
        Further qualifications (MCMC total-variation bound, ...).
    unit : str
        The privacy unit: whose record one neighbour step adds, removes or changes
        (``"person"``, ``"housing unit"``, ``"trip"``); ``""``: one record of the input.
    neighbour : {"add/remove", "change"}
        The neighbour relation the noise is calibrated to (:data:`NEIGHBOURS`): the
        measurements' sensitivities here are one record's largest contribution, i.e.
        add/remove.
    exact : tuple of str
        Areas released exactly *through* the invariants without being named by them: a node
        that is its invariant parent's only child (DC, the only county of its state), e.g.
        ``"county 11001 (the only child of state 11): total"``.
    target : float or None
        The budget an allocation aimed at, when it differs from the spend (noise scales
        rounded up spend a little less); None when they agree.
    reveals : tuple of str
        What each data-dependent step discloses (:func:`with_products`).
    parts : tuple of str
        The statements this one composes, each named with its budget (:func:`compose`-style
        sequential composition of two releases).
    change_factor : float or None
        The loss of changing one unit's record as a multiple of the add/remove loss, when
        derived for the mechanism (2 for Gaussian-type noise on counting queries:
        :func:`censusdp.pipelines.release_statement.change_factor`); None: the bound that
        holds for any mechanism (:meth:`change_loss`).
    """

    accounting: Accounting
    epsilon: float | None = None
    rho: float | None = None
    delta: float | None = None
    invariants: tuple[str, ...] = ()
    geometry: str = "euclidean"
    data_dependent: bool = False
    mechanism: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    unit: str = ""
    neighbour: str = "add/remove"
    exact: tuple[str, ...] = ()
    target: float | None = None
    reveals: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    change_factor: float | None = None

    def __post_init__(self) -> None:
        if self.accounting not in ("pure", "zcdp"):
            raise ValueError("accounting must be 'pure' or 'zcdp'")
        if self.accounting == "pure" and self.epsilon is None:
            raise ValueError("pure accounting needs epsilon")
        if self.accounting == "zcdp" and self.rho is None:
            raise ValueError("zcdp accounting needs rho")
        object.__setattr__(self, "accounting", Accounting(self.accounting))
        if self.neighbour not in NEIGHBOURS:
            raise ValueError(
                f"neighbour must be one of {sorted(NEIGHBOURS)}, got {self.neighbour!r}"
            )
        for name in ("invariants", "notes", "exact", "reveals", "parts"):
            object.__setattr__(self, name, tuple(str(x) for x in getattr(self, name)))

    @property
    def budget(self) -> PrivacyLoss:
        """The stated loss as a typed budget (:class:`PureDP` or :class:`ZCDP`)."""
        return loss(self.accounting, self.epsilon if self.accounting == "pure" else self.rho)

    @property
    def guarantee(self) -> str:
        """The kind of guarantee: plain DP only when nothing is held invariant."""
        if self.invariants:
            return "induced subspace differential privacy"
        return "differential privacy"

    def with_notes(self, *notes: str, data_dependent: bool | None = None) -> PrivacyStatement:
        """A copy with extra notes (and optionally the data-dependence flag set)."""
        return dataclasses.replace(
            self,
            data_dependent=self.data_dependent if data_dependent is None else data_dependent,
            notes=self.notes + tuple(notes),
        )

    def epsilons(self) -> tuple[float, float] | None:
        """(ε by the Canonne–Kamath–Steinke conversion, ε by the simple bound) of a zCDP
        statement with a δ (:func:`zcdp_to_dp_cks`, :func:`zcdp_to_dp`); None otherwise."""
        if self.accounting != "zcdp" or self.delta is None:
            return None
        return zcdp_to_dp_cks(self.rho, self.delta), zcdp_to_dp(self.rho, self.delta)

    def budget_text(self) -> str:
        """The budget spent, the allocation's target beside it where they differ, and for
        zCDP with a δ the (ε, δ) it implies by the tighter conversion (Canonne, Kamath &
        Steinke 2020, Cor. 13), the simple bound (Bun & Steinke 2016, Prop. 1.3) labelled
        as the secondary figure."""
        budget = self.budget
        text = f"{budget} spent"
        if self.target is not None and not math.isclose(self.target, budget.amount, rel_tol=1e-12):
            sym = budget.symbol
            text += (
                f" (exactly {sym} = {budget.amount:.7g}: the noise actually added, its "
                f"scales rounded up; the allocation's target was {sym} = {self.target:.7g})"
            )
        eps = self.epsilons()
        if eps is not None:
            text += (
                f", implying (ε = {eps[0]:.4g}, δ = {self.delta:g}) by the Canonne–Kamath–"
                f"Steinke conversion (the simple bound ρ + 2√(ρ ln(1/δ)) gives ε = {eps[1]:.4g})"
            )
        return text

    def change_loss(self) -> PrivacyLoss:
        """The loss bound for *changing* one unit's record when the noise is calibrated to
        adding or removing one (``neighbour == "add/remove"``): a removal and an addition.

        ``change_factor`` × the loss when it was derived for the mechanism (2 for
        Gaussian-type noise on counting queries: ‖Q(e_i − e_j)‖₂² ≤ 2Δ₂² since the cross
        term of non-negative columns is ≥ 0, and ρ = Δ₂²/(2σ²), Bun & Steinke 2016,
        Prop. 1.6). Otherwise the bound every mechanism has: group privacy for two steps,
        2ε for pure ε-DP (Dwork & Roth 2014, Thm. 2.2) and 4ρ for ρ-zCDP (Bun & Steinke
        2016, Prop. 27).
        """
        budget = self.budget
        if self.neighbour == "change":
            return budget
        if self.change_factor is not None:
            return budget.scaled(self.change_factor)
        return budget.scaled(2.0 if isinstance(budget, PureDP) else 4.0)

    def relation_text(self) -> str:
        """The privacy unit and neighbour relation, and under invariants what induced
        subspace DP means for that relation (Gao, Gong & Yu 2022, Def. 6: DP of the release's
        component orthogonal to the invariants, among neighbours in the relation; Dharangutte
        et al. 2023, Def. 2: among databases that share the invariants, a loss that grows
        with their distance)."""
        unit = self.unit or "record"
        who = self.unit or "input record (the privacy unit is whatever one record is)"
        step = (
            NEIGHBOURS[self.neighbour]
            .format(unit=unit)
            .replace("one record's record", "one record")
        )
        text = f"privacy unit: one {who}; neighbouring databases differ by {step}"
        one_record = "one record" if unit == "record" else f"one {unit}'s record"
        if not self.invariants or self.neighbour == "change":
            return text
        change = self.change_loss()
        conv = ""
        if isinstance(change, ZCDP) and self.delta is not None:
            conv = f", (ε = {zcdp_to_dp_cks(change.rho, self.delta):.4g}, δ = {self.delta:g})"
        factor = change.amount / self.budget.amount
        return (
            f"{text}. Under the invariants such neighbours differ in an invariant, which is "
            f"released exactly, so the stated loss bounds what the release says beyond the "
            f"invariants (induced subspace DP); two databases that share the invariants differ "
            f"at least by changing {one_record} (a removal and an addition), which costs "
            f"at most {factor:g}{self.budget.symbol}: {change}{conv} — the loss in the "
            "subspace-DP paper's own relation (Gao, Gong & Yu 2022, Def. 1: databases "
            "differing in one row)"
        )

    def exact_text(self) -> str:
        """The areas released exactly through the invariants, the first :data:`EXACT_SHOWN`."""
        shown = "; ".join(self.exact[:EXACT_SHOWN])
        more = len(self.exact) - EXACT_SHOWN
        if more > 0:
            shown += f"; and {more} more (listed in the manifest)"
        return (
            "released exactly through the invariants (an area that is its invariant parent's "
            f"only child, standard error 0, no protection): {shown}"
        )

    def text(self) -> str:
        """One paragraph for reports and manifests."""
        parts = [f"{self.guarantee}, {self.budget_text()}"]
        if self.mechanism:
            parts.append(f"mechanism: {self.mechanism}")
        parts.append(self.relation_text())
        if self.invariants:
            inv = "; ".join(self.invariants)
            parts.append(
                f"invariants released exactly: {inv}; the guarantee holds for databases "
                "that share these invariants (induced subspace DP), not plain DP"
            )
            if self.geometry == "weighted":
                parts.append("projection in the Σ⁻¹-weighted geometry (subspace DP in that metric)")
        if self.exact:
            parts.append(self.exact_text())
        if self.data_dependent:
            if self.reveals:
                parts.append(
                    "a data-dependent step (not post-processing) was used: "
                    + "; ".join(self.reveals)
                    + " — outside the DP guarantee, which covers the noisy measurements only"
                )
            else:
                parts.append(
                    "a data-dependent step was used (see the notes): the plain DP argument "
                    "does not cover this output"
                )
        if self.parts:
            parts.append("composed of: " + "; ".join(self.parts))
        parts.extend(self.notes)
        return ". ".join(parts) + "."

    def to_dict(self) -> dict:
        eps = self.epsilons()
        return {
            "guarantee": self.guarantee,
            "accounting": self.accounting.value,
            "epsilon": self.epsilon,
            "rho": self.rho,
            "delta": self.delta,
            "epsilon_cks": None if eps is None else eps[0],
            "epsilon_simple_bound": None if eps is None else eps[1],
            "target": self.target,
            "unit": self.unit,
            "neighbour": self.neighbour,
            "invariants": list(self.invariants),
            "exact": list(self.exact),
            "geometry": self.geometry,
            "data_dependent": self.data_dependent,
            "reveals": list(self.reveals),
            "mechanism": self.mechanism,
            "parts": list(self.parts),
            "change_factor": self.change_factor,
            "notes": list(self.notes),
            "text": self.text(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> PrivacyStatement:
        """The statement :meth:`to_dict` wrote (``guarantee``, the ε's and ``text`` are
        derived, so not read; a missing field takes its default)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"accounting"}
        kw = {k: v for k, v in d.items() if k in names}
        kw["data_dependent"] = bool(kw.get("data_dependent", False))
        return cls(d["accounting"], **kw)


# --------------------------------------------------------------------------------------------
# Products: what each released product did after the measurements

#: What a step may read and stay post-processing: the noisy measurements, the invariants
#: (released exactly and named in the statement), public inputs (a public block list, the
#: schema) and randomness independent of the data.
POST_PROCESSING_READS = ("measurements", "invariants", "public", "randomness")
#: Everything a :class:`Step` may read.
STEP_READS = (*POST_PROCESSING_READS, "confidential")


@dataclass(frozen=True)
class Step:
    """One step between the confidential data and a released product, with what it reads.

    Parameters
    ----------
    name : str
        What the step does (``"GLS estimate"``, ``"block list from the rows"``).
    reads : tuple of str
        Among :data:`STEP_READS`.
    reveals : str
        What the step discloses: required when it reads ``"confidential"`` data.

    Notes
    -----
    A step that reads only :data:`POST_PROCESSING_READS` is post-processing: a DP guarantee
    is closed under it (Dwork & Roth 2014, Prop. 2.1), and induced subspace DP under maps of
    the measurements given the invariants (Gao, Gong & Yu 2022, §2.3).
    """

    name: str
    reads: tuple[str, ...]
    reveals: str = ""

    def __post_init__(self) -> None:
        reads = tuple(self.reads)
        bad = [r for r in reads if r not in STEP_READS]
        if not reads or bad:
            raise ValueError(
                f"step {self.name!r}: reads must be among {list(STEP_READS)}, got {list(reads)}"
            )
        if "confidential" in reads and not self.reveals.strip():
            raise ValueError(
                f"step {self.name!r} reads confidential data: say what it reveals (reveals=...)"
            )
        object.__setattr__(self, "reads", reads)

    @property
    def post_processing(self) -> bool:
        """Whether the step reads only :data:`POST_PROCESSING_READS`."""
        return all(r in POST_PROCESSING_READS for r in self.reads)


@dataclass(frozen=True)
class Product:
    """A released product and the steps that made it: its :meth:`wording` is the one
    sentence every file of a release says about it."""

    name: str
    steps: tuple[Step, ...]

    @property
    def post_processing(self) -> bool:
        """Whether every step is post-processing."""
        return all(s.post_processing for s in self.steps)

    @property
    def reveals(self) -> tuple[str, ...]:
        """What its steps that are not post-processing disclose."""
        return tuple(
            dict.fromkeys(
                f"{s.name} reveals {s.reveals}" for s in self.steps if not s.post_processing
            )
        )

    def wording(self) -> str:
        """Post-processing (the statement covers it unchanged) or not (naming what each
        step that read confidential data reveals), derived from :attr:`steps`."""
        steps = ", ".join(s.name for s in self.steps)
        if self.post_processing:
            said = {"measurements": "the noisy measurements", "invariants": "the invariants",
                    "public": "public inputs", "randomness": "fresh randomness"}  # fmt: skip
            read = [said[r] for r in POST_PROCESSING_READS if any(r in s.reads for s in self.steps)]
            return (
                f"{self.name}: post-processing ({steps}; these read only "
                f"{', '.join(read)}): the privacy statement covers it unchanged"
            )
        bad = "; ".join(
            f"{s.name} read confidential data and reveals {s.reveals}"
            for s in self.steps
            if not s.post_processing
        )
        return (
            f"{self.name}: not post-processing alone ({steps}): {bad}; the privacy statement "
            "covers the noisy measurements, not that disclosure"
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "post_processing": self.post_processing,
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "wording": self.wording(),
        }


def with_products(statement: PrivacyStatement, products: Sequence[Product]) -> PrivacyStatement:
    """The statement of a release of ``products``: data-dependent, naming what is revealed,
    exactly when a product has a step that is not post-processing (:class:`Step`)."""
    reveals = tuple(dict.fromkeys(r for p in products for r in p.reveals))
    return dataclasses.replace(
        statement,
        data_dependent=statement.data_dependent or bool(reveals),
        reveals=tuple(dict.fromkeys(statement.reveals + reveals)),
    )


# --------------------------------------------------------------------------------------------
# Accountants

#: Relative slack allowed when spends add up to the total (float rounding of shares).
SPEND_TOLERANCE = 1e-9


@dataclass(frozen=True)
class LedgerEntry:
    """One spend: what was measured (``label``) and the ε or ρ it cost (``amount``)."""

    label: str
    amount: float


class Accountant:
    """Sequential composition of one privacy budget (base class).

    Spends add: ε under pure DP, ρ under zCDP. The accountant refuses a spend that would
    take the total over the stated budget (up to a relative :data:`SPEND_TOLERANCE` for the
    rounding of shares). Budgets are not confidential, so errors print amounts.

    Parameters
    ----------
    total : float
        The stated total budget, > 0.

    Attributes
    ----------
    accounting : {"pure", "zcdp"}
    unit : {"epsilon", "rho"}
    """

    accounting: str = ""
    unit: str = ""

    def __init__(self, total: float) -> None:
        check = check_epsilon if self.unit == "epsilon" else check_rho
        self._total = check(total, f"total {self.unit}")
        self._ledger: list[LedgerEntry] = []

    @property
    def total(self) -> float:
        """The stated budget."""
        return self._total

    @property
    def spent(self) -> float:
        """Sum of all spends so far (compensated summation)."""
        return math.fsum(e.amount for e in self._ledger)

    @property
    def remaining(self) -> float:
        """Budget still available (never negative)."""
        return max(0.0, self._total - self.spent)

    @property
    def ledger(self) -> tuple[LedgerEntry, ...]:
        """Every spend, in order."""
        return tuple(self._ledger)

    @property
    def budget(self) -> PrivacyLoss:
        """The stated total as a typed budget."""
        return loss(self.accounting, self._total)

    def spend(self, amount: float | PrivacyLoss, label: str) -> LedgerEntry:
        """Record a spend of ``amount`` (ε or ρ in this accountant's unit, or a typed loss:
        a :class:`PureDP` spend is counted as ε²/2 by a zCDP accountant) for the
        measurement ``label``.

        Raises
        ------
        BudgetError
            If ``amount`` is not positive and finite, the spend would exceed the total, or a
            zCDP loss is spent from a pure-ε budget (it gives no pure guarantee).
        """
        if isinstance(amount, PureDP | ZCDP):
            if self.accounting == "pure" and isinstance(amount, ZCDP):
                raise BudgetError(
                    f"spend for {label!r}: {amount} cannot be spent from a pure ε budget "
                    "(zCDP noise gives no pure ε-DP guarantee); use a zCDP accountant"
                )
            amount = amount.to_zcdp().rho if self.accounting == "zcdp" else amount.amount
        amount = float(amount)
        if not (amount > 0 and math.isfinite(amount)):
            raise BudgetError(
                f"spend for {label!r}: {self.unit} must be a positive finite number, got {amount!r}"
            )
        after = math.fsum([self.spent, amount])
        if after > self._total * (1.0 + SPEND_TOLERANCE):
            raise BudgetError(
                f"spend for {label!r} of {self.unit} = {amount:g} would exceed the budget: "
                f"{self.spent:g} already spent of {self._total:g} ({self.remaining:g} left); "
                "lower the shares or raise the total"
            )
        entry = LedgerEntry(str(label), amount)
        self._ledger.append(entry)
        return entry

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.unit}: spent {self.spent:g} of {self._total:g}, "
            f"{len(self._ledger)} spends)"
        )


class PureAccountant(Accountant):
    """Pure ε-DP: ε adds under sequential composition (Laplace, discrete Laplace).

    Parameters
    ----------
    total_epsilon : float
        The stated total ε > 0.

    References
    ----------
    Dwork & Roth, "The Algorithmic Foundations of Differential Privacy" (2014), Thm. 3.16.
    """

    accounting = Accounting.PURE
    unit = "epsilon"

    def __init__(self, total_epsilon: float) -> None:
        super().__init__(total_epsilon)


class ZCDPAccountant(Accountant):
    """ρ-zCDP: ρ adds under composition (Gaussian, discrete Gaussian).

    Parameters
    ----------
    total_rho : float
        The stated total ρ > 0.
    delta : float, optional
        δ at which the budget is also reported as (ε, δ)-DP.

    References
    ----------
    Bun & Steinke (2016), Lemma 2.3 (composition).
    """

    accounting = Accounting.ZCDP
    unit = "rho"

    def __init__(self, total_rho: float, delta: float | None = None) -> None:
        super().__init__(total_rho)
        self.delta = None if delta is None else check_delta(delta)

    def epsilon(self, *, tight: bool = True, spent: bool = False) -> float | None:
        """(ε, δ)-DP equivalent of the total (or of the spent) ρ; None without a δ.

        ``tight`` selects :func:`zcdp_to_dp_cks`, otherwise :func:`zcdp_to_dp`.
        """
        if self.delta is None:
            return None
        rho = self.spent if spent else self.total
        return (zcdp_to_dp_cks if tight else zcdp_to_dp)(rho, self.delta)


def accountant_for(accounting: str, total: float, delta: float | None = None) -> Accountant:
    """A :class:`PureAccountant` or :class:`ZCDPAccountant` for ``accounting``."""
    if Accounting.parse(accounting) is Accounting.PURE:
        return PureAccountant(total)
    return ZCDPAccountant(total, delta)


# --------------------------------------------------------------------------------------------
# Allocation

#: Absolute tolerance on a set of shares summing to 1.
SHARE_TOLERANCE = 1e-9


def _check_shares(shares: Mapping[str, float], where: str) -> None:
    if not shares:
        raise BudgetError(f"{where}: no shares given; give at least one share")
    for name, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise BudgetError(f"{where}: share of {name!r} must be a number, got {share!r}")
        if not (math.isfinite(share) and share > 0):
            raise BudgetError(
                f"{where}: share of {name!r} is {share!r}; shares must be positive "
                "(omit an entry rather than giving it a zero share)"
            )
    total = math.fsum(float(s) for s in shares.values())
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise BudgetError(
            f"{where}: shares sum to {total:.12g}; they must sum to 1 "
            f"(tolerance {SHARE_TOLERANCE:g})"
        )


def allocate(
    total: float,
    level_shares: Mapping[str, float],
    query_shares: Mapping[str, Mapping[str, float]],
) -> dict[tuple[str, str], float]:
    """Split a total budget per level and per query: total × level share × query share.

    Shares split the accounting unit itself: ε for pure accounting, ρ for zCDP (the Census
    Bureau's convention for the 2020 DAS production settings, where ρ shares are published
    per geographic level and query). Because the unit composes additively, the pieces add
    back up to ``total``.

    Parameters
    ----------
    total : float
        Total ε or ρ, > 0.
    level_shares : mapping of level → share
        Positive shares summing to 1 (tolerance :data:`SHARE_TOLERANCE`).
    query_shares : mapping of level → (mapping of query → share)
        For every level of ``level_shares`` and no other, positive query shares summing to 1.

    Returns
    -------
    dict of (level, query) → float
        The budget of each measurement, in the order of ``level_shares`` then queries.

    Raises
    ------
    BudgetError
        Non-positive total or share, shares not summing to 1 (naming the level), or levels
        of the two mappings that do not match.

    References
    ----------
    Abowd et al., "The 2020 Census Disclosure Avoidance System TopDown Algorithm", Harvard
    Data Science Review (2022), §5 (per-level, per-query ρ allocation).
    """
    total = check_positive("total budget", total)
    _check_shares(level_shares, "level shares")
    missing = [lvl for lvl in level_shares if lvl not in query_shares]
    if missing:
        raise BudgetError(
            f"no query shares for level(s) {missing}; give query shares for every level "
            "that has a level share"
        )
    extra = [lvl for lvl in query_shares if lvl not in level_shares]
    if extra:
        raise BudgetError(
            f"query shares given for level(s) {extra} that have no level share; "
            f"levels with a share: {list(level_shares)}"
        )
    out: dict[tuple[str, str], float] = {}
    for level, level_share in level_shares.items():
        queries = query_shares[level]
        _check_shares(queries, f"query shares at level {level!r}")
        for query, share in queries.items():
            out[(level, query)] = total * float(level_share) * float(share)
    return out


@dataclass(frozen=True)
class Budget:
    """A stated privacy budget and its split per level and query.

    Parameters
    ----------
    accounting : {"pure", "zcdp"}
        Pure ε-DP or ρ-zCDP.
    total : float
        Total ε (pure) or ρ (zCDP), > 0.
    level_shares : mapping of level → share
        Shares of the total per level (sum to 1).
    query_shares : mapping of level → (mapping of query → share)
        Shares of each level's budget per query (each sums to 1).
    delta : float, optional
        δ at which a zCDP budget is also reported as (ε, δ)-DP.
    """

    accounting: str
    total: float
    level_shares: Mapping[str, float]
    query_shares: Mapping[str, Mapping[str, float]]
    delta: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "accounting", Accounting.parse(self.accounting))
        if self.delta is not None:
            check_delta(self.delta)
        self.allocation()  # validate now

    @property
    def budget(self) -> PrivacyLoss:
        """The total as a typed budget."""
        return loss(self.accounting, self.total)

    def allocation(self) -> dict[tuple[str, str], float]:
        """The budget of each (level, query): see :func:`allocate`."""
        return allocate(self.total, self.level_shares, self.query_shares)

    def accountant(self) -> Accountant:
        """A fresh accountant holding this total."""
        return accountant_for(self.accounting, self.total, self.delta)


def invariant_labels(level_names: Sequence[str], invariants: Sequence) -> tuple[str, ...]:
    """``"level: query"`` for every invariant of a computation (each :class:`Invariant` has
    ``level`` (index into ``level_names``) and ``query`` (with a ``name``)), without
    repeats, in order."""
    out: list[str] = []
    for inv in invariants:
        label = f"{level_names[inv.level]}: {inv.query.name}"
        if label not in out:
            out.append(label)
    return tuple(out)


def with_invariants(privacy: PrivacyStatement, labels: Sequence[str]) -> PrivacyStatement:
    """The statement of a computation that holds ``labels`` exactly.

    An estimator given invariants calls this with the labels of the invariants it actually
    holds (:func:`invariant_labels`), so a release is never labelled plain "differential
    privacy" — nor silent about an invariant — because the caller's statement omitted them:
    every label the statement lacks is added, with a note saying it came from the
    computation. Labels the caller stated are kept as written.

    References
    ----------
    Gao, Gong & Yu (2022), Def. 6 (induced subspace DP: the guarantee holds only among
    databases that share the invariants).
    """
    missing = tuple(str(x) for x in labels if str(x) not in privacy.invariants)
    if not missing:
        return privacy
    return dataclasses.replace(
        privacy,
        invariants=privacy.invariants + missing,
        notes=privacy.notes
        + (
            "invariants named from the computation (the supplied statement omitted them): "
            + "; ".join(missing),
        ),
    )


def statement_for(
    accounting: str | PrivacyLoss,
    total: float | None = None,
    delta: float | None = None,
    invariants: Sequence[str] | Mapping[str, str] = (),
    mechanism: str = "",
    geometry: str = "euclidean",
) -> PrivacyStatement:
    """Build the :class:`PrivacyStatement` of a release.

    Parameters
    ----------
    accounting : {"pure", "zcdp"}, or PureDP or ZCDP
        The accounting, or the typed budget itself (then ``total`` is not given).
    total : float
        Total ε (pure) or ρ (zCDP) of the stated budget, with an accounting name.
    delta : float, optional
        δ for reporting a zCDP budget as (ε, δ).
    invariants : sequence of str, or mapping of level → invariant
        Statistics released exactly; a mapping ``{"state": "total"}`` becomes
        ``("state: total",)``. Any invariant makes the guarantee induced subspace DP.
    mechanism : str
        Noise law name, as a label (which accountant a law needs is known to the noise-law
        registry, :mod:`censusdp.mechanisms.registry`, above core; statements derived from
        measurements, :func:`censusdp.mechanisms.privacy.derive_statement`, are consistent
        by construction).
    geometry : {"euclidean", "weighted"}
        Geometry of the projection onto the invariant subspace.

    Raises
    ------
    BudgetError
        Bad accounting, total, δ or geometry.

    References
    ----------
    Gao, Gong & Yu (2022), Def. 6 (induced subspace DP).
    """
    if isinstance(accounting, PureDP | ZCDP):
        if total is not None:
            raise BudgetError(
                f"statement_for({accounting}, total={total!r}): a typed budget carries its "
                "own total; give one or the other"
            )
        accounting, total = accounting.accounting, accounting.amount
    accounting = Accounting.parse(accounting)
    if total is None:
        raise BudgetError(f"statement_for({accounting!r}): give the total ε or ρ")
    total = (check_epsilon if accounting == "pure" else check_rho)(
        total, f"total {ACCOUNTINGS[accounting]}"
    )
    if delta is not None:
        delta = check_delta(delta)
    if geometry not in ("euclidean", "weighted"):
        raise BudgetError(f"geometry must be 'euclidean' or 'weighted', got {geometry!r}")
    if isinstance(invariants, Mapping):
        names = tuple(f"{level}: {inv}" for level, inv in invariants.items())
    else:
        names = tuple(str(i) for i in invariants)
    return PrivacyStatement(
        accounting=accounting,
        epsilon=total if accounting == "pure" else None,
        rho=total if accounting == "zcdp" else None,
        delta=delta,
        invariants=names,
        geometry=geometry,
        mechanism=mechanism,
    )
