"""The two typed plans of the ``blocksparse`` backend, each owning its forward and backward.

:class:`CallsPlan` (``kind`` "docs" or "rows"): a sequence of fused SDPA calls (:class:`Call`)
on (P, R, L, d) tensors. :class:`BandPlan` (``kind`` "band"): one batched call for the interior
query blocks against their key windows, a strided view (``unfold``) of k and v that copies
nothing, plus calls for the edge blocks whose windows leave [0, Lk). :func:`make_plan` in
:mod:`attnkit.kernels.blocksparse.planner` chooses and builds them.

Both take and return tensors in the layout of :func:`~attnkit.kernels.fused_cpu.unit_rows`
and expose ``forward(q, k, v, scale) -> (out, saved)``, ``backward(go, q, k, v, saved, scale)
-> (gq, gk, gv, [grad of each learned tile mask])`` and :meth:`grad_masks` (the tile masks that
require grad, extra inputs of the autograd Function).

Shape legend: ``P`` mask batch elements, ``R`` other batch dims, ``N`` = P * R, ``L`` lengths,
``d`` the one width, ``nb`` interior blocks, ``W`` keys per window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor

from attnkit.kernels.blocksparse import tiles
from attnkit.kernels.blocksparse.sinks import sink_forward, sink_grad
from attnkit.kernels.blocksparse.tiles import Call, calls_backward, calls_forward
from attnkit.kernels.fused_cpu import unit_rows


@dataclass(frozen=True)
class CallsPlan:
    """Fused SDPA calls in query order on (P, R, L, d) tensors; ``lead`` is the number of
    leading batch dims of q the mask varies over and ``elements`` their product P (per-element
    calls have ``p``). ``kind``: "docs" (one unmasked call per document) or "rows".
    ``fold`` G > 1: the rows are G query heads folded (:mod:`~attnkit.kernels.blocksparse.fold`)
    and q0:q1 count folded rows."""

    kind: str
    q_len: int
    kv_len: int
    lead: int = 0
    elements: int = 1
    calls: tuple[Call, ...] = ()
    fold: int = 1

    def entries(self) -> int:
        """Query x key score entries computed per element of the mask's batch (and head)."""
        total = 0
        for c in self.calls:
            total += (c.q1 - c.q0) * (c.hi - c.lo) * (self.elements if c.p is None else 1)
        return total // (self.elements * self.fold)

    def computed_fraction(self) -> float:
        """Fraction of the Lq x Lk score entries the plan computes."""
        return self.entries() / (self.q_len * self.kv_len)

    def grad_masks(self) -> list[Tensor]:
        """The tile masks that require grad, in call order."""
        return [c.mask for c in self.calls if c.learns_mask]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float, sinks=None):
        """q (P, R, Lq, d), k, v (P, R, Lk, d), sinks (P, R, Lq, 1) or None -> (output
        (P, R, Lq, d), saved tensors)."""
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        saved = calls_forward(self.calls, q, k, v, scale, out, sinks)
        return out, saved

    def backward(self, go: Tensor, q, k, v, saved, scale: float, sinks=None):
        """(gq, gk, gv, [grad of each learned tile mask], grad of sinks or None)."""
        gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        gs = None if sinks is None else torch.zeros_like(sinks)
        gmasks = calls_backward(self.calls, go, q, k, v, saved, scale, gq, gk, gv, sinks, gs)
        return gq, gk, gv, gmasks, gs


BLOCKS_AS_BATCH = 64
"""Interior blocks from which a band's forward runs its interior as one fused call with the
blocks as the call's batch and the batch elements as its heads (:meth:`BandPlan._blocks_as_batch`),
writing the output in (L, N, d) memory."""


BACKWARD_CHUNK_BYTES = 2**23
"""Most bytes of the key-window gradients (k and v) of one fused backward call of a band's
interior; the interior runs in chunks of blocks below it. The fused op zero-fills its gradient
windows, which hold each key about window / block times: at L = 16k, window 128, 8 heads, one
call over the whole interior filled 370 MB of fresh pages, 28% of the backward in page faults,
where chunks reuse the same few MB of heap."""


