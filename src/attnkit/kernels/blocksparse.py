"""``blocksparse``: dot-product attention that skips the blocks a structured mask leaves empty.

The mask's block map (:meth:`attnkit.masks.Mask.block_map`, cached on the mask) says which
(block_q x block_kv) blocks of the score matrix hold at least one allowed entry. Only those are
computed, with PyTorch's fused CPU SDPA kernel (forward and backward) on slices of q, k and v,
inside one ``torch.autograd.Function`` that accumulates the gradients of the slices in place.
Forward and backward use O(Lq * w) memory, w being the number of keys a query block needs,
instead of O(Lq * Lk). Three plans:

``band``   sliding windows / local-causal (any band ``lo <= j - i <= hi``): the key windows
           of the query blocks are one strided view (``unfold``) of k and v, so every block
           whose window lies inside the keys goes into one batched SDPA call with one shared
           (block x window) mask, without copying k or v; the one or two blocks at each end
           are ``rows`` calls.
``docs``   sorted document ids (alone, or ``& causal()``): one unmasked SDPA call per document
           (``is_causal`` inside each document for the causal variant).
``rows``   everything else: per query block, one SDPA call on the contiguous key range that
           covers its non-empty blocks, with the mask tile as an additive float mask (dropped
           when every block of the range is full and there is no bias). Per-batch masks
           (key padding, batched documents...) either share one range per query block or get
           one call per batch element, whichever is estimated cheaper.

Rows with no allowed key give output 0 (and gradient 0), never NaN.

Shape legend: ``...`` batch dims of q/k/v, ``P`` the product of the leading batch dims the mask
varies over, ``R`` the product of the other batch dims (heads), ``Lq``/``Lk`` lengths, ``d``
widths, ``nb`` query blocks, ``W`` keys per window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels.base import AttentionCall, Backend
from attnkit.masks import EMPTY, FULL, Mask, _And, causal, document

BLOCK_Q = 128
"""Default query block (rows per SDPA call in the ``rows`` plan, rows per window in ``band``)."""

BLOCK_KV = 64
"""Default key block: the granularity of the key ranges."""

MIN_EMPTY = 0.2
"""Least fraction of empty blocks for ``auto`` dispatch to choose this backend. Measured (CPU
time, one thread; fp32, B=2, H=8, d=64, L=2048) against the dense backend with the materialised
mask: equal speed at about 10% empty blocks (key padding 1.0x; a window leaving 5% empty 0.9x),
1.1-1.5x at 20-25%, 1.6-1.8x at 40%, 2.3-3.3x at 60%."""

_FLOPS = 60e9
"""Rough SDPA throughput (flop/s) used to choose between plans."""

_CALL_S = 60e-6
"""Rough fixed cost of one SDPA call from Python (s) used to choose between plans."""


def _additive(allowed: Tensor, bias: Tensor | None, dtype: torch.dtype):
    """(float mask with -inf for disallowed entries, row_ok or None). Rows without any allowed
    entry are opened (so SDPA does not produce NaN) and flagged in row_ok (..., n, 1) for
    zeroing; row_ok is None when every row has a key."""
    row_ok = allowed.any(-1, keepdim=True)
    if bool(row_ok.all()):
        row_ok = None
    else:
        allowed = allowed | ~row_ok
        row_ok = row_ok.to(dtype)
    base = torch.zeros((), dtype=dtype) if bias is None else bias.to(dtype)
    return torch.where(allowed, base, torch.tensor(-math.inf, dtype=dtype)), row_ok


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One SDPA call of a ``rows`` or ``docs`` plan: query rows q0:q1 of batch element ``p``
    (None = every element) against keys lo:hi; ``mask`` float (.., q1-q0, hi-lo) or None;
    ``row_ok`` (.., q1-q0, 1) zeroes rows without keys; ``is_causal`` for documents & causal."""

    q0: int
    q1: int
    lo: int
    hi: int
    p: int | None = None
    mask: Tensor | None = None
    row_ok: Tensor | None = None
    is_causal: bool = False


