"""Dependent (controlled) unbiased rounding of many bipartite matrices, compiled.

Given groups of rows (one group per parent, say its children), each group a matrix ``P``
(rows × columns) of probabilities in ``[0, 1]`` whose column sums are integers,
:func:`dependent_round` returns bits ``Z`` with

* ``E[Z_ij] = P_ij`` exactly (up to float resolution: entries within ``tol`` of 0 or 1 count
  as integral);
* every column sum of every group exact: ``Σ_i Z_ij = Σ_i P_ij``;
* every row sum ``⌊Σ_j P_ij⌋`` or ``⌈Σ_j P_ij⌉``;
* the bits at one row or one column pairwise non-positively correlated (Gandhi et al. 2006,
  property B3).

**Method.** Each group's matrix is bordered by one slack column ``s_i = ⌈r_i⌉ − r_i`` (``r_i``
the row sum): the bordered matrix has integer row sums, and integer column sums since
``Σ_i s_i = Σ_i ⌈r_i⌉ − Σ_j (column sums)`` is an integer. On the bipartite graph of its
fractional entries every vertex (row or column) with one fractional entry has at least two,
so a walk that never goes straight back closes a cycle (even length, ≥ 4). Shifting the cycle's
entries alternately by ``+δ``/``−δ`` keeps every line sum; with ``α`` (``β``) the largest
step up (down) that keeps every entry in ``[0, 1]``, take ``δ = α`` with probability
``β/(α + β)`` and ``δ = −β`` otherwise: ``E[δ] = 0``, so every entry is a martingale, and at
least one entry of the cycle becomes integral (Cox 1987; Gandhi, Khuller, Parthasarathy &
Srinivasan 2006, §2). Repeating until no entry is fractional gives the bits; a row's slack
bit is 1 exactly when the row rounds down.

Row-pair sweeps do most of the work first, reading memory row by row: row ``a`` meets
each later row ``b`` in turn, and scanning ``a``'s fractional columns, every column where
both are fractional closes the 4-cycle ``(a, c), (b, c), (b, j), (a, j)`` with the pending
column ``c``; after ``b`` at most one column has both fractional, so ``a``'s fractional
entries about halve per partner. A general walk then finishes. It closes a 4-cycle through the vertex three steps back whenever that edge is
fractional, and otherwise follows linked lists of each row's and column's fractional entries
(the first remaining one in index order that is not the edge just used), so a step and a
removal are O(1) and a group costs O(entries + total cycle length); in dense matrices almost
every cycle has length 4. The loop is sequential by nature and compiled with numba (Lam, Pitrou &
Seibert 2015).

**Randomness.** A group uses at most one uniform per entry of its bordered matrix (each shift
makes at least one fractional entry integral): ``uniforms`` has shape
``(n_rows, n_columns + 1)`` and group ``g`` reads its rows' uniforms in row-major order. The
bits of a group depend on its own rows of ``P`` and ``uniforms`` only, so any split of the
groups gives the same bits; :func:`keyed_uniforms` draws them from
:meth:`~censusdp.rng.KeyedRNG.draw` by global row index, so the bits do not depend on the
partitioning.

References
----------
Cox, L. H. (1987). A constructive procedure for unbiased controlled rounding. JASA 82(398).
Gandhi, R., Khuller, S., Parthasarathy, S. & Srinivasan, A. (2006). Dependent rounding and
    its applications to approximation algorithms. J. ACM 53(3).
Lam, S. K., Pitrou, A. & Seibert, S. (2015). Numba: a LLVM-based Python JIT compiler. LLVM-HPC.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from censusdp.errors import DataError
from censusdp.rng import CHUNK, KeyedRNG, Sampler, aes_counter, chunk_range

__all__ = [
    "DR_TOL",
    "aes_uniform_draws",
    "dependent_round",
    "flow_round",
    "keyed_uniforms",
    "settle_margins",
]

#: Entries within this of 0 or 1 count as integral (the bias this allows is at most this).
DR_TOL = 1e-9


@njit(cache=True, nogil=True)
def _sweep(W, Uf, k, tol, cols):
    """Row-pair sweeps on a bordered group ``W`` before the general walk; returns the next
    uniform's index. Row ``a`` meets rows ``b > a`` in turn: scanning ``a``'s fractional
    columns, each column where both rows are fractional closes the 4-cycle ``(a, c), (b, c),
    (b, j), (a, j)`` with the pending column ``c``. After row ``b`` at most one column has
    both rows fractional, so ``a``'s fractional entries roughly halve per partner; memory is
    read row by row."""
    n, m = W.shape
    for a in range(n):
        cnt = 0
        for j in range(m):
            if W[a, j] > tol and W[a, j] < 1.0 - tol:
                cols[cnt] = j
                cnt += 1
        for b in range(a + 1, n):
            if cnt <= 4:
                break
            c = -1
            for idx in range(cnt):
                j = cols[idx]
                wa = W[a, j]
                wb = W[b, j]
                if not (wa > tol and wa < 1.0 - tol and wb > tol and wb < 1.0 - tol):
                    continue
                if c < 0:
                    c = j
                    continue
                # +(a, c) −(b, c) +(b, j) −(a, j)
                ac = W[a, c]
                bc = W[b, c]
                alpha = min(min(1.0 - ac, bc), min(1.0 - wb, wa))
                beta = min(min(ac, 1.0 - bc), min(wb, 1.0 - wa))
                step = alpha if Uf[k] * (alpha + beta) < beta else -beta
                k += 1
                ac += step
                bc -= step
                wb += step
                wa -= step
                ac = 0.0 if ac <= tol else (1.0 if ac >= 1.0 - tol else ac)
                bc = 0.0 if bc <= tol else (1.0 if bc >= 1.0 - tol else bc)
                wa = 0.0 if wa <= tol else (1.0 if wa >= 1.0 - tol else wa)
                wb = 0.0 if wb <= tol else (1.0 if wb >= 1.0 - tol else wb)
                W[a, c] = ac
                W[b, c] = bc
                W[a, j] = wa
                W[b, j] = wb
                if not (0.0 < ac < 1.0 and 0.0 < bc < 1.0):
                    c = j if (0.0 < wa < 1.0 and 0.0 < wb < 1.0) else -1
            kept = 0
            for idx in range(cnt):
                j = cols[idx]
                if W[a, j] > tol and W[a, j] < 1.0 - tol:
                    cols[kept] = j
                    kept += 1
            cnt = kept
    return k


@njit(cache=True, nogil=True, inline="always")
def _unlink(e, nxt, prv, heads, h):
    """Remove entry ``e`` from line ``h``'s doubly linked list."""
    if prv[e] >= 0:
        nxt[prv[e]] = nxt[e]
    else:
        heads[h] = nxt[e]
    if nxt[e] >= 0:
        prv[nxt[e]] = prv[e]


