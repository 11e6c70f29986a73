"""``blocksparse``: dot-product attention that skips the blocks a structured mask leaves empty.

The mask's block map (:meth:`attnkit.masks.Mask.block_map`, cached on the mask) says which
(block_q x block_kv) blocks of the score matrix hold at least one allowed entry. Only those are
computed, with PyTorch's fused CPU SDPA kernel (forward and backward) on slices of q, k and v,
inside one ``torch.autograd.Function`` that accumulates the gradients of the slices in place.
Forward and backward use O(Lq * w) memory, w being the number of keys a query block needs,
instead of O(Lq * Lk). :mod:`~attnkit.kernels.blocksparse.planner` chooses the plan (``band``,
``docs`` or ``rows``); :mod:`~attnkit.kernels.blocksparse.plans` holds the two plan types
(:class:`BandPlan`, :class:`CallsPlan`), each with its forward and backward, and the autograd
Function; :mod:`~attnkit.kernels.blocksparse.tiles` runs single fused SDPA calls.

Grouped-query calls (k, v with Hkv < H heads, ``supports_gqa``) whose mask is shared by the
heads run with the G = H / Hkv query heads of each key/value head folded into the rows of one
SDPA call per block (:mod:`~attnkit.kernels.blocksparse.fold`): k and v are never repeated;
masks that vary per head, and the policy's off-fused paths, get k and v repeated first.

With ``dropout_p`` > 0 the same plan runs as explicit tiles with dropout on the weights
(:mod:`~attnkit.kernels.blocksparse.dropout`), the keep mask a hash of (seed, batch-head, i, j)
(:mod:`~attnkit.kernels.blocksparse.keep`) with one seed per call from torch's default generator;
p = 0 is the fused path, untouched. (A call whose scores are too large for any recomputing
backward, below, takes the ``math`` implementation and torch's own dropout.)

Attention sinks run on the fused path, applied exactly from each tile's log-sum-exp. Logit
softcapping on a band mask (causal, windows) in float32 without dropout runs fused: torch's
products with one numba pass between them (cap, mask, softmax) per tile
(:mod:`~attnkit.kernels.blocksparse.softcap`); other softcap calls run as explicit tiles (the
fused SDPA kernel has no hook between q kᵀ and the softmax), with the same plan and its skipped
blocks (:mod:`~attnkit.kernels.blocksparse.sinks`).

Rows with no allowed key give output 0 (and gradient 0), never NaN; every input layout is read
correctly (the fused ops get unit-stride rows); a float mask that requires grad (a learned
bias) gets its gradient; the NaN/inf/overflow policy is :mod:`attnkit.kernels.policy.numerics`, run
by dispatch once per call, whose decision the backend receives. A call whose scores are too large
for any fused backward to be exact (|s| * eps(float64) >= 2**-10, the decision's
``fused_backward_ok``) is handed by dispatch to the ``math`` backend instead
(:meth:`BlocksparseBackend.decision_reasons`): exact gradients at O(Lq * Lk) memory, for inputs
that no fused kernel can differentiate.

Shape legend: ``...`` batch dims of q/k/v, ``Lq``/``Lk`` lengths, ``dk``/``dv`` widths.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels.blocksparse import softcap
from attnkit.kernels.blocksparse.dropout import DropoutFn, Setup
from attnkit.kernels.blocksparse.emptiness import empty_blocks
from attnkit.kernels.blocksparse.fold import fold_q, group_size, unfold_out
from attnkit.kernels.blocksparse.keep import draw_seed
from attnkit.kernels.blocksparse.planner import BLOCK_KV, BLOCK_Q, make_plan, single_tile
from attnkit.kernels.blocksparse.plans import BandPlan, BlocksparseFn, CallsPlan, Plan
from attnkit.kernels.blocksparse.tiles import Call
from attnkit.kernels.call.backend import Backend, fused_backward_reasons
from attnkit.kernels.call.base import AttentionCall, ungrouped
from attnkit.kernels.fused_cpu import FLASH, FLASH_BWD, unit_rows
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.kernels.policy.mask_bias import bias_tensors
from attnkit.kernels.policy.numerics import compute_dtype
from attnkit.kernels.tuning import DEFAULT, Tuning, current

__all__ = [
    "BLOCK_KV",
    "BLOCK_Q",
    "DROPOUT_MIN_EMPTY",
    "ELEMENT_CALL_ENTRIES",
    "MIN_EMPTY",
    "BandPlan",
    "BlocksparseBackend",
    "Call",
    "block_rows",
    "CallsPlan",
    "Plan",
    "attend",
    "make_plan",
]

MIN_EMPTY = DEFAULT.blocksparse_min_empty
"""Built-in default (0.25) of the least fraction of empty blocks for ``auto`` dispatch to choose
this backend (the value in use: ``tuning.current().blocksparse_min_empty``, measured on the
user's machine by ``attnkit tune``). Measured against the dense backend with the materialised
mask (fp32, H=8, d=64, L=2048): on the project's 2-core AVX-512 Xeon (one thread) equal speed at
about 10% empty blocks, 1.1-1.5x at 20-25%, 1.6-1.8x at 40%, 2.3-3.3x at 60%; on a quiet 2-core
AMD EPYC (Zen 5, two threads; ``attnkit tune`` and the dispatch bench rows) 1.51x at 31%, 1.70x
at 47%, 1.95x for a 700-wide window and 1.74x for prefix-LM 512. On that EPYC under a load of
13-18 (other jobs on both cores) blocksparse lost at 38-45% (0.53-0.84x): timings under load
measure the load, so the default follows the quiet measurements of both machines, a little
above the Xeon's crossover."""

DROPOUT_MIN_EMPTY = DEFAULT.blocksparse_dropout_min_empty
"""Built-in default of the same with dropout (explicit tiles,
:mod:`~attnkit.kernels.blocksparse.dropout`, against the dense backend's SDPA math path with
dropout; in use: ``tuning.current().blocksparse_dropout_min_empty``). Measured (fwd+bwd, fp32,
B=1, H=8, d=64, L=2048, p=0.1, 2 threads on a shared 2-core machine, one run): 88% empty
(window 128 & causal) 3.6x faster, 73% 1.04x, 58% 1.1x, 51% (causal & key padding, rows plan)
0.65x."""

SOFTCAP_BLOCK_Q = 512
"""Query block of the plan of a softcap call without dropout (explicit tiles) when the backend
has the default BLOCK_Q: a tile is a query block against its key range, and each tile's
tensor operations cost about the same fixed time on a loaded machine, so fewer, larger tiles
are faster (a window of 4,096 keys computes 512 / 4,096 more entries than with 128)."""

ELEMENT_CALL_ENTRIES = DEFAULT.blocksparse_element_call_entries
"""Built-in default (in use: ``tuning.current().blocksparse_element_call_entries``). Blocks
empty in only some elements of the mask's batch (key padding whose length varies per element)
are skipped with one SDPA call per element and query block, each with its own tile mask;
``auto`` dispatch counts them only when each such call skips at least this many score entries
(summed over the heads); otherwise it judges by the blocks empty in every element.

The calls run in streams (:mod:`.streams`: each on one thread, shared out between torch's
threads), so no call opens a parallel region that waits for a descheduled thread. Measured
(blocksparse vs dense, forward, fp32, 2 threads, AMD EPYC 2 cores, key padding with lengths
L/16..L per element, 2026-11-28): skipped entries per call 24k-43k: 0.75-0.99x quiet,
0.49-1.19x with a second process copying memory on the other core; 76k: 0.83-1.04x quiet,
0.99-1.13x loaded; 113k (the BERT batch (32, 12, 255, 32)): 1.08-1.17x quiet, 1.12-1.21x
loaded; 164k-295k: 1.16-1.34x loaded. Before the streams, the same BERT batch ran 0.26-0.57x
under that load (every call a region of two threads), and the default was 2**20. The default
sits between the tie (76k) and the win (113k); ``attnkit tune`` measures this threshold at BERT-like
sizes (:func:`attnkit.autotune.element_calls`)."""


def _attend(call: AttentionCall, compute: torch.dtype, block_q: int, block_kv: int) -> Tensor:
    """The plan run on q, k, v in ``compute``: float64 when P5 asks for it; float32 for half
    types (P4: the tiles' outputs, logsumexps and gradients are accumulated in float32 and
    rounded once, and no CPU without native bf16 is asked for bf16 matmuls). A grouped call
    (which reaches here only when :func:`group_size` is G >= 2) runs with its G query heads per
    key/value head folded into the rows (:mod:`~attnkit.kernels.blocksparse.fold`)."""
    if softcap.applies(call, compute):  # one fused pass per tile (numba)
        return softcap.fused_attend(call, call.sinks)
    g = group_size(call)
    if call.softcap is not None and call.dropout_p == 0 and block_q == BLOCK_Q:
        block_q = SOFTCAP_BLOCK_Q  # explicit tiles: fewer, larger tensor operations
    plan = make_plan(call, block_q, block_kv, compute, fold=g)
    q, k, v = call.q, call.k, call.v
    if q.dtype != compute:
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    batch, dk, dv = tuple(q.shape[:-2]), q.shape[-1], v.shape[-1]
    if dk != dv:  # the fused kernel wants one width: zero columns change nothing
        width = max(dk, dv)
        q, k = F.pad(q, (0, width - dk)), F.pad(k, (0, width - dk))
        v = F.pad(v, (0, width - dv))
    q = fold_q(q, g)  # (..., Hkv, Lq * G, d) for a grouped call
    if plan.kind == "band":
        shape = (-1,) + q.shape[-2:], (-1,) + k.shape[-2:], (-1,) + v.shape[-2:]
    else:
        lead = math.prod(batch[: plan.lead])
        if q.dim() == 4 and plan.lead <= 1:  # already (P, R, L, d): no copy of strided inputs
            shape = q.shape, k.shape, v.shape
        else:
            shape = tuple((lead, -1) + t.shape[-2:] for t in (q, k, v))
    q, k, v = (unit_rows(t.reshape(s)) for t, s in zip((q, k, v), shape, strict=True))
    sinks = _sink_rows(call, compute, g, q.shape)
    if call.dropout_p > 0 or call.softcap is not None:  # explicit tiles
        out = _dropout(call, plan, q, k, v, g, sinks)
    else:
        out = BlocksparseFn.apply(q, k, v, plan, call.scale, sinks, *plan.grad_masks())
    if not plan.grad_masks() and call.needs_grad:  # every biased entry masked or skipped:
        learned = [t for t in bias_tensors(call.mask) if t.requires_grad]
        if learned:  # the bias's gradient is exactly 0, and autograd must still reach it
            out = ZeroGradLink.apply(out, *learned)
    out = out.reshape(call.k.shape[:-2] + (call.q_len * g, out.shape[-1]))
    return unfold_out(out, g)[..., :dv]


def _sink_rows(call: AttentionCall, dtype: torch.dtype, g: int, q_shape: tuple) -> Tensor | None:
    """The sink logit of every query row in the plan's layout (q_shape[:-1], 1), rows folded by
    G like q (:func:`fold_q`); differentiable back to ``call.sinks`` (H,); None without sinks."""
    if call.sinks is None:
        return None
    s = call.sinks.to(dtype)[:, None, None].expand(call.q.shape[:-1] + (1,))  # (..., H, Lq, 1)
    return fold_q(s, g).reshape(tuple(q_shape[:-1]) + (1,)).contiguous()


def _dropout(call: AttentionCall, plan: Plan, q, k, v, g: int, sinks: Tensor | None) -> Tensor:
    """The plan as explicit tiles (:mod:`~attnkit.kernels.blocksparse.dropout`): dropout on the
    weights (the seed drawn from torch's default generator, only when p > 0) and the softcap;
    q, k, v, the sink rows and the output in the plan's shape."""
    band = plan.kind == "band"
    if band:  # (N, L, d) as one element of N rows
        q, k, v = q[None], k[None], v[None]
        sinks = None if sinks is None else sinks[None]
    seed = draw_seed() if call.dropout_p > 0 else 0
    keep_lse = call.needs_grad or sinks is not None
    setup = Setup(
        call.scale, call.dropout_p, seed, g, q.shape[0], q.shape[1], call.softcap, keep_lse
    )
    out = DropoutFn.apply(q, k, v, plan, setup, sinks, *plan.grad_masks())
    return out[0] if band else out


def _cap_sink_notes(call: AttentionCall) -> list[str]:
    """What this backend does with a call's softcap and sinks (for ``explain_dispatch``)."""
    notes = []
    if call.softcap is not None:
        if softcap.applies(call, compute_dtype(call.dtype)):  # unless P5 asks for float64
            notes.append(
                "softcap fused on the band: matrix products with one pass for cap, mask and "
                "softmax between them"
            )
        else:
            notes.append(
                "softcap as explicit tiles (dropout, a mask that is not a band, a bias, float64 "
                "or no numba)"
            )
    if call.sinks is not None:
        notes.append("sinks applied exactly from each tile's log-sum-exp")
    return notes


class ZeroGradLink(torch.autograd.Function):
    """``out`` unchanged, with a zero gradient for each extra tensor: links tensors whose
    gradient is exactly zero (a learned bias on entries that are all masked) to the graph, so
    ``.grad`` is zeros, as in the other backends, rather than None."""

    @staticmethod
    def forward(ctx, out: Tensor, *tensors: Tensor) -> Tensor:
        ctx.specs = [(t.shape, t.dtype, t.device) for t in tensors]
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return (grad, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.specs))


