"""Keyed, partition-independent streams of :class:`censusdp.rng.KeyedRNG`."""

from __future__ import annotations

import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp import rng as rng_module
from censusdp.rng import CHUNK, KeyedRNG, ReproducibleSeedWarning, StreamNotHeld, chunk_range


def _normal(g: np.random.Generator, n: int) -> np.ndarray:
    return g.standard_normal(n)


def _ints(g: np.random.Generator, n: int) -> np.ndarray:
    return g.integers(-1000, 1000, size=n)


@st.composite
def _split(draw: st.DrawFn) -> tuple[int, int, int, int, int, int]:
    chunk = draw(st.integers(1, 9))
    n_items = draw(st.integers(0, 6 * chunk))
    a = draw(st.integers(0, n_items))
    b = draw(st.integers(a, n_items))
    c = draw(st.integers(a, b))
    width = draw(st.integers(1, 3))
    return chunk, n_items, a, c, b, width


@settings(max_examples=200, deadline=None)
@given(case=_split(), sampler=st.sampled_from([_normal, _ints]), label=st.text(max_size=8))
def test_split_range_identity(case, sampler, label):
    chunk, n_items, a, c, b, width = case
    keyed = KeyedRNG.reproducible(5, warn=False)
    with mock.patch.object(rng_module, "CHUNK", chunk):
        whole = keyed.draw(label, n_items, a, b, sampler, width)
        left = keyed.draw(label, n_items, a, c, sampler, width)
        right = keyed.draw(label, n_items, c, b, sampler, width)
        full = keyed.draw(label, n_items, 0, n_items, sampler, width)
    assert whole.shape == (b - a, width)
    assert np.array_equal(whole, np.concatenate([left, right], axis=0))
    assert np.array_equal(whole, full[a:b])


def test_split_range_identity_real_chunk_size(rng):
    n_items = 2 * CHUNK + 1234
    a, c, b = 17, CHUNK + 5, 2 * CHUNK + 1000
    whole = rng.draw("county/total", n_items, a, b, _normal, 2)
    parts = [rng.draw("county/total", n_items, lo, hi, _normal, 2) for lo, hi in [(a, c), (c, b)]]
    assert np.array_equal(whole, np.concatenate(parts))
    # chunk j is one whole sampler call on generator(label, j)
    chunk1 = _normal(rng.generator("county/total", 1), CHUNK * 2).reshape(CHUNK, 2)
    assert np.array_equal(whole[CHUNK - a : 2 * CHUNK - a], chunk1)


def test_empty_and_out_of_range(rng):
    assert rng.draw("x", 10, 4, 4, _ints, 3).shape == (0, 3)
    with pytest.raises(ValueError, match="outside"):
        rng.draw("x", 10, 3, 11, _ints)
    with pytest.raises(ValueError, match="outside"):
        rng.draw("x", 10, 5, 4, _ints)


def test_secure_runs_differ():
    a, b = KeyedRNG.secure(), KeyedRNG.secure()
    assert not a.reproducible_mode
    assert not np.array_equal(a.draw("s", 64, 0, 64, _normal), b.draw("s", 64, 0, 64, _normal))


def test_same_seed_agrees_and_other_seed_differs():
    draws = [
        KeyedRNG.reproducible(s, warn=False).draw("state/total", 100, 0, 100, _normal)
        for s in (3, 3, 4)
    ]
    assert np.array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])


def test_labels_chunks_and_children_give_different_streams(rng):
    x = rng.draw("measure/state/total", 200, 0, 200, _normal)
    y = rng.draw("measure/state/detailed", 200, 0, 200, _normal)
    assert not np.array_equal(x, y)
    # unrelated streams: sample correlation of 200 pairs far from 1
    assert abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) < 0.5
    g0 = rng.generator("s", 0).standard_normal(10)
    g1 = rng.generator("s", 1).standard_normal(10)
    assert not np.array_equal(g0, g1)
    c = rng.child("rep:0").generator("s").standard_normal(10)
    assert not np.array_equal(c, g0)
    assert rng.child("rep:0").reproducible_mode


