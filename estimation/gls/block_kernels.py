"""BLAS-free batched kernels for the per-block algebra: products, solves, symmetric eigensystems.

The structured GLS (:mod:`censusdp.estimation.gls.kernel`, :mod:`censusdp.estimation.gls.marginal_basis`,
:mod:`censusdp.estimation.gls.structured`) works on stacks of small matrices — one per node and
block (sizes 1 to a few dozen) — and on the basis moves, a small fixed matrix applied to every
fibre of a node tensor. Done with ``numpy.matmul`` / ``numpy.linalg`` those go to BLAS and
LAPACK, whose kernels (chosen per processor: OpenBLAS's ``OPENBLAS_CORETYPE``, MKL's code
paths) sum in different orders and use fused multiply–adds or not: the estimates and
covariances, and with them the digest of a run, then depend on the BLAS build and the machine
(measured: different digests under OpenBLAS's Haswell and Sandybridge kernels on the same
run). The kernels here are compiled loops with one FIXED order of floating-point operations
per output entry, so their values depend on nothing but their inputs:

* :func:`matmul` — ``A @ B`` over stacks (leading dimensions broadcast as in numpy): entry
  ``(a, c)`` is ``((0 + A[a,0] B[0,c]) + A[a,1] B[1,c]) + …`` in ascending ``k``, each
  product rounded, then each sum (no fused multiply–add: numba compiles without
  ``fastmath``, so LLVM does not contract them).
* :func:`solve` — ``X⁻¹ B`` per matrix by Gaussian elimination with partial pivoting
  (the first row of largest ``|pivot|``), then back substitution, in fixed loop order
  (Golub & Van Loan, *Matrix Computations*, 4th ed., Alg. 3.4.1).
* :func:`eigh` — the eigenvalues (ascending) and orthonormal eigenvectors of symmetric
  matrices (lower triangle read, as LAPACK's ``UPLO='L'``) by the cyclic Jacobi method with
  the symmetric Schur rotation (Golub & Van Loan, Alg. 8.5.2 / 8.5.3), a rotation skipped
  when ``|a_pq| ≤ ε √|a_pp| √|a_qq|`` (Demmel & Veselić 1992, the high-relative-accuracy
  test) or below ``1e-20 ‖A‖_F``, stopped after a sweep with no rotation. Ties of
  eigenvalues keep column order (a stable sort). Eigenvectors are determined up to sign and,
  for repeated eigenvalues, rotation within their space: every caller uses them through
  projectors, pseudo-inverses or bases of a subspace, which do not depend on that choice.

Each matrix of a stack is computed alone, so a node gets the same bits in any batch (the
partition / scheduler / Dask bit-identity of the streamed engine).

The loops are plain O(K³) code: for the per-block matrices of the structured GLS (a block's
size is a product of refinement sizes — 1 and 3 for ``pl94``, its bordered systems at most
``4K + n_H``) they cost no more than a BLAS call, but for a dense K = 2,016 histogram (the
dense tree GLS of :mod:`censusdp.estimation.gls.tree` runs the same kernel) they would cost
20–50× a tuned BLAS. Above :data:`MAX_DIM` (products, solves) and :data:`MAX_DIM_EIGH`
(eigensystems) the functions hand the stack to numpy (BLAS/LAPACK) instead: the choice
depends on the shape only, never on the batch, so bit-identity across partitions holds
either way, but the values of such large problems depend on the BLAS build.

References
----------
Golub, G. H. & Van Loan, C. F. (2013). *Matrix Computations*, 4th ed., §3.4, §8.5.
Demmel, J. & Veselić, K. (1992). Jacobi's method is more accurate than QR. SIAM J. Matrix
    Anal. Appl. 13(4), 1204–1245.
Lam, Pitrou & Seibert, "Numba: a LLVM-based Python JIT compiler", LLVM-HPC 2015.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["MAX_DIM", "MAX_DIM_EIGH", "eigh", "eigvalsh", "matmul", "solve"]

#: Largest matrix dimension :func:`matmul` and :func:`solve` compute themselves (above it:
#: numpy, BLAS/LAPACK — the dense K × K path, module docstring).
MAX_DIM = 256
#: Largest matrix :func:`eigh` diagonalises by Jacobi (a sweep is ~4K³ flops; above it: LAPACK).
MAX_DIM_EIGH = 64

_EPS = float(np.finfo(np.float64).eps)


@njit(cache=True, nogil=True)
def _matmul_kernel(A, B, out):  # pragma: no cover - compiled
    """``out[i] = A[i|0] @ B[i|0]``, each entry summed in ascending k from 0.0."""
    n, p, r = out.shape
    q = A.shape[2]
    sa = A.shape[0] > 1
    sb = B.shape[0] > 1
    for i in range(n):
        ia = i if sa else 0
        ib = i if sb else 0
        if r == 1:  # a matrix–vector product: the same sum in a register
            for a in range(p):
                acc = 0.0
                for k in range(q):
                    acc += A[ia, a, k] * B[ib, k, 0]
                out[i, a, 0] = acc
            continue
        a = 0
        while a + 4 <= p:  # four rows share each load of B's row k: the same sums, 27% faster
            for c in range(r):
                out[i, a, c] = 0.0
                out[i, a + 1, c] = 0.0
                out[i, a + 2, c] = 0.0
                out[i, a + 3, c] = 0.0
            for k in range(q):
                x0, x1, x2, x3 = A[ia, a, k], A[ia, a + 1, k], A[ia, a + 2, k], A[ia, a + 3, k]
                for c in range(r):
                    b = B[ib, k, c]
                    out[i, a, c] += x0 * b
                    out[i, a + 1, c] += x1 * b
                    out[i, a + 2, c] += x2 * b
                    out[i, a + 3, c] += x3 * b
            a += 4
        while a < p:
            for c in range(r):
                out[i, a, c] = 0.0
            for k in range(q):
                x = A[ia, a, k]
                for c in range(r):
                    out[i, a, c] += x * B[ib, k, c]
            a += 1


def _stack(X: np.ndarray, lead: tuple[int, ...], n: int) -> np.ndarray:
    """``X`` (``(*l, p, q)``) as a ``(1|n, p, q)`` stack for the leading shape ``lead``
    (one shared matrix made contiguous: a cheap copy that the loops read faster)."""
    if X.shape[:-2] == lead:
        return X.reshape(n, *X.shape[-2:])
    if int(np.prod(X.shape[:-2], dtype=np.int64)) == 1:
        return np.ascontiguousarray(X.reshape(1, *X.shape[-2:]))
    return np.broadcast_to(X, (*lead, *X.shape[-2:])).reshape(n, *X.shape[-2:])


def matmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A @ B`` of float64 stacks (``ndim ≥ 2`` each, leading dimensions broadcast), with
    one fixed summation order per entry (module docstring): no BLAS.

    Parameters
    ----------
    A, B : numpy.ndarray
        ``(..., p, q)`` and ``(..., q, r)``.

    Returns
    -------
    numpy.ndarray
        ``(..., p, r)`` float64, the broadcast leading shape.
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2]:
        raise ValueError(f"matmul: shapes {A.shape} and {B.shape} do not chain")
    if max(A.shape[-2], A.shape[-1], B.shape[-1]) > MAX_DIM:
        return np.matmul(A, B)
    lead = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    n = int(np.prod(lead, dtype=np.int64))
    out = np.empty((n, A.shape[-2], B.shape[-1]))
    if n and out.size:
        _matmul_kernel(_stack(A, lead, n), _stack(B, lead, n), out)
    elif out.size:
        out[...] = 0.0
    return out.reshape(*lead, A.shape[-2], B.shape[-1])


@njit(cache=True, nogil=True)
def _solve_kernel(X, B, out):  # pragma: no cover - compiled
    """Gaussian elimination with partial pivoting per matrix; returns the index of the first
    singular matrix, or -1."""
    n, K, R = out.shape
    sx = X.shape[0] > 1
    LU = np.empty((K, K))
    for i in range(n):
        ix = i if sx else 0
        for a in range(K):
            for b in range(K):
                LU[a, b] = X[ix, a, b]
            for c in range(R):
                out[i, a, c] = B[i, a, c]
        for k in range(K):
            p = k
            best = abs(LU[k, k])
            for a in range(k + 1, K):
                v = abs(LU[a, k])
                if v > best:
                    p = a
                    best = v
            if best == 0.0 or best != best:
                return i
            if p != k:
                for b in range(K):
                    t = LU[k, b]
                    LU[k, b] = LU[p, b]
                    LU[p, b] = t
                for c in range(R):
                    t = out[i, k, c]
                    out[i, k, c] = out[i, p, c]
                    out[i, p, c] = t
            for a in range(k + 1, K):
                f = LU[a, k] / LU[k, k]
                for b in range(k + 1, K):
                    LU[a, b] -= f * LU[k, b]
                for c in range(R):
                    out[i, a, c] -= f * out[i, k, c]
        for k in range(K - 1, -1, -1):
            for c in range(R):
                s = out[i, k, c]
                for b in range(k + 1, K):
                    s -= LU[k, b] * out[i, b, c]
                out[i, k, c] = s / LU[k, k]
    return -1


def solve(X: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``X⁻¹ B`` per matrix of a stack (``X`` ``(1|n, K, K)`` or ``(K, K)``; ``B``
    ``(n, K, R)``), by Gaussian elimination with partial pivoting in fixed order: no LAPACK.

    Raises
    ------
    numpy.linalg.LinAlgError
        A matrix of ``X`` is exactly singular (as ``numpy.linalg.solve``).
    """
    X = np.asarray(X, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if X.ndim == 2:
        X = X[None]
    if B.ndim != 3 or X.shape[-1] != X.shape[-2] or X.shape[-1] != B.shape[1]:
        raise ValueError(f"solve: shapes {X.shape} and {B.shape} do not match")
    if X.shape[0] not in (1, B.shape[0]):
        raise ValueError(f"solve: {X.shape[0]} matrices for {B.shape[0]} right-hand sides")
    if X.shape[-1] > MAX_DIM:
        return np.linalg.solve(X, B)
    out = np.empty(B.shape)
    if out.size == 0:
        return out
    bad = _solve_kernel(X, B, out)
    if bad >= 0:
        raise np.linalg.LinAlgError(f"Singular matrix (matrix {bad} of the stack)")
    return out


@njit(cache=True, nogil=True)
def _eigh_kernel(M, ev, V, eps):  # pragma: no cover - compiled
    """Cyclic Jacobi per matrix (lower triangle of ``M``); ``ev`` ascending, ``V`` columns."""
    n, K = ev.shape
    A = np.empty((K, K))
    W = np.empty((K, K))
    order = np.empty(K, np.int64)
    for i in range(n):
        fro = 0.0
        for a in range(K):
            for b in range(K):
                A[a, b] = M[i, a, b] if a >= b else M[i, b, a]
                W[a, b] = 1.0 if a == b else 0.0
                fro += A[a, b] * A[a, b]
        floor = 1e-20 * np.sqrt(fro)
        for _sweep in range(100):
            rotated = False
            for p in range(K - 1):
                for q in range(p + 1, K):
                    apq = A[p, q]
                    app = A[p, p]
                    aqq = A[q, q]
                    if abs(apq) <= eps * np.sqrt(abs(app)) * np.sqrt(abs(aqq)) or abs(apq) <= floor:
                        A[p, q] = 0.0
                        A[q, p] = 0.0
                        continue
                    rotated = True
                    theta = (aqq - app) / (2.0 * apq)
                    if abs(theta) > 1e150:
                        t = 0.5 / theta
                    else:
                        t = 1.0 / (abs(theta) + np.sqrt(theta * theta + 1.0))
                        if theta < 0.0:
                            t = -t
                    c = 1.0 / np.sqrt(t * t + 1.0)
                    s = t * c
                    for r in range(K):
                        arp = A[r, p]
                        arq = A[r, q]
                        A[r, p] = c * arp - s * arq
                        A[r, q] = s * arp + c * arq
                    for r in range(K):
                        apr = A[p, r]
                        aqr = A[q, r]
                        A[p, r] = c * apr - s * aqr
                        A[q, r] = s * apr + c * aqr
                    A[p, p] = app - t * apq
                    A[q, q] = aqq + t * apq
                    A[p, q] = 0.0
                    A[q, p] = 0.0
                    for r in range(K):
                        wrp = W[r, p]
                        wrq = W[r, q]
                        W[r, p] = c * wrp - s * wrq
                        W[r, q] = s * wrp + c * wrq
            if not rotated:
                break
        for a in range(K):  # stable insertion sort of the diagonal
            order[a] = a
        for a in range(1, K):
            j = order[a]
            b = a - 1
            while b >= 0 and A[order[b], order[b]] > A[j, j]:
                order[b + 1] = order[b]
                b -= 1
            order[b + 1] = j
        for a in range(K):
            ev[i, a] = A[order[a], order[a]]
            for r in range(K):
                V[i, r, a] = W[r, order[a]]


def eigh(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors (columns) of symmetric ``(..., K, K)``
    matrices, read from their lower triangle, by cyclic Jacobi in fixed order: no LAPACK.

    The drop-in for ``numpy.linalg.eigh`` on the per-block stacks (module docstring: the
    eigenvectors are those of LAPACK up to sign and rotation within repeated eigenvalues).
    """
    M = np.asarray(M, dtype=np.float64)
    if M.ndim < 2 or M.shape[-1] != M.shape[-2]:
        raise ValueError(f"eigh: {M.shape} is not a stack of square matrices")
    lead, K = M.shape[:-2], M.shape[-1]
    if K > MAX_DIM_EIGH:
        return np.linalg.eigh(M)
    n = int(np.prod(lead, dtype=np.int64))
    ev = np.empty((n, K))
    V = np.empty((n, K, K))
    if n and K:
        _eigh_kernel(M.reshape(n, K, K), ev, V, _EPS)
    return ev.reshape(*lead, K), V.reshape(*lead, K, K)


def eigvalsh(M: np.ndarray) -> np.ndarray:
    """The eigenvalues (ascending) of :func:`eigh`."""
    return eigh(M)[0]
