"""The planner of the ``blocksparse`` backend: which fused SDPA calls compute an attention call.

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

Tile masks are built in the call's compute dtype (:func:`attnkit.kernels.policy.numerics.numerics`),
biases saturated to it. A bias that requires grad stays linked to its mask tensor through the
tiles (and such plans are never cached on the mask object).

The plans themselves (:class:`CallsPlan`, :class:`BandPlan`) and their execution are in
:mod:`attnkit.kernels.blocksparse.plans`.

Shape legend: ``P`` the product of the leading batch dims the mask varies over, ``R`` the
product of the other batch dims (heads), ``Lq``/``Lk`` lengths, ``W`` keys per window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.kernels.blocksparse.fold import fold_plan
from attnkit.kernels.blocksparse.plans import BandPlan, CallsPlan, Plan
from attnkit.kernels.blocksparse.tiles import Call
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.call.memo import MemoKey
from attnkit.kernels.dense import open_empty_rows
from attnkit.kernels.tuning import DEFAULT, current
from attnkit.masks import EMPTY, FULL, Intersection, Mask, document

BLOCK_Q = DEFAULT.blocksparse_block_q
"""Built-in default query block (rows per SDPA call in the ``rows`` plan, rows per window in
``band``); in use: ``tuning.current().blocksparse_block_q``."""

BLOCK_KV = DEFAULT.blocksparse_block_kv
"""Built-in default key block, the granularity of the key ranges; in use:
``tuning.current().blocksparse_block_kv``. The rows plan's cost model (SDPA throughput and the
fixed cost of one call, used to choose between one range per query block and one call per batch
element) is ``planner_flops`` / ``planner_call_s`` of the tuning in use."""


def _additive(allowed: Tensor, bias: Tensor | None, dtype: torch.dtype):
    """(float mask with -inf for disallowed entries, row_ok or None). Rows without any allowed
    entry are opened (so SDPA does not produce NaN) and flagged in row_ok (..., n, 1) for
    zeroing; row_ok is None when every row has a key. ``bias`` is already in ``dtype``."""
    allowed, row_ok = open_empty_rows(allowed)
    row_ok = None if row_ok is None else row_ok.to(dtype)
    base = torch.zeros((), dtype=dtype) if bias is None else bias
    return torch.where(allowed, base, torch.tensor(-math.inf, dtype=dtype)), row_ok


def _lead_dims(mask: Mask) -> int:
    """Number of leading batch dims the mask varies over (trailing singletons dropped)."""
    shape = list(mask.batch_shape)
    while shape and shape[-1] == 1:
        shape.pop()
    return len(shape)


def _tile_call(
    mask: Mask, q0: int, q1: int, lo: int, hi: int, call: AttentionCall, dtype: torch.dtype
) -> Call:
    """A call for rows q0:q1 against keys lo:hi of an unbatched mask, with its tile mask (None
    when every entry is allowed and there is no bias)."""
    lq, lk = call.q_len, call.kv_len
    if hi <= lo:
        return Call(q0, q1, 0, 0)
    allowed = mask.tile(q0, q1, lo, hi, lq, lk).reshape(q1 - q0, hi - lo)
    bias = mask.bias_tile(q0, q1, lo, hi, lq, lk, dtype)
    bias = None if bias is None else bias.reshape(q1 - q0, hi - lo)
    if bias is None and bool(allowed.all()):
        return Call(q0, q1, lo, hi)
    if not bool(allowed.any()):
        return Call(q0, q1, 0, 0)
    fm, row_ok = _additive(allowed, bias, dtype)
    return Call(q0, q1, lo, hi, None, fm, row_ok)


EDGE_MERGE = 1.25
"""Consecutive edge blocks of a band plan share one fused call while the call computes at most
this many times the score entries of their separate calls: each call is a parallel region of
the fused op, which waits for every thread (about 0.15 ms quiet, 15 ms median on 2 cores
under a load of 6), and the edges are a few percent of a long band's entries."""


def _edge_runs(blocks: list[int], keys, bq: int, lq: int) -> list[tuple[int, int, int, int]]:
    """Group consecutive edge blocks (sorted indices) into runs (b0, b1, lo, hi): blocks b0:b1
    against the union lo:hi of their key ranges (``keys(b)`` -> (lo, hi), empty when
    hi <= lo), a run growing while its area stays within :data:`EDGE_MERGE` of its blocks'."""

    def rows(b0: int, b1: int) -> int:
        return min(lq, b1 * bq) - b0 * bq

    runs: list[list[int]] = []
    for b in blocks:
        lo, hi = keys(b)
        area = rows(b, b + 1) * max(0, hi - lo)
        if runs and runs[-1][1] == b:
            r0, _, rlo, rhi, total = runs[-1]
            if hi <= lo:
                lo, hi = rlo, rhi
            elif rlo < rhi:
                lo, hi = min(lo, rlo), max(hi, rhi)
            if rows(r0, b + 1) * max(0, hi - lo) <= EDGE_MERGE * (total + area):
                runs[-1] = [r0, b + 1, lo, hi, total + area]
                continue
            lo, hi = keys(b)
        runs.append([b, b + 1, lo, hi, area])
    return [(r0, r1, lo, hi) for r0, r1, lo, hi, _ in runs]