@njit(cache=True, nogil=True)
def _round_group(W, Uf, k, tol, bits, rnext, rprev, rhead, cnext, cprev, chead, stack, pos):
    """Cycle-cancel one bordered group ``W`` (n × m, modified) into ``bits`` (n × m).

    ``Uf[k], Uf[k + 1], …`` are the group's uniforms. Returns −1 on success, else the vertex (row ``i`` or column ``n + j``) left with a single
    fractional entry: its line sum was not an integer.
    """
    n, m = W.shape
    k = _sweep(W, Uf, k, tol, stack)
    for i in range(n):
        rhead[i] = -1
    for j in range(m):
        chead[j] = -1
    # linked lists of fractional entries (flat index i*m + j), built backwards so that each
    # list is in increasing index order
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            w = W[i, j]
            e = i * m + j
            if w > tol and w < 1.0 - tol:
                bits[i, j] = 0
                rnext[e] = rhead[i]
                rprev[e] = -1
                if rhead[i] >= 0:
                    rprev[rhead[i]] = e
                rhead[i] = e
                cnext[e] = chead[j]
                cprev[e] = -1
                if chead[j] >= 0:
                    cprev[chead[j]] = e
                chead[j] = e
            else:
                bits[i, j] = 1 if w > 0.5 else 0
    for v in range(n + m):
        pos[v] = -1
    for r0 in range(n):
        if rhead[r0] < 0:
            continue
        sp = 0
        stack[0] = r0
        pos[r0] = 0
        while sp >= 0:
            v = stack[sp]
            head = rhead[v] if v < n else chead[v - n]
            if head < 0:
                pos[v] = -1
                sp -= 1
                continue
            prev = stack[sp - 1] if sp > 0 else -1
            nxt = -1
            if sp >= 3:
                # close a 4-cycle through the vertex three steps back when its edge is
                # fractional (almost always, in dense matrices)
                u = stack[sp - 3]
                w = W[v, u - n] if v < n else W[u, v - n]
                if w > tol and w < 1.0 - tol:
                    nxt = u
            if nxt < 0:
                # else the first fractional entry at v not leading back to prev
                e = head
                if v < n:
                    if prev >= 0 and e - v * m == prev - n:
                        e = rnext[e]
                    if e < 0:
                        return v
                    nxt = n + (e - v * m)
                else:
                    if prev >= 0 and e // m == prev:
                        e = cnext[e]
                    if e < 0:
                        return v
                    nxt = e // m
            if pos[nxt] < 0:
                sp += 1
                stack[sp] = nxt
                pos[nxt] = sp
                continue
            # a cycle stack[pos[nxt]] .. stack[sp] and back; edge t joins stack[p0+t] and the
            # next vertex, shifted by +δ for even t and −δ for odd t
            p0 = pos[nxt]
            L = sp - p0 + 1
            alpha = 1.0
            beta = 1.0
            for t in range(L):
                a = stack[p0 + t]
                b = stack[p0 + t + 1] if t + 1 < L else stack[p0]
                ii = a if a < n else b
                jj = (b if a < n else a) - n
                w = W[ii, jj]
                if t % 2 == 0:
                    alpha = min(alpha, 1.0 - w)
                    beta = min(beta, w)
                else:
                    alpha = min(alpha, w)
                    beta = min(beta, 1.0 - w)
            step = alpha if Uf[k] * (alpha + beta) < beta else -beta
            k += 1
            for t in range(L):
                a = stack[p0 + t]
                b = stack[p0 + t + 1] if t + 1 < L else stack[p0]
                ii = a if a < n else b
                jj = (b if a < n else a) - n
                w = W[ii, jj] + (step if t % 2 == 0 else -step)
                W[ii, jj] = w
                if w <= tol or w >= 1.0 - tol:
                    bits[ii, jj] = 1 if w > 0.5 else 0
                    e = ii * m + jj
                    _unlink(e, rnext, rprev, rhead, ii)
                    _unlink(e, cnext, cprev, chead, jj)
            # back to the cycle's first vertex: the edges before it are untouched
            for t in range(p0 + 1, sp + 1):
                pos[stack[t]] = -1
            sp = p0
    return -1


