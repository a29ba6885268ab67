"""Exact discrete Gaussian noise at the speed of the random source: fixed-point CDF inversion.

One uniform 32-bit half-word per draw is inverted against a table of the exact floors
``C_c = ⌊2³²·F(c)⌋`` of the cumulative distribution function F, through a 2¹⁶-entry guide
table (the indexed search of Chen & Asau 1974) and ``np.searchsorted`` for the few words whose
top 16 bits do not settle the answer. A word that *equals* a table entry is resolved exactly
by drawing further 64-bit words and comparing the longer uniform with F in certified ball
arithmetic (Arb, Johansson 2017, through python-flint). No floating-point value ever decides a
draw.

For σ above :data:`TABLE_SIGMA_MAX` the table would be long (and the guide table useless), so
the table holds a *cell* law instead: cells of odd width L = 2h + 1 centred on multiples of L,
cell c weighted by ``exp(−d_c²/(2σ²))`` with ``d_c = max(|c|·L − h, 0)`` the smallest |k| in
the cell. A draw is a cell from the table, a uniform offset in the cell, and an exact
Bernoulli(exp(−(k² − d_c²)/(2σ²))) acceptance (Canonne, Kamath & Steinke 2020, Algorithm 1),
rejection of the proposal ``Q(k) ∝ exp(−d_c²/(2σ²))``; with L ≈ σ/64 about 99% of proposals
are accepted. The pure table is the special case L = 1 (d_c = |c|, nothing to accept).

Proof sketch (the output law is exactly the discrete Gaussian)
-------------------------------------------------------------
Let U be a uniform real in [0, 1) whose binary digits are the stream's bits: its first 32
bits form the word W, later bits come from further words. Inversion returns the cell
``c(U) = min{c : U < F(c)}``, which has law ``P(c) = F(c) − F(c − 1)``, the cell law exactly.

* Table entries are exact: the end entries are 0 and 2³² − 1 because the extent M is
  certified (``T(M + 1)/Z < 2⁻³²``); every other ``C_c = ⌊2³²F(c)⌋`` is the unique integer in
  the floor of an Arb ball that contains ``2³²T(−c)/Z`` (c < 0), or ``2³²`` less the unique
  ceiling of one that contains ``2³²T(c + 1)/Z`` (c ≥ 0), the ball's product and rounding taken
  at its own precision (Arb's enclosures are rigorous); a ball whose floor is not unique is
  recomputed at twice the precision, which settles any entry that is not exactly an integer
  (the tail balls have *relative* radius, however far out). The normaliser
  Z = 1 + 2·Σ_{c≥1} w_c is summed with a rigorous geometric bound on the tail (below).
* Certified words: if ``C_{c−1} < W < C_c`` then ``U ≥ W/2³² ≥ (C_{c−1} + 1)/2³² > F(c − 1)``
  and ``U < (W + 1)/2³² ≤ C_c/2³² ≤ F(c)``, so ``c(U) = c``: the fast path returns exactly
  what inversion of U returns. The guide table only skips the search where a whole bucket of
  2¹⁶ words lies strictly between two consecutive entries.
* Every other word equals some entry (the table runs until ``C = 0`` on the left and
  ``C = 2³² − 1`` on the right, so no word lies beyond it). For it, U is known to lie in
  ``[a/2ⁿ, (a + 1)/2ⁿ)`` (a = W, n = 32); the resolver returns c only once it has
  *certified* ``F(c − 1) ≤ a/2ⁿ`` and ``(a + 1)/2ⁿ ≤ F(c)`` in ball arithmetic, which
  implies ``c(U) = c``; otherwise it appends the next 64-bit word to a (n += 64) and raises
  the working precision. The bits it reads are fresh stream bits, so given W they are
  uniform, and the answer is c(U) for the same U: the conditional law given W is that of
  inversion, not of a redraw. U lies on a boundary with probability 0, so the loop ends with
  probability 1 (after one extra word with probability ≈ 1 − 2⁻⁵⁸).
* Hence the cell is exactly inversion of a uniform U. For L = 1 the cell is the draw. For
  L > 1, ``k = c·L + u`` with u uniform on {−h, …, h} (numpy's exact bounded integers) has
  law ``Q(k) = P(c)/L ∝ exp(−d_c²/(2σ²))``; |k| ≥ d_c on cell c, so accepting with
  probability ``exp(−(k² − d_c²)/(2σ²)) ≤ 1`` (an exact rational exponent; CKS Algorithm 1)
  leaves ``P(k) ∝ exp(−k²/(2σ²))``: von Neumann rejection, a fresh proposal on reject.

Tail bound: for ``c ≥ r ≥ 1``, ``w_{c+1}/w_c = exp(−(2(cL − h)L + L²)/(2σ²)) ≤ ρ_r`` with
``ρ_r`` that ratio at c = r, so ``Σ_{c ≥ r} w_c ≤ w_r/(1 − ρ_r)``.

Random source
-------------
Measured on the 2-core project machine, randomgen's ChaCha20 yields 4.2·10⁷ 64-bit words/s
per core and AES-128 in counter mode with AES-NI (randomgen's ``AESCounter``) 2.0·10⁸/s:
ChaCha20 alone cannot reach 5·10⁷ draws/s. The default source is therefore
:func:`censusdp.rng.aes_counter`: AES-128-CTR keyed by 128 bits drawn from the stream's own
ChaCha20 generator (the KeyedRNG chunk generator), a standard cryptographically secure
generator (NIST SP 800-90A's CTR construction) that stays a pure function of the key, label and
chunk, so any partition regenerates its own noise. ``source="chacha20"`` draws every word from
the ChaCha20 stream itself (256-bit key, ~4× slower). Half-words are taken low half first (a
host-independent definition).

Measured (``benchmarks/samplers.py``, 2-core machine under load from other jobs, so per CPU
second; batch 10⁶ / 10⁷): σ = 1, 2.25, 10, 100: 109–136 / 63–117 M draws/s, 0.54–0.79 of the
AES word rate timed alternately in the same run, 2–3× ``rint(normal)``, 45–60× the previous
CKS sampler, 2,300–4,400× OpenDP's vector API (29–42 k/s); σ = 10⁴, 10⁶ (cells): 13–15 M/s,
320–370× OpenDP and 1,400× the previous sampler at σ = 10⁶. Table build: ≤ 0.2 s, cached.
On the quiet machine (2026-11-24, batch 10⁶, OpenDP 0.16.0): σ = 1, 2.25, 10, 100: 147, 146, 143,
123 M draws/s, 0.71, 0.71, 0.69, 0.60 of the AES word rate (206–209 M/s in the same run), 2.6–3.2×
``rint(normal)``, 2,900–4,800× OpenDP's vector API (30–44 k/s); σ = 10⁴, 10⁶: 19 and 20 M/s
(0.09–0.10 of the word rate: a uniform inside the cell and its acceptance test), 430× OpenDP.

Compiled pass (issue 36). On the table path the words are no longer made by randomgen and
inverted by numpy: :func:`~censusdp.mechanisms.dg_kernel.invert_aes_window` encrypts the
counters with the AES-NI instructions (the same AES-128-CTR words: tested against
``AESCounter.random_raw``), inverts each half-word by the rule of :meth:`CellTable.invert` in
integers (guide bucket, else the first entry ≥ W, searched from the bucket's first entry
:attr:`CellTable.starts`) and writes int64 straight into the output; ties (a word equal to an
entry) are resolved by :meth:`CellTable.resolve` in position order as before. So the draws, and
every seeded release, are unchanged (tested draw for draw against the numpy path,
``kernel=False``, over σ). Measured (``benchmarks/samplers.py --quick``, 2026-11-28, AMD Zen 5
host, two cores shared with six other sessions' jobs, per CPU second, batch 10⁶): σ = 1, 2.25,
10, 100: 696, 736, 693, 565 M draws/s, 1.10, 1.14, 1.06, 0.88 of randomgen's AES-CTR 64-bit
word rate in the same run (633–652 M/s), 1.75–1.97× the numpy path on the same words (385,
420, 380, 286 M/s), 6–8× ``rint(normal)``; the cell path (σ = 10⁴) is numpy's, 50 M/s.

Determinism: ``sample(gen, size)`` is a pure function of the generator's state and ``size``
(the current CKS sampler guarantees the same and no more); through
:meth:`censusdp.rng.KeyedRNG.draw`, which always draws whole chunks, noise is independent of
how nodes are partitioned.

References
----------
Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020.
Chen & Asau, "On generating random variates from an empirical distribution", AIIE Trans. 1974.
Johansson, "Arb: efficient arbitrary-precision midpoint-radius interval arithmetic",
IEEE Trans. Computers 2017.
Devroye, "Non-Uniform Random Variate Generation", Springer 1986, §II.2 (inversion) and §II.3
(rejection).
Bernstein, "ChaCha, a variant of Salsa20", 2008; NIST SP 800-90A Rev. 1 (2015), CTR_DRBG.
"""

