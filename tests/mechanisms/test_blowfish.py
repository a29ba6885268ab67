"""Blowfish: P_G, policy sensitivity by brute force, transformational equivalence, workloads,
and the closed-form range errors against dense references."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import linalg

from censusdp.errors import SpecError
from censusdp.mechanisms import blowfish as bf
from censusdp.mechanisms import blowfish_workloads as wl
from censusdp.mechanisms.blowfish_policies import incidence
from censusdp.mechanisms.blowfish_strategies import padded_size, strategy_matrix

# ----------------------------------------------------------------------------- helpers


def random_policy(seed: int, k: int, with_bottom: bool) -> bf.PolicyGraph:
    g = np.random.default_rng(seed)
    nodes = list(range(k)) + ([bf.BOTTOM] if with_bottom else [])
    while True:
        graph = nx.gnp_random_graph(len(nodes), 0.5, seed=int(g.integers(1 << 30)))
        if nx.is_connected(graph):
            break
    edges = []
    for a, b in graph.edges:
        u, v = nodes[a], nodes[b]
        edges.append((v, u) if u == bf.BOTTOM else (u, v))
    return bf.PolicyGraph.from_edges(range(k), edges, f"random{seed}")


def databases(k: int, n: int) -> list[np.ndarray]:
    """All histograms over k values with exactly n individuals."""
    out = []
    for combo in itertools.combinations_with_replacement(range(k), n):
        out.append(np.bincount(np.array(combo, dtype=int), minlength=k).astype(float))
    return out


def neighbours(x: np.ndarray, policy: bf.PolicyGraph) -> list[np.ndarray]:
    """Definition 3.2: move one individual along an edge, or add/remove one via ⊥."""
    out = []
    for u, v in policy.edges:
        iu = policy.index[u]
        if v == bf.BOTTOM:
            y = x.copy()
            y[iu] += 1
            out.append(y)
            if x[iu] > 0:
                y = x.copy()
                y[iu] -= 1
                out.append(y)
            continue
        iv = policy.index[v]
        for a, b in ((iu, iv), (iv, iu)):
            if x[a] > 0:
                y = x.copy()
                y[a] -= 1
                y[b] += 1
                out.append(y)
    return out


def brute_sensitivity(w: np.ndarray, policy: bf.PolicyGraph, n_max: int) -> float:
    sizes = range(n_max + 1) if policy.has_bottom else [n_max]
    best = 0.0
    for n in sizes:
        for x in databases(policy.k, n):
            for y in neighbours(x, policy):
                best = max(best, float(np.abs(w @ x - w @ y).sum()))
    return best


# ----------------------------------------------------------------------------- P_G


def test_line_case_ii_inverse_is_cumulative():
    """Example 4.9: for G¹_k with the last value replaced by ⊥, P⁻¹ is C'_k (prefix sums)."""
    t = bf.transform(bf.line_policy(6))
    assert t.replaced == 5
    assert np.array_equal(t.right_inverse(), np.tril(np.ones((5, 5))))
    x = np.array([3.0, 0, 2, 5, 1, 4])
    assert np.allclose(t.database(x), np.cumsum(x)[:5])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 6), with_bottom=st.booleans())
def test_transform_is_full_rank_and_exact(seed, k, with_bottom):
    policy = random_policy(seed, k, with_bottom)
    t = bf.transform(policy)
    p = t.p.toarray()
    assert np.linalg.matrix_rank(p) == p.shape[0] == (k if with_bottom else k - 1)
    assert np.allclose(p @ t.right_inverse(), np.eye(p.shape[0]), atol=1e-10)
    g = np.random.default_rng(seed)
    w = g.integers(-2, 3, (4, k)).astype(float)
    x = g.integers(0, 5, k).astype(float)
    # W x = W_G x_G + c (Theorem 4.1 and Lemma 4.8 i)
    assert np.allclose(t.workload(w) @ t.database(x) + t.offset(w, x.sum()), w @ x)
    # W' P_G' does not depend on which vertex became ⊥: it is W times the full incidence
    assert np.allclose(t.workload(w), w @ incidence(policy).toarray())


