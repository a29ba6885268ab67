"""Metropolis–Hastings with an asymmetric proposal targets the right law (Hastings 1970).

Every move set the package ships is symmetric or a Gibbs move, so the engine's
``log q(s | s*) − log q(s* | s)`` term is only exercised by a move set that reports it. Here a
tiny constrained case: the noise of two cells whose sum is held at 0 (e₂ = −e₁), each cell a
discrete Gaussian of scale σ, moved along (1, −1) by +1 with probability 0.8 and −1 with 0.2.
The conditioned law of e₁ is P(k) ∝ exp(−k²/σ²) exactly. Twenty thousand independent chains
start from exact draws of it, so a correct kernel keeps their law exact after any number of
steps; their e₁ after a few steps are tested against it by χ² at α = 1e-6. The same chains
with the ratio's sign flipped (which targets about π·16^k) or the ratio left out (π·4^k) drift
away and must be rejected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from stattests import chi2_pvalue

from censusdp.estimation.conditioning.mcmc import (
    MetropolisHastings,
    MoveSet,
    ProductTarget,
    Proposal,
)
from censusdp.mechanisms.discrete import DiscreteGaussian

ALPHA = 1e-6
SIGMA = 2
P_UP = 0.8
CHAINS = 20_000
STEPS = 10


class BiasedPairMoves(MoveSet):
    """``(e₁, e₂) += δ (1, −1)`` with δ = +1 w.p. ``p_up``, −1 otherwise: an asymmetric
    proposal reporting its log proposal ratio times ``sign`` (1: correct)."""

    integer = True

    def __init__(self, p_up: float, sign: float = 1.0, report: bool = True) -> None:
        self.p_up, self.sign, self.report = p_up, sign, report

    def _proposal(self, up: np.ndarray) -> Proposal:
        n = up.size
        step = np.where(up, 1, -1).astype(np.int64)
        idx = np.broadcast_to(np.array([0, 1], dtype=np.int64), (n, 2))
        delta = np.stack([step, -step], axis=1)
        # log q(s | s*) − log q(s* | s): the reverse of an up-move is a down-move
        forward = np.where(up, math.log(self.p_up), math.log1p(-self.p_up))
        backward = np.where(up, math.log1p(-self.p_up), math.log(self.p_up))
        ratio = self.sign * (backward - forward) if self.report else None
        return Proposal(idx, delta, log_q_ratio=ratio)

    def propose(self, states, gen):
        return self._proposal(gen.random(states.shape[0]) < self.p_up)

    def propose_coupled(self, x, y, gen):
        up = gen.random(x.shape[0]) < self.p_up
        return self._proposal(up), self._proposal(up)


def conditioned_log_pmf(xs: np.ndarray) -> np.ndarray:
    """log P(e₁ = k | e₁ + e₂ = 0) for two independent discrete Gaussians of scale σ."""
    k = np.arange(-60, 61)
    log_z = np.log(np.exp(-(k * k) / SIGMA**2).sum())
    return -(xs.astype(float) ** 2) / SIGMA**2 - log_z


def final_states(moves: MoveSet, gen: np.random.Generator) -> np.ndarray:
    """e₁ of every chain after ``STEPS`` moves from exact draws of the conditioned law."""
    law = DiscreteGaussian(SIGMA)
    engine = MetropolisHastings(ProductTarget([law], np.zeros(2, np.int64)), moves)
    support = np.arange(-30, 31)
    pmf = np.exp(conditioned_log_pmf(support))
    start = support[np.minimum(np.searchsorted(np.cumsum(pmf), gen.random(CHAINS)), 60)]
    cs = engine.init(np.stack([start, -start], axis=1))
    for _ in range(STEPS):
        engine.step(cs, gen)
    assert np.all(cs.states.sum(axis=1) == 0)  # the constraint is kept exactly
    return cs.states[:, 0]


XS = np.arange(-15, 16)


def test_asymmetric_proposal_chain_matches_the_exact_conditioned_law(rng):
    draws = final_states(BiasedPairMoves(P_UP), rng.generator("mh-asym/right"))
    p = chi2_pvalue(draws, conditioned_log_pmf(XS), XS)
    assert p > ALPHA, p
    assert abs(draws.mean()) < 4 * draws.std() / math.sqrt(CHAINS)  # the target is symmetric


@pytest.mark.parametrize(("sign", "report"), [(-1.0, True), (1.0, False)], ids=["sign", "none"])
def test_a_wrong_or_missing_proposal_ratio_is_detected(rng, sign, report):
    """Power: the chain built with the ratio's sign flipped, or without it, is rejected."""
    draws = final_states(BiasedPairMoves(P_UP, sign, report), rng.generator(f"mh-asym/{sign}"))
    assert chi2_pvalue(draws, conditioned_log_pmf(XS), XS) < ALPHA
