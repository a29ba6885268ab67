"""Sampler throughput at scale 10: prints JSON {"<law>": {"samples_per_s": ...}, ...}.

Laws: continuous Laplace and Gaussian (numpy, not floating-point safe), the exact discrete
Laplace and discrete Gaussian of censusdp (vectorised CKS), a plain-Python ``fractions``
implementation of the CKS discrete Gaussian written here as the slow baseline, and OpenDP's
sampler when it is importable. Draws come from a KeyedRNG (ChaCha20) stream; the reported
figure is the best of three runs. Run: ``python benchmarks/samplers.py``.
"""

from __future__ import annotations

import json
import math
import random
import time
from fractions import Fraction

from censusdp.mechanisms import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace
from censusdp.rng import KeyedRNG

SCALE = 10
N_FAST = 2_000_000
N_SLOW = 20_000


def _bern_exp(rnd: random.Random, gamma: Fraction) -> bool:
    """CKS Algorithm 1 with Fractions."""
    while gamma > 1:
        if not _bern_exp(rnd, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while True:
        f = gamma / k
        if rnd.randrange(f.denominator) >= f.numerator:
            break
        k += 1
    return k % 2 == 1


def _dlap(rnd: random.Random, t: int) -> int:
    """CKS Algorithm 2 (integer scale t)."""
    while True:
        u = rnd.randrange(t)
        if not _bern_exp(rnd, Fraction(u, t)):
            continue
        v = 0
        while _bern_exp(rnd, Fraction(1)):
            v += 1
        x = u + t * v
        b = rnd.randrange(2)
        if b == 1 and x == 0:
            continue
        return -x if b else x


def fractions_discrete_gaussian(rnd: random.Random, sigma2: Fraction) -> int:
    """CKS Algorithm 3 in plain Python with Fractions (the slow baseline)."""
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1
    while True:
        y = _dlap(rnd, t)
        if _bern_exp(rnd, (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)):
            return y


def _rate(fn, n: int, repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


def main() -> dict:
    rng = KeyedRNG.reproducible(2026, warn=False)
    gen = rng.generator("benchmarks/samplers")
    out: dict = {}
    for name, law in (
        ("laplace", Laplace(SCALE)),
        ("gaussian", Gaussian(SCALE)),
        ("discrete_laplace", DiscreteLaplace(SCALE)),
        ("discrete_gaussian", DiscreteGaussian(SCALE)),
    ):
        out[name] = {"samples_per_s": _rate(lambda n, law=law: law.sample(gen, n), N_FAST)}
    rnd = random.Random(2026)
    s2 = Fraction(SCALE**2)
    out["discrete_gaussian_fractions_baseline"] = {
        "samples_per_s": _rate(
            lambda n: [fractions_discrete_gaussian(rnd, s2) for _ in range(n)], N_SLOW, 1
        )
    }
    try:
        from opendp import measurements  # noqa: F401
    except ImportError:
        out["discrete_gaussian_opendp"] = {"samples_per_s": None, "status": "not installed"}
    else:  # pragma: no cover - opendp is optional and not installed here
        import opendp.prelude as dp

        dp.enable_features("contrib")
        meas = dp.m.make_gaussian(dp.atom_domain(T=int), dp.absolute_distance(T=int), float(SCALE))
        out["discrete_gaussian_opendp"] = {
            "samples_per_s": _rate(lambda n: [meas(0) for _ in range(n)], N_SLOW, 1)
        }
    base = out["discrete_gaussian_fractions_baseline"]["samples_per_s"]
    out["discrete_gaussian"]["speedup_vs_fractions"] = (
        out["discrete_gaussian"]["samples_per_s"] / base
    )
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