def test_repr_never_shows_the_key():
    keyed = KeyedRNG.reproducible(123456789, warn=False)
    text = repr(keyed) + str(keyed)
    key = keyed._key
    assert key.hex() not in text and str(int.from_bytes(key, "little")) not in text
    assert "123456789" not in text
    assert text.startswith("KeyedRNG(reproducible)")
    assert repr(KeyedRNG.secure()) == "KeyedRNG(secure)"


def test_reproducible_mode_warns():
    with pytest.warns(ReproducibleSeedWarning, match="never for a real release"):
        KeyedRNG.reproducible(1)
    with pytest.warns(ReproducibleSeedWarning):
        KeyedRNG.from_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KeyedRNG.reproducible(1, warn=False)
        assert not KeyedRNG.from_seed(None).reproducible_mode


@pytest.mark.parametrize("seed", [-1, 1.5, True, "7", None])
def test_bad_seeds_are_refused(seed):
    with pytest.raises(ValueError, match="non-negative integer"):
        KeyedRNG.reproducible(seed, warn=False)


@pytest.mark.parametrize("key", [b"short", b"x" * 33, "x" * 32])
def test_bad_keys_are_refused(key):
    with pytest.raises(ValueError, match="32-byte key"):
        KeyedRNG(key)


# ------------------------------------------------------------------ restricted sub-keys
@settings(max_examples=100, deadline=None)
@given(case=_split(), sampler=st.sampled_from([_normal, _ints]))
def test_subkeys_draw_exactly_the_held_chunks_and_nothing_else(case, sampler):
    chunk, n_items, a, c, b, width = case
    keyed = KeyedRNG.reproducible(5, warn=False)
    with mock.patch.object(rng_module, "CHUNK", chunk):
        held = keyed.restrict({"county/total": chunk_range(a, b)})
        assert np.array_equal(
            held.draw("county/total", n_items, a, b, sampler, width),
            keyed.draw("county/total", n_items, a, b, sampler, width),
        )
        assert np.array_equal(
            held.draw("county/total", n_items, c, b, sampler, width),
            keyed.draw("county/total", n_items, c, b, sampler, width),
        )
        outside = [j for j in range(-(-n_items // chunk)) if j not in chunk_range(a, b)]
        for j in outside:
            with pytest.raises(StreamNotHeld, match=f"chunk {j} of stream 'county/total'"):
                held.draw("county/total", n_items, j * chunk, j * chunk + 1, sampler, width)
        if b > a:
            with pytest.raises(StreamNotHeld, match="'county/detailed'"):
                held.draw("county/detailed", n_items, a, b, sampler, width)


def test_subkeys_generators_equal_the_keys_and_refuse_others(rng):
    held = rng.restrict({"rounding/bipartite": range(3, 6), "x": [0]})
    for j in (3, 4, 5):
        assert np.array_equal(
            held.generator("rounding/bipartite", j).integers(0, 1 << 62, 8),
            rng.generator("rounding/bipartite", j).integers(0, 1 << 62, 8),
        )
    for label, j in (("rounding/bipartite", 2), ("rounding/bipartite", 6), ("y", 0), ("x", 1)):
        with pytest.raises(StreamNotHeld):
            held.generator(label, j)
    assert not hasattr(held, "child") and not hasattr(held, "subkey")
    assert held.streams == {"rounding/bipartite": (3, 4, 5), "x": (0,)}


def test_subkeys_carry_no_key_and_keep_the_mode(rng):
    import pickle

    held = rng.restrict({"state/total": range(2)})
    blob = pickle.dumps(held)
    assert rng._key not in blob  # noqa: SLF001 - the secret the sub-keys must not carry
    assert rng.child("measure")._key not in pickle.dumps(rng.child("measure").restrict({"a": [0]}))  # noqa: SLF001
    again = pickle.loads(blob)
    assert np.array_equal(
        again.draw("state/total", 10, 0, 10, _normal), rng.draw("state/total", 10, 0, 10, _normal)
    )
    assert again.reproducible_mode and repr(held) == "SubKeys(2 chunks of 1 streams)"
    assert KeyedRNG.secure().restrict({"a": [0]}).reproducible_mode is False
    # an empty range draws nothing and needs no sub-key
    assert held.draw("other", 5, 2, 2, _ints, 3).shape == (0, 3)