@njit(cache=True, nogil=True)
def _round_groups(P, starts, U, tol, out):
    """Every group of ``P``; returns (group, vertex) of the first failure or (−1, −1)."""
    n_rows, K = P.shape
    m = K + 1
    Uf = U.reshape(-1)
    big = 0
    for g in range(starts.size - 1):
        big = max(big, starts[g + 1] - starts[g])
    W = np.empty((big, m))
    bits = np.empty((big, m), np.int8)
    rnext = np.empty(big * m, np.int32)
    rprev = np.empty(big * m, np.int32)
    cnext = np.empty(big * m, np.int32)
    cprev = np.empty(big * m, np.int32)
    rhead = np.empty(big, np.int64)
    chead = np.empty(m, np.int64)
    stack = np.empty(big + m + 1, np.int64)
    pos = np.empty(big + m, np.int64)
    for g in range(starts.size - 1):
        lo, hi = starts[g], starts[g + 1]
        n = hi - lo
        if n == 0:
            continue
        Wg = W[:n]
        for i in range(n):
            r = 0.0
            for j in range(K):
                Wg[i, j] = P[lo + i, j]
                r += P[lo + i, j]
            s = np.ceil(r - tol) - r
            Wg[i, K] = s if s > 0.0 else 0.0
        bad = _round_group(
            Wg, Uf, lo * m, tol, bits[:n], rnext, rprev, rhead, cnext, cprev, chead, stack, pos
        )
        if bad >= 0:
            return g, bad - n if bad >= n else -1 - bad
        out[lo:hi] = bits[:n, :K]
    return -1, 0


@njit(cache=True, nogil=True, inline="always")
def _snap(x, tol):
    """``x`` snapped to 0 within ``tol`` of 0 and to 1 within ``tol`` of 1."""
    return 0.0 if x <= tol else (1.0 if x >= 1.0 - tol else x)


@njit(cache=True, nogil=True, inline="always")
def _frac(x, tol):
    return x > tol and x < 1.0 - tol


@njit(cache=True, nogil=True)
def _matrix_of_arcs(tail, head, base, n, m, sgn):
    """Check that arcs ``base + r·m + s`` (rows ``r < n``, slots ``s < m``, ``m ≥ 2``) form a
    matrix: every arc of row ``r`` touches one row vertex (the endpoint shared by its first
    two arcs), every arc of slot ``s`` joins it to one column vertex, pointing the same way
    in every row. Writes ``sgn[s]`` (+1: row → column, −1: column → row); returns −1, or
    the first arc that breaks the pattern."""
    for r in range(n):
        e0 = base + r * m
        t0, h0, t1, h1 = tail[e0], head[e0], tail[e0 + 1], head[e0 + 1]
        R = t0 if (t0 == t1 or t0 == h1) else h0
        for s in range(m):
            e = e0 + s
            if tail[e] == R:
                d, C = 1, head[e]
            elif head[e] == R:
                d, C = -1, tail[e]
            else:
                return e
            if r == 0:
                sgn[s] = d
                sgn[m + s] = C
            elif sgn[s] != d or sgn[m + s] != C:
                return e
    return -1


