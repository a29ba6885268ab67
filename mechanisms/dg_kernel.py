"""The exact table sampler fused with its AES-128-CTR words: one compiled pass per window.

:class:`~censusdp.mechanisms.dg_table.CellTable` inverts 32-bit half-words of an AES-128
counter-mode stream (randomgen's ``AESCounter``, keyed by :func:`censusdp.rng.aes_key`)
against the exact fixed-point CDF ``C_c = ⌊2³²·F(c)⌋`` of the discrete Gaussian. Done with
numpy, a window of draws costs a pass to make the 64-bit words (randomgen's buffered
``random_raw``), a view, a shift, a gather from the guide table, a compare, a
``flatnonzero`` and, for the caller, a pass adding the noise to the answers and copies
between them. :func:`invert_aes_window` does all of it in one compiled loop: it encrypts the
counters itself with the AES-NI instructions (four blocks at a time, so the four independent
chains hide the instruction latency), splits each block into its four half-words, inverts
each, and writes ``answers + noise`` (or the noise) as int64 straight into the output.

Same words, same rule, same draws
---------------------------------
* **Words.** Half-word ``i`` of the stream is half ``i mod 2`` (low half first) of 64-bit word
  ``⌊i/2⌋``, and 64-bit word ``w`` is lane ``w mod 2`` of ``AES-128_K(⌊w/2⌋)``, the counter a
  little-endian 128-bit integer: randomgen's ``AESCounter(key=K, counter=0)`` in counter mode
  (NIST SP 800-38A §6.5; its state's ``seed`` holds the expanded key, FIPS-197 §5.2, which this
  module reads from it rather than re-deriving it). The AES rounds are the processor's
  ``AESENC``/``AESENCLAST`` (FIPS-197 §5.1, one round per instruction). The test suite checks
  the words against ``random_raw`` for many keys and offsets.
* **Inversion.** The rule is that of ``CellTable._invert_into`` exactly, in integers: the
  cell of word W is ``guide[W >> 16]`` when that bucket of 2¹⁶ words lies strictly between
  two consecutive entries, else ``lowest + i`` with ``i`` the first entry ``≥ W``
  (``np.searchsorted(bounds, W, side="left")``), found by stepping up from the bucket's first
  entry ``starts[W >> 16]`` (every entry before it is below the bucket's first word, hence
  below W; the expected number of steps is about the table's length over 2¹⁶). Only integer
  comparisons decide a draw; no word is converted to floating point.
* **Ties.** A word equal to a table entry (``bounds[i] == W``) is not certified by its 32
  bits; its position is returned and the caller resolves it exactly as today
  (``CellTable.resolve``: further 64-bit words of the stream from word ``⌈size/2⌉`` on, in
  position order, compared with F in certified ball arithmetic), so the law of every draw is
  inversion of a uniform U (the proof sketch of :mod:`censusdp.mechanisms.dg_table`), and the
  draws equal the numpy path's draw for draw (tested with hypothesis over σ).

Without AES-NI (:data:`HAVE_AESNI` false) the words come from randomgen's ``random_raw`` (the
same words) and only the inversion is compiled.

References
----------
NIST FIPS-197 (2001), Advanced Encryption Standard; NIST SP 800-38A (2001), §6.5 (CTR mode).
Gueron, "Intel Advanced Encryption Standard (AES) New Instructions Set", Intel white paper
323641-001 rev. 3.01 (2012), §4 (pipelining independent blocks).
Chen & Asau, "On generating random variates from an empirical distribution", AIIE Trans. 1974
(the guide table).
Lam, Pitrou & Seibert, "Numba: a LLVM-based Python JIT compiler", LLVM-HPC 2015.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as _llb
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core import config as _numba_config
from numba.extending import intrinsic
from randomgen import AESCounter

__all__ = [
    "HAVE_AESNI",
    "aes_half_words",
    "invert_aes_window",
    "invert_words",
    "round_keys",
]


def _aesni() -> bool:
    """Whether numba compiles for a processor with the AES instructions: the host's, unless
    ``NUMBA_CPU_NAME`` names another target (then its ``NUMBA_CPU_FEATURES`` must list +aes)."""
    if _numba_config.CPU_NAME not in (None, "host"):
        return "+aes" in (_numba_config.CPU_FEATURES or "").split(",")
    return bool(_llb.get_host_cpu_features().get("aes", False))


#: Whether the words are made in the kernel (AES-NI); else randomgen makes them.
HAVE_AESNI = _aesni()

_SENTINEL = np.iinfo(np.int64).min
_MASK32 = np.uint64(0xFFFFFFFF)
_V2 = ir.VectorType(ir.IntType(64), 2)
_PAIR = types.UniTuple(types.uint64, 2)


def _aes_round(llvm_name: str):
    """A numba intrinsic ``f(lo, hi, klo, khi) -> (lo, hi)``: one AES round instruction on the
    128-bit state ``(lo, hi)`` (lane 0 the low 64 bits) with round key ``(klo, khi)``."""

    @intrinsic
    def aes_round(typingctx, lo, hi, klo, khi):
        sig = _PAIR(types.uint64, types.uint64, types.uint64, types.uint64)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            zero, one = ir.Constant(i32, 0), ir.Constant(i32, 1)

            def vec(a, b):
                v = builder.insert_element(ir.Constant(_V2, ir.Undefined), a, zero)
                return builder.insert_element(v, b, one)

            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V2, [_V2, _V2]), llvm_name
            )
            r = builder.call(fn, [vec(args[0], args[1]), vec(args[2], args[3])])
            out = [builder.extract_element(r, zero), builder.extract_element(r, one)]
            return context.make_tuple(builder, signature.return_type, out)

        return sig, codegen

    return aes_round


_aesenc = _aes_round("llvm.x86.aesni.aesenc")
_aesenclast = _aes_round("llvm.x86.aesni.aesenclast")


def round_keys(key: np.ndarray) -> np.ndarray:
    """The 11 AES-128 round keys of ``key`` (two uint64: :func:`censusdp.rng.aes_key`) as 22
    uint64, lane 0 first: randomgen's own expansion (the ``seed`` of its state)."""
    rk = np.asarray(AESCounter(key=key, counter=0).state["s"]["seed"], dtype=np.uint64)
    if rk.shape != (22,):
        raise RuntimeError(f"randomgen's AES state changed layout: seed of shape {rk.shape}")
    return np.ascontiguousarray(rk)


