"""Tiles of the ``blocksparse`` backend: one fused SDPA call on slices of q, k and v.

A :class:`Call` is query rows q0:q1 of one batch element (or all) against keys lo:hi, with its
tile mask. :func:`calls_forward` / :func:`calls_backward` run a sequence of calls and
accumulate the gradients of the slices in place (autograd through slices would zero-fill a
full-size gradient per slice). Tile masks that require grad (a learned bias) get their gradient
dS = P * (dP - rowsum(dO * O)), P recomputed from the saved log-sum-exp (the fused backward
does not return it).

The private fused CPU ops (:mod:`attnkit.kernels.fused_cpu`) read q, k, v, the output and its
gradient through the strides of their batch, head and row dims only: they assume a unit-stride
last dim (and BLAS needs rows at least a row apart). ``fused_cpu.unit_rows`` gives every tensor
that layout once per call (a copy only when needed); tiles and windows are views of those
tensors and keep it.

Shape legend: ``P`` mask batch elements, ``R`` other batch dims, ``L`` lengths, ``d`` width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.kernels.blocksparse.sinks import sink_forward, sink_grad
from attnkit.kernels.blocksparse.streams import run_streams, streams_for
from attnkit.kernels.dense import is_causal_exact
from attnkit.kernels.fused_cpu import FLASH, FLASH_BWD


def causal_as_mask(q: Tensor, k: Tensor, mask: Tensor | None, scale: float, is_causal: bool):
    """(mask, is_causal) for the fused ops: ``is_causal`` as a -inf tile mask at a scale where it
    is not exact (:func:`~attnkit.kernels.dense.is_causal_exact`: 0 in float32, or negative)."""
    if not is_causal or is_causal_exact(scale):
        return mask, is_causal
    n, m = q.shape[-2], k.shape[-2]
    above = torch.ones(n, m, dtype=torch.bool, device=q.device).triu_(1)
    causal = torch.zeros(n, m, dtype=q.dtype, device=q.device).masked_fill_(above, -torch.inf)
    return (causal if mask is None else mask + causal), False


def sdpa_fwd(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, is_causal: bool):
    """One fused SDPA forward on 4-D tiles: (output, logsumexp). Every SDPA call of the backend
    goes through here (the tests watch tile sizes and layouts by patching it)."""
    mask, is_causal = causal_as_mask(q, k, mask, scale, is_causal)
    return FLASH(q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)


def sdpa_bwd(go, q, k, v, out, lse, mask, scale, is_causal):
    """One fused SDPA backward on 4-D tiles: (grad q, grad k, grad v)."""
    mask, is_causal = causal_as_mask(q, k, mask, scale, is_causal)
    return FLASH_BWD(go, q, k, v, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale)


@dataclass(frozen=True)
class Call:
    """One SDPA call: query rows q0:q1 of batch element ``p`` (None = every element) against
    keys lo:hi; ``mask`` float (.., q1-q0, hi-lo) or None; ``row_ok`` (.., q1-q0, 1) zeroes
    rows without keys; ``is_causal`` for documents & causal."""

    q0: int
    q1: int
    lo: int
    hi: int
    p: int | None = None
    mask: Tensor | None = None
    row_ok: Tensor | None = None
    is_causal: bool = False
    band: tuple[float, float] | None = None
    """Explicit tiles only (:mod:`.dropout`): keys i + band[0] <= j <= i + band[1]."""

    @property
    def learns_mask(self) -> bool:
        """True when the tile mask requires grad (it comes from a learned bias)."""
        return self.mask is not None and self.mask.requires_grad

    def sel(self, t: Tensor, a: int, b: int) -> Tensor:
        """Rows a:b of this call's batch element(s) of a 4-D tensor, kept 4-D."""
        e = slice(None) if self.p is None else slice(self.p, self.p + 1)
        return t[e, :, a:b]


def _forward_one(c: Call, q, k, v, scale: float, out: Tensor, sinks):
    """One call of :func:`calls_forward`: writes its rows of ``out``; (output, lse) or None."""
    assert c.band is None, "a band tile is for explicit tiles only"
    dst = c.sel(out, c.q0, c.q1)
    if c.hi <= c.lo:
        dst.zero_()
        return None
    qs, ks, vs = c.sel(q, c.q0, c.q1), c.sel(k, c.lo, c.hi), c.sel(v, c.lo, c.hi)
    o, lse = sdpa_fwd(qs, ks, vs, c.mask, scale, c.is_causal)
    if sinks is not None:
        o, lse = sink_forward(o, lse, c.sel(sinks, c.q0, c.q1)[..., 0])
    dst.copy_(o if c.row_ok is None else o * c.row_ok)
    return o, lse


def _overlap(spans: list[tuple[int, int]]) -> bool:
    """True when two of the row spans (start, end) meet."""
    spans = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def disjoint_rows(calls) -> bool:
    """True when no two calls write the same output rows (a call of every element overlaps
    any other call's rows where their query rows meet)."""
    spans: dict[int | None, list[tuple[int, int]]] = {}
    for c in calls:
        spans.setdefault(c.p, []).append((c.q0, c.q1))
    every = spans.pop(None, [])
    return not _overlap(every) and not any(_overlap(own + every) for own in spans.values())