from __future__ import annotations

import hashlib
import math
import sys
import threading
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import numpy as np
from flint import arb, ctx
from randomgen import AESCounter

from censusdp.mechanisms.dg_kernel import aes_half_words, invert_aes_window
from censusdp.mechanisms.discrete import bernoulli_exp, bernoulli_exp_reference
from censusdp.rng import aes_counter, aes_key

__all__ = [
    "GUIDE_BITS",
    "TABLE_SIGMA_MAX",
    "WORD_BITS",
    "CellTable",
    "add_discrete_gaussian_window",
    "cell_table",
    "sample_discrete_gaussian_fast",
    "sample_discrete_gaussian_window",
]

#: Bits of uniform per draw on the fast path (half a 64-bit word).
WORD_BITS = 32
#: The guide table is indexed by this many leading bits of the word.
GUIDE_BITS = 16
#: Largest σ sampled by pure table inversion (L = 1); above it, cells of width ≈ σ/64.
TABLE_SIGMA_MAX = 128
_CELLS_PER_SIGMA = 64
_BLOCK = 1 << 15  # draws per vectorised block: the block's arrays stay in L2 cache
_SCAN = 1 << 20  # draws per block of a prefix scan (its int64 scratch: 8 MB)
_SENTINEL = np.iinfo(np.int64).min
_WORD_MASK = (1 << WORD_BITS) - 1
_INT62 = 1 << 62
_PREC_MAX = 1 << 16  # an entry 65,536 bits do not settle: fail loudly, never loop
#: Arb's working precision is process-global: table builds and resolutions hold this lock so
#: that threads (a threaded Dask worker) never change it under each other, which would make
#: the number of words a resolution reads, hence the draws, depend on thread timing.
_ARB_LOCK = threading.RLock()