def block_rows(call: AttentionCall, t: Tuning) -> int:
    """Query rows per block from the tuning in use, for a band mask (sliding or causal window)
    without a softcap, where a block of B queries computes B + width keys per query:
    ``blocksparse_band_block_q`` without gradients (at width 257 on the 2-core EPYC, forward:
    32 rows 66 ms, 128 rows 97 ms), ``blocksparse_band_backward_block_q`` with them (the
    backward's blocks; the forward of such a band still runs its interior in
    ``blocksparse_band_block_q`` rows, :attr:`BandPlan.forward_plan`; at width 257, L = 16k,
    backward: 64 rows 207 ms, 128 rows 229 ms); ``blocksparse_block_q`` otherwise (the forward
    band rows never above it)."""
    m = call.mask
    if call.softcap is not None or m is None or m.as_band() is None:
        return t.blocksparse_block_q
    if call.needs_grad:
        return t.blocksparse_band_backward_block_q
    return min(t.blocksparse_block_q, t.blocksparse_band_block_q)


def attend(
    call: AttentionCall,
    decision: NumericsDecision,
    block_q: int | None = None,
    block_kv: int | None = None,
) -> Tensor:
    """softmax(q kᵀ · scale + mask) v computed on the mask's non-empty blocks only, in the
    policy's compute dtype (``decision``, from dispatch): (..., Lq, dv). Differentiable in q, k,
    v and the mask's float tensors. Block sizes default to the tuning in use
    (:func:`block_rows`, ``blocksparse_block_kv``)."""
    t = current()
    block_kv = block_kv or t.blocksparse_block_kv
    return _attend(call, decision.compute, block_q or block_rows(call, t), block_kv)


