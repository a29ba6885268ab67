"""The shared conditional-shares kernel (one level down and the networks below the cut)
against a slow, obviously correct reference: the same numbers bit for bit, and the
conditional fractions keep every column's target exactly (up to float) inside [0, 1]."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.estimation.integer.controlled import conditional_shares


def _cap(f: float, phi: float) -> float:
    if phi <= 0.0:
        return 1.0 - f
    if phi >= 1.0:
        return f
    return min(f / phi, (1.0 - f) / (1.0 - phi))


def reference(x, fl_par, p_par, starts):
    """Group by group, column by column, the water level raised by full passes over every
    child until no column moves (at most n + 1 passes), as the module docstring states."""
    n_c, K = x.shape
    G = starts.size - 1
    p, a = np.zeros((n_c, K)), np.zeros((n_c, K))
    fl = np.zeros((n_c, K), np.int64)
    phi_out, dev = np.zeros((G, K)), np.zeros((G, K))
    for g in range(G):
        lo, hi = int(starts[g]), int(starts[g + 1])
        n = hi - lo
        if n == 0:
            continue
        for c in range(K):
            f = [x[i, c] - np.floor(x[i, c]) for i in range(lo, hi)]
            S = 0.0
            for v in f:
                S += v
            F = sum(int(np.floor(x[i, c])) for i in range(lo, hi))
            m = np.floor(S)
            phi = S - m
            want = float(fl_par[g, c] - F) + (p_par[g, c] if p_par.shape[0] else 0.0)
            T = min(max(want, m), m + 1.0)
            dev[g, c], phi_out[g, c] = want - T, phi
            u = [_cap(v, phi) for v in f]
            t = 1.0 / n
            for _ in range(n + 1):
                capped, free = 0.0, 0
                for uc in u:
                    if uc <= t:
                        capped += uc
                    else:
                        free += 1
                if free == 0 or (1.0 - capped) / free <= t:
                    break
                t = (1.0 - capped) / free
            for k, i in enumerate(range(lo, hi)):
                a[i, c] = min(t, u[k])
                q = f[k] + (T - S) * a[i, c]
                p[i, c] = min(max(q, 0.0), 1.0)
                fl[i, c] = int(np.floor(x[i, c]))
    return p, fl, a, phi_out, dev


@st.composite
def groups(draw):
    sizes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
    K = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    real = draw(st.booleans())
    rng = np.random.default_rng(seed)
    n_c = sum(sizes)
    x = rng.uniform(-3.0, 9.0, (n_c, K))
    # some exact integers and repeated fractions: the box's edges
    x[rng.random((n_c, K)) < 0.2] = 0.0
    whole = rng.random((n_c, K)) < 0.2
    x[whole] = np.floor(x[whole])
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    G = len(sizes)
    fl_par = np.zeros((G, K), np.int64)
    p_par = np.zeros((G, K)) if real else np.zeros((0, K))
    for g in range(G):
        lo, hi = starts[g], starts[g + 1]
        f = x[lo:hi] - np.floor(x[lo:hi])
        base = np.floor(x[lo:hi]).sum(axis=0).astype(np.int64) + np.floor(f.sum(axis=0)).astype(
            np.int64
        )
        phi = f.sum(axis=0) - np.floor(f.sum(axis=0))
        if real:  # a parent's conditional value anywhere in [base, base + 1]
            val = rng.random(K)
            fl_par[g], p_par[g] = base, val
        else:  # its integer: up with probability φ
            fl_par[g] = base + (rng.random(K) < phi)
        fl_par[g] += 2 * (rng.random(K) < 0.1)  # now and then inconsistent: dev = 1 or 2
    return x, fl_par, p_par, starts


def _kernel(x, fl_par, p_par, starts, want=True):
    n_c, K = x.shape
    G = starts.size - 1
    p, fl = np.empty((n_c, K)), np.empty((n_c, K), np.int64)
    a = np.empty((n_c if want else 0, K))
    phi = np.empty((G if want else 0, K))
    dev, ext = np.zeros((G, K)), np.empty(2)
    conditional_shares(x, fl_par, p_par, starts, p, fl, a, phi, dev, ext)
    return p, fl, a, phi, dev, ext


@settings(max_examples=120, deadline=None)
@given(groups())
def test_kernel_equals_the_full_pass_reference(case):
    x, fl_par, p_par, starts = case
    p, fl, a, phi, dev, ext = _kernel(x, fl_par, p_par, starts)
    rp, rfl, ra, rphi, rdev = reference(x, fl_par, p_par, starts)
    assert np.array_equal(p, rp)
    assert np.array_equal(fl, rfl)
    assert np.array_equal(a, ra)
    assert np.array_equal(phi, rphi)
    assert np.array_equal(dev, rdev)
    assert ext[0] == (np.abs(x).max() if x.size else 0.0)
    assert ext[1] == (np.abs(rdev).max() if rdev.size else 0.0)
    # without the shares asked for, the same fractions
    p2, fl2, *_, dev2, _ = _kernel(x, fl_par, p_par, starts, want=False)
    assert np.array_equal(p2, p) and np.array_equal(fl2, fl) and np.array_equal(dev2, dev)


@settings(max_examples=120, deadline=None)
@given(groups())
def test_fractions_keep_the_target_inside_the_box(case):
    x, fl_par, p_par, starts = case
    p, fl, a, phi, dev, _ = _kernel(x, fl_par, p_par, starts)
    assert np.all((p >= 0.0) & (p <= 1.0))
    for g in range(starts.size - 1):
        lo, hi = starts[g], starts[g + 1]
        if hi == lo:
            assert np.all(dev[g] == 0.0)
            continue
        target = fl_par[g] + (p_par[g] if p_par.shape[0] else 0.0) - dev[g]
        assert np.allclose((fl[lo:hi] + p[lo:hi]).sum(axis=0), target, atol=1e-9)
        # the shares are a distribution where the box leaves room (0 < φ < 1, more than
        # one child), water-filled from 1/n
        inner = (phi[g] > 1e-9) & (phi[g] < 1.0 - 1e-9)
        assert np.allclose(a[lo:hi, inner].sum(axis=0), 1.0, atol=1e-9)


def test_a_wrong_water_level_is_seen():
    # power: the reference tells the kernel's shares from those of a level left at 1/n
    rng = np.random.default_rng(5)
    x = rng.uniform(0.0, 4.0, (5, 3))
    x[0] = np.floor(x[0]) + 0.97  # one large fraction: its cap binds, the level must rise
    starts = np.array([0, 5])
    fl_par = (np.floor(x).sum(axis=0) + np.floor((x - np.floor(x)).sum(axis=0))).astype(np.int64)[
        None
    ]
    _, _, a, _, _, _ = _kernel(x, fl_par, np.zeros((0, 3)), starts)
    assert not np.array_equal(a, np.minimum(1.0 / 5, a))