@njit(cache=True, nogil=True, inline="always")
def _aes4(rk, c):  # pragma: no cover - compiled
    """AES-128 of the counters ``c, c + 1, c + 2, c + 3`` (high lane 0), four independent
    chains interleaved round by round: 8 uint64, block by block, lane 0 first."""
    k0, k1 = rk[0], rk[1]
    a0, a1 = np.uint64(c) ^ k0, k1
    b0, b1 = np.uint64(c + 1) ^ k0, k1
    d0, d1 = np.uint64(c + 2) ^ k0, k1
    e0, e1 = np.uint64(c + 3) ^ k0, k1
    for r in range(1, 10):
        q0, q1 = rk[2 * r], rk[2 * r + 1]
        a0, a1 = _aesenc(a0, a1, q0, q1)
        b0, b1 = _aesenc(b0, b1, q0, q1)
        d0, d1 = _aesenc(d0, d1, q0, q1)
        e0, e1 = _aesenc(e0, e1, q0, q1)
    q0, q1 = rk[20], rk[21]
    a0, a1 = _aesenclast(a0, a1, q0, q1)
    b0, b1 = _aesenclast(b0, b1, q0, q1)
    d0, d1 = _aesenclast(d0, d1, q0, q1)
    e0, e1 = _aesenclast(e0, e1, q0, q1)
    return a0, a1, b0, b1, d0, d1, e0, e1