def _band_plan(call: AttentionCall, block_q: int, dtype: torch.dtype, sub: int) -> Plan | None:
    mask = call.mask
    band = mask.as_band()
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
    fmask, _ = _additive(in_band[None, None], None, dtype)  # every row has keys

    def keys(b: int) -> tuple[int, int]:
        return max(0, s0 + b * bq), min(lk, s0 + b * bq + w)

    edges = tuple(
        _tile_call(mask, r0 * bq, min(lq, r1 * bq), lo_, hi_, call, dtype)
        for r0, r1, lo_, hi_ in _edge_runs([b for b in range(nb) if not b0 <= b < b1], keys, bq, lq)
    )
    return BandPlan(
        lq,
        lk,
        calls=edges,
        block=bq,
        interior=(b0, b1),
        start=s0 + b0 * bq,
        window=w,
        mask=fmask,
        sub_block=sub,
    )


def single_tile(call: AttentionCall) -> bool:
    """True when the plan is one call with one tile and no tile mask: a plain top-left causal
    mask for a call with sinks or a softcap (the only reasons ``auto`` sends a plain causal
    mask here: the dense backend has neither; on the fused path SDPA's ``is_causal`` skips the
    blocks above the diagonal and its log-sum-exp gives the sinks), or any band in which every
    query has a key for a softcap call without dropout (explicit tiles: row chunks whose key
    ranges follow the band, its edges masked by index, :mod:`.dropout`). No bias, a mask shared
    by the batch. Grouped calls take it with k and v repeated (tiles of positions, not folded
    rows)."""
    m = call.mask
    if m is None or m.has_bias or _lead_dims(m):
        return False
    if m.is_plain_causal:
        return call.sinks is not None or call.softcap is not None
    return call.softcap is not None and call.dropout_p == 0 and _band_keys(call) is not None


def _band_keys(call: AttentionCall) -> tuple[float, float] | None:
    """(lo, hi) with query i attending to keys i + lo <= j <= i + hi of a band mask in which
    every query has a key, else None."""
    band = call.mask.as_band()
    if band is None:
        return None
    off = band.offset(call.q_len, call.kv_len)
    lo, hi = band.lo + off, band.hi + off
    if not (lo <= hi and hi >= 0 and call.q_len - 1 + lo <= call.kv_len - 1):
        return None
    return lo, hi


def _docs_mask(mask: Mask, call: AttentionCall) -> tuple[document, bool] | None:
    """(document mask, causal inside documents) when the docs plan applies, else None."""
    if isinstance(mask, document):
        doc, is_causal = mask, False
    elif isinstance(mask, Intersection):
        parts = mask.parts
        docs = [m for m in parts if isinstance(m, document)]
        cz = [m for m in parts if m.is_plain_causal]
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
    return CallsPlan("docs", call.q_len, call.kv_len, lead, n_el, tuple(calls))


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


def _rows_plan(call: AttentionCall, block_q: int, block_kv: int, dtype: torch.dtype) -> Plan:
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
        t = current()
        flop, call_s = 2 * r * width / t.planner_flops, t.planner_call_s
        per_element = w_e * flop + c_e * call_s < n_el * w_u * flop + c_u * call_s
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
        bias = mask.bias_tile(q0, q1, lo, hi, lq, lk, dtype)
        if lead:
            allowed = _to_elements(allowed, mask, lead, lead_shape)
            bias = None if bias is None else _to_elements(bias, mask, lead, lead_shape)
        else:
            allowed = allowed.reshape(allowed.shape[-2:])
            bias = None if bias is None else bias.reshape(bias.shape[-2:])
        if not per_element:
            fm, row_ok = _additive(allowed, bias, dtype)
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
            run = None if bias is not None else column_run(allowed[p, :, a:b])
            if run is not None:  # the same keys for every row (key padding): no tile mask
                calls.append(Call(q0, q1, rp[0] + run[0], rp[0] + run[1], p))
                continue
            fm, row_ok = _additive(
                allowed[p, :, a:b], None if bias is None else bias[p, :, a:b], dtype
            )
            calls.append(Call(q0, q1, rp[0], rp[1], p, fm, row_ok))
    if per_element:
        calls = merge_row_blocks(calls)
    return CallsPlan("rows", lq, lk, lead, n_el, tuple(calls))


