"""The numba kernels of ``additive_fused`` (plain ``@njit``; all arithmetic float32).

Loaded through :func:`attnkit.kernels.numba.runtime.load_kernels`, which points numba's
on-disk cache at its directory while the decorators below run. Entry points: :func:`forward_units`
and :func:`backward_units`, each running the work units ``first, first + step, ...`` (see
:func:`attnkit.kernels.numba.runtime.launch`). They share the score evaluation
(:func:`_scores4`) and the masked probabilities (:func:`_row_max`, :func:`_row_probs`,
inlined). The forward's accumulation loop is written out in place: as a separate inlined
function it ran about 5% slower.

Masking: only the mask decides what is masked (policy P2). A disallowed entry gets probability 0
whatever its score; whether a row has seen an allowed key is tracked on its own. The forward
stores the row max and 1 / row sum apart (a log-sum-exp would lose log(sum) next to scores of
1e30), and the backward recomputes P = exp(score - max) / sum from them with the forward's exact
arithmetic. Every input value is finite (the policy in :mod:`.policy` keeps NaN/inf out and
sends calls that could overflow float32 to float64), so ``fastmath`` is safe.

Shape legend: ``BH`` flattened batch dims, ``Lq``/``Lk`` query/key length, ``h`` additive hidden
width, ``dv`` value width; masks as in :mod:`.tiles`.
"""

import numpy as np
from numba import njit

from attnkit.kernels.numba.nbmath import exp_nonpos_f32, tanh_f32
from attnkit.masks import EMPTY, FULL

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_TWO = np.float32(2.0)
_FOUR = np.float32(4.0)
_SECH_ZERO = np.float32(43.5)
"""|x| from which 1 - tanh²(x) = 4e / (1 + e)², e = e^(-2|x|), is taken as 0 (it is below
6.6e-38 there; exp_nonpos_f32 clamps its argument at -87 and would give 6.6e-38 for every larger
|x|, a gradient that w_v ~ 1e30 makes visible)."""
MAX_START = np.float32(-np.finfo(np.float32).max / 4)
"""Running max before a row has seen an allowed key: below every score the kernels get
(|score| <= sum |w_v| < finfo.max / 16, policy P5) and far enough from -finfo.max that
``MAX_START - score`` stays finite. Never a mask."""

KERNEL = dict(cache=True, fastmath=True, error_model="numpy", nogil=True)
"""Options of the entry points."""
INLINE = dict(fastmath=True, error_model="numpy", forceinline=True)
"""Options of the helpers, inlined into the entry points."""
EXACT_FASTMATH = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
"""fastmath without "reassoc" for the score loops: forward and backward then round every score
identically, so the probabilities the backward recomputes match the forward's max and sum."""