@dataclass(frozen=True)
class BandPlan:
    """A band ``lo <= j - i - offset <= hi`` on (N, L, d) tensors: query blocks
    ``interior = (b0, b1)`` of ``block`` rows, block b against the ``window`` keys starting at
    ``start + (b - b0) * block``, in one batched call with one shared additive ``mask``
    (1, 1, block * fold, window); ``calls`` are the edge blocks (on (1, N, L, d) views).
    ``fold`` G > 1: q holds G query heads per row position (rows i * G .. i * G + G - 1, see
    :mod:`~attnkit.kernels.blocksparse.fold`), a query block is ``block * G`` rows.
    ``sub_block`` s > 0 (dividing ``block``): the forward runs the interior as blocks of s rows
    against windows of ``window - block + s`` keys (:attr:`forward_plan`), and the backward as
    blocks of ``block`` rows; both read the same rows' output and log-sum-exp."""

    q_len: int
    kv_len: int
    calls: tuple[Call, ...]
    block: int
    interior: tuple[int, int]
    start: int
    window: int
    mask: Tensor
    kind: str = "band"
    fold: int = 1
    sub_block: int = 0

    @property
    def interior_blocks(self) -> int:
        return max(0, self.interior[1] - self.interior[0])

    def entries(self) -> int:
        """Query x key score entries computed (per batch element)."""
        total = self.interior_blocks * self.block * self.window
        return total + sum((c.q1 - c.q0) * (c.hi - c.lo) for c in self.calls) // self.fold

    def computed_fraction(self) -> float:
        """Fraction of the Lq x Lk score entries the plan computes."""
        return self.entries() / (self.q_len * self.kv_len)

    def grad_masks(self) -> list[Tensor]:
        return []  # a band plan has no bias

    @cached_property
    def forward_plan(self) -> BandPlan:
        """The plan whose interior the forward runs: this one, or with ``sub_block`` rows per
        block (the same interior rows and first key; a block of s rows needs
        ``window - block + s`` keys, so a forward computes fewer masked entries, while the
        backward's per-window work favours large blocks)."""
        s = self.sub_block
        if not 0 < s < self.block or self.block % s:
            return self
        r, w = self.block // s, self.window - self.block + s
        return replace(
            self,
            calls=(),
            block=s,
            interior=(self.interior[0] * r, self.interior[1] * r),
            window=w,
            mask=self.mask[..., : s * self.fold, :w].contiguous(),
            sub_block=0,
        )

    def _interior_saved(self, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
        """The interior's (output, log-sum-exp) in this plan's blocks: (N, nb, block * G, d)
        (a view of ``out`` (N, Lq, d)) and (N, nb, block * G)."""
        n = self.interior_blocks
        o = out[:, self._rows()].unflatten(1, (n, -1))
        return o, lse.reshape(o.shape[:-1])

    def _rows(self) -> slice:
        rows = self.block * self.fold
        return slice(self.interior[0] * rows, self.interior[1] * rows)

    def _blocks(self, t: Tensor) -> Tensor:
        """q or its gradient (N, Lq * G, d) -> the interior query blocks (N, nb, block * G, d)."""
        return t[:, self._rows()].unflatten(1, (self.interior_blocks, self.block * self.fold))

    def _windows(self, t: Tensor) -> Tensor:
        """k or v (N, Lk, d) -> the interior windows, a strided view (N, nb, W, d) whose last
        dim keeps t's (unit) stride."""
        n, bq, w = self.interior_blocks, self.block, self.window
        return t[:, self.start : self.start + (n - 1) * bq + w].unfold(1, w, bq).transpose(-1, -2)

    def _fold_into(self, g: Tensor, gw: Tensor, b0: int = 0) -> None:
        """Add the gradient of the windows gw (N, n, W, d) of interior blocks b0 .. b0 + n - 1
        (counted from the first interior block) into g (N, Lk, d)."""
        n, bq, w = gw.shape[1], self.block, self.window
        sn, sl, sd = g.stride()
        for c in range(math.ceil(w / bq)):  # window rows c*bq.. of block b: keys s + (b+c)*bq..
            t = min(bq, w - c * bq)
            dst = g.as_strided(
                (g.shape[0], n, t, g.shape[2]),
                (sn, bq * sl, sl, sd),
                g.storage_offset() + (self.start + (b0 + c) * bq) * sl,
            )
            dst += gw[:, :, c * bq : c * bq + t]

    def _backward_chunks(self, n: int, width: int, itemsize: int) -> list[slice]:
        """The interior blocks in runs whose key-window gradients, (n, blocks, W, width) for
        k and v together, stay within :data:`BACKWARD_CHUNK_BYTES`."""
        per_block = max(1, n * self.window * width * itemsize)
        per = max(1, BACKWARD_CHUNK_BYTES // per_block)
        nb = self.interior_blocks
        return [slice(c, min(nb, c + per)) for c in range(0, nb, per)]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float, sinks=None):
        """q (N, Lq, d), k, v (N, Lk, d), sinks (N, Lq, 1) or None -> (output (N, Lq, d),
        saved tensors)."""
        p = self.forward_plan if sinks is None else self
        if p.interior_blocks >= BLOCKS_AS_BATCH and sinks is None:  # (L, N, d) memory
            out = q.new_empty((q.shape[1], q.shape[0], v.shape[-1])).transpose(0, 1)[None]
        else:
            out = q.new_empty((1,) + q.shape[:-1] + (v.shape[-1],))
        s1 = None if sinks is None else sinks[None]
        saved = calls_forward(self.calls, q[None], k[None], v[None], scale, out, s1)
        if self.interior_blocks:
            kw, vw = p._windows(k), p._windows(v)
            dst = out[0, :, p._rows()].unflatten(1, (p.interior_blocks, -1))
            if p.interior_blocks >= BLOCKS_AS_BATCH and sinks is None:
                lse = p._blocks_as_batch(q, kw, vw, scale, dst)
                saved.append(self._interior_saved(out[0], lse))
                return out[0], saved
            o, lse = tiles.sdpa_fwd(p._blocks(q), kw, vw, p.mask, scale, False)
            if sinks is not None:
                o, lse = sink_forward(o, lse, self._blocks(sinks)[..., 0])
            dst.copy_(o)
            saved.append((o, lse) if p is self else self._interior_saved(out[0], lse))
        return out[0], saved

    def _blocks_as_batch(self, q: Tensor, kw: Tensor, vw: Tensor, scale: float, dst: Tensor):
        """The interior windows as one fused call with the blocks as its batch and the batch
        elements as its heads, (nb, N, block * G, d); its output copied into ``dst``
        (N, nb, block * G, d), rows of an output in (L, N, d) memory; returns the logsumexp
        (N, nb, block * G). The fused op writes its output as (batch, rows, heads, d), here
        (blocks, rows, N, d): the rows in order, so the copy is contiguous, in one call (one
        call per batch element, the earlier route, was one parallel region each: a loaded
        machine made each wait; one call over (N, nb) writes (N, rows, nb, d), and gathering
        that back took 13% of the forward at L 16k, window 128)."""
        o, lse = tiles.sdpa_fwd(
            self._blocks(q).transpose(0, 1),
            kw.transpose(0, 1),
            vw.transpose(0, 1),
            self.mask,
            scale,
            False,
        )
        dst.copy_(o.transpose(0, 1))
        return lse.transpose(0, 1)

    def backward(self, go: Tensor, q, k, v, saved, scale: float, sinks=None):
        """(gq, gk, gv, [], grad of sinks or None)."""
        gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        gs = None if sinks is None else torch.zeros_like(sinks)
        edges = saved[: len(self.calls)]
        calls_backward(
            self.calls,
            go[None],
            q[None],
            k[None],
            v[None],
            edges,
            scale,
            *(t[None] for t in (gq, gk, gv)),
            None if sinks is None else sinks[None],
            None if gs is None else gs[None],
        )
        if self.interior_blocks:
            o, lse = saved[-1]
            kw, vw = self._windows(k), self._windows(v)
            qi, goi, gqi = self._blocks(q), self._blocks(go), self._blocks(gq)
            width = k.shape[-1] + v.shape[-1]
            for c in self._backward_chunks(q.shape[0], width, k.element_size()):
                args = (goi[:, c], qi[:, c], kw[:, c], vw[:, c], o[:, c], lse[:, c])
                a, b, d = tiles.sdpa_bwd(*args, self.mask, scale, False)
                gqi[:, c] += a
                self._fold_into(gk, b, c.start)
                self._fold_into(gv, d, c.start)
            if gs is not None:
                rs = (goi * o).sum(-1)
                self._blocks(gs)[..., 0].add_(sink_grad(self._blocks(sinks)[..., 0], lse, rs))
        return gq, gk, gv, [], gs


Plan = CallsPlan | BandPlan
"""A plan of the ``blocksparse`` backend."""


class BlocksparseFn(torch.autograd.Function):
    """softmax(q kᵀ · scale + tile masks) v by ``plan``: q, k, v in the plan's shape and the
    layout of :func:`~attnkit.kernels.fused_cpu.unit_rows`; ``sinks`` (the plan's
    rows, 1) or None (:mod:`~attnkit.kernels.blocksparse.sinks`); extra inputs: the plan's
    :meth:`grad_masks` (their gradients are returned)."""

    @staticmethod
    def forward(ctx, q, k, v, plan: Plan, scale: float, sinks, *masks):
        out, saved = plan.forward(q, k, v, scale, sinks)
        ctx.present = [s is not None for s in saved]
        ctx.plan, ctx.scale, ctx.has_sinks = plan, scale, sinks is not None
        extra = (sinks,) if sinks is not None else ()
        ctx.save_for_backward(q, k, v, *extra, *(t for s in saved if s is not None for t in s))
        return out

    @staticmethod
    def backward(ctx, go):
        q, k, v, *rest = ctx.saved_tensors
        sinks = rest.pop(0) if ctx.has_sinks else None
        it = iter(rest)
        saved = [(next(it), next(it)) if p else None for p in ctx.present]
        go = unit_rows(go)
        gq, gk, gv, gmasks, gs = ctx.plan.backward(go, q, k, v, saved, ctx.scale, sinks)
        return (gq, gk, gv, None, None, gs, *gmasks)