@njit(cache=True, nogil=True)
def _cell(w, bounds, guide, starts, lowest):  # pragma: no cover - compiled
    """(cell, tie) of the 32-bit word ``w``: ``CellTable._invert_into``'s rule in integers."""
    c = guide[w >> np.uint64(16)]
    if c != _SENTINEL:
        return c, False
    lo = starts[w >> np.uint64(16)]  # the bucket's first entry: those before are below w
    while np.uint64(bounds[lo]) < w:  # first i with bounds[i] >= w (bounds[-1] = 2³² − 1)
        lo += 1
    return lowest + lo, np.uint64(bounds[lo]) == w


@njit(cache=True, nogil=True)
def _invert_end(
    rk, g, lo, hi, first, bounds, guide, starts, lowest, out, ties, nt
):  # pragma: no cover
    """Half-words ``[lo, hi)`` of group ``g`` (a partial group at a window's end), one by one;
    the tie count."""
    if lo >= hi:
        return nt
    buf = np.empty(8, np.uint64)
    buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7] = _aes4(rk, 4 * g)
    for h in range(lo, hi):
        t = h - (g << 4)
        w = (buf[t >> 1] >> np.uint64(32 * (t & 1))) & _MASK32
        c, tie = _cell(w, bounds, guide, starts, lowest)
        if tie:
            ties[nt] = h - first
            nt += 1
        out[h - first] = c
    return nt


@njit(cache=True, nogil=True)
def _invert_aes(rk, first, bounds, guide, starts, lowest, out, ties):  # pragma: no cover - compiled
    """Half-words ``[first, first + out.size)`` of the stream keyed by ``rk``, inverted into
    ``out``; tie positions (relative, ascending) into ``ties``; their count.

    A group is 4 AES blocks = 8 words = 16 half-words. The groups wholly inside the window run
    through one flat loop (the inversion written out in it: a call per draw that passes
    arrays costs their reference counts), the partial groups at its ends through
    :func:`_invert_end`, in position order."""
    stop = first + out.size
    g_in, g1 = (first + 15) >> 4, stop >> 4  # groups [g_in, g1) lie wholly inside
    if g_in > g1:  # the window lies inside one group
        return _invert_end(rk, g1, first, stop, first, bounds, guide, starts, lowest, out, ties, 0)
    nt = _invert_end(
        rk, g_in - 1, first, g_in << 4, first, bounds, guide, starts, lowest, out, ties, 0
    )
    buf = np.empty(8, np.uint64)
    for g in range(g_in, g1):
        buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7] = _aes4(rk, 4 * g)
        i0 = (g << 4) - first
        for t in range(16):
            w = (buf[t >> 1] >> np.uint64(32 * (t & 1))) & _MASK32
            c = guide[w >> np.uint64(16)]
            if c == _SENTINEL:  # the first entry >= w: np.searchsorted(bounds, w, "left")
                lo = starts[w >> np.uint64(16)]  # from the bucket's first entry: a step or two
                while np.uint64(bounds[lo]) < w:
                    lo += 1
                c = lowest + lo
                if np.uint64(bounds[lo]) == w:
                    ties[nt] = i0 + t
                    nt += 1
            out[i0 + t] = c
    return _invert_end(rk, g1, g1 << 4, stop, first, bounds, guide, starts, lowest, out, ties, nt)


@njit(cache=True, nogil=True)
def _aes_half_words(rk, positions, out):  # pragma: no cover - compiled
    buf = np.empty(8, np.uint64)
    for j in range(positions.size):
        h = positions[j]
        buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7] = _aes4(rk, 4 * (h >> 4))
        t = h & 15
        out[j] = (buf[t >> 1] >> np.uint64(32 * (t & 1))) & _MASK32


