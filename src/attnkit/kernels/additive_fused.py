"""``additive_fused``: additive attention in fused numba kernels, O(L*h) memory, with backward.

e_ij = w_v . tanh(qp_i + kp_j) with qp = q W_qᵀ, kp = k W_kᵀ (computed by torch, so autograd
gives the W_q / W_k / q / k gradients); P = softmax_j(e) over the allowed keys; out = P v.

Forward: one work unit per (batch*head, block of BLOCK_Q query rows), key blocks of BLOCK_K keys,
online softmax (running max and sum per row), so neither the (Lq, Lk, h) tanh tensor nor the
(Lq, Lk) score matrix ever exists. It stores the output and the row log-sum-exp. Query rows go 4
at a time, so that each key row loaded feeds 4 tanh evaluations.

tanh: for |qp|, |kp| <= EXP_LIMIT (the usual case) tanh(qp + kp) = (p - 1) / (p + 1) with
p = exp(2 qp) exp(2 kp), the exponentials computed once per row / key by torch: a product and a
division per entry (see :func:`_tanh_operands`); otherwise the rational tanh_f32 of
:mod:`attnkit.kernels.nbmath`.

Backward (FlashAttention-style): recomputes the scores per (4 rows, key block) tile with exactly
the forward's arithmetic (so P = exp(score - lse) is consistent with the forward), keeps tanh for
the tile, and with dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - D_i), D_i = dO_i . O_i:
d(qp_i) += w_v * sum_j dS_ij (1 - t_ij^2), d(kp_j) += w_v * sum_i dS_ij (1 - t_ij^2),
d(w_v) += sum_ij dS_ij t_ij, dv_j += sum_i P_ij dO_i. Work units are (batch*head, interleaved
share of the query blocks); each unit owns its rows of d(qp) and its own partial d(kp), dv, d(w_v)
(summed by torch afterwards), so no two threads write the same memory.

Masks: classified per (BLOCK_Q x BLOCK_K) tile by the mask's block map; EMPTY tiles are skipped,
FULL tiles need no mask, and only PARTIAL tiles are evaluated (``mask.tile``, a few query blocks
at a time) and passed to the kernels as packed bool tiles. The full Lq x Lk grid is never built
unless every tile is partial (then the mask holds that much information anyway). A row without
any allowed key gets output 0 and gradient 0.

Threads and compilation: the kernels are compiled by numba on first use (a few seconds; cached on
disk, see :func:`_cache_dir`), release the GIL, and run on ``torch.get_num_threads()`` Python
threads that share the work units; numba's own thread pool is never started, so it cannot compete
with torch's.

Shape legend: ``BH`` flattened batch dims, ``Lq``/``Lk`` query/key length, ``h`` additive hidden
width, ``dv`` value width, ``MB`` flattened batch dims of the mask, ``nq``/``nk`` numbers of query /
key blocks, ``T`` number of partial tiles.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnkit.kernels.base import AttentionCall, Backend
from attnkit.masks import EMPTY, FULL, PARTIAL

BLOCK_Q = 32
"""Query rows per work unit and per mask tile."""
BLOCK_K = 128
"""Keys per block (inner loops run over these, contiguous in memory)."""
EXP_LIMIT = 21.5
"""Largest |qp|, |kp| for the exp form of tanh (e^(4 * 21.5) = e^86 < float32 max e^88.7)."""
TILE_EVAL_ELEMENTS = 2**22
"""Most mask entries evaluated by one ``mask.tile`` call while packing partial tiles."""

f32 = np.float32
_MASKED = f32(-1e30)
"""Score of a masked entry (finite: fastmath assumes no infinities)."""
_MASKED_CUT = f32(-5e29)
"""Scores at or below this are masked. Real scores are bounded by sum |w_v|."""
_ZERO = f32(0.0)
_ONE = f32(1.0)


# Placeholders, replaced by their numba versions in _compile() before anything is compiled.
def tanh_f32(x):  # pragma: no cover - replaced by attnkit.kernels.nbmath.tanh_f32
    return math.tanh(x)


def exp_nonpos_f32(x):  # pragma: no cover - replaced by attnkit.kernels.nbmath.exp_nonpos_f32
    return math.exp(x)


# ---------------------------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------------------------
class AdditiveFusedBackend(Backend):
    """Fused additive attention (numba): float32 on CPU, forward and backward, no weights."""

    name = "additive_fused"
    description = "fused additive attention, online softmax, O(L*h) memory"
    kinds = ("additive",)
    dtypes = (torch.float32,)
    devices = ("cpu",)
    supports_grad = True
    supports_weights = False
    supports_dropout = False
    supports_bias = False

    def available(self) -> str | None:
        return _numba_missing()

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.dtype == torch.float64:
            return ["float64 runs on the reference-precision path (math); this kernel is float32"]
        return []

    def run(self, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
        return additive_fused(call), None


def additive_fused(call: AttentionCall) -> Tensor:
    """Run an additive call: output (..., Lq, dv), differentiable w.r.t. q, k, v, w_q, w_k, w_v."""
    batch, lq, lk = call.batch_shape, call.q_len, call.kv_len
    h = call.w_v.shape[0]
    qp = (call.q @ call.w_q.transpose(0, 1)).reshape(-1, lq, h)  # (BH, Lq, h)
    kp = (call.k @ call.w_k.transpose(0, 1)).reshape(-1, lk, h)  # (BH, Lk, h)
    v = call.v.reshape(-1, lk, call.v.shape[-1])  # (BH, Lk, dv)
    out = _AdditiveFunction.apply(qp, kp, v, call.w_v, mask_tiles(call))
    return out.reshape(batch + (lq, out.shape[-1]))


# ---------------------------------------------------------------------------------------------
# masks as tiles
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MaskTiles:
    """A mask in the form the kernels read.

    mask_index: (BH,) int64, the mask batch element of each flattened batch element.
    classes: (MB, nq, nk) int8 EMPTY / PARTIAL / FULL per (BLOCK_Q x BLOCK_K) tile.
    tile_id: (MB, nq, nk) int32 index into ``tiles`` of each PARTIAL tile, -1 elsewhere.
    tiles: (T, BLOCK_Q, BLOCK_K) uint8, 1 = may attend (padded with 0 past Lq / Lk); T >= 1.
    """

    mask_index: np.ndarray
    classes: np.ndarray
    tile_id: np.ndarray
    tiles: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.mask_index, self.classes, self.tile_id, self.tiles


def mask_tiles(call: AttentionCall) -> MaskTiles:
    """Tile classes and packed partial tiles of ``call.mask`` (cached on the call)."""
    if "additive_fused_tiles" not in call._cache:
        call._cache["additive_fused_tiles"] = _build_mask_tiles(call)
    return call._cache["additive_fused_tiles"]


def _build_mask_tiles(call: AttentionCall) -> MaskTiles:
    lq, lk = call.q_len, call.kv_len
    nq, nk = -(-lq // BLOCK_Q), -(-lk // BLOCK_K)
    batch = call.batch_shape
    mask = call.mask
    if mask is None:
        return MaskTiles(
            np.zeros(math.prod(batch), np.int64),
            np.full((1, nq, nk), FULL, np.int8),
            np.full((1, nq, nk), -1, np.int32),
            np.zeros((1, BLOCK_Q, BLOCK_K), np.uint8),
        )
    mshape = tuple(mask.batch_shape)
    mb = math.prod(mshape)
    index = torch.arange(mb).reshape(mshape + (1,) * (len(batch) - len(mshape)))
    index = index.expand(batch).reshape(-1)
    classes = call.block_map(BLOCK_Q, BLOCK_K).reshape(mb, nq, nk)
    partial = classes == PARTIAL
    tile_id = torch.full((mb, nq, nk), -1, dtype=torch.int32)
    pieces = [torch.zeros((1, BLOCK_Q, BLOCK_K), dtype=torch.uint8)]  # tile 0: unused filler
    count = 1
    step = max(1, TILE_EVAL_ELEMENTS // (mb * BLOCK_Q * nk * BLOCK_K))  # query blocks per call
    for qb0 in range(0, nq, step):
        qb1 = min(nq, qb0 + step)
        sel = partial[:, qb0:qb1]
        cols = sel.any(0).any(0).nonzero()
        if cols.numel() == 0:
            continue
        kb0, kb1 = int(cols[0]), int(cols[-1]) + 1
        sel = sel[:, :, kb0:kb1]
        q0, q1 = qb0 * BLOCK_Q, min(lq, qb1 * BLOCK_Q)
        k0, k1 = kb0 * BLOCK_K, min(lk, kb1 * BLOCK_K)
        t = mask.tile(q0, q1, k0, k1, lq, lk).reshape(mb, q1 - q0, k1 - k0)
        pad_q, pad_k = (qb1 - qb0) * BLOCK_Q - (q1 - q0), (kb1 - kb0) * BLOCK_K - (k1 - k0)
        t = torch.nn.functional.pad(t.to(torch.uint8), (0, pad_k, 0, pad_q))
        t = t.reshape(mb, qb1 - qb0, BLOCK_Q, kb1 - kb0, BLOCK_K).permute(0, 1, 3, 2, 4)
        chosen = t[sel]  # (n, BLOCK_Q, BLOCK_K), row-major order of sel
        n = chosen.shape[0]
        tile_id[:, qb0:qb1, kb0:kb1][sel] = torch.arange(count, count + n, dtype=torch.int32)
        pieces.append(chosen)
        count += n
    return MaskTiles(
        index.numpy().astype(np.int64),
        np.ascontiguousarray(classes.numpy().astype(np.int8)),
        tile_id.numpy(),
        np.ascontiguousarray(torch.cat(pieces).numpy()),
    )


# ---------------------------------------------------------------------------------------------
# autograd
# ---------------------------------------------------------------------------------------------
def _np(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _tanh_operands(qp: Tensor, kp: Tensor) -> tuple[np.ndarray, np.ndarray, bool]:
    """What the kernels evaluate tanh(qp_i + kp_j) from: (a (BH, Lq, h), bt (BH, h, Lk), direct).

    Fast form (``direct`` False): a = exp(2 qp), bt = exp(2 kp)ᵀ, and with p = a b,
    tanh(qp + kp) = (p - 1) / (p + 1): a product and one division per entry instead of a
    rational function (about half the instructions, and more accurate: rms error 3.5e-8 against
    4.9e-8 for tanh_f32). It needs |qp|, |kp| <= EXP_LIMIT (so that p stays a normal float32);
    otherwise ``direct`` is True, a = qp, bt = kpᵀ and the kernels call tanh_f32.
    """
    qp, kt = qp.detach(), kp.detach().transpose(1, 2)
    if max(float(qp.abs().max()), float(kt.abs().max())) <= EXP_LIMIT:
        return _np(torch.exp(qp * 2)), _np(torch.exp(kt * 2)), False
    return _np(qp), _np(kt), True


class _AdditiveFunction(torch.autograd.Function):
    """out = additive attention of projected inputs: qp (BH, Lq, h), kp (BH, Lk, h), v (BH, Lk,
    dv), w_v (h,) -> (BH, Lq, dv)."""

    @staticmethod
    def forward(ctx, qp: Tensor, kp: Tensor, v: Tensor, w_v: Tensor, tiles: MaskTiles) -> Tensor:
        bh, lq, _ = qp.shape
        a, bt, direct = _tanh_operands(qp, kp)
        out = torch.empty((bh, lq, v.shape[2]), dtype=torch.float32)
        lse = torch.empty((bh, lq), dtype=torch.float32)
        args = (a, bt, direct, _np(w_v), _np(v), *tiles.arrays(), out.numpy(), lse.numpy())
        _launch("forward", args, bh * tiles.classes.shape[1])
        ctx.save_for_backward(qp, kp, v, w_v, out, lse)
        ctx.tiles = tiles
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        qp, kp, v, w_v, out, lse = ctx.saved_tensors
        bh, lq, h = qp.shape
        lk, dv = kp.shape[1], v.shape[2]
        d_out = d_out.to(torch.float32).contiguous()
        d_sum = (d_out * out).sum(-1)  # D_i = dO_i . O_i, (BH, Lq)
        nq = -(-lq // BLOCK_Q)
        split = max(1, min(nq, -(-_PARTS_PER_THREAD * torch.get_num_threads() // bh)))
        dq = torch.zeros((bh, lq, h), dtype=torch.float32)
        dkt = np.zeros((bh * split, h, lk), np.float32)
        dvt = np.zeros((bh * split, dv, lk), np.float32)
        dw = np.zeros((bh * split, h), np.float32)
        a, bt, direct = _tanh_operands(qp, kp)
        args = (
            a,
            bt,
            direct,
            _np(w_v),
            _np(v.transpose(1, 2)),
            _np(d_out),
            _np(lse),
            _np(d_sum),
            *ctx.tiles.arrays(),
            split,
            dq.numpy(),
            dkt,
            dvt,
            dw,
        )
        _launch("backward", args, bh * split)
        dkp = torch.from_numpy(dkt).reshape(bh, split, h, lk).sum(1).transpose(1, 2)
        dv_ = torch.from_numpy(dvt).reshape(bh, split, dv, lk).sum(1).transpose(1, 2)
        dwv = torch.from_numpy(dw).sum(0)
        return dq, dkp, dv_, dwv, None


# ---------------------------------------------------------------------------------------------
# compilation, caching, threads
# ---------------------------------------------------------------------------------------------
_JIT: dict[str, dict] = {}
"""Functions of this module that _compile() turns into numba functions, with their options."""
_JIT_OPTIONS = dict(fastmath=True, error_model="numpy", nogil=True)
_PARTS_PER_THREAD = 4
"""Work is cut into about this many parts per thread, handed out as threads become free."""
_LOCK = threading.Lock()


def _jit(fn=None, **options):
    """Mark a module-level function for numba compilation (done on first use, in _compile);
    ``options`` override _JIT_OPTIONS. Use as ``@_jit`` or ``@_jit(fastmath=...)``."""

    def mark(f):
        _JIT[f.__name__] = {**_JIT_OPTIONS, **options}
        return f

    return mark if fn is None else mark(fn)


@functools.cache
def _numba_missing() -> str | None:
    """None when numba imports, else why not."""
    try:
        import numba

        from attnkit.kernels import nbmath  # noqa: F401
    except Exception as e:  # any import failure (missing, ABI mismatch) means: not available
        return f"numba is not usable: {type(e).__name__}: {e}"
    if numba.config.DISABLE_JIT:
        return "numba's JIT is disabled (NUMBA_DISABLE_JIT is set)"
    return None


def _launch(kernel: str, args: tuple, units: int) -> None:
    """Run ``_{kernel}_units(*args, first, step)`` over ``units`` work units on torch's number of
    threads (one part per call: units first, first + step, ...). The kernels release the GIL;
    Python threads share the work, so numba needs no thread pool of its own."""
    fn = _compile()[kernel]
    threads = max(1, min(torch.get_num_threads(), units))
    if threads == 1:
        fn(*args, 0, 1)
        return
    parts = min(units, _PARTS_PER_THREAD * threads)
    pool = _pool(threads, os.getpid())
    for f in [pool.submit(fn, *args, i, parts) for i in range(parts)]:
        f.result()


@functools.cache
def _pool(threads: int, pid: int) -> ThreadPoolExecutor:
    """A pool per thread count and process (a forked child must not reuse its parent's pool,
    whose threads it does not have)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="attnkit-additive")