@njit(cache=True, nogil=True)
def _sweep_arcs(w, base, n, m, sgn, U, k, tol, cols):
    """:func:`_sweep` on a matrix of arcs (:func:`_matrix_of_arcs`): row ``a`` meets rows
    ``b > a`` in turn and each column where both are fractional closes the 4-cycle ``(a, c),
    (b, c), (b, j), (a, j)`` with the pending column ``c``, walked row → column → row: an
    arc moves by ``+δ`` along its direction (``sgn``), ``−δ`` against it. Returns the next
    uniform's index."""
    for a in range(n):
        ra = base + a * m
        cnt = 0
        for j in range(m):
            if _frac(w[ra + j], tol):
                cols[cnt] = j
                cnt += 1
        for b in range(a + 1, n):
            if cnt <= 4:
                break
            rb = base + b * m
            c = -1
            for idx in range(cnt):
                j = cols[idx]
                wa = w[ra + j]
                wb = w[rb + j]
                # one test, not two branches: which entries turn integral is random, so
                # every branch on it is a coin flip for the predictor
                if not ((wa > tol) & (wa < 1.0 - tol) & (wb > tol) & (wb < 1.0 - tol)):
                    continue
                if c < 0:
                    c = j
                    continue
                # along the walk a → c → b → j → a: (a, c) and (b, j) out of a row, (b, c)
                # and (a, j) into one; times the arcs' directions
                ac = w[ra + c]
                bc = w[rb + c]
                sc = sgn[c]
                sj = sgn[j]
                # the largest steps up (α) and down (β) keeping the four in [0, 1]: an arc
                # along its direction bounds α by 1 − x and β by x, against it the reverse
                if sc > 0:
                    alpha = min(1.0 - ac, bc)
                    beta = min(ac, 1.0 - bc)
                else:
                    alpha = min(ac, 1.0 - bc)
                    beta = min(1.0 - ac, bc)
                if sj > 0:
                    alpha = min(alpha, min(1.0 - wb, wa))
                    beta = min(beta, min(wb, 1.0 - wa))
                else:
                    alpha = min(alpha, min(wb, 1.0 - wa))
                    beta = min(beta, min(1.0 - wb, wa))
                alpha = min(alpha, 1.0)
                beta = min(beta, 1.0)
                step = alpha if U[k] * (alpha + beta) < beta else -beta
                k += 1
                fc = sc * step
                fj = sj * step
                ac = _snap(ac + fc, tol)
                bc = _snap(bc - fc, tol)
                wb = _snap(wb + fj, tol)
                wa = _snap(wa - fj, tol)
                w[ra + c] = ac
                w[rb + c] = bc
                w[ra + j] = wa
                w[rb + j] = wb
                # the pending column stays while both its entries are fractional, else j
                # takes its place if both of j's are, else none: selects, not branches
                keep = (ac > 0.0) & (ac < 1.0) & (bc > 0.0) & (bc < 1.0)
                both = (wa > 0.0) & (wa < 1.0) & (wb > 0.0) & (wb < 1.0)
                c = c if keep else (j if both else -1)
            kept = 0
            for idx in range(cnt):
                j = cols[idx]
                x = w[ra + j]
                cols[kept] = j
                kept += (x > tol) & (x < 1.0 - tol)
            cnt = kept
    return k


@njit(cache=True, nogil=True)
def _sweep_matrices(tail, head, w, arc_start, k_at, U, tol, mat_start, mat_rows, mat_cols):
    """Sweep each matrix of arcs (:func:`_matrix_of_arcs`) by 4-cycles (:func:`_sweep_arcs`),
    in order, each from its component's next uniform ``k_at[g]`` (advanced). Returns −1, or
    ``−2 − e`` for the first arc ``e`` that breaks a matrix's pattern or its component."""
    sgn = np.empty(2 * mat_cols, np.int64)
    cols = np.empty(mat_cols, np.int64)
    g = 0
    for q in range(mat_start.size):
        b0 = mat_start[q]
        while arc_start[g + 1] <= b0:
            g += 1
        bad = _matrix_of_arcs(tail, head, b0, mat_rows[q], mat_cols, sgn)
        if bad >= 0 or b0 + mat_rows[q] * mat_cols > arc_start[g + 1]:
            return -2 - (bad if bad >= 0 else b0)
        k_at[g] = _sweep_arcs(w, b0, mat_rows[q], mat_cols, sgn, U, k_at[g], tol, cols)
    return -1


@njit(cache=True, nogil=True)
def _compact_fractional(tail, head, w, arc_start, tol, bits):
    """Write the bits of the integral arcs; copy the fractional ones out, in arc order.

    Returns ``(arc, ct, ch, cw, c_start)``: each fractional arc's index, tail, head and
    value, and each component's run of them (``c_start``, one more than the components)."""
    F = 0
    for e in range(tail.size):
        x = w[e]
        if _frac(x, tol):
            F += 1
        else:
            bits[e] = 1 if x > 0.5 else 0
    arc = np.empty(F, tail.dtype)
    ct = np.empty(F, tail.dtype)
    ch = np.empty(F, tail.dtype)
    cw = np.empty(F)
    c_start = np.empty(arc_start.size, np.int64)
    f = 0
    for g in range(arc_start.size - 1):
        c_start[g] = f
        for e in range(arc_start[g], arc_start[g + 1]):
            if _frac(w[e], tol):
                arc[f] = e
                ct[f] = tail[e]
                ch[f] = head[e]
                cw[f] = w[e]
                f += 1
    c_start[arc_start.size - 1] = f
    return arc, ct, ch, cw, c_start