class BlocksparseBackend(Backend):
    """Skips the empty blocks of a structured mask (see the module docstring).

    ``block_q`` / ``block_kv`` set the block sizes; ``min_empty`` the least fraction of empty
    blocks for which the backend accepts a call (0 accepts any mask with an empty block). Each
    left at None follows the tuning in use (:func:`attnkit.kernels.tuning.current`).
    """

    name = "blocksparse"
    kinds = ("dot",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu",)
    supports_grad = True
    supports_weights = False
    supports_dropout = True
    supports_bias = True
    supports_gqa = True
    supports_softcap = True
    supports_sinks = True

    def __init__(
        self,
        block_q: int | None = None,
        block_kv: int | None = None,
        min_empty: float | None = None,
    ) -> None:
        self._block_q, self._block_kv, self._min_empty = block_q, block_kv, min_empty

    @property
    def block_q(self) -> int:
        return self._block_q or current().blocksparse_block_q

    @property
    def block_kv(self) -> int:
        return self._block_kv or current().blocksparse_block_kv

    @property
    def min_empty(self) -> float:
        return current().blocksparse_min_empty if self._min_empty is None else self._min_empty

    def available(self) -> str | None:
        if FLASH is None or FLASH_BWD is None:
            return "this torch build lacks the fused CPU SDPA kernel (forward and backward)"
        return None

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.mask is None:
            return ["no mask: no block to skip"]
        return []

    def speed_reasons(self, call: AttentionCall) -> list[str]:
        """Why ``auto`` should prefer the dense backend, citing the constant of the tuning in
        use that decided (:mod:`attnkit.kernels.tuning`): a plain causal mask; fewer than
        ``blocksparse_min_empty`` (``blocksparse_dropout_min_empty`` with dropout) of the
        blocks empty in every element of the mask's batch, unless per-element calls skip at
        least ``blocksparse_element_call_entries`` each. None with softcap or sinks: the dense
        backend cannot serve them, and ``math`` builds the whole score matrix."""
        return self._judge(call)[0]

    def choice_notes(self, call: AttentionCall) -> list[str]:
        """The constant that let ``auto`` choose this backend, and the measured fraction."""
        return self._judge(call)[1]

    def _judge(self, call: AttentionCall) -> tuple[list[str], list[str]]:
        """(speed reasons, notes when there are none): see :meth:`speed_reasons`."""
        if call.mask is None:
            return [], []
        if call.softcap is not None or call.sinks is not None:
            return [], _cap_sink_notes(call)  # the dense backend serves neither
        if call.mask.is_plain_causal:
            return [
                "plain top-left causal: the dense backend's SDPA is_causal skips the blocks itself"
            ], []
        t = current()
        bq, bkv = self.block_q, self.block_kv
        e = empty_blocks(call, bq, bkv)
        frac, each, calls, skipped = e.every, e.each, e.calls, e.skipped_per_call
        blocks = f"{bq}x{bkv} blocks"
        least, rule = self.min_empty, "blocksparse_min_empty"
        if call.dropout_p > 0 and least > 0:  # explicit tiles: slower per entry than fused
            if t.blocksparse_dropout_min_empty > least:
                least, rule = t.blocksparse_dropout_min_empty, "blocksparse_dropout_min_empty"
            blocks += " with dropout"
        own = self._min_empty is not None and rule == "blocksparse_min_empty"
        cite = f"min_empty = {least:g} (set on this backend)" if own else t.cite(rule)
        if frac >= least:
            return [], [f"{frac:.0%} of {blocks} empty (>= {least:.0%}), by {cite}"]
        if each == 0.0:
            return [f"mask leaves no {bq}x{bkv} block empty"], []
        if each < least:
            return [f"mask leaves only {each:.0%} of {blocks} empty (< {least:.0%}), by {cite}"], []
        entries = t.cite("blocksparse_element_call_entries")
        if skipped >= t.blocksparse_element_call_entries:
            note = f"{calls} per-element query blocks skip {skipped:,.0f} score entries each, by "
            return [], [note + entries]
        return [
            f"mask leaves {each:.0%} of {blocks} empty per batch element but only {frac:.0%} "
            f"in every element (< {least:.0%}); skipping per element means {calls} "
            f"query blocks of {skipped:,.0f} skipped score entries each "
            f"(< {t.blocksparse_element_call_entries:,}): slower than dense, by {entries}"
        ], []

    fallback = "math"

    def decision_reasons(self, call: AttentionCall, decision: NumericsDecision) -> list[str]:
        return [] if decision.fused_backward_ok else fused_backward_reasons(decision)

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, None]:
        if call.grouped and not (
            group_size(call) and (not single_tile(call) or softcap.applies(call, decision.compute))
        ):
            call = ungrouped(call)  # per-head masks, and single tiles, need H heads
        return attend(call, decision, self._block_q, self._block_kv), None