class CellTable:
    """The exact fixed-point inversion table of the cell law of a discrete Gaussian.

    Parameters
    ----------
    sigma2 : Fraction
        σ² = p/q > 0.
    width : int
        Odd cell width L ≥ 1 (L = 1: the cells are the integers and the law is the discrete
        Gaussian itself).

    Attributes
    ----------
    lowest : int
        The cell of table entry 0; entry i is ``C_{lowest+i} = ⌊2³²·F(lowest + i)⌋``.
    bounds : numpy.ndarray
        uint32 entries, non-decreasing, from 0 to 2³² − 1.
    guide : numpy.ndarray
        int64 of length 2¹⁶: the cell of every word in a bucket, or a sentinel.
    starts : numpy.ndarray
        int64 of length 2¹⁶: the index of the first entry ≥ each bucket's first word (where the
        compiled inversion starts its search in a sentinel bucket).
    """

    def __init__(self, sigma2: Fraction, width: int = 1) -> None:
        if width < 1 or width % 2 == 0:
            raise ValueError(f"cell width must be an odd positive integer, got {width}")
        self.sigma2 = Fraction(sigma2)
        self.width = int(width)
        self.half = (self.width - 1) // 2
        self._p, self._q = self.sigma2.numerator, self.sigma2.denominator
        self._cache: dict[int, tuple[arb, list[arb]]] = {}
        with _ARB_LOCK:
            self.extent = self._extent()
            self.lowest = -self.extent - 1
            self.bounds = self._bounds()
        self.guide = self._guide()

    # ---- exact cell law -------------------------------------------------------------------

    def _distance(self, c: int) -> int:
        """d_c: the smallest |k| in cell c."""
        return max(abs(c) * self.width - self.half, 0)

    def _weight(self, c: int) -> arb:
        """w_c = exp(−d_c²·q/(2p)) as a ball at the current precision."""
        d = self._distance(c)
        return (-(arb(d * d * self._q) / (2 * self._p))).exp()

    def _tail_direct(self, m: int) -> arb:
        """T(m) = Σ_{c ≥ m} w_c (m ≥ 1) with the rigorous geometric remainder bound.

        The ball is ``[S, S + R]`` with S ≥ w_m > 0 the partial sum and R < 2^(−prec−8)·S
        the bound on the rest: a *relative* enclosure however small T(m) is (Arb's exponents
        do not underflow), so T(m)/Z is certified positive at any precision.
        """
        total, c = arb(0), m
        eps = arb(2) ** (-ctx.prec - 8)
        cut = 2.0 ** (-ctx.prec - 8)
        while True:
            w = self._weight(c)
            if float(w.mid()) <= cut * float(total.mid()):  # both 0.0 once floats underflow
                d = self._distance(c)
                step = arb((2 * d * self.width + self.width**2) * self._q) / (2 * self._p)
                rest = w / (1 - (-step).exp())  # ≥ Σ_{j ≥ c} w_j
                if rest < eps * (total + w):  # never on the first term: rest ≥ w
                    return total + arb(0, rest.upper())  # [total, total + rest]
            total += w
            c += 1

    def _state(self, prec: int) -> tuple[arb, list[arb]]:
        """(Z, [T(1), …, T(extent + 1)]) at ``prec`` bits, cached."""
        if prec not in self._cache:
            old = ctx.prec
            ctx.prec = prec
            try:
                top = self.extent + 1 if hasattr(self, "extent") else 1
                tails = [arb(0)] * (top + 1)
                tails[top] = self._tail_direct(top)
                for m in range(top - 1, 0, -1):
                    tails[m] = tails[m + 1] + self._weight(m)
                self._cache[prec] = (1 + 2 * tails[1], tails)
            finally:
                ctx.prec = old
        return self._cache[prec]

    def cdf(self, c: int, prec: int = 128) -> arb:
        """F(c) = P(cell ≤ c) as a ball of ``prec``-bit precision (any integer c)."""
        z, tails = self._state(prec)
        old = ctx.prec
        ctx.prec = prec
        try:
            m = -c if c < 0 else c + 1
            t = tails[m] if m < len(tails) else self._tail_direct(m)
            return t / z if c < 0 else 1 - t / z
        finally:
            ctx.prec = old

    def _extent(self) -> int:
        """The smallest M with T(M + 1)/Z < 2⁻³², located in floating point, certified."""
        s2 = float(self.sigma2)
        top = int((math.sqrt(2 * s2 * 48) + self.half) / self.width) + 2  # e⁻⁴⁸ ≪ 2⁻³²
        d = np.maximum(np.arange(1, top + 1) * float(self.width) - self.half, 0.0)
        w = np.exp(-(d * d) / (2 * s2))
        tails = np.cumsum(w[::-1])[::-1]  # tails[i] ≈ T(i + 1)
        ratio = tails / (1 + 2 * tails[0])
        m = max(1, int(np.flatnonzero(ratio < 2.0**-WORD_BITS)[0]))  # T(m + 1)/Z < 2⁻³²
        z, _ = self._state(160)
        old = ctx.prec
        ctx.prec = 160
        try:
            limit = arb(2) ** (-WORD_BITS)
            while not (self._tail_direct(m + 1) / z < limit):
                m += 1
            while m > 1 and self._tail_direct(m) / z < limit:
                m -= 1
        finally:
            ctx.prec = old
        self._cache.clear()
        return m

    def _bounds(self) -> np.ndarray:
        """The entries ``⌊2³²F(c)⌋`` for c = lowest … extent, each certified exact.

        The end entries follow from the certified extent M (``T(M + 1)/Z < 2⁻³²``):
        ``F(lowest) = T(M + 1)/Z < 2⁻³²`` gives 0 and ``1 − 2⁻³² < F(M) < 1`` gives 2³² − 1.
        Every other entry comes from the tail on its side, ``⌊2³²·T(−c)/Z⌋`` for c < 0 and
        ``2³² − ⌈2³²·T(c + 1)/Z⌉`` for c ≥ 0 (``⌊N − x⌋ = N − ⌈x⌉``), a ball of relative
        precision 2^(−prec) whose product and rounding are taken at that same precision, so
        doubling the precision settles any entry that is not exactly an integer. (Rounding
        ``2³²·(1 − T/Z)`` at a fixed precision instead cannot separate ``2³²F(c)`` from an
        integer closer than that precision allows: at σ² = 155/4096, 2³²F(1) = 2³² − 5·10⁻¹⁴.)
        """
        out = np.empty(self.extent - self.lowest + 1, dtype=np.uint32)
        out[0], out[-1] = 0, _WORD_MASK
        for c in range(self.lowest + 1, self.extent):
            prec = 128
            while (v := self._tail_word(c, prec)) is None:
                if prec >= _PREC_MAX:
                    raise ArithmeticError(
                        f"table entry {c} of the discrete Gaussian with sigma² = {self.sigma2} "
                        f"is not certified at {prec} bits"
                    )
                prec *= 2
            out[c - self.lowest] = v
        return out

    def _tail_word(self, c: int, prec: int) -> int | None:
        """``⌊2³²F(c)⌋`` for ``lowest < c < extent`` if a ``prec``-bit ball settles it."""
        z, tails = self._state(prec)
        m = -c if c < 0 else c + 1
        old = ctx.prec
        ctx.prec = prec
        try:
            x = (tails[m] if m < len(tails) else self._tail_direct(m)) * (1 << WORD_BITS) / z
            if c < 0:
                v = x.floor().unique_fmpz()
                return None if v is None else int(v)
            v = x.ceil().unique_fmpz()
            return None if v is None else (1 << WORD_BITS) - int(v)
        finally:
            ctx.prec = old

    def _guide(self) -> np.ndarray:
        shift = WORD_BITS - GUIDE_BITS
        starts = np.arange(1 << GUIDE_BITS, dtype=np.uint64) << np.uint64(shift)
        first = np.searchsorted(self.bounds, starts, side="left")  # first entry ≥ bucket start
        nxt = self.bounds[np.minimum(first, self.bounds.size - 1)].astype(np.uint64)
        pure = (first < self.bounds.size) & (nxt >= starts + np.uint64(1 << shift))
        pure &= first > 0
        guide = np.full(1 << GUIDE_BITS, _SENTINEL, dtype=np.int64)
        guide[pure] = self.lowest + first[pure]
        self.starts = first.astype(np.int64)
        return guide

    def acceptance_exponent(self, k: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, int]:
        """The cell path's acceptance exponent γ = (k² − d_c²)/(2σ²) as ``(num, den)``.

        A proposal k drawn uniformly in cell c (law ``Q(k) ∝ exp(−d_c²/(2σ²))``) is accepted
        with probability exp(−γ) ≤ 1, which leaves ``P(k) ∝ exp(−k²/(2σ²))`` (Devroye 1986
        §II.3; the Bernoulli is CKS 2020 Algorithm 1). With σ² = p/q,
        ``γ = q·(|k| − d_c)(|k| + d_c)/(2p)`` exactly.

        Parameters
        ----------
        k, cells : numpy.ndarray
            int64 proposals and their cells (k in cell c: ``|k − c·L| ≤ h``).

        Returns
        -------
        (num, den) : numpy.ndarray, int
            ``den = 2p``; ``num`` int64 when every numerator and ``den`` stay below 2⁶², else
            an object array of Python integers (exact, slower).
        """
        p, q, width, half = self._p, self._q, self.width, self.half
        d = np.maximum(np.abs(cells) * width - half, 0)
        ak = np.abs(k)
        kmax = int(ak.max()) if ak.size else 0
        if q * width * (2 * kmax + width) < _INT62 and 2 * p < _INT62:
            return q * (ak - d) * (ak + d), 2 * p
        num = [q * (int(a) - int(b)) * (int(a) + int(b)) for a, b in zip(ak, d, strict=True)]
        return np.array(num, dtype=object), 2 * p

    # ---- inversion ------------------------------------------------------------------------

    def invert(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cells of certified 32-bit words; the positions of words equal to a table entry.

        Returns
        -------
        (cells, ambiguous) : numpy.ndarray, numpy.ndarray
            int64 cells (unspecified at ambiguous positions) and the int64 positions that
            :meth:`resolve` must settle.
        """
        words = np.asarray(words, dtype=np.uint32)
        cells = np.empty(words.size, dtype=np.int64)
        index = np.empty(words.size, dtype=np.intp)
        amb = self._invert_into(words, cells, index)
        return cells, amb

    def _invert_into(self, words: np.ndarray, cells: np.ndarray, index: np.ndarray) -> np.ndarray:
        np.right_shift(words, WORD_BITS - GUIDE_BITS, out=index, casting="unsafe")
        np.take(self.guide, index, out=cells, mode="wrap")
        slow = np.flatnonzero(cells == _SENTINEL)
        if not slow.size:
            return slow
        w = words[slow]
        i = np.searchsorted(self.bounds, w, side="left")
        cells[slow] = self.lowest + i
        return slow[self.bounds[i] == w]

    def resolve(self, word: int, more: Callable[[], int]) -> int:
        """The cell of U whose first 32 bits are ``word``, reading later 64-bit words from
        ``more`` until the cell is certified (see the module's proof sketch)."""
        a, n = int(word), WORD_BITS
        guess = self.lowest + int(np.searchsorted(self.bounds, np.uint32(word), side="left"))
        with _ARB_LOCK:
            return self._resolve(a, n, guess, more)

    def _resolve(self, a: int, n: int, guess: int, more: Callable[[], int]) -> int:
        old = ctx.prec
        try:
            while True:
                prec = n + 96
                ctx.prec = prec  # a/2ⁿ and (a + 1)/2ⁿ are exact at this precision
                scale = arb(2) ** n
                c = self._locate(arb(2 * a + 1) / (2 * scale), guess, prec)
                ctx.prec = prec
                lower, upper = self.cdf(c - 1, prec), self.cdf(c, prec)
                ctx.prec = prec
                if lower * scale <= a and upper * scale >= a + 1:
                    return c
                a = (a << 64) | (int(more()) & ((1 << 64) - 1))
                n += 64
                guess = c
        finally:
            ctx.prec = old

    def _locate(self, x: arb, guess: int, prec: int) -> int:
        """The smallest c whose F(c) midpoint exceeds x (a search; the caller certifies)."""

        def above(c: int) -> bool:
            return bool(self.cdf(c, prec).mid() > x)

        lo = hi = guess
        step = 1
        while not above(hi):
            lo, hi, step = hi, hi + step, step * 2
        step = 1
        while above(lo):
            hi, lo, step = lo, lo - step, step * 2
        while hi - lo > 1:  # above(lo) is False, above(hi) is True
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if above(mid) else (mid, hi)
        return hi

    def sample_cells(self, bitgen, size: int) -> np.ndarray:
        """``size`` exact draws of the cell law from the raw 64-bit words of ``bitgen``."""
        out = np.empty(size, dtype=np.int64)
        index = np.empty(min(size, _BLOCK), dtype=np.intp)
        pending: list[tuple[int, int]] = []
        for start in range(0, size, _BLOCK):
            m = min(_BLOCK, size - start)
            words = _half_words(bitgen.random_raw((m + 1) // 2))[:m]
            amb = self._invert_into(words, out[start : start + m], index[:m])
            pending.extend((start + int(j), int(words[j])) for j in amb)
        for pos, word in pending:
            out[pos] = self.resolve(word, bitgen.random_raw)
        return out


def _half_words(raw: np.ndarray) -> np.ndarray:
    """The 32-bit halves of 64-bit words, low half first, on any host."""
    if sys.byteorder == "little":
        return raw.view(np.uint32)
    return (
        np.stack([raw & np.uint64(_WORD_MASK), raw >> np.uint64(32)], axis=1)
        .astype(np.uint32)
        .ravel()
    )


def _cell_width(sigma2: Fraction) -> int:
    sigma = math.sqrt(float(sigma2))
    if sigma <= TABLE_SIGMA_MAX:
        return 1
    return 2 * int(sigma / (2 * _CELLS_PER_SIGMA)) + 1


@lru_cache(maxsize=64)
def cell_table(sigma2: Fraction) -> CellTable:
    """The (cached) inversion table the fast sampler uses for σ²."""
    return CellTable(Fraction(sigma2), _cell_width(Fraction(sigma2)))


def _accept(gen: np.random.Generator, k: np.ndarray, cells: np.ndarray, table: CellTable):
    """Bernoulli(exp(−(k² − d_c²)/(2σ²))) elementwise, exactly (CKS Algorithm 1)."""
    num, den = table.acceptance_exponent(k, cells)
    if num.dtype != object:
        return bernoulli_exp(gen, num, den)
    return np.array([bernoulli_exp_reference(gen, Fraction(int(n), den)) for n in num], dtype=bool)


def sample_discrete_gaussian_fast(
    gen: np.random.Generator,
    size: int,
    sigma2: Fraction | int,
    *,
    source: str = "aes",
    kernel: bool = True,
) -> np.ndarray:
    """``size`` exact draws of the discrete Gaussian P(k) ∝ exp(−k²/(2σ²)), σ² rational.

    Parameters
    ----------
    gen : numpy.random.Generator
        The keyed stream (a KeyedRNG chunk generator). With ``source="aes"`` two of its
        64-bit words key the AES-128-CTR word source; with ``"chacha20"`` every word is its.
    size : int
    sigma2 : Fraction or int
    source : {"aes", "chacha20"}
    kernel : bool
        On the table path with AES words, invert in the compiled pass of
        :func:`~censusdp.mechanisms.dg_kernel.invert_aes_window` (default); False runs the
        numpy inversion (:meth:`CellTable.sample_cells`), the same draws: the reference the
        tests hold the kernel to.

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(size,)``; a pure function of the generator's state and size.
    """
    if source not in ("aes", "chacha20"):
        raise ValueError(f"source must be 'aes' or 'chacha20', got {source!r}")
    table = cell_table(Fraction(sigma2))
    if source == "aes" and table.width == 1 and kernel:
        size = int(size)
        return _fused_window(table, aes_key(gen), size, 0, size, None)
    bitgen = aes_counter(gen) if source == "aes" else gen.bit_generator
    if table.width == 1:
        return table.sample_cells(bitgen, int(size))
    words = np.random.Generator(bitgen)
    out = np.empty(int(size), dtype=np.int64)
    filled = 0
    while filled < size:
        need = int(size) - filled
        m = min(need + need // 32 + 16, _BLOCK)  # acceptance ≳ 0.97; blocks stay in cache
        cells = table.sample_cells(bitgen, m)
        k = cells * table.width + words.integers(-table.half, table.half + 1, size=m)
        k = k[_accept(words, k, cells, table)]
        take = min(need, k.size)
        out[filled : filled + take] = k[:take]
        filled += take
    return out


# ---- drawing a window of a chunk ------------------------------------------------------------
#: Prefix scans remembered per (chunk's word key, σ², size): how far the words were scanned,
#: and every ambiguous position met with the number of 64-bit words its resolution read.
_PREFIX_SCANS: dict = {}
_PREFIX_LIMIT = 4096
_PREFIX_LOCK = threading.Lock()


def _invert_window(
    table: CellTable, key: np.ndarray, first: int, stop: int, out: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Invert half-words ``[first, stop)`` (into ``out`` if given; else through a scratch
    buffer of :data:`_SCAN` draws) in the compiled pass; the ambiguous positions (relative to
    ``first``) and their words."""
    if out is not None:
        pos = invert_aes_window(key, first, table, out)
        return pos, aes_half_words(key, pos + first)
    scratch = np.empty(min(stop - first, _SCAN), dtype=np.int64)
    found = []
    for a in range(first, stop, _SCAN):
        b = min(a + _SCAN, stop)
        amb = invert_aes_window(key, a, table, scratch[: b - a])
        found.append(amb + (a - first))
    pos = np.concatenate(found) if found else np.empty(0, np.int64)
    return pos, aes_half_words(key, pos + first)


def _fused_window(
    table: CellTable,
    key: np.ndarray,
    size: int,
    start: int,
    stop: int,
    base: np.ndarray | None,
) -> np.ndarray:
    """Draws ``[start, stop)`` of the table path's ``size`` draws from the AES words keyed
    by ``key`` (plus ``base``, int64 of any shape and strides, when given; the result then
    has its shape): one compiled pass
    (:func:`~censusdp.mechanisms.dg_kernel.invert_aes_window`), then the rare ambiguous words
    resolved in position order from word ``⌈size/2⌉`` on, after those of the draws before
    ``start`` (:func:`_prefix_words`)."""
    out = np.empty(stop - start if base is None else base.shape, dtype=np.int64)
    pos = invert_aes_window(key, start, table, out, base)
    if pos.size:
        words = aes_half_words(key, pos + start)
        more = AESCounter(key=key, counter=0)
        more.advance((size + 1) // 2 + (_prefix_words(table, key, size, start) if start else 0))
        flat = out.reshape(-1)  # a view: out is C-contiguous
        for p, w in zip(pos.tolist(), words.tolist(), strict=True):
            c = table.resolve(w, more.random_raw)
            flat[p] = c if base is None else int(base.flat[p]) + c
    return out


def _prefix_words(table: CellTable, key: np.ndarray, size: int, start: int) -> int:
    """64-bit words read by the resolutions of the ambiguous draws before ``start`` (they
    read the stream from word ``⌈size/2⌉`` on, in position order)."""
    memo = (hashlib.sha256(key.tobytes()).digest(), table._p, table._q, table.width, size)
    with _PREFIX_LOCK:
        scanned, found = _PREFIX_SCANS.get(memo, (0, ()))
    if scanned < start:
        pos, words = _invert_window(table, key, scanned, start, None)
        more = AESCounter(key=key, counter=0)
        more.advance((size + 1) // 2 + sum(u for _, u in found))
        new = []
        for p, w in zip(pos.tolist(), words.tolist(), strict=True):
            read = [0]

            def word(read=read) -> int:
                read[0] += 1
                return more.random_raw()

            table.resolve(w, word)
            new.append((scanned + p, read[0]))
        found, scanned = (*found, *new), start
        with _PREFIX_LOCK:
            if _PREFIX_SCANS.get(memo, (0,))[0] < scanned:
                if len(_PREFIX_SCANS) >= _PREFIX_LIMIT:
                    _PREFIX_SCANS.pop(next(iter(_PREFIX_SCANS)))
                _PREFIX_SCANS[memo] = (scanned, found)
    return sum(u for p, u in found if p < start)


def sample_discrete_gaussian_window(
    gen: np.random.Generator,
    size: int,
    start: int,
    stop: int,
    sigma2: Fraction | int,
) -> np.ndarray:
    """Draws ``[start, stop)`` of ``sample_discrete_gaussian_fast(gen, size, sigma2)``, equal
    bit for bit, drawing only those.

    On the table path (σ ≤ :data:`TABLE_SIGMA_MAX`) draw ``i`` is the inversion of half-word
    ``i`` of the AES word stream, unless that word equals a table entry; those few
    (probability ≈ table length / 2³² per draw) are resolved after every half-word, in
    position order, reading the stream from word ``⌈size/2⌉`` on. So the window's words are
    read straight from the counter (``AESCounter.advance``); only when the window holds an
    ambiguous word are the words before ``start`` scanned for the ambiguous ones and their
    resolutions replayed, to find the word the window's resolutions start at (the scan is
    remembered per chunk: a chunk's prefix is scanned at most once per process). The cell
    path (σ above the table) reads a variable number of words per draw: it is drawn whole
    and sliced.

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(stop − start,)``.
    """
    size, start, stop = int(size), int(start), int(stop)
    if not 0 <= start <= stop <= size:
        raise ValueError(f"window [{start}, {stop}) is outside [0, {size})")
    table = cell_table(Fraction(sigma2))
    if table.width != 1:
        return sample_discrete_gaussian_fast(gen, size, sigma2)[start:stop]
    return _fused_window(table, aes_key(gen), size, start, stop, None)


def add_discrete_gaussian_window(
    gen: np.random.Generator,
    size: int,
    start: int,
    stop: int,
    sigma2: Fraction | int,
    answers: np.ndarray,
) -> np.ndarray:
    """``answers + sample_discrete_gaussian_window(gen, size, start, stop, sigma2)``, bit for
    bit, without an array of noise: on the table path the draws are inverted from their AES
    words straight into the output, and the answers added there in place
    (:func:`~censusdp.mechanisms.dg_kernel.invert_aes_window`).

    Parameters
    ----------
    answers : numpy.ndarray
        Integer answers (int64 arithmetic), ``stop − start`` of them in any shape and strides
        (read in C order; e.g. a query's columns of a wider answer table, read in place).

    Returns
    -------
    numpy.ndarray
        int64 of the shape of ``answers``: the noisy answers (int64 arithmetic, as numpy's).
    """
    size, start, stop = int(size), int(start), int(stop)
    if not 0 <= start <= stop <= size:
        raise ValueError(f"window [{start}, {stop}) is outside [0, {size})")
    answers = np.asarray(answers)
    if answers.size != stop - start:
        raise ValueError(f"{answers.size} answers for the {stop - start} draws [{start}, {stop})")
    table = cell_table(Fraction(sigma2))
    if table.width != 1:
        noise = sample_discrete_gaussian_fast(gen, size, sigma2)[start:stop]
        return answers.astype(np.int64, copy=False) + noise.reshape(answers.shape)
    return _fused_window(
        table, aes_key(gen), size, start, stop, answers.astype(np.int64, copy=False)
    )