@njit(cache=True, nogil=True)
def _vertex_lists(ct, ch, n_vert):
    """Each vertex's doubly linked list of arcs, in increasing arc order: half-edge ``2f`` is
    arc ``f`` at its tail, ``2f + 1`` at its head. Returns ``(vhead, nxt, prv)``."""
    F = ct.size
    vhead = np.full(n_vert, -1, ct.dtype)
    nxt = np.empty(2 * F, ct.dtype)
    prv = np.empty(2 * F, ct.dtype)
    for e in range(F - 1, -1, -1):
        for side in range(2):
            v = ct[e] if side == 0 else ch[e]
            h = 2 * e + side
            nxt[h] = vhead[v]
            prv[h] = -1
            if vhead[v] >= 0:
                prv[vhead[v]] = h
            vhead[v] = h
    return vhead, nxt, prv


@njit(cache=True, nogil=True)
def _walk_component(f0, f1, k, U, tol, arc, ct, ch, cw, bits, live, lists, walk):
    """Cancel cycles among the fractional arcs ``f0 .. f1`` (one component), drawing
    ``U[k], U[k + 1], …``: from each arc still fractional, walk (never back along the arc
    just used) until a vertex repeats, cancel that cycle and resume from its first vertex.
    ``lists`` is :func:`_vertex_lists`' ``(vhead, nxt, prv)``, ``walk`` the scratch ``(pos,
    sv, se)``: each vertex's place on the walk (−1: off it), the walk's vertices and the
    half-edge each was entered by (:func:`_vertex_lists`; its parity says whether the arc
    was walked along its direction, no load of its tail). Returns −1, or a vertex left with
    a single fractional arc."""
    vhead, nxt, prv = lists
    pos, sv, se = walk
    for e0 in range(f0, f1):
        if not live[e0]:
            continue
        sp = 0
        sv[0] = ct[e0]
        se[0] = -2
        pos[ct[e0]] = 0
        while sp >= 0:
            v = sv[sp]
            h = vhead[v]
            if h >= 0 and (h >> 1) == (se[sp] >> 1):
                h = nxt[h]
            if h < 0:
                if vhead[v] >= 0:
                    return v
                pos[v] = -1
                sp -= 1
                continue
            u = ch[h >> 1] if (h & 1) == 0 else ct[h >> 1]
            if pos[u] < 0:
                sp += 1
                sv[sp] = u
                se[sp] = h
                pos[u] = sp
                continue
            # the cycle sv[p0] .. sv[sp] and back to sv[p0] by half-edge h; an arc left by
            # its tail (even half-edge) is walked along its direction and moves by +δ,
            # against it by −δ; arcs made integral leave the lists
            p0 = pos[u]
            alpha = 1.0
            beta = 1.0
            for t in range(p0 + 1, sp + 2):
                g = se[t] if t <= sp else h
                x = cw[g >> 1]
                if (g & 1) == 0:
                    alpha = min(alpha, 1.0 - x)
                    beta = min(beta, x)
                else:
                    alpha = min(alpha, x)
                    beta = min(beta, 1.0 - x)
            step = alpha if U[k] * (alpha + beta) < beta else -beta
            k += 1
            for t in range(p0 + 1, sp + 2):
                g = se[t] if t <= sp else h
                a = g >> 1
                x = cw[a] + (step if (g & 1) == 0 else -step)
                cw[a] = x
                if x <= tol or x >= 1.0 - tol:
                    bits[arc[a]] = 1 if x > 0.5 else 0
                    live[a] = False
                    _unlink(2 * a, nxt, prv, vhead, ct[a])
                    _unlink(2 * a + 1, nxt, prv, vhead, ch[a])
            for t in range(p0 + 1, sp + 1):
                pos[sv[t]] = -1
            sp = p0
    return -1


@njit(cache=True, nogil=True)
def _cancel_flow(
    tail, head, w, arc_start, u_start, U, tol, n_vert, bits, mat_start, mat_rows, mat_cols
):
    """Cycle-cancel the fractional arcs of each component (``arc_start`` boundaries) of a
    network into ``bits``; component ``g`` reads ``U[u_start[g]], …`` in order. Returns −1
    on success, ``−2 − e`` when arc ``e`` breaks a matrix's pattern, else a vertex left with
    a single fractional arc (its balance not integral).

    ``mat_start`` (increasing) and ``mat_rows`` name matrices of arcs (``mat_cols`` slots a
    row, :func:`_matrix_of_arcs`), each within one component: they are swept first
    (:func:`_sweep_matrices`). The arcs still fractional then (a few per cent below the cut)
    are copied out (:func:`_compact_fractional`) and walked there (:func:`_walk_component`;
    compact, cache-resident lists: 16 bytes per such arc instead of per arc)."""
    k_at = u_start.copy()  # each component's next uniform
    if mat_start.size:
        bad = _sweep_matrices(tail, head, w, arc_start, k_at, U, tol, mat_start, mat_rows, mat_cols)
        if bad != -1:
            return bad
    arc, ct, ch, cw, c_start = _compact_fractional(tail, head, w, arc_start, tol, bits)
    lists = _vertex_lists(ct, ch, n_vert)
    live = np.ones(cw.size, np.bool_)
    walk = (
        np.full(n_vert, -1, np.int64),
        np.empty(n_vert + 1, np.int64),
        np.empty(n_vert + 1, np.int64),
    )
    for g in range(arc_start.size - 1):
        v = _walk_component(
            c_start[g], c_start[g + 1], k_at[g], U, tol, arc, ct, ch, cw, bits, live, lists, walk
        )
        if v >= 0:
            return v
    return -1