@njit(fastmath=EXACT_FASTMATH, error_model="numpy")
def _scores4(a0, a1, a2, a3, kt_b, direct, w, s, keep, t, dt, j0, jb):
    """Scores of 4 query rows against keys j0..j0+jb: s[q, jj] = sum_c w_c tanh_qc(jj).

    a0..a3 (h,) rows of qa; kt_b (h, Lk); see ``tanh_operands`` for ``direct``. With ``keep`` also
    t[q, c, jj] = tanh and dt[q, c, jj] = 1 - tanh² (t, dt: (4, h, block_k)); the scores are
    computed by the same expressions either way.

    1 - tanh² is not computed from t: near saturation (|x| of a few units and more) t rounds to
    within an ulp of +-1 and 1 - t² loses all but a few bits (|x| = 3.3: relative error 5e-5 in
    float32). It is 4z / (z + 1)² in the exp form (z = e^(2x)) and 4e / (1 + e)² with
    e = e^(-2|x|) in the direct form, both accurate to a few ulp for every x.
    """
    s0, s1, s2, s3 = s[0, :jb], s[1, :jb], s[2, :jb], s[3, :jb]
    for jj in range(jb):
        s0[jj] = _ZERO
        s1[jj] = _ZERO
        s2[jj] = _ZERO
        s3[jj] = _ZERO
    for c in range(w.size):
        wc = w[c]
        x0, x1, x2, x3 = a0[c], a1[c], a2[c], a3[c]
        kc = kt_b[c, j0 : j0 + jb]
        if direct:
            for jj in range(jb):
                y = kc[jj]
                s0[jj] += wc * tanh_f32(x0 + y)
                s1[jj] += wc * tanh_f32(x1 + y)
                s2[jj] += wc * tanh_f32(x2 + y)
                s3[jj] += wc * tanh_f32(x3 + y)
        else:  # tanh(qp + kp) = (z - 1) / (z + 1), z = exp(2 qp) exp(2 kp)
            for jj in range(jb):
                y = kc[jj]
                z0, z1, z2, z3 = x0 * y, x1 * y, x2 * y, x3 * y
                s0[jj] += wc * ((z0 - _ONE) * (_ONE / (z0 + _ONE)))
                s1[jj] += wc * ((z1 - _ONE) * (_ONE / (z1 + _ONE)))
                s2[jj] += wc * ((z2 - _ONE) * (_ONE / (z2 + _ONE)))
                s3[jj] += wc * ((z3 - _ONE) * (_ONE / (z3 + _ONE)))
        if keep:  # one row at a time: few arrays per loop, so the loop vectorises
            for q in range(4):
                xq = x0 if q == 0 else (x1 if q == 1 else (x2 if q == 2 else x3))
                tq, dtq = t[q, c, :jb], dt[q, c, :jb]
                if direct:
                    for jj in range(jb):
                        x = xq + kc[jj]
                        tq[jj] = tanh_f32(x)
                        ax = abs(x)
                        e = exp_nonpos_f32(-_TWO * ax)
                        d = (_FOUR * e) / ((_ONE + e) * (_ONE + e))
                        dtq[jj] = d if ax < _SECH_ZERO else _ZERO
                else:
                    for jj in range(jb):
                        z = xq * kc[jj]
                        r = _ONE / (z + _ONE)
                        tq[jj] = (z - _ONE) * r
                        dtq[jj] = (z * r) * (_FOUR * r)  # z r first: r² underflows for z ~ e^86


@njit(**INLINE)
def _row_max(sq, mq, full, start):
    """(max(start, max of the allowed scores), number of allowed entries) of one row: scores
    sq (jb,), allowed flags mq (jb,) uint8 (ignored when ``full``: every entry allowed)."""
    mx = start
    if full:
        for jj in range(sq.size):
            mx = max(mx, sq[jj])
        return mx, sq.size
    n = 0
    for jj in range(sq.size):
        ok = mq[jj] != 0
        mx = max(mx, sq[jj] if ok else MAX_START)
        n += 1 if ok else 0
    return mx, n


@njit(**INLINE)
def _row_probs(sq, mq, full, m, scale):
    """sq[jj] = exp(sq[jj] - m) * scale on the allowed entries, 0 elsewhere; returns the sum.
    Shared by the forward (scale 1) and the backward (m = row max, scale = 1 / row sum)."""
    total = _ZERO
    if full:
        for jj in range(sq.size):
            p = exp_nonpos_f32(sq[jj] - m) * scale
            sq[jj] = p
            total += p
        return total
    for jj in range(sq.size):
        x = sq[jj]
        p = exp_nonpos_f32(x - m) * scale if mq[jj] != 0 else _ZERO
        sq[jj] = p
        total += p
    return total