def column_run(allowed: Tensor) -> tuple[int, int] | None:
    """(a, b) when ``allowed`` (n, m) allows exactly the columns a:b (a < b) in every row, as
    key padding does; else None."""
    cols = allowed.any(0)
    if not bool(cols.any()) or not bool((allowed == cols).all()):
        return None
    idx = cols.nonzero()[:, 0]
    a, b = int(idx[0]), int(idx[-1]) + 1
    return (a, b) if b - a == idx.numel() else None


def merge_row_blocks(calls: list[Call]) -> list[Call]:
    """Per-element calls with consecutive query rows, the same keys and no tile mask merged into
    one call each (one SDPA call of a whole element's rows instead of one per query block);
    every other call kept, in the order of its first block."""
    out: list[Call] = []
    last: dict[int | None, int] = {}  # element -> index in out of its last mergeable call
    for c in calls:
        plain = c.p is not None and c.mask is None and c.row_ok is None and not c.is_causal
        i = last.get(c.p) if plain else None
        prev = None if i is None else out[i]
        if prev is not None and (prev.q1, prev.lo, prev.hi) == (c.q0, c.lo, c.hi):
            out[i] = Call(prev.q0, c.q1, c.lo, c.hi, c.p)
            continue
        if plain:
            last[c.p] = len(out)
        else:
            last.pop(c.p, None)
        out.append(c)
    return out


def _to_elements(t: Tensor, mask: Mask, lead: int, lead_shape: tuple[int, ...]) -> Tensor:
    """Mask tile batch_shape + (n, m) -> (P, n, m) over the leading dims of q."""
    t = t.reshape(tuple(mask.batch_shape[:lead]) + t.shape[-2:])
    return t.expand(lead_shape + t.shape[-2:]).reshape((-1,) + t.shape[-2:])


@dataclass(frozen=True)
class PlanKey(MemoKey[Plan]):
    """What a plan depends on beyond the mask: the lengths, the block sizes, the dtype of its
    tile masks, the leading dims of q the mask's batch dims cover, the folded heads, and the
    rows per block of a band's forward (``blocksparse_band_block_q`` of the tuning). The key
    of the plan in the call's memo and in the mask's ``plan_cache`` (for calls to come)."""

    q_len: int
    kv_len: int
    block_q: int
    block_kv: int
    dtype: torch.dtype
    lead_shape: tuple[int, ...]
    fold: int
    sub_block: int = 0


def make_plan(
    call: AttentionCall,
    block_q: int | None = None,
    block_kv: int | None = None,
    dtype: torch.dtype | None = None,
    fold: int = 1,
) -> Plan:
    """The plan for ``call`` with tile masks in ``dtype`` (default: the call's dtype), kept in the
    call's memo, and on the mask object for reuse across calls with the same shapes (masks are
    immutable by convention) unless a bias tensor requires grad (its tiles are graph nodes).
    Block sizes default to the tuning in use.

    ``fold`` G > 1: the plan on G query heads folded into the rows
    (:func:`~attnkit.kernels.blocksparse.fold.fold_plan`; causal documents then take the
    ``rows`` plan, as SDPA's is_causal cannot see folded rows)."""
    block_q = block_q or current().blocksparse_block_q
    block_kv = block_kv or current().blocksparse_block_kv
    dtype = dtype or call.dtype
    lead_shape = tuple(call.q.shape[: _lead_dims(call.mask)])
    sub = current().blocksparse_band_block_q
    key = PlanKey(call.q_len, call.kv_len, block_q, block_kv, dtype, lead_shape, fold, sub)
    return call.memo.get(key, lambda: _plan(call, key))


def _plan(call: AttentionCall, key: PlanKey) -> Plan:
    """:func:`make_plan` for a call that has none in its memo: from the mask's plan cache, or
    built (and kept there)."""
    block_q, block_kv, dtype, fold = key.block_q, key.block_kv, key.dtype, key.fold
    mcache = None if call.bias_needs_grad else call.mask.plan_cache
    plan = None if mcache is None else mcache.get(key)
    if plan is None and single_tile(call) and fold == 1:
        causal = call.mask.is_plain_causal
        band = None if causal else _band_keys(call)
        c = Call(0, call.q_len, 0, call.kv_len, is_causal=causal, band=band)
        plan = CallsPlan("docs", call.q_len, call.kv_len, calls=(c,))
    if plan is None:
        plan = _band_plan(call, block_q, dtype, key.sub_block) or _docs_plan(call, block_q)
        plan = plan and fold_plan(plan, fold)
        plan = plan or fold_plan(_rows_plan(call, block_q, block_kv, dtype), fold)
        if mcache is not None:
            mcache.put(key, plan)
    return plan