def flow_round(
    tail: np.ndarray,
    head: np.ndarray,
    frac: np.ndarray,
    arc_start: np.ndarray,
    u_start: np.ndarray,
    uniforms: np.ndarray,
    *,
    matrices: tuple[np.ndarray, np.ndarray, int] | None = None,
    overwrite: bool = False,
    tol: float = DR_TOL,
) -> np.ndarray:
    """Unbiased dependent rounding of a network flow's fractional parts, component by component.

    Arc ``e`` runs from vertex ``tail[e]`` to ``head[e]`` and carries the fractional part
    ``frac[e]`` of its flow; every vertex's fractional balance (in minus out) must be an
    integer. Randomised cycle cancelling (Gandhi, Khuller, Parthasarathy & Srinivasan 2006,
    §2, on the undirected graph of fractional arcs; Cox 1987 for matrices): a walk that never
    turns back on the arc it came by closes a cycle (a vertex with one fractional arc would
    have a fractional balance); the cycle's arcs move by ``+δ`` along and ``−δ`` against
    their direction, which keeps every balance, with ``δ = α`` w.p. ``β/(α + β)`` and ``−β``
    otherwise (``α``, ``β`` the largest steps keeping every arc in ``[0, 1]``): ``E[δ] = 0``,
    every arc is a martingale and at least one becomes integral per step.

    Hence every bit has mean ``frac`` exactly (up to ``tol``), every vertex's balance is kept
    exactly, and every *cut* of arcs whose fractional sum is fixed by the balances stays
    within its floor and ceiling: with node totals and node cells of a tree as arcs
    (:func:`~censusdp.estimation.integer.controlled.round_structured_partition`), every
    node's total and every node's cell is the floor or ceiling of its value.

    Parameters
    ----------
    tail, head : (n_arcs,) arrays of int
        Vertex indices (from 0); arcs grouped by component, in a fixed order.
    frac : (n_arcs,) array of float
        Fractional parts in ``[0, 1]``.
    arc_start : (n_components + 1,) array of int
        Component boundaries in the arcs (no vertex is shared by two components).
    u_start : (n_components,) array of int
        Where each component's uniforms start in ``uniforms`` (a component uses at most one
        per fractional arc, in order).
    uniforms : 1-d array of float
        Independent U[0, 1) draws.
    matrices : (starts, rows, cols), optional
        Runs of arcs forming matrices, swept by 4-cycles before the walk (as
        :func:`dependent_round`'s row-pair sweeps), row by row through memory: matrix ``q``
        is arcs ``starts[q] + r·cols + s`` (``r < rows[q]``), each row's arcs sharing one
        vertex and each slot's arcs one other vertex, one way round in every row (e.g. a
        parent's children × (total, cells) below the cut); ``starts`` increasing, each
        matrix within one component. It changes which cycles are cancelled (hence the bits
        drawn from given uniforms), not the guarantees: every step is a martingale shift of
        a cycle, whichever cycle it is.
    overwrite : bool
        Move ``frac`` itself (float64, contiguous) instead of a copy: saves 8 bytes an arc
        when the caller has no further use for it.

    Returns
    -------
    (n_arcs,) numpy.ndarray of int8

    Raises
    ------
    DataError
        Shapes that disagree, fractions outside ``[0, 1]``, too few uniforms, or a vertex
        whose fractional balance is not an integer (named).

    References
    ----------
    Cox, L. H. (1987). JASA 82(398). Gandhi, R. et al. (2006). J. ACM 53(3).
    """
    t, hd, w, a, us, U = _checked_inputs(
        tail, head, frac, arc_start, u_start, uniforms, overwrite, tol
    )
    ms, mr, mc = _matrix_runs(matrices, t.size)
    n_vert = int(max(t.max(initial=-1), hd.max(initial=-1))) + 1
    bits = np.zeros(t.size, np.int8)
    bad = _cancel_flow(t, hd, w, a, us, U, tol, n_vert, bits, ms, mr, mc)
    if bad <= -2:
        raise DataError(
            f"flow rounding: arc {-2 - bad} breaks its matrix (a row's arcs must share one "
            "vertex and a column's another, one way round, within one component); give "
            "matrices of that shape"
        )
    if bad >= 0:
        raise DataError(
            f"flow rounding: vertex {bad} has a fractional balance that is not an integer; "
            "give arcs whose flow is conserved at every vertex"
        )
    return bits