@njit(**KERNEL)
def forward_units(
    qa, kb_t, direct, w, v, mask_index, classes, tile_id, tiles, out, stats, first, step
):
    """Forward for work units first, first + step, ... (unit = batch element b, query block qb).

    qa (BH, Lq, h), kb_t (BH, h, Lk): exp(2 qp), exp(2 kp)ᵀ, or qp, kpᵀ when ``direct`` (see
    :func:`attnkit.kernels.additive.autograd.tanh_operands`); w (h,) = w_v; v (BH, Lk, dv).
    Writes out (BH, Lq, dv) and stats (BH, Lq, 2) (row max, 1 / row sum; 0, 0 for a row without
    an allowed key, whose output is 0) rows of its units. Query rows go 4 at a time (a row past
    Lq repeats the last row; its results are never stored), so every key load feeds 4 rows.
    """
    bh, lq, h = qa.shape
    lk, dv = kb_t.shape[2], v.shape[2]
    nq, nk = classes.shape[1], classes.shape[2]
    block_q, block_k = tiles.shape[1], tiles.shape[2]  # the tile (a multiple of 4 rows)
    s = np.empty((4, block_k), np.float32)
    no_tile = np.empty((4, 1, 1), np.float32)
    acc = np.empty((block_q, dv), np.float32)
    run_max = np.empty(block_q, np.float32)
    run_sum = np.empty(block_q, np.float32)
    seen = np.empty(block_q, np.bool_)
    for u in range(first, bh * nq, step):
        b = u // nq
        qb = u - b * nq
        mi = mask_index[b]
        a, kt_b, v_b = qa[b], kb_t[b], v[b]
        i0 = qb * block_q
        nb = min(block_q, lq - i0)
        run_max[:] = MAX_START
        run_sum[:] = _ZERO
        seen[:] = False
        acc[:] = _ZERO
        for kb in range(nk):
            cls = classes[mi, qb, kb]
            if cls == EMPTY:
                continue
            j0 = kb * block_k
            jb = min(block_k, lk - j0)
            tile = tiles[max(tile_id[mi, qb, kb], 0)]
            for r in range(0, nb, 4):
                a0 = a[min(i0 + r, lq - 1)]
                a1 = a[min(i0 + r + 1, lq - 1)]
                a2 = a[min(i0 + r + 2, lq - 1)]
                a3 = a[min(i0 + r + 3, lq - 1)]
                _scores4(a0, a1, a2, a3, kt_b, direct, w, s, False, no_tile, no_tile, j0, jb)
                # online softmax: s becomes probabilities, the accumulators are rescaled
                for q in range(4):
                    sq, mq, acc_q = s[q, :jb], tile[r + q, :jb], acc[r + q]
                    mx, n = _row_max(sq, mq, cls == FULL, run_max[r + q])
                    if n == 0:  # no allowed key for this row in this tile
                        sq[:] = _ZERO
                        continue
                    alpha = exp_nonpos_f32(run_max[r + q] - mx)
                    total = _row_probs(sq, mq, cls == FULL, mx, _ONE)
                    run_sum[r + q] = run_sum[r + q] * alpha + total
                    run_max[r + q] = mx
                    seen[r + q] = True
                    for c in range(dv):
                        acc_q[c] *= alpha
                # acc[r + q] += sum_jj p[q, jj] v[j0 + jj], 4 keys per step
                c0, c1, c2, c3 = acc[r], acc[r + 1], acc[r + 2], acc[r + 3]
                s0, s1, s2, s3 = s[0, :jb], s[1, :jb], s[2, :jb], s[3, :jb]
                jj = 0
                while jj + 4 <= jb:
                    j = j0 + jj
                    v0, v1, v2, v3 = v_b[j], v_b[j + 1], v_b[j + 2], v_b[j + 3]
                    p00, p01, p02, p03 = s0[jj], s0[jj + 1], s0[jj + 2], s0[jj + 3]
                    p10, p11, p12, p13 = s1[jj], s1[jj + 1], s1[jj + 2], s1[jj + 3]
                    p20, p21, p22, p23 = s2[jj], s2[jj + 1], s2[jj + 2], s2[jj + 3]
                    p30, p31, p32, p33 = s3[jj], s3[jj + 1], s3[jj + 2], s3[jj + 3]
                    for c in range(dv):
                        y0, y1, y2, y3 = v0[c], v1[c], v2[c], v3[c]
                        c0[c] += p00 * y0 + p01 * y1 + p02 * y2 + p03 * y3
                        c1[c] += p10 * y0 + p11 * y1 + p12 * y2 + p13 * y3
                        c2[c] += p20 * y0 + p21 * y1 + p22 * y2 + p23 * y3
                        c3[c] += p30 * y0 + p31 * y1 + p32 * y2 + p33 * y3
                    jj += 4
                while jj < jb:
                    v0 = v_b[j0 + jj]
                    p00, p10, p20, p30 = s0[jj], s1[jj], s2[jj], s3[jj]
                    for c in range(dv):
                        y0 = v0[c]
                        c0[c] += p00 * y0
                        c1[c] += p10 * y0
                        c2[c] += p20 * y0
                        c3[c] += p30 * y0
                    jj += 1
        for r in range(nb):
            o = out[b, i0 + r]
            inv = _ONE / run_sum[r] if seen[r] else _ZERO
            stats[b, i0 + r, 0] = run_max[r] if seen[r] else _ZERO
            stats[b, i0 + r, 1] = inv
            acc_r = acc[r]
            for c in range(dv):
                o[c] = acc_r[c] * inv


