"""The ``flex`` backend: structured masks on CUDA on torch's compiled FlexAttention, its
BlockMask built from attnkit's exact block maps (:mod:`attnkit.kernels.flex`).

``backend="auto"`` chooses it only for CUDA calls with a mask (no mask and the plain top-left
causal mask stay on SDPA's fused kernels, ``dense``); ``backend="flex"`` also runs on a CPU,
forward only there (torch's Flex refuses a CPU backward), eagerly by default (Flex's eager
implementation materialises the scores: for tests and small sizes) or compiled.

The plan (modifiers and BlockMask) is kept in the mask's plan cache and in the call's memo
(:class:`FlexMemoKey`); the compiled kernel is one ``torch.compile(flex_attention)`` per
process. A call's first run of a new kernel family compiles it: ``explain_dispatch`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.kernels.call.backend import Backend, fused_backward_reasons
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.call.memo import MemoKey
from attnkit.kernels.dense import sdpa_causal
from attnkit.kernels.flex.block_mask import BLOCK_SIZE
from attnkit.kernels.flex.engine import (
    FamilyKey,
    FlexPlan,
    FlexPlanKey,
    attend,
    first_call,
    plan_for,
)
from attnkit.kernels.flex.mods import supported_mask
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.masks import TensorMask

__all__ = ["FLEX_HEAD_DIMS", "FLEX_TENSOR_MASK_LIMIT", "FlexBackend", "FlexMemoKey"]

FLEX_HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head dims (dk and dv) the compiled CUDA kernel is used with."""

FLEX_TENSOR_MASK_LIMIT = 2**31 - 1
"""Most entries of a tensor mask the compiled kernel reads (int32 offsets)."""


@dataclass(frozen=True)
class FlexMemoKey(MemoKey[FlexPlan]):
    """The call's Flex plan in its memo (block size and whether it runs compiled)."""

    block_size: int


class FlexBackend(Backend):
    """FlexAttention (``torch.nn.attention.flex_attention``) with attnkit's block maps.

    ``compiled``: None = compiled on CUDA, eager on CPU; True / False force it (tests)."""

    name = "flex"
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    devices = ("cuda", "cpu")
    supports_bias = True
    supports_gqa = True
    supports_softcap = True
    supports_sinks = True
    fallback = "math"

    def __init__(self, compiled: bool | None = None, block_size: int = BLOCK_SIZE) -> None:
        self.compiled = compiled
        self.block_size = block_size

    def is_compiled(self, call: AttentionCall) -> bool:
        """Whether ``call`` runs on the compiled kernel."""
        return call.q.device.type == "cuda" if self.compiled is None else self.compiled

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        r = []
        nb = len(call.batch_shape)
        why = supported_mask(call.mask, nb)
        if why:
            r.append(why)
        if call.sinks is not None and nb == 0:
            r.append("sinks need a heads dim (q (..., H, Lq, d))")
        if call.q.device.type == "cpu" and call.needs_grad:
            r.append("no backward on CPU (torch's FlexAttention refuses it)")
        if call.bias_needs_grad:
            r.append("no gradient for a learned score bias")
        if self.is_compiled(call) and call.q.device.type == "cuda":
            dims = {call.q.shape[-1], call.v.shape[-1]}
            if not dims <= set(FLEX_HEAD_DIMS):
                r.append(f"head dims {sorted(dims)} not in {FLEX_HEAD_DIMS} (compiled kernel)")
        big = [
            leaf
            for leaf in (call.mask.leaves() if call.mask is not None else ())
            if isinstance(leaf, TensorMask) and leaf.t.numel() > FLEX_TENSOR_MASK_LIMIT
        ]
        if big:
            r.append(f"a tensor mask of more than {FLEX_TENSOR_MASK_LIMIT:,} entries")
        return r

    def speed_reasons(self, call: AttentionCall) -> list[str]:
        if call.q.device.type != "cuda":
            return ["on a CPU the CPU backends are faster (force with backend='flex')"]
        if call.mask is None or sdpa_causal(call) is not None:
            return [
                "no mask, or a causal mask SDPA takes without materialising it (top-left; "
                "bottom-right with Lq <= Lk: cached decoding, chunked prefill): SDPA's fused "
                "kernels are faster"
            ]
        return []

    def family(self, call: AttentionCall) -> FamilyKey:
        """The compiled-kernel family of ``call`` (see :func:`~.engine.first_call`)."""
        mask = call.mask
        return FamilyKey(
            call.q.device.type, call.dtype, (call.q.shape[-1], call.v.shape[-1]), call.grouped,
            mask is not None, mask is not None and mask.has_bias, call.softcap is not None,
            call.sinks is not None, call.needs_grad,
        )  # fmt: skip

    def choice_notes(self, call: AttentionCall) -> list[str]:
        if self.is_compiled(call) and first_call(self.family(call)):
            return [
                "first call of this kind compiles a FlexAttention kernel (seconds, once per "
                "process and shape family; later calls reuse it)"
            ]
        return []

    def plan(self, call: AttentionCall) -> FlexPlan:
        """The call's Flex plan (memo, then the mask's plan cache)."""
        key = FlexPlanKey(
            call.q_len, call.kv_len, len(call.batch_shape), call.q.device, self.block_size,
            call.softcap,
        )  # fmt: skip
        return call.memo.get(FlexMemoKey(self.block_size), lambda: plan_for(call.mask, key))

    def decision_reasons(self, call: AttentionCall, decision: NumericsDecision) -> list[str]:
        """Flex computes in the inputs' dtype with a fused, recomputing backward: a decision
        for float64 (scores that would overflow float32) or for an explicit softmax's backward
        goes to the fallback (``math``)."""
        if decision.compute not in self.dtypes:
            return [f"the policy computes this call in {decision.compute}: Flex has no float64"]
        return fused_backward_reasons(decision)

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, None]:
        compiled = self.is_compiled(call)
        family = self.family(call) if compiled else None
        # float16/bfloat16 run as they are: Flex accumulates them in float32 itself (the P4
        # compute dtype); a float64 decision never reaches here (decision_reasons)
        out = attend(
            call.q, call.k, call.v, self.plan(call), call.scale, call.sinks, compiled, family
        )
        return out, None