def _compile() -> dict:
    """The numba kernels by name ("forward", "backward"); compiled (or loaded from the disk
    cache) on the first call, which takes a few seconds."""
    with _LOCK:
        return _compile_once()


@functools.cache
def _compile_once() -> dict:
    import numba

    from attnkit.kernels import nbmath

    g = globals()
    g.update(tanh_f32=nbmath.tanh_f32, exp_nonpos_f32=nbmath.exp_nonpos_f32)
    cache_dir = _cache_dir()
    old = numba.config.CACHE_DIR
    try:
        numba.config.CACHE_DIR = cache_dir or old
        for name, options in _JIT.items():
            try:
                g[name] = numba.njit(cache=bool(cache_dir), **options)(g[name])
            except RuntimeError:  # numba found no writable cache location after all
                g[name] = numba.njit(**options)(g[name])
    finally:
        numba.config.CACHE_DIR = old
    return dict(forward=g["_forward_units"], backward=g["_backward_units"])


def _cache_dir() -> str | None:
    """A writable directory for numba's on-disk cache, or None (no caching).

    The directory name carries a hash of this file and of nbmath.py: numba only notices changes
    to the file that defines a kernel, not to the helpers it inlines from another file.
    Candidates: $NUMBA_CACHE_DIR/attnkit-<hash>, this package's __pycache__/numba-<hash>,
    $XDG_CACHE_HOME (or ~/.cache)/attnkit/numba-<hash>; the first writable one wins.
    """
    here = Path(__file__).resolve()
    digest = hashlib.sha1()
    for f in (here, here.with_name("nbmath.py")):
        digest.update(f.read_bytes())
    tag = digest.hexdigest()[:12]
    candidates = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(Path(os.environ["NUMBA_CACHE_DIR"]) / f"attnkit-{tag}")
    candidates.append(here.parent / "__pycache__" / f"numba-{tag}")
    user = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates.append(Path(user) / "attnkit" / f"numba-{tag}")
    return _first_writable(candidates)