@njit(**KERNEL)
def backward_units(
    qa,
    kb_t,
    direct,
    w,
    vt,
    do,
    stats,
    dsum,
    mask_index,
    classes,
    tile_id,
    tiles,
    split,
    dq,
    dkt,
    dvt,
    dw,
    first,
    step,
):
    """Backward for work units first, first + step, ... (unit u = batch element u // split,
    query blocks u % split, u % split + split, ...; every key block).

    Inputs as in forward_units plus vt (BH, dv, Lk), do (BH, Lq, dv) = dO, stats and
    dsum (BH, Lq) = D. Writes dq (BH, Lq, h) rows of its query blocks and accumulates the unit's
    own dkt[u] (h, Lk), dvt[u] (dv, Lk), dw[u] (h,) (zeroed by the caller): gradients with
    respect to qp, kpᵀ, vᵀ and w. Rows go 4 at a time as in the forward (a row past the block
    gets probability 0, so it contributes nothing).
    """
    bh, lq, h = qa.shape
    lk, dv = kb_t.shape[2], vt.shape[1]
    nq, nk = classes.shape[1], classes.shape[2]
    block_q, block_k = tiles.shape[1], tiles.shape[2]  # the tile (a multiple of 4 rows)
    s = np.empty((4, block_k), np.float32)  # scores, then probabilities P
    g = np.empty((4, block_k), np.float32)  # dP, then dS
    t = np.empty((4, h, block_k), np.float32)  # tanh
    dt = np.empty((4, h, block_k), np.float32)  # 1 - tanh²
    for u in range(first, bh * split, step):
        b = u // split
        part = u - b * split
        mi = mask_index[b]
        a, kt_b, vt_b, do_b = qa[b], kb_t[b], vt[b], do[b]
        dq_b, dkt_u, dvt_u, dw_u = dq[b], dkt[u], dvt[u], dw[u]
        for kb in range(nk):
            j0 = kb * block_k
            jb = min(block_k, lk - j0)
            p0, p1, p2, p3 = s[0, :jb], s[1, :jb], s[2, :jb], s[3, :jb]
            g0, g1, g2, g3 = g[0, :jb], g[1, :jb], g[2, :jb], g[3, :jb]
            for qb in range(part, nq, split):
                cls = classes[mi, qb, kb]
                if cls == EMPTY:
                    continue
                tile = tiles[max(tile_id[mi, qb, kb], 0)]
                i0 = qb * block_q
                nb = min(block_q, lq - i0)
                for r in range(0, nb, 4):
                    i_0 = min(i0 + r, lq - 1)
                    i_1 = min(i0 + r + 1, lq - 1)
                    i_2 = min(i0 + r + 2, lq - 1)
                    i_3 = min(i0 + r + 3, lq - 1)
                    _scores4(
                        a[i_0], a[i_1], a[i_2], a[i_3], kt_b, direct, w, s, True, t, dt, j0, jb
                    )
                    # P = exp(score - max) / sum on allowed entries of real rows, else 0
                    for q in range(4):
                        sq = s[q, :jb]
                        if r + q < nb:
                            m_q, inv_q = stats[b, i0 + r + q, 0], stats[b, i0 + r + q, 1]
                            _row_probs(sq, tile[r + q, :jb], cls == FULL, m_q, inv_q)
                        else:
                            sq[:] = _ZERO
                        g[q, :jb] = _ZERO
                    # dP = dO_i . v_j and dv_j += sum_i P_ij dO_i
                    e0, e1, e2, e3 = do_b[i_0], do_b[i_1], do_b[i_2], do_b[i_3]
                    for c in range(dv):
                        c0, c1, c2, c3 = e0[c], e1[c], e2[c], e3[c]
                        vc = vt_b[c, j0 : j0 + jb]
                        dvc = dvt_u[c, j0 : j0 + jb]
                        for jj in range(jb):
                            y = vc[jj]
                            g0[jj] += c0 * y
                            g1[jj] += c1 * y
                            g2[jj] += c2 * y
                            g3[jj] += c3 * y
                            dvc[jj] += c0 * p0[jj] + c1 * p1[jj] + c2 * p2[jj] + c3 * p3[jj]
                    d0, d1 = dsum[b, i_0], dsum[b, i_1]
                    d2, d3 = dsum[b, i_2], dsum[b, i_3]
                    for jj in range(jb):  # dS = P (dP - D)
                        g0[jj] = p0[jj] * (g0[jj] - d0)
                        g1[jj] = p1[jj] * (g1[jj] - d1)
                        g2[jj] = p2[jj] * (g2[jj] - d2)
                        g3[jj] = p3[jj] * (g3[jj] - d3)
                    # d(qp_i) += w_c sum_j dS_ij (1 - t²), d(kp_j) likewise over i,
                    # d(w_c) += sum_ij dS_ij t
                    for c in range(h):
                        wc = w[c]
                        u0, u1, u2, u3 = t[0, c, :jb], t[1, c, :jb], t[2, c, :jb], t[3, c, :jb]
                        f0, f1 = dt[0, c, :jb], dt[1, c, :jb]
                        f2, f3 = dt[2, c, :jb], dt[3, c, :jb]
                        dkc = dkt_u[c, j0 : j0 + jb]
                        ga0 = _ZERO
                        ga1 = _ZERO
                        ga2 = _ZERO
                        ga3 = _ZERO
                        gw = _ZERO
                        for jj in range(jb):
                            h0 = g0[jj] * f0[jj]
                            h1 = g1[jj] * f1[jj]
                            h2 = g2[jj] * f2[jj]
                            h3 = g3[jj] * f3[jj]
                            ga0 += h0
                            ga1 += h1
                            ga2 += h2
                            ga3 += h3
                            gw += (
                                g0[jj] * u0[jj]
                                + g1[jj] * u1[jj]
                                + g2[jj] * u2[jj]
                                + g3[jj] * u3[jj]
                            )
                            dkc[jj] += wc * (h0 + h1 + h2 + h3)
                        dw_u[c] += gw
                        dq_b[i_0, c] += wc * ga0
                        if r + 1 < nb:
                            dq_b[i_1, c] += wc * ga1
                        if r + 2 < nb:
                            dq_b[i_2, c] += wc * ga2
                        if r + 3 < nb:
                            dq_b[i_3, c] += wc * ga3