def calls_forward(calls, q: Tensor, k: Tensor, v: Tensor, scale: float, out: Tensor, sinks=None):
    """Run ``calls`` on q (P, R, Lq, d), k, v (P, R, Lk, d), writing into ``out``
    (P, R, Lq, d); returns per call (output, logsumexp) or None for calls without keys.
    ``sinks`` (P, R, Lq, 1) or None: each row's sink logit joins its denominator (the saved
    output and logsumexp are the ones with the sink, :func:`~.sinks.sink_forward`).

    Calls that write disjoint rows run in streams (:mod:`.streams`: shared out between torch's
    threads, each call on one thread) when there are enough of them."""
    n = streams_for(len(calls))
    if n <= 1 or not disjoint_rows(calls):
        return [_forward_one(c, q, k, v, scale, out, sinks) for c in calls]
    elems = q.shape[0]
    costs = [(c.q1 - c.q0) * max(c.hi - c.lo, 0) * (elems if c.p is None else 1) for c in calls]
    jobs = [functools.partial(_forward_one, c, q, k, v, scale, out, sinks) for c in calls]
    return run_streams(jobs, costs, n)


def _mask_grad(c: Call, g: Tensor, qs, ks, vs, o, lse, scale: float) -> Tensor:
    """Gradient of the tile mask c.mask: dS = P * (dP - rowsum(g * o)), summed to its shape."""
    acc = torch.promote_types(qs.dtype, torch.float32)
    qf, kf, vf, gf, of = (t.to(acc) for t in (qs, ks, vs, g, o))
    s = (qf @ kf.transpose(-2, -1)) * scale + c.mask.to(acc)
    p = torch.exp(s - lse.to(acc)[..., None])
    ds = p * (gf @ vf.transpose(-2, -1) - (gf * of).sum(-1, keepdim=True))
    return ds.sum_to_size(c.mask.shape).to(c.mask.dtype)


def _backward_one(c: Call, s, go, q, k, v, scale, gq, gk, gv, sinks, gsinks):
    """One call of :func:`calls_backward`: accumulates its gradients; its tile mask's gradient
    or None."""
    o, lse = s
    g = c.sel(go, c.q0, c.q1)
    g = g if c.row_ok is None else g * c.row_ok.to(g.dtype)
    qs, ks, vs = c.sel(q, c.q0, c.q1), c.sel(k, c.lo, c.hi), c.sel(v, c.lo, c.hi)
    a, b, d = sdpa_bwd(g, qs, ks, vs, o, lse, c.mask, scale, c.is_causal)
    c.sel(gq, c.q0, c.q1).add_(a)
    c.sel(gk, c.lo, c.hi).add_(b)
    c.sel(gv, c.lo, c.hi).add_(d)
    if gsinks is not None:
        rs = (g * o).sum(-1)
        c.sel(gsinks, c.q0, c.q1)[..., 0].add_(sink_grad(c.sel(sinks, c.q0, c.q1)[..., 0], lse, rs))
    return _mask_grad(c, g, qs, ks, vs, o, lse, scale) if c.learns_mask else None


def _own_elements(*grads) -> bool:
    """True when each batch element of every gradient has memory of its own (no broadcast
    batch dim), so calls of different elements never add into the same entries."""
    return all(t is None or t.shape[0] == 1 or t.stride(0) != 0 for t in grads)


def calls_backward(
    calls, go: Tensor, q, k, v, saved, scale: float, gq, gk, gv, sinks=None, gsinks=None
) -> list:
    """Accumulate the gradients of ``calls`` into gq, gk, gv (shaped like q, k, v) and, with
    ``sinks``, of the sink rows into ``gsinks`` (shaped like ``sinks``); returns the gradient
    of every tile mask that requires grad, in call order.

    Calls of single batch elements run in streams (:mod:`.streams`), an element's calls in one
    stream in their order, when there are enough elements: no two streams add into the same
    gradient entries."""
    if len(saved) != len(calls):
        raise ValueError(f"saved: expected one entry per call ({len(calls)}), got {len(saved)}")
    args = (calls, saved, go, q, k, v, scale, gq, gk, gv, sinks, gsinks)
    live = [i for i, s in enumerate(saved) if s is not None]
    by_elem: dict[int | None, list[int]] = {}
    for i in live:
        by_elem.setdefault(calls[i].p, []).append(i)
    n = streams_for(len(by_elem))
    if n <= 1 or None in by_elem or not _own_elements(gq, gk, gv, gsinks):
        groups = [live]
        done = [_backward_calls(live, args)]
    else:
        groups = list(by_elem.values())
        costs = [
            sum((calls[i].q1 - calls[i].q0) * (calls[i].hi - calls[i].lo) for i in g)
            for g in groups
        ]
        done = run_streams([functools.partial(_backward_calls, g, args) for g in groups], costs, n)
    gmask = {
        i: gm for g, got in zip(groups, done, strict=True) for i, gm in zip(g, got, strict=True)
    }
    return [gmask[i] for i in live if calls[i].learns_mask]


def _backward_calls(indices: list[int], args) -> list:
    """:func:`_backward_one` for the calls at ``indices``, in order (a stream of
    :func:`calls_backward`, or all of them)."""
    calls, saved, *rest = args
    return [_backward_one(calls[i], saved[i], *rest) for i in indices]