@pytest.mark.parametrize("with_bottom", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_policy_sensitivity_equals_brute_force(seed, with_bottom):
    """Δ_W(G) over all neighbouring databases with ≤ 3 (Case I) or = 3 (Case II) individuals
    equals the largest column ℓ₁ norm of W_G (Lemma 4.5)."""
    k = 4
    policy = random_policy(100 + seed, k, with_bottom)
    w = np.random.default_rng(seed).integers(-3, 4, (5, k)).astype(float)
    brute = brute_sensitivity(w, policy, 3)
    t = bf.transform(policy)
    assert bf.policy_sensitivity(w, policy) == brute
    assert float(np.abs(t.workload(w)).sum(axis=0).max()) == pytest.approx(brute, abs=1e-12)


def test_sensitivity_power_wrong_graph_differs():
    """Power: the sensitivity of the cumulative workload depends on the policy (1 vs k−1)."""
    c = np.tril(np.ones((5, 5)))
    assert bf.policy_sensitivity(c, bf.line_policy(5)) == 1.0
    assert bf.policy_sensitivity(c, bf.bounded_dp_policy(5)) == 4.0
    assert bf.policy_sensitivity(c, bf.unbounded_dp_policy(5)) == 5.0


def test_tree_maps_neighbours_to_unit_vectors():
    """Lemma 4.7: for a tree with ⊥, P⁻¹(x − x') is ±(unit vector) for G-neighbours."""
    tree = bf.PolicyGraph.from_edges(range(4), [(0, 1), (1, bf.BOTTOM), (2, 1), (3, 2)], "t")
    t = bf.transform(tree)
    for x in databases(4, 2):
        for y in neighbours(x, tree):
            d = t.database(x - y)
            assert np.count_nonzero(np.abs(d) > 1e-12) == 1
            assert np.max(np.abs(d)) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- mechanisms


@pytest.mark.parametrize("with_bottom", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_mechanism_equals_transformed_mechanism(seed, with_bottom, rng):
    """Theorem 4.1: same Laplace draws → same answers, to 1e-9."""
    k = 6
    policy = random_policy(200 + seed, k, with_bottom)
    g = np.random.default_rng(seed)
    w = g.integers(-2, 3, (7, k)).astype(float)
    a = np.vstack([np.eye(k), g.integers(0, 2, (3, k))]).astype(float)
    x = g.integers(0, 9, k).astype(float)
    eta = bf.laplace_draws(rng, f"eq{seed}", a.shape[0])
    direct = bf.blowfish_matrix_mechanism(w, x, a, policy, 0.7, eta)
    twin = bf.transformed_matrix_mechanism(w, x, a, policy, 0.7, eta)
    assert np.max(np.abs(direct - twin)) < 1e-9
    inst = bf.transformed_instance(w, x, a, policy)
    assert bf.l1_sensitivity(inst.strategy) == pytest.approx(bf.policy_sensitivity(a, policy))
    other = bf.transformed_matrix_mechanism(w, x, a, policy, 0.7, -eta)
    assert np.max(np.abs(direct - other)) > 1e-3  # the comparison can fail
    # the one query protocol: the strategy as a Query object gives the same release
    from censusdp.mechanisms.queries import Query

    q = Query("a", a, tuple(f"r{i}" for i in range(a.shape[0])))
    np.testing.assert_array_equal(bf.blowfish_matrix_mechanism(w, x, q, policy, 0.7, eta), direct)
    assert bf.l1_sensitivity(q) == bf.l1_sensitivity(a)


def test_unsupported_strategy_is_refused():
    policy = bf.line_policy(4)
    with pytest.raises(SpecError, match="does not support"):
        bf.blowfish_matrix_mechanism(
            np.eye(4), np.ones(4), np.ones((1, 4)), policy, 1.0, np.zeros(1)
        )


def test_line_mechanism_monte_carlo_matches_closed_form(rng):
    """Algorithm 1 run for real on all ranges (k = 32): mean squared error per query equals
    line_range_mse within 4 SE; a 30% wrong noise scale is rejected."""
    k, eps, reps = 32, 0.8, 300
    policy = bf.line_policy(k)
    t = bf.transform(policy)
    r = wl.dense(wl.ranges(k))
    x = np.random.default_rng(1).integers(0, 20, k).astype(float)
    a_g = np.eye(k - 1)
    errs = []
    for i in range(reps):
        eta = bf.laplace_draws(rng, f"mc{i}", k - 1)
        errs.append(np.mean((bf.edge_strategy_mechanism(r, x, a_g, policy, eps, eta) - r @ x) ** 2))
    errs = np.array(errs)
    se = errs.std(ddof=1) / math.sqrt(reps)
    expected = bf.line_range_mse(k, eps)
    assert abs(errs.mean() - expected) < 4 * se
    assert abs(errs.mean() - 1.3**2 * expected) > 4 * se
    assert t.workload(r).shape == (r.shape[0], k - 1)


# ----------------------------------------------------------------------------- workloads


def test_workload_operators_match_dense_and_adjoints():
    k = 7
    g = np.random.default_rng(0)
    x = g.normal(size=k)
    lo, hi = wl.range_bounds(k)
    ref = np.zeros((lo.size, k))
    for i, (a, b) in enumerate(zip(lo, hi, strict=True)):
        ref[i, a : b + 1] = 1
    assert np.allclose(wl.dense(wl.ranges(k)), ref)
    y = g.normal(size=lo.size)
    assert np.allclose(wl.ranges(k).rmatvec(y), ref.T @ y)
    assert np.allclose(wl.dense(wl.cumulative(k)), np.tril(np.ones((k, k))))
    assert np.allclose(wl.cumulative(k).rmatvec(x), np.tril(np.ones((k, k))).T @ x)
    assert np.allclose(wl.dense(wl.histogram(k)), np.eye(k))
    r2 = wl.dense(wl.ranges_2d(3))
    assert np.allclose(r2, np.kron(wl.dense(wl.ranges(3)), wl.dense(wl.ranges(3))))
    z = g.normal(size=r2.shape[0])
    assert np.allclose(wl.ranges_2d(3).rmatvec(z), r2.T @ z)
    assert wl.n_ranges(4096) == 8_390_656
    with pytest.raises(SpecError, match="materialise"):
        wl.dense(wl.ranges(4096))


# ----------------------------------------------------------------------------- closed forms


def _dense_mse(wq: np.ndarray, b: np.ndarray, scale: float) -> float:
    """Mean over queries of Var = 2 scale² ‖(W B)_i‖² for W + W B Lap(scale)."""
    return 2.0 * scale**2 * float(np.mean(np.sum((wq @ b) ** 2, axis=1)))


@pytest.mark.parametrize("strategy", ["identity", "hierarchical", "privelet"])
@pytest.mark.parametrize("k", [16, 12])
def test_dp_range_mse_matches_dense(strategy, k):
    n, _ = padded_size(k)
    a = strategy_matrix(strategy, k).toarray()
    r = np.hstack([wl.dense(wl.ranges(k)), np.zeros((wl.n_ranges(k), n - k))])
    dense = _dense_mse(r, np.linalg.pinv(a), bf.l1_sensitivity(a) / 0.5)
    assert bf.dp_range_mse(k, 0.5, strategy) == pytest.approx(dense, rel=1e-10)


def test_line_range_mse_matches_dense():
    k, eps = 20, 0.3
    w_g = bf.transform(bf.line_policy(k)).workload(wl.dense(wl.ranges(k)))
    assert bf.line_range_mse(k, eps) == pytest.approx(_dense_mse(w_g, np.eye(k - 1), 1 / eps))


@pytest.mark.parametrize(("k", "theta"), [(16, 4), (18, 4), (20, 8), (10, 2)])
def test_threshold_range_mse_matches_dense(k, theta):
    """H^θ_k with Privelet per group of θ edges (short groups padded at the end), at ε/3."""
    eps = 0.9
    tree = bf.threshold_tree(k, theta)
    t = bf.transform(tree)
    assert t.replaced == k - 1 and tree.is_tree()
    w_h = t.workload(wl.dense(wl.ranges(k)))
    hp = strategy_matrix("privelet", theta).toarray()
    blocks_a, blocks_b = [], []
    for first in range(0, k - 1, theta):
        last = min(first + theta - 1, k - 1)
        cols = slice(0, last - max(first, 1) + 1)  # the group's real edges; padding unused
        blocks_a.append(hp[:, cols])
        blocks_b.append(np.linalg.inv(hp)[cols, :])
    a_g = linalg.block_diag(*blocks_a)
    b = linalg.block_diag(*blocks_b)
    assert np.allclose(b @ a_g, np.eye(k - 1))
    dense = _dense_mse(w_h, b, bf.l1_sensitivity(a_g) / (eps / 3))
    assert bf.threshold_range_mse(k, theta, eps) == pytest.approx(dense, rel=1e-10)


@pytest.mark.parametrize(("k", "theta"), [(12, 2), (12, 3), (17, 4)])
def test_threshold_tree_stretch_is_at_most_three(k, theta):
    g, h = bf.threshold_policy(k, theta), bf.threshold_tree(k, theta)
    assert set(map(frozenset, h.edges)) <= set(map(frozenset, g.edges))
    assert bf.stretch(g, h) == 3
    assert bf.stretch(g, bf.line_policy(k)) == theta  # the line would cost θ, not 3


@pytest.mark.parametrize("k", [4, 8])
def test_grid_range_mse_matches_dense(k, rng):
    """G¹_{k²}: Privelet on each of the 2(k−1) lines of k boundary edges (Theorem 5.4)."""
    eps = 1.0
    policy = bf.grid_policy(k)
    w = wl.dense(wl.ranges_2d(k))
    hp = strategy_matrix("privelet", k).toarray()
    a_g = linalg.block_diag(*([hp] * (2 * (k - 1))))
    w_g = bf.transform(policy).workload(w)
    dense = _dense_mse(w_g, np.linalg.inv(a_g), bf.l1_sensitivity(a_g) / eps)
    assert bf.grid_range_mse(k, eps) == pytest.approx(dense, rel=1e-10)
    # the edge mechanism is exact on noiseless input and supports W_G
    x = np.arange(k * k, dtype=float)
    out = bf.edge_strategy_mechanism(w, x, a_g, policy, eps, np.zeros(a_g.shape[0]))
    assert np.allclose(out, w @ x)


def test_dp_range_mse_2d_matches_dense():
    k, eps = 4, 0.5
    a1 = strategy_matrix("privelet", k).toarray()
    a = np.kron(a1, a1)
    w = wl.dense(wl.ranges_2d(k))
    dense = _dense_mse(w, np.linalg.inv(a), bf.l1_sensitivity(a) / eps)
    assert bf.dp_range_mse_2d(k, eps) == pytest.approx(dense, rel=1e-10)


def test_line_error_is_flat_while_privelet_grows():
    ks = 2 ** np.arange(6, 13)
    line = np.array([bf.line_range_mse(int(k), 1.0) for k in ks])
    priv = np.array([bf.dp_range_mse(int(k), 1.0, "privelet") for k in ks])
    slope_line = np.polyfit(np.log2(ks), line, 1)[0]
    slope_priv = np.polyfit(np.log2(ks), priv, 1)[0]
    assert abs(slope_line) < 0.01 * line.mean()
    assert slope_priv > 0.1 * priv.mean()
    assert np.all(line < 4.0 + 1e-12) and np.all(line > 3.8)


def test_policy_validation():
    with pytest.raises(SpecError, match="disconnected"):
        bf.PolicyGraph.from_edges(range(4), [(0, 1), (2, 3)], "two")
    with pytest.raises(SpecError, match="not valid"):
        bf.PolicyGraph.from_edges(range(3), [(0, 7)], "bad")
    with pytest.raises(SpecError, match="replaced"):
        bf.transform(bf.unbounded_dp_policy(3), replaced=0)