def _first_writable(dirs: list[Path]) -> str | None:
    """The first of ``dirs`` that exists or can be created and accepts a file, else None."""
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=d).close()
            return str(d)
        except OSError:
            continue
    return None


# ---------------------------------------------------------------------------------------------
# numba kernels (plain Python until _kernels() compiles them; all arithmetic float32)
# ---------------------------------------------------------------------------------------------
_EXACT_FASTMATH = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
"""fastmath without "reassoc" for the score loops: forward and backward then round every score
identically, so the probabilities the backward recomputes match the forward's log-sum-exp."""


@_jit(fastmath=_EXACT_FASTMATH)
def _scores4(a0, a1, a2, a3, kt_b, direct, w, s, keep, t, j0, jb):
    """Scores of 4 query rows against keys j0..j0+jb: s[q, jj] = sum_c w_c tanh_qc(jj).

    a0..a3 (h,) rows of qa; kt_b (h, Lk); see _tanh_operands for ``direct``. With ``keep`` also
    t[q, c, jj] = tanh (t: (4, h, BLOCK_K)); the scores are computed by the same expressions
    either way.
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
                tq = t[q, c, :jb]
                if direct:
                    for jj in range(jb):
                        tq[jj] = tanh_f32(xq + kc[jj])
                else:
                    for jj in range(jb):
                        z = xq * kc[jj]
                        tq[jj] = (z - _ONE) * (_ONE / (z + _ONE))


@_jit
def _forward_units(
    qa, kb_t, direct, w, v, mask_index, classes, tile_id, tiles, out, lse, first, step
):
    """Forward for work units first, first + step, ... (unit = batch element b, query block qb).

    qa (BH, Lq, h), kb_t (BH, h, Lk): exp(2 qp), exp(2 kp)ᵀ, or qp, kpᵀ when ``direct`` (see
    _tanh_operands); w (h,) = w_v; v (BH, Lk, dv). Writes out (BH, Lq, dv) and lse (BH, Lq) rows
    of its units. Query rows go 4 at a time (a row past Lq repeats the last row; its results are
    never stored), so every key load feeds 4 rows.
    """
    bh, lq, h = qa.shape
    lk, dv = kb_t.shape[2], v.shape[2]
    nq, nk = classes.shape[1], classes.shape[2]
    s = np.empty((4, BLOCK_K), np.float32)
    no_tile = np.empty((4, 1, 1), np.float32)
    acc = np.empty((BLOCK_Q, dv), np.float32)
    run_max = np.empty(BLOCK_Q, np.float32)
    run_sum = np.empty(BLOCK_Q, np.float32)
    for u in range(first, bh * nq, step):
        b = u // nq
        qb = u - b * nq
        mi = mask_index[b]
        a, kt_b, v_b = qa[b], kb_t[b], v[b]
        i0 = qb * BLOCK_Q
        nb = min(BLOCK_Q, lq - i0)
        for r in range(BLOCK_Q):
            run_max[r] = _MASKED
            run_sum[r] = _ZERO
            acc_r = acc[r]
            for c in range(dv):
                acc_r[c] = _ZERO
        for kb in range(nk):
            cls = classes[mi, qb, kb]
            if cls == EMPTY:
                continue
            j0 = kb * BLOCK_K
            jb = min(BLOCK_K, lk - j0)
            tile = tiles[max(tile_id[mi, qb, kb], 0)]
            s0, s1, s2, s3 = s[0, :jb], s[1, :jb], s[2, :jb], s[3, :jb]
            for r in range(0, nb, 4):
                a0 = a[min(i0 + r, lq - 1)]
                a1 = a[min(i0 + r + 1, lq - 1)]
                a2 = a[min(i0 + r + 2, lq - 1)]
                a3 = a[min(i0 + r + 3, lq - 1)]
                _scores4(a0, a1, a2, a3, kt_b, direct, w, s, False, no_tile, j0, jb)
                # mask, online softmax (s becomes probabilities), rescale the accumulators
                for q in range(4):
                    sq = s[q, :jb]
                    if cls != FULL:
                        mq = tile[r + q, :jb]
                        for jj in range(jb):
                            sq[jj] = sq[jj] if mq[jj] != 0 else _MASKED
                    m_old = run_max[r + q]
                    mx = m_old
                    for jj in range(jb):
                        mx = max(mx, sq[jj])
                    alpha = exp_nonpos_f32(m_old - mx)
                    total = _ZERO
                    for jj in range(jb):
                        x = sq[jj]
                        pj = exp_nonpos_f32(x - mx) if x > _MASKED_CUT else _ZERO
                        sq[jj] = pj
                        total += pj
                    run_sum[r + q] = run_sum[r + q] * alpha + total
                    run_max[r + q] = mx
                    acc_q = acc[r + q]
                    for c in range(dv):
                        acc_q[c] *= alpha
                # acc[r + q] += sum_jj p[q, jj] v[j0 + jj], 4 keys per step
                c0, c1, c2, c3 = acc[r], acc[r + 1], acc[r + 2], acc[r + 3]
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
            total = run_sum[r]
            o = out[b, i0 + r]
            if total > _ZERO:
                inv = _ONE / total
                lse[b, i0 + r] = run_max[r] + np.float32(math.log(total))
            else:  # no allowed key: output 0
                inv = _ZERO
                lse[b, i0 + r] = _ZERO
            acc_r = acc[r]
            for c in range(dv):
                o[c] = acc_r[c] * inv


@_jit
def _backward_units(
    qa,
    kb_t,
    direct,
    w,
    vt,
    do,
    lse,
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

    Inputs as in _forward_units plus vt (BH, dv, Lk), do (BH, Lq, dv) = dO, lse and
    dsum (BH, Lq) = D. Writes dq (BH, Lq, h) rows of its query blocks and accumulates the unit's
    own dkt[u] (h, Lk), dvt[u] (dv, Lk), dw[u] (h,) (zeroed by the caller): gradients with
    respect to qp, kpᵀ, vᵀ and w. Rows go 4 at a time as in the forward (a row past the block
    gets probability 0, so it contributes nothing).
    """
    bh, lq, h = qa.shape
    lk, dv = kb_t.shape[2], vt.shape[1]
    nq, nk = classes.shape[1], classes.shape[2]
    s = np.empty((4, BLOCK_K), np.float32)  # scores, then probabilities P
    g = np.empty((4, BLOCK_K), np.float32)  # dP, then dS
    t = np.empty((4, h, BLOCK_K), np.float32)  # tanh
    for u in range(first, bh * split, step):
        b = u // split
        part = u - b * split
        mi = mask_index[b]
        a, kt_b, vt_b, do_b = qa[b], kb_t[b], vt[b], do[b]
        dq_b, dkt_u, dvt_u, dw_u = dq[b], dkt[u], dvt[u], dw[u]
        for kb in range(nk):
            j0 = kb * BLOCK_K
            jb = min(BLOCK_K, lk - j0)
            p0, p1, p2, p3 = s[0, :jb], s[1, :jb], s[2, :jb], s[3, :jb]
            g0, g1, g2, g3 = g[0, :jb], g[1, :jb], g[2, :jb], g[3, :jb]
            for qb in range(part, nq, split):
                cls = classes[mi, qb, kb]
                if cls == EMPTY:
                    continue
                tile = tiles[max(tile_id[mi, qb, kb], 0)]
                i0 = qb * BLOCK_Q
                nb = min(BLOCK_Q, lq - i0)
                for r in range(0, nb, 4):
                    i_0 = min(i0 + r, lq - 1)
                    i_1 = min(i0 + r + 1, lq - 1)
                    i_2 = min(i0 + r + 2, lq - 1)
                    i_3 = min(i0 + r + 3, lq - 1)
                    _scores4(a[i_0], a[i_1], a[i_2], a[i_3], kt_b, direct, w, s, True, t, j0, jb)
                    # P = exp(score - lse) on allowed entries of real rows, else 0
                    for q in range(4):
                        sq = s[q, :jb]
                        if cls != FULL:
                            mq = tile[r + q, :jb]
                            for jj in range(jb):
                                sq[jj] = sq[jj] if mq[jj] != 0 else _MASKED
                        if r + q >= nb:
                            for jj in range(jb):
                                sq[jj] = _MASKED
                        lse_q = lse[b, min(i0 + r + q, lq - 1)]
                        gq = g[q, :jb]
                        for jj in range(jb):
                            x = sq[jj]
                            sq[jj] = exp_nonpos_f32(x - lse_q) if x > _MASKED_CUT else _ZERO
                            gq[jj] = _ZERO
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
                        dkc = dkt_u[c, j0 : j0 + jb]
                        ga0 = _ZERO
                        ga1 = _ZERO
                        ga2 = _ZERO
                        ga3 = _ZERO
                        gw = _ZERO
                        for jj in range(jb):
                            h0 = g0[jj] * (_ONE - u0[jj] * u0[jj])
                            h1 = g1[jj] * (_ONE - u1[jj] * u1[jj])
                            h2 = g2[jj] * (_ONE - u2[jj] * u2[jj])
                            h3 = g3[jj] * (_ONE - u3[jj] * u3[jj])
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