def aes_half_words(key: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Half-words at ``positions`` of the AES-128-CTR stream keyed by ``key`` (uint32)."""
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    if not HAVE_AESNI:
        out = np.empty(positions.size, dtype=np.uint32)
        for j, h in enumerate(positions.tolist()):
            bitgen = AESCounter(key=key, counter=0)
            bitgen.advance(h // 2)
            out[j] = (int(bitgen.random_raw()) >> (32 * (h % 2))) & 0xFFFFFFFF
        return out
    out = np.empty(positions.size, dtype=np.uint64)
    _aes_half_words(round_keys(key), positions, out)
    return out.astype(np.uint32)


@njit(cache=True, nogil=True)
def _invert_given(words, bounds, guide, starts, lowest, out, ties):  # pragma: no cover - compiled
    nt = 0
    for i in range(out.size):  # _cell written out (a call per word that passes arrays is slow)
        w = np.uint64(words[i])
        c = guide[w >> np.uint64(16)]
        if c == _SENTINEL:
            lo = starts[w >> np.uint64(16)]
            while np.uint64(bounds[lo]) < w:
                lo += 1
            c = lowest + lo
            if np.uint64(bounds[lo]) == w:
                ties[nt] = i
                nt += 1
        out[i] = c
    return nt


def invert_words(words: np.ndarray, table, out: np.ndarray) -> np.ndarray:
    """Invert given 32-bit ``words`` against ``table`` (a
    :class:`~censusdp.mechanisms.dg_table.CellTable`) into ``out`` (int64), compiled; the
    positions of ties (words equal to a table entry) to resolve."""
    ties = np.empty(out.size, dtype=np.int64)
    words = np.ascontiguousarray(words, np.uint32)
    nt = _invert_given(words, table.bounds, table.guide, table.starts, np.int64(table.lowest),
                       out, ties)  # fmt: skip
    return ties[:nt].copy()


def invert_aes_window(
    key: np.ndarray, first: int, table, out: np.ndarray, base: np.ndarray | None = None
) -> np.ndarray:
    """Half-words ``[first, first + out.size)`` of the AES-128-CTR stream keyed by ``key``
    inverted against ``table`` (a :class:`~censusdp.mechanisms.dg_table.CellTable`: its
    ``bounds``, ``guide``, ``starts`` and ``lowest``) into ``out`` (int64, C-contiguous): the cells, or ``base + cell`` when ``base``
    (integers of ``out``'s shape, any strides) is given.

    With ``base`` the noise goes into ``out`` and ``base`` is added to it in place
    (``np.add(base, out, out=out)``): no array of noise besides the output, no int64 →
    float64 conversion. Adding inside the compiled loop was measured *slower* on the project
    machine (AMD Zen 5, σ = 10, 2.6·10⁵ draws of a 4096 × 64 column slice: 1.67 ns per draw
    contiguous, 1.95 strided, against 1.27 and 1.41 for the loop and then the add): the loop
    is bound by the latency of its table lookups, and one more load per draw in it costs more
    than a streaming vector add after it.

    Returns
    -------
    numpy.ndarray
        int64 positions in ``out`` (flat) of the ties (words equal to a table entry),
        ascending; the values written there are placeholders the caller replaces by their
        resolution (plus ``base``).
    """
    if out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous int64 array")
    if base is not None and np.shape(base) != out.shape:
        raise ValueError(f"base has shape {np.shape(base)}, out {out.shape}")
    flat = out.reshape(-1)
    if not HAVE_AESNI:  # the same words from randomgen, the inversion compiled
        bitgen = AESCounter(key=key, counter=0)
        bitgen.advance(first // 2)
        stop = first + flat.size
        raw = np.atleast_1d(bitgen.random_raw((stop + 1) // 2 - first // 2))
        halves = np.empty(2 * raw.size, dtype=np.uint32)  # low half first, on any host
        halves[0::2], halves[1::2] = raw & _MASK32, raw >> np.uint64(32)
        ties = invert_words(halves[first % 2 : first % 2 + flat.size], table, flat)
    else:
        ties = np.empty(flat.size, dtype=np.int64)
        lowest = np.int64(table.lowest)
        nt = _invert_aes(round_keys(key), np.int64(first), table.bounds, table.guide,
                         table.starts, lowest, flat, ties)  # fmt: skip
        ties = ties[:nt].copy()
    if base is not None:
        np.add(base, out, out=out)
    return ties