def _checked_inputs(
    tail, head, frac, arc_start, u_start, uniforms, overwrite: bool, tol: float
) -> tuple[np.ndarray, ...]:
    """:func:`flow_round`'s inputs as the kernel takes them, checked: vertex indices 32-bit
    where they fit (the links are most of the memory), ``frac`` itself with ``overwrite``
    (float64, 1-d) else a copy (the kernel moves it)."""
    small = np.asarray(tail).size < 2**30
    idx = np.int32 if small else np.int64
    t = np.ascontiguousarray(tail, idx)
    hd = np.ascontiguousarray(head, idx)
    if overwrite and isinstance(frac, np.ndarray) and frac.dtype == np.float64 and frac.ndim == 1:
        w = np.ascontiguousarray(frac)
    else:
        w = np.array(frac, dtype=np.float64)
    a = np.ascontiguousarray(arc_start, np.int64)
    us = np.ascontiguousarray(u_start, np.int64)
    U = np.ascontiguousarray(uniforms, np.float64).reshape(-1)
    if not (t.shape == hd.shape == w.shape and t.ndim == 1):
        raise DataError("flow rounding: tail, head and fractions must be 1-d of one length")
    if (
        a.size < 1
        or a[0] != 0
        or a[-1] != t.size
        or np.any(np.diff(a) < 0)
        or us.size != a.size - 1
    ):
        raise DataError("flow rounding: component boundaries must run from 0 to the arcs")
    if w.size and not (float(w.min()) >= -tol and float(w.max()) <= 1.0 + tol):
        raise DataError("flow rounding: fractions must lie in [0, 1] (a NaN or a value outside)")
    if us.size and np.any(us + np.diff(a) > U.size):
        raise DataError("flow rounding: a component has fewer uniforms than arcs")
    return t, hd, w, a, us, U


def _matrix_runs(
    matrices: tuple[np.ndarray, np.ndarray, int] | None, n_arcs: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`flow_round`'s ``matrices`` as ``(starts, rows, cols)`` int64 arrays and an int,
    checked against ``n_arcs`` (none: empty)."""
    if matrices is None:
        return np.empty(0, np.int64), np.empty(0, np.int64), 0
    ms = np.ascontiguousarray(matrices[0], np.int64).reshape(-1)
    mr = np.ascontiguousarray(matrices[1], np.int64).reshape(-1)
    mc = int(matrices[2])
    if ms.size and (
        ms.shape != mr.shape
        or mc < 2
        or np.any(mr < 1)
        or np.any(np.diff(ms) <= 0)
        or ms[0] < 0
        or ms[-1] + mr[-1] * mc > n_arcs
    ):
        raise DataError(
            "flow rounding: matrices need increasing starts, at least one row and two "
            "columns each, within the arcs"
        )
    return ms, mr, mc


def dependent_round(
    p: np.ndarray, starts: np.ndarray, uniforms: np.ndarray, *, tol: float = DR_TOL
) -> np.ndarray:
    """Unbiased dependent rounding of each group's rows with exact column sums.

    Parameters
    ----------
    p : (n_rows, n_cols) array of float
        Probabilities in ``[0, 1]``; the rows of group ``g`` are ``starts[g]:starts[g+1]``
        and each group's column sums must be integers (within float resolution).
    starts : (n_groups + 1,) array of int
        Group boundaries, non-decreasing, from 0 to ``n_rows``.
    uniforms : (n_rows, n_cols + 1) array of float
        Independent U[0, 1) draws (group ``g`` uses at most its own rows' ``n × (n_cols +
        1)`` of them, in row-major order); e.g. from :func:`keyed_uniforms`.
    tol : float
        Entries within ``tol`` of 0 or 1 count as integral.

    Returns
    -------
    (n_rows, n_cols) numpy.ndarray of int8
        Bits with ``E = p``, each group's column sums exactly those of ``p``, each row sum
        the floor or ceiling of ``p``'s (module docstring).

    Raises
    ------
    DataError
        Shapes that do not match, probabilities outside ``[0, 1]``, or a group whose column
        sum is not an integer (naming group and column).

    References
    ----------
    Cox (1987); Gandhi, Khuller, Parthasarathy & Srinivasan (2006).
    """
    P = np.ascontiguousarray(p, dtype=np.float64)
    s = np.ascontiguousarray(starts, dtype=np.int64)
    U = np.ascontiguousarray(uniforms, dtype=np.float64)
    if P.ndim != 2 or U.shape != (P.shape[0], P.shape[1] + 1):
        raise DataError(
            f"dependent rounding: probabilities of shape {P.shape} need uniforms of shape "
            f"(rows, columns + 1) = ({P.shape[0] if P.ndim else 0}, "
            f"{P.shape[-1] + 1 if P.ndim else 1}), got {U.shape}"
        )
    if s.ndim != 1 or s.size < 1 or s[0] != 0 or s[-1] != P.shape[0] or np.any(np.diff(s) < 0):
        raise DataError(
            "dependent rounding: group starts must run non-decreasing from 0 to the number "
            f"of rows ({P.shape[0]})"
        )
    if P.size and not (float(P.min()) >= -tol and float(P.max()) <= 1.0 + tol):
        raise DataError(
            "dependent rounding: probabilities must lie in [0, 1] (a NaN or a value outside "
            "was given); check the caller's conditional marginals"
        )
    out = np.zeros(P.shape, np.int8)
    g, c = _round_groups(P, s, U, tol, out)
    if g >= 0:
        where = (
            f"column {c}"
            if 0 <= c < P.shape[1]
            else "the rows' slack"
            if c >= 0
            else f"row {int(s[g]) + (-1 - c)}"
        )
        raise DataError(
            f"dependent rounding: group {g}, {where}: the column sums of the group are not "
            "integers within float resolution; give each group probabilities whose column "
            "sums are integers"
        )
    return out


def aes_uniform_draws(g: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uniforms on [0, 1) from AES-128-CTR keyed by ``g``
    (:func:`~censusdp.rng.aes_counter`): the kernel wants about one per entry, and AES-NI
    draws them several times faster than the chunk's ChaCha20 generator itself."""
    return np.random.Generator(aes_counter(g)).random(n)


