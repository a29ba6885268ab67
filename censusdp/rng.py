"""Randomness: a cryptographically secure generator and keyed, partition-independent streams.

Default mode draws a fresh 256-bit key from :func:`secrets.token_bytes`. Reproducible mode
derives the key from an explicit integer seed and warns (:class:`ReproducibleSeedWarning`):
seeded output is for reproduction and testing, never for a real release. The seed is never
stored on the object in clear text and must never be written to outputs.

Noise is a pure function of ``(key, label, node index)``: the nodes of a stream (one level and
query, say) are cut into fixed chunks of :data:`CHUNK` nodes, and chunk ``j`` is drawn from a
ChaCha20 generator keyed by ``HMAC-SHA256(key, f"{label}:{j}")``. Drawing nodes ``[a, c)`` and
``[c, b)`` separately therefore equals drawing ``[a, b)`` at once, bit for bit, however the work
is partitioned. A sampler that can start mid-chunk (a ``window``: the exact discrete Gaussian's
table path reads one half-word per draw from a counter generator it can advance) lets a range
draw only its own nodes' noise, the same values; other samplers draw the chunk whole and slice. This is the shared-secret-key protocol of Algorithm 4 in the subspace-DP paper
(every agent holds the common key and regenerates locally the noise it needs).

A task never needs the key itself: :meth:`KeyedRNG.restrict` gives a :class:`SubKeys` holding
only the per-chunk sub-keys ``HMAC-SHA256(key, f"{label}:{j}")`` of the streams and chunks it
names. It draws exactly what the key would draw for those chunks and refuses every other one
(:class:`StreamNotHeld`); HMAC being a pseudorandom function, the sub-keys reveal nothing about
the key or any other chunk's sub-key. A partition's task gets the sub-keys of its own node
ranges (:func:`chunk_range`); the granularity is the chunk, so a chunk shared by two
partitions' ranges is held by both.

References
----------
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022, Algorithm 4 (distributed
privatization with a common secret key).
Bernstein, "ChaCha, a variant of Salsa20", 2008 (the ChaCha20 stream cipher as a CSPRNG).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import warnings
from collections.abc import Callable, Iterable, Mapping

import numpy as np
from randomgen import AESCounter, ChaCha

__all__ = [
    "AddWindow",
    "CHUNK",
    "KeyedRNG",
    "ReproducibleSeedWarning",
    "Sampler",
    "aes_counter",
    "aes_key",
    "StreamNotHeld",
    "SubKeys",
    "Window",
    "chunk_range",
]

#: Nodes per keyed chunk. Fixed forever: changing it changes every seeded release.
CHUNK = 1 << 16

#: ``sampler(generator, size) -> 1-D array of `size` draws``.
Sampler = Callable[[np.random.Generator, int], np.ndarray]
#: ``window(generator, size, start, stop)``: draws ``[start, stop)`` of ``sampler(generator, size)``.
Window = Callable[[np.random.Generator, int, int, int], np.ndarray]
#: ``add_window(generator, size, start, stop, values)``: ``values`` plus draws ``[start, stop)``
#: of ``sampler(generator, size)``, in one pass.
AddWindow = Callable[[np.random.Generator, int, int, int, np.ndarray], np.ndarray]


class ReproducibleSeedWarning(UserWarning):
    """Seeded (reproducible) randomness is in use: not for a real release."""


class StreamNotHeld(LookupError):
    """A :class:`SubKeys` was asked for a stream or chunk whose sub-key it does not hold."""


def _chacha(key: bytes) -> np.random.Generator:
    return np.random.Generator(ChaCha(key=int.from_bytes(key, "little"), counter=0, rounds=20))


def aes_key(gen: np.random.Generator) -> np.ndarray:
    """The 128-bit AES key :func:`aes_counter` takes from ``gen``: its next two 64-bit words
    (a second counter generator on the same key reads the same words, e.g. from any word
    on with ``AESCounter.advance``)."""
    return gen.bit_generator.random_raw(2)


def aes_counter(gen: np.random.Generator) -> AESCounter:
    """An AES-128 counter-mode bit generator keyed by the next 128 bits of ``gen``.

    A bulk word source for samplers that consume one word per draw: AES-NI makes it about
    5× faster than ChaCha20 here (see :mod:`censusdp.mechanisms.dg_table`). Keyed from a
    KeyedRNG chunk generator it stays a pure function of (key, label, chunk); AES-128 in
    counter mode is the CTR construction of NIST SP 800-90A, a cryptographically secure
    generator. Two words of ``gen`` are consumed.
    """
    return AESCounter(key=aes_key(gen), counter=0)


def chunk_range(start: int, stop: int) -> range:
    """The chunks :meth:`KeyedRNG.draw` reads to draw items ``[start, stop)`` of a stream."""
    if stop <= start:
        return range(0)
    return range(start // CHUNK, (stop - 1) // CHUNK + 1)


class _Streams:
    """Chunked draws from per-chunk generators (:meth:`generator` is the subclass's)."""

    __slots__ = ()

    def generator(self, label: str, chunk: int = 0) -> np.random.Generator:
        raise NotImplementedError

    def draw(
        self,
        label: str,
        n_items: int,
        start: int,
        stop: int,
        sampler: Sampler,
        width: int = 1,
        *,
        window: Window | None = None,
    ) -> np.ndarray:
        """Draws for items ``[start, stop)`` of a stream of ``n_items`` items.

        Each item is a row of ``width`` draws. Chunk ``j`` covers items
        ``[j*CHUNK, min((j+1)*CHUNK, n_items))`` and is defined as one call
        ``sampler(generator(label, j), rows*width)``, sliced to the range. The result depends
        only on ``(key, label, n_items, start, stop, width)`` and the sampler, never on how
        the range is split.

        ``window(generator(label, j), rows*width, a, b)``, when given, must return draws
        ``[a, b)`` of that call bit for bit (e.g.
        :meth:`~censusdp.mechanisms.laws.NoiseLaw.sample_window`); it is used for a chunk
        the range covers only in part, so a partition draws only its own nodes' noise, not
        its chunks' whole.

        Returns
        -------
        numpy.ndarray
            Shape ``(stop - start, width)``.
        """
        if not 0 <= start <= stop <= n_items:
            raise ValueError(f"stream {label!r}: range [{start}, {stop}) is outside [0, {n_items})")
        if width < 1:
            raise ValueError("width must be at least 1")
        parts = []
        for j in chunk_range(start, stop):
            lo, hi = j * CHUNK, min((j + 1) * CHUNK, n_items)
            a, b = max(start, lo) - lo, min(stop, hi) - lo
            if window is not None and (a, b) != (0, hi - lo):
                rows = np.asarray(window(self.generator(label, j), (hi - lo) * width,
                                         a * width, b * width))  # fmt: skip
                if rows.shape != ((b - a) * width,):
                    raise ValueError(
                        f"window returned shape {rows.shape}, expected {((b - a) * width,)}"
                    )
                parts.append(rows.reshape(b - a, width))
                continue
            rows = np.asarray(sampler(self.generator(label, j), (hi - lo) * width))
            if rows.shape != ((hi - lo) * width,):
                raise ValueError(
                    f"sampler returned shape {rows.shape}, expected {((hi - lo) * width,)}"
                )
            rows = rows.reshape(hi - lo, width)
            parts.append(rows[a:b])
        if not parts:  # only the dtype is wanted: no draw, so no key
            probe = np.asarray(sampler(_chacha(bytes(32)), 0))
            return np.empty((0, width), dtype=probe.dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def add_draws(
        self,
        label: str,
        n_items: int,
        start: int,
        stop: int,
        base: np.ndarray,
        add_window: AddWindow,
        width: int = 1,
    ) -> np.ndarray:
        """``base + draw(label, n_items, start, stop, sampler, width)`` in one pass per chunk.

        ``add_window(generator(label, j), rows*width, a, b, values)`` must return
        ``values + sampler(generator(label, j), rows*width)[a:b]`` bit for bit (e.g.
        :func:`~censusdp.mechanisms.dg_table.add_discrete_gaussian_window`, which adds each
        draw to its value as it makes it): no array of noise, no concatenation, no second
        pass. Chunks are those of :meth:`draw`, so the result is that of :meth:`draw` plus
        ``base``, whatever the range and however it is split.

        Parameters
        ----------
        base : numpy.ndarray
            ``(stop - start, width)`` values (the exact answers).

        Returns
        -------
        numpy.ndarray
            Shape ``(stop - start, width)``.
        """
        if not 0 <= start <= stop <= n_items:
            raise ValueError(f"stream {label!r}: range [{start}, {stop}) is outside [0, {n_items})")
        if width < 1:
            raise ValueError("width must be at least 1")
        base = np.asarray(base)
        if base.shape != (stop - start, width):
            raise ValueError(f"base has shape {base.shape}, expected {(stop - start, width)}")
        out: np.ndarray | None = None
        for j in chunk_range(start, stop):
            lo, hi = j * CHUNK, min((j + 1) * CHUNK, n_items)
            a, b = max(start, lo) - lo, min(stop, hi) - lo
            rows = base[a + lo - start : b + lo - start]
            got = np.asarray(add_window(self.generator(label, j), (hi - lo) * width, a * width,
                                        b * width, rows))  # fmt: skip
            if got.shape != rows.shape:
                raise ValueError(f"add_window returned shape {got.shape}, expected {rows.shape}")
            if out is None:
                if b - a == stop - start:  # one chunk: its result is the answer, no copy
                    return got
                out = np.empty(base.shape, dtype=got.dtype)
            out[a + lo - start : b + lo - start] = got
        return base.copy() if out is None else out


class KeyedRNG(_Streams):
    """A secret key and the generators derived from it.

    Parameters
    ----------
    key : bytes
        The 32-byte secret key. Use :meth:`secure` or :meth:`reproducible` rather than
        passing a key by hand.

    Examples
    --------
    >>> rng = KeyedRNG.reproducible(7)                       # doctest: +SKIP
    >>> g = rng.generator("mcmc/proposals")                  # one stream
    >>> noise = rng.draw("county/total", 3221, 0, 3221,      # nodes [0, 3221) of a level
    ...                  lambda g, n: g.laplace(size=n))
    """

    __slots__ = ("_key", "reproducible_mode")

    def __init__(self, key: bytes, *, reproducible_mode: bool = False) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise ValueError(
                "KeyedRNG needs a 32-byte key; use KeyedRNG.secure() or .reproducible(seed)"
            )
        self._key = bytes(key)
        self.reproducible_mode = reproducible_mode

    def __repr__(self) -> str:  # never show the key
        mode = "reproducible" if self.reproducible_mode else "secure"
        return f"KeyedRNG({mode})"

    @classmethod
    def secure(cls) -> KeyedRNG:
        """A fresh key from the operating system's CSPRNG (the default for releases)."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def reproducible(cls, seed: int, *, warn: bool = True) -> KeyedRNG:
        """A key derived from an explicit seed, for reproduction and tests only."""
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError("the seed must be a non-negative integer")
        if warn:
            warnings.warn(
                "reproducible mode: an explicit seed was given; seeded output is for "
                "reproduction and testing, never for a real release",
                ReproducibleSeedWarning,
                stacklevel=2,
            )
        key = hashlib.sha256(b"censusdp/seed/" + str(int(seed)).encode()).digest()
        return cls(key, reproducible_mode=True)

    @classmethod
    def from_seed(cls, seed: int | None) -> KeyedRNG:
        """:meth:`secure` when ``seed`` is None, otherwise :meth:`reproducible`."""
        return cls.secure() if seed is None else cls.reproducible(seed)

    def subkey(self, label: str) -> bytes:
        """``HMAC-SHA256(key, label)``: the key of one named stream."""
        return hmac.new(self._key, label.encode(), hashlib.sha256).digest()

    def child(self, label: str) -> KeyedRNG:
        """An independent keyed RNG for a sub-task (e.g. one repetition of an experiment)."""
        return KeyedRNG(self.subkey("child:" + label), reproducible_mode=self.reproducible_mode)

    def generator(self, label: str, chunk: int = 0) -> np.random.Generator:
        """The ChaCha20 generator of chunk ``chunk`` of stream ``label``."""
        return _chacha(self.subkey(f"{label}:{int(chunk)}"))

    def restrict(self, streams: Mapping[str, Iterable[int]]) -> SubKeys:
        """The sub-keys of the listed chunks of the listed streams, and nothing else.

        Parameters
        ----------
        streams : mapping of label → iterable of int
            The chunks each stream's holder may draw (e.g. ``chunk_range(start, stop)`` of
            a node range, or one generator index per parent).

        Returns
        -------
        SubKeys
            Draws exactly as this key does for those chunks (``generator`` and ``draw``);
            any other stream or chunk raises :class:`StreamNotHeld`. It holds neither this
            key nor anything it could be derived from, so it is what a task is sent.
        """
        keys = {
            (str(label), int(j)): self.subkey(f"{label}:{int(j)}")
            for label, chunks in streams.items()
            for j in chunks
        }
        return SubKeys(keys, reproducible_mode=self.reproducible_mode)


class SubKeys(_Streams):
    """Per-chunk sub-keys of some streams (from :meth:`KeyedRNG.restrict`).

    Parameters
    ----------
    keys : dict of (label, chunk) → bytes
        ``HMAC-SHA256(key, f"{label}:{chunk}")`` of every chunk held.
    reproducible_mode : bool
        As the :class:`KeyedRNG` it came from.
    """

    __slots__ = ("_keys", "reproducible_mode")

    def __init__(
        self, keys: Mapping[tuple[str, int], bytes], *, reproducible_mode: bool = False
    ) -> None:
        self._keys = dict(keys)
        self.reproducible_mode = reproducible_mode

    def __repr__(self) -> str:  # never show a key
        return f"SubKeys({len(self._keys)} chunks of {len(self.streams)} streams)"

    @property
    def streams(self) -> dict[str, tuple[int, ...]]:
        """The chunks held, per stream label."""
        out: dict[str, list[int]] = {}
        for label, j in self._keys:
            out.setdefault(label, []).append(j)
        return {label: tuple(sorted(js)) for label, js in out.items()}

    def generator(self, label: str, chunk: int = 0) -> np.random.Generator:
        """The ChaCha20 generator of chunk ``chunk`` of stream ``label``, if held."""
        key = self._keys.get((label, int(chunk)))
        if key is None:
            held = "no chunk" if label not in self.streams else f"chunks {self.streams[label]}"
            raise StreamNotHeld(
                f"these sub-keys do not cover chunk {int(chunk)} of stream {label!r} (they "
                f"hold {held} of it); restrict() the key to every stream and chunk the task draws"
            )
        return _chacha(key)