@dataclass(frozen=True)
class Plan:
    """How one attention call is computed. ``kind`` is "band", "docs" or "rows".

    ``calls``: SDPA calls in query order on (P, R, L, d) tensors; ``lead`` is the number of
    leading batch dims of q the mask varies over and ``elements`` their product P (per-element
    calls have ``p``). A band plan also has one batched ``interior`` call: query blocks
    ``interior = (b0, b1)`` of ``block`` rows, block b against the ``window`` keys starting at
    ``start + (b - b0) * block`` (a strided view of k and v), with one shared additive ``mask``
    (1, 1, block, window); its ``calls`` are the edge blocks whose windows leave [0, Lk).
    """

    kind: str
    q_len: int
    kv_len: int
    lead: int = 0
    elements: int = 1
    calls: tuple[Call, ...] = ()
    block: int = 0
    interior: tuple[int, int] = (0, 0)
    start: int = 0
    window: int = 0
    mask: Tensor | None = None

    @property
    def interior_blocks(self) -> int:
        return max(0, self.interior[1] - self.interior[0])

    def entries(self) -> int:
        """Query x key score entries computed per element of the mask's batch."""
        total = self.interior_blocks * self.block * self.window * self.elements
        for c in self.calls:
            total += (c.q1 - c.q0) * (c.hi - c.lo) * (self.elements if c.p is None else 1)
        return total // self.elements

    def computed_fraction(self) -> float:
        """Fraction of the Lq x Lk score entries the plan computes."""
        return self.entries() / (self.q_len * self.kv_len)


def _lead_dims(mask: Mask) -> int:
    """Number of leading batch dims the mask varies over (trailing singletons dropped)."""
    shape = list(mask.batch_shape)
    while shape and shape[-1] == 1:
        shape.pop()
    return len(shape)


def _tile_call(mask: Mask, q0: int, q1: int, lo: int, hi: int, call: AttentionCall) -> Call:
    """A call for rows q0:q1 against keys lo:hi of an unbatched mask, with its tile mask (None
    when every entry is allowed and there is no bias)."""
    lq, lk = call.q_len, call.kv_len
    if hi <= lo:
        return Call(q0, q1, 0, 0)
    allowed = mask.tile(q0, q1, lo, hi, lq, lk).reshape(q1 - q0, hi - lo)
    bias = mask.bias_tile(q0, q1, lo, hi, lq, lk)
    bias = None if bias is None else bias.reshape(q1 - q0, hi - lo)
    if bias is None and bool(allowed.all()):
        return Call(q0, q1, lo, hi)
    if not bool(allowed.any()):
        return Call(q0, q1, 0, 0)
    fm, row_ok = _additive(allowed, bias, call.dtype)
    return Call(q0, q1, lo, hi, None, fm, row_ok)