def _group_sums(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Column sums of each group's rows (an empty group sums to zero)."""
    run = np.zeros((x.shape[0] + 1, x.shape[1]))
    np.cumsum(x, axis=0, out=run[1:])
    return run[starts[1:]] - run[starts[:-1]]


def settle_margins(
    p: np.ndarray,
    starts: np.ndarray,
    row_sums: np.ndarray,
    col_sums: np.ndarray,
    *,
    sweeps: int = 50,
    tol: float = 1e-12,
) -> float:
    """Move fractional parts, in place, so each row and each group's columns sum to integer
    targets they meet only up to a solver's tolerance (what :func:`dependent_round` needs).

    Alternating additive corrections: a row's residual is spread over its entries in
    proportion to ``p(1 − p)`` (integral entries stay put, entries stay in ``[0, 1]`` for
    residuals below a quarter of the weights), then each group's column residuals the same
    way; both margins' totals agree, so the residuals shrink geometrically. The change to
    each entry is of the order of the residuals given, so the rounding's bias stays there.

    Parameters
    ----------
    p : (n_rows, n_cols) array of float
        Fractional parts in ``[0, 1]``, modified.
    starts : (n_groups + 1,) array of int
        Group boundaries as in :func:`dependent_round`.
    row_sums, col_sums : arrays of shape (n_rows,) and (n_groups, n_cols)
        Integer targets.
    sweeps, tol : int, float
        At most ``sweeps`` row-then-column corrections, stopping when every residual is
        below ``tol``.

    Returns
    -------
    float
        The largest residual left (the caller decides whether it is small enough).
    """
    s = np.asarray(starts, dtype=np.int64)
    sizes = np.diff(s)
    left = np.inf
    for _ in range(sweeps):
        w = p * (1.0 - p)
        r = row_sums - p.sum(axis=1)
        ws = w.sum(axis=1)
        ok = ws > 0.0
        p[ok] += w[ok] * (r[ok] / ws[ok])[:, None]
        w = p * (1.0 - p)
        c = col_sums - _group_sums(p, s)
        wc = _group_sums(w, s)
        step = np.divide(c, wc, out=np.zeros_like(c), where=wc > 0.0)
        p += w * np.repeat(step, sizes, axis=0)
        np.clip(p, 0.0, 1.0, out=p)
        left = max(
            float(np.abs(row_sums - p.sum(axis=1)).max(initial=0.0)),
            float(np.abs(col_sums - _group_sums(p, s)).max(initial=0.0)),
        )
        if left < tol:
            break
    return left


def keyed_uniforms(
    rng: KeyedRNG,
    label: str,
    n_rows_global: int,
    row_lo: int,
    row_hi: int,
    n_cols: int,
    sampler: Sampler = aes_uniform_draws,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The uniforms :func:`dependent_round` needs for global rows ``[row_lo, row_hi)``.

    Item ``row · (n_cols + 1) + j`` of the keyed stream ``label`` (of ``n_rows_global ·
    (n_cols + 1)`` items): a partition holding any run of whole groups draws the same
    uniforms for them as a single machine does. ``sampler`` is :func:`aes_uniform_draws`
    unless a test replaces it. ``out`` (C-contiguous float64, ``row_hi − row_lo`` rows of
    ``n_cols + 1``) receives them chunk by chunk, the same draws with no range-sized
    temporary.

    Returns
    -------
    (row_hi − row_lo, n_cols + 1) numpy.ndarray
        ``out`` when given.
    """
    m = n_cols + 1
    n, a, b = n_rows_global * m, row_lo * m, row_hi * m
    if out is None:
        return rng.draw(label, n, a, b, sampler).reshape(row_hi - row_lo, m)
    flat = out.reshape(-1)  # a view of a C-contiguous out
    if flat.size != b - a or not np.shares_memory(flat, out):
        raise DataError(f"keyed uniforms: out must be C-contiguous with {b - a} entries")
    for j in chunk_range(a, b):  # draw() of a range within a chunk slices that chunk's call
        s, e = max(a, j * CHUNK), min(b, (j + 1) * CHUNK)
        flat[s - a : e - a] = rng.draw(label, n, s, e, sampler).reshape(-1)
    return out