def _band_plan(call: AttentionCall, block_q: int) -> Plan | None:
    mask = call.mask
    band = mask._band()
    if band is None or mask.has_bias or _lead_dims(mask):
        return None
    if not (math.isfinite(band.lo) and math.isfinite(band.hi)) or band.hi < band.lo:
        return None
    lq, lk, bq = call.q_len, call.kv_len, block_q
    lo, hi = int(band.lo), int(band.hi)
    w = bq + hi - lo  # keys a block of bq queries needs
    nb = math.ceil(lq / bq)
    if nb * bq * w > 0.5 * lq * lk:  # the windows would cover most of the matrix
        return None
    s0 = band.offset(lq, lk) + lo  # first key of block 0's window (may be < 0)
    # interior: full blocks whose whole window lies inside [0, Lk)
    b0 = max(0, -(s0 // bq)) if s0 < 0 else 0
    b1 = min(lq // bq, (lk - w - s0) // bq + 1)
    b1 = max(b0, b1)
    r = torch.arange(bq)[:, None]
    c = torch.arange(w)[None, :]
    in_band = (c - r >= 0) & (c - r <= hi - lo)  # lo <= j - i - offset <= hi, window coords
    fmask, _ = _additive(in_band[None, None], None, call.dtype)  # every row has keys
    edges = tuple(
        _tile_call(
            mask, b * bq, min(lq, b * bq + bq), max(0, s0 + b * bq), min(lk, s0 + b * bq + w), call
        )
        for b in range(nb)
        if not b0 <= b < b1
    )
    return Plan(
        "band",
        lq,
        lk,
        calls=edges,
        block=bq,
        interior=(b0, b1),
        start=s0 + b0 * bq,
        window=w,
        mask=fmask,
    )


def _docs_mask(mask: Mask, call: AttentionCall) -> tuple[document, bool] | None:
    """(document mask, causal inside documents) when the docs plan applies, else None."""
    if isinstance(mask, document):
        doc, is_causal = mask, False
    elif isinstance(mask, _And):
        parts = (mask.a, mask.b)
        docs = [m for m in parts if isinstance(m, document)]
        cz = [m for m in parts if type(m) is causal and m.alignment == "top_left"]
        if len(docs) != 1 or len(cz) != 1:
            return None
        doc, is_causal = docs[0], True
        if doc.kv_ids is not doc.ids or call.q_len != call.kv_len:
            return None
    else:
        return None
    if not doc.is_sorted():
        return None
    return doc, is_causal


def _docs_plan(call: AttentionCall, block_q: int) -> Plan | None:
    found = _docs_mask(call.mask, call)
    if found is None:
        return None
    doc, is_causal = found
    lead = _lead_dims(doc)
    qspans, kspans = doc.spans("ids"), doc.spans("kv_ids")
    if max(len(s) for s in qspans) > 2 * math.ceil(call.q_len / block_q):
        return None  # many tiny documents: the rows plan batches them better
    calls = []
    for p, (qs, ks) in enumerate(zip(qspans, kspans, strict=True)):
        kv = {i: (s, e) for i, s, e in ks}
        for i, s, e in qs:
            lo, hi = kv.get(i, (0, 0))
            calls.append(Call(s, e, lo, hi, p if lead else None, is_causal=is_causal))
    n_el = call.q.shape[0] if lead else 1
    return Plan("docs", call.q_len, call.kv_len, lead=lead, elements=n_el, calls=tuple(calls))


def _ranges(nonempty: Tensor, full: Tensor, block_kv: int, kv_len: int):
    """Per query block: (first, last) non-empty key block (or None) and whether every block in
    between is full. nonempty, full: (nq, nk) bool."""
    nk = nonempty.shape[-1]
    has = nonempty.any(-1)
    first = nonempty.int().argmax(-1)
    last = nk - 1 - nonempty.flip(-1).int().argmax(-1)
    zero = torch.zeros(nonempty.shape[0], 1, dtype=torch.long)
    notfull = torch.cat([zero, (~full).long().cumsum(-1)], dim=-1)  # not-full blocks before j
    n_notfull = notfull.gather(1, (last + 1)[:, None]) - notfull.gather(1, first[:, None])
    rows = zip(
        has.tolist(), first.tolist(), last.tolist(), (n_notfull[:, 0] == 0).tolist(), strict=True
    )
    return [
        (f * block_kv, min((la + 1) * block_kv, kv_len), span_full) if h else None
        for h, f, la, span_full in rows
    ]


def _rows_plan(call: AttentionCall, block_q: int, block_kv: int) -> Plan:
    mask = call.mask
    lq, lk = call.q_len, call.kv_len
    lead = _lead_dims(mask)
    lead_shape = tuple(call.q.shape[:lead])
    n_el = math.prod(lead_shape)
    nq = math.ceil(lq / block_q)
    bm = call.block_map(block_q, block_kv)  # mask.batch_shape + (nq, nk)
    bm = bm.reshape(tuple(mask.batch_shape[:lead]) + bm.shape[-2:])  # drop trailing 1s
    bm = bm.expand(lead_shape + bm.shape[-2:]).reshape((n_el,) + bm.shape[-2:])
    nonempty, full = bm != EMPTY, bm == FULL
    union = _ranges(nonempty.any(0), full.all(0), block_kv, lk)
    each = [_ranges(nonempty[p], full[p], block_kv, lk) for p in range(n_el)] if n_el > 1 else None
    width = call.q.shape[-1] + call.v.shape[-1]
    r = math.prod(call.q.shape[lead:-2])

    def cost(ranges_list):
        work = calls = 0
        for ranges in ranges_list:
            for bi, rg in enumerate(ranges):
                if rg is not None:
                    n = min(lq, (bi + 1) * block_q) - bi * block_q
                    work += n * (rg[1] - rg[0])
                    calls += 1
        return work, calls

    w_u, c_u = cost([union])
    per_element = False
    if each is not None:
        w_e, c_e = cost(each)
        flop = 2 * r * width / _FLOPS
        per_element = w_e * flop + c_e * _CALL_S < n_el * w_u * flop + c_u * _CALL_S
    calls = []
    for bi in range(nq):
        q0, q1 = bi * block_q, min(lq, (bi + 1) * block_q)
        rg = union[bi]
        if rg is None:
            calls.append(Call(q0, q1, 0, 0))
            continue
        lo, hi, is_full = rg
        if is_full and not mask.has_bias and not per_element:
            calls.append(Call(q0, q1, lo, hi))
            continue
        allowed = mask.tile(q0, q1, lo, hi, lq, lk)  # mask.batch_shape + (n, m)
        bias = mask.bias_tile(q0, q1, lo, hi, lq, lk)
        if lead:
            allowed = _to_elements(allowed, mask, lead, lead_shape)
            bias = None if bias is None else _to_elements(bias, mask, lead, lead_shape)
        else:
            allowed = allowed.reshape(allowed.shape[-2:])
            bias = None if bias is None else bias.reshape(bias.shape[-2:])
        if not per_element:
            fm, row_ok = _additive(allowed, bias, call.dtype)
            if lead:  # (P, n, m) -> (P, 1, n, m) against q (P, R, n, d)
                fm = fm[:, None]
                row_ok = None if row_ok is None else row_ok[:, None]
            calls.append(Call(q0, q1, lo, hi, None, fm, row_ok))
            continue
        for p in range(n_el):
            rp = each[p][bi]
            if rp is None:
                calls.append(Call(q0, q1, 0, 0, p))
                continue
            a, b = rp[0] - lo, rp[1] - lo
            if rp[2] and bias is None:
                calls.append(Call(q0, q1, rp[0], rp[1], p))
                continue
            fm, row_ok = _additive(
                allowed[p, :, a:b], None if bias is None else bias[p, :, a:b], call.dtype
            )
            calls.append(Call(q0, q1, rp[0], rp[1], p, fm, row_ok))
    return Plan("rows", lq, lk, lead=lead, elements=n_el, calls=tuple(calls))


def _to_elements(t: Tensor, mask: Mask, lead: int, lead_shape: tuple[int, ...]) -> Tensor:
    """Mask tile batch_shape + (n, m) -> (P, n, m) over the leading dims of q."""
    t = t.reshape(tuple(mask.batch_shape[:lead]) + t.shape[-2:])
    return t.expand(lead_shape + t.shape[-2:]).reshape((-1,) + t.shape[-2:])


def make_plan(call: AttentionCall, block_q: int = BLOCK_Q, block_kv: int = BLOCK_KV) -> Plan:
    """The plan for ``call`` (cached on the call, and on the mask object for reuse across calls
    with the same shapes: masks are immutable by convention)."""
    key = ("blocksparse-plan", block_q, block_kv)
    if key in call._cache:
        return call._cache[key]
    mkey = (
        "blocksparse-plan",
        call.q_len,
        call.kv_len,
        block_q,
        block_kv,
        call.dtype,
        tuple(call.q.shape[: _lead_dims(call.mask)]),
    )
    mcache = call.mask._cache()
    plan = mcache.get(mkey)
    if plan is None:
        plan = _band_plan(call, block_q) or _docs_plan(call, block_q)
        plan = plan or _rows_plan(call, block_q, block_kv)
        if len(mcache) > 64:
            mcache.pop(next(iter(mcache)))
        mcache[mkey] = plan
    call._cache[key] = plan
    return plan


# ---------------------------------------------------------------------------------------------
# execution: one autograd Function per attention call. The forward keeps each SDPA call's output
# and log-sum-exp; the backward runs the fused SDPA backward per call and accumulates the
# gradients in place (autograd through slices would zero-fill a full-size gradient per slice).
# ---------------------------------------------------------------------------------------------
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def _sdpa_fwd(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, is_causal: bool):
    """One fused SDPA forward on 4-D tiles: (output, logsumexp). Every SDPA call of this module
    goes through here (the tests watch the tile sizes by patching it)."""
    return _FLASH(q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)


def _sdpa_bwd(go, q, k, v, out, lse, mask, scale, is_causal):
    return _FLASH_BWD(go, q, k, v, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale)


def _windows(plan: Plan, t: Tensor) -> Tensor:
    """k or v (N, Lk, d) -> the interior windows, a strided view (N, nb, W, d)."""
    n, bq, w = plan.interior_blocks, plan.block, plan.window
    return t[:, plan.start : plan.start + (n - 1) * bq + w].unfold(1, w, bq).transpose(-1, -2)


def _interior_rows(plan: Plan) -> slice:
    return slice(plan.interior[0] * plan.block, plan.interior[1] * plan.block)


def _interior_forward(plan: Plan, q: Tensor, k: Tensor, v: Tensor, scale: float):
    """q (N, Lq, d), k, v (N, Lk, d): (output (N, nb, bq, d), logsumexp)."""
    qi = q[:, _interior_rows(plan)].unflatten(1, (plan.interior_blocks, plan.block))
    return _sdpa_fwd(qi, _windows(plan, k), _windows(plan, v), plan.mask, scale, False)


def _fold_into(plan: Plan, g: Tensor, gw: Tensor) -> None:
    """Add the gradient of the windows gw (N, nb, W, d) into g (N, Lk, d), contiguous."""
    n, bq, w = plan.interior_blocks, plan.block, plan.window
    sn, sl, sd = g.stride()
    for c in range(math.ceil(w / bq)):  # window rows c*bq.. of block b land on keys s + (b+c)*bq..
        t = min(bq, w - c * bq)
        dst = g.as_strided(
            (g.shape[0], n, t, g.shape[2]), (sn, bq * sl, sl, sd), (plan.start + c * bq) * sl
        )
        dst += gw[:, :, c * bq : c * bq + t]


def _interior_backward(plan: Plan, go, q, k, v, o, lse, gq, gk, gv, scale: float) -> None:
    """Accumulate the interior's gradients into gq (N, Lq, d), gk, gv (N, Lk, d)."""
    rows = _interior_rows(plan)
    qi = q[:, rows].unflatten(1, (plan.interior_blocks, plan.block))
    goi = go[:, rows].unflatten(1, (plan.interior_blocks, plan.block)).contiguous()
    a, b, d = _sdpa_bwd(
        goi, qi, _windows(plan, k), _windows(plan, v), o, lse, plan.mask, scale, False
    )
    gq[:, rows] += a.flatten(1, 2)
    _fold_into(plan, gk, b)
    _fold_into(plan, gv, d)


def _sel(c: Call, t: Tensor, a: int, b: int) -> Tensor:
    """Rows a:b of batch element c.p (all elements when None) of a 4-D tensor, kept 4-D."""
    e = slice(None) if c.p is None else slice(c.p, c.p + 1)
    return t[e, :, a:b]


def _calls_forward(plan: Plan, q: Tensor, k: Tensor, v: Tensor, scale: float):
    """q (P, R, Lq, d), k, v (P, R, Lk, d) -> output (P, R, Lq, d), per-call (out, lse)."""
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    saved = []
    for c in plan.calls:
        dst = _sel(c, out, c.q0, c.q1)
        if c.hi <= c.lo:
            dst.zero_()
            saved.append(None)
            continue
        qs, ks, vs = _sel(c, q, c.q0, c.q1), _sel(c, k, c.lo, c.hi), _sel(c, v, c.lo, c.hi)
        o, lse = _sdpa_fwd(qs, ks, vs, c.mask, scale, c.is_causal)
        dst.copy_(o if c.row_ok is None else o * c.row_ok)
        saved.append((o, lse))
    return out, saved


def _calls_backward(plan: Plan, go: Tensor, q, k, v, saved, scale: float):
    gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for c, s in zip(plan.calls, saved, strict=True):
        if s is None:
            continue
        o, lse = s
        g = _sel(c, go, c.q0, c.q1)
        g = (g if c.row_ok is None else g * c.row_ok).contiguous()
        qs, ks, vs = _sel(c, q, c.q0, c.q1), _sel(c, k, c.lo, c.hi), _sel(c, v, c.lo, c.hi)
        a, b, d = _sdpa_bwd(g, qs, ks, vs, o, lse, c.mask, scale, c.is_causal)
        _sel(c, gq, c.q0, c.q1).add_(a)
        _sel(c, gk, c.lo, c.hi).add_(b)
        _sel(c, gv, c.lo, c.hi).add_(d)
    return gq, gk, gv


class _BlocksparseFn(torch.autograd.Function):
    """q, k, v: (P, R, L, d) for rows/docs plans, (N, L, d) for band plans; one width d."""

    @staticmethod
    def forward(ctx, q, k, v, plan: Plan, scale: float):
        band = plan.kind == "band"
        q4, k4, v4 = (q[None], k[None], v[None]) if band else (q, k, v)
        out, saved = _calls_forward(plan, q4, k4, v4, scale)
        tensors = [t for s in saved if s is not None for t in s]
        if band and plan.interior_blocks:
            o, lse = _interior_forward(plan, q, k, v, scale)
            out[0, :, _interior_rows(plan)] = o.flatten(1, 2)
            tensors += [o, lse]
        ctx.present = [s is not None for s in saved]
        ctx.plan, ctx.scale = plan, scale
        ctx.save_for_backward(q, k, v, *tensors)
        return out[0] if band else out

    @staticmethod
    def backward(ctx, go):
        plan, scale = ctx.plan, ctx.scale
        q, k, v, *rest = ctx.saved_tensors
        band = plan.kind == "band"
        it = iter(rest)
        saved = [(next(it), next(it)) if p else None for p in ctx.present]
        q4, k4, v4, go4 = (q[None], k[None], v[None], go[None]) if band else (q, k, v, go)
        gq, gk, gv = _calls_backward(plan, go4, q4, k4, v4, saved, scale)
        if band:
            gq, gk, gv = gq[0], gk[0], gv[0]
            if plan.interior_blocks:
                o, lse = next(it), next(it)
                _interior_backward(plan, go, q, k, v, o, lse, gq, gk, gv, scale)
        return gq, gk, gv, None, None


def attend(call: AttentionCall, block_q: int = BLOCK_Q, block_kv: int = BLOCK_KV) -> Tensor:
    """softmax(q kᵀ · scale + mask) v computed on the mask's non-empty blocks only:
    (..., Lq, dv). Differentiable in q, k and v."""
    plan = make_plan(call, block_q, block_kv)
    q, k, v = call.q, call.k, call.v
    batch, dk, dv = tuple(q.shape[:-2]), q.shape[-1], v.shape[-1]
    if dk != dv:  # the fused kernel wants one width: zero columns change nothing
        width = max(dk, dv)
        q, k = F.pad(q, (0, width - dk)), F.pad(k, (0, width - dk))
        v = F.pad(v, (0, width - dv))
    if plan.kind == "band":
        shape = (-1,) + q.shape[-2:], (-1,) + k.shape[-2:], (-1,) + v.shape[-2:]
    else:
        lead = math.prod(batch[: plan.lead])
        if q.dim() == 4 and plan.lead <= 1:  # already (P, R, L, d): no copy of strided inputs
            shape = q.shape, k.shape, v.shape
        else:
            shape = tuple((lead, -1) + t.shape[-2:] for t in (q, k, v))
    q, k, v = (t.reshape(s) for t, s in zip((q, k, v), shape, strict=True))
    out = _BlocksparseFn.apply(q, k, v, plan, call.scale)
    return out.reshape(batch + (call.q_len, out.shape[-1]))[..., :dv]


# ---------------------------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------------------------
class BlocksparseBackend(Backend):
    """Skips the empty blocks of a structured mask (see the module docstring).

    ``block_q`` / ``block_kv`` set the block sizes; ``min_empty`` the least fraction of empty
    blocks for which the backend accepts a call (0 accepts any mask with an empty block).
    """

    name = "blocksparse"
    description = "skips the blocks a structured mask leaves empty (SDPA on key ranges)"
    kinds = ("dot",)
    dtypes = (torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu",)
    supports_grad = True
    supports_weights = False
    supports_dropout = False
    supports_bias = True

    def __init__(
        self, block_q: int = BLOCK_Q, block_kv: int = BLOCK_KV, min_empty: float = MIN_EMPTY
    ) -> None:
        self.block_q, self.block_kv, self.min_empty = block_q, block_kv, min_empty

    def available(self) -> str | None:
        if _FLASH is None or _FLASH_BWD is None:
            return "this torch build lacks the fused CPU SDPA kernel (forward and backward)"
        return None

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.mask is None:
            return ["no mask: no block to skip"]
        return []

    def speed_reasons(self, call: AttentionCall) -> list[str]:
        if call.mask is None:
            return []
        if type(call.mask) is causal and call.mask.alignment == "top_left":
            return [
                "plain top-left causal: the dense backend's SDPA is_causal skips the blocks itself"
            ]
        bm = call.block_map(self.block_q, self.block_kv)
        frac = float((bm == EMPTY).float().mean())
        if frac == 0.0:
            return [f"mask leaves no {self.block_q}x{self.block_kv} block empty"]
        if frac < self.min_empty:
            return [
                f"mask leaves only {frac:.0%} of {self.block_q}x{self.block_kv} blocks empty "
                f"(< {self.min_empty:.0%})"
            ]
        return []

    def run(self, call: AttentionCall) -> tuple[Tensor, None]:
        return attend(call, self.block_q, self.block_kv), None
