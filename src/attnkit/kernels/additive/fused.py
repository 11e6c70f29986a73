"""The ``additive_fused`` backend: what it serves, and how a call reaches the kernels.

Additive (Bahdanau) attention e_ij = w_v . tanh(qp_i + kp_j) with qp = q W_qᵀ, kp = k W_kᵀ
(computed by torch, so autograd gives the W_q / W_k / q / k gradients); P = softmax_j(e) over
the allowed keys; out = P v; in fused numba kernels with O(L*h) memory (:mod:`.autograd`).

It serves float32 calls on CPU without a score bias (biased masks, learned biases included, go
to ``math``, which computes their gradient), weights or dropout. The NaN/inf/overflow policy is
:mod:`.policy`, run by dispatch: calls whose values could overflow float32 are handed to the
``math`` backend in float64 (:meth:`AdditiveFusedBackend.decision_reasons`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.kernels.additive.autograd import AdditiveFunction
from attnkit.kernels.additive.tiles import mask_tiles
from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.math import plain_attention
from attnkit.kernels.numba.runtime import numba_missing
from attnkit.kernels.policy.additive import run_additive
from attnkit.kernels.policy.decision import NumericsDecision


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
    fallback = "math"

    def available(self) -> str | None:
        return numba_missing()

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.dtype == torch.float64:
            return ["float64 runs on the reference-precision path (math); this kernel is float32"]
        return []

    def decision_reasons(self, call: AttentionCall, decision: NumericsDecision) -> list[str]:
        if decision.compute == torch.float32:
            return []
        return [f"the policy computes this call in {decision.compute} (P5); this kernel is float32"]

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, Tensor | None]:
        return _impl(call, decision)


def additive_fused(call: AttentionCall) -> Tensor:
    """Run an additive call: output (..., Lq, dv), differentiable w.r.t. q, k, v, w_q, w_k, w_v,
    under the NaN/inf/overflow policy of :mod:`.policy` (float64 calls on torch's arithmetic)."""
    return run_additive(call, _impl)[0]


def _impl(call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, None]:
    """The fused kernels in float32 (torch's arithmetic of ``math`` when P5 asks for float64)."""
    if decision.compute != torch.float32:
        return plain_attention(call, decision.compute)[0], None
    batch, lq, lk = call.batch_shape, call.q_len, call.kv_len
    h = call.w_v.shape[0]
    qp = (call.q @ call.w_q.transpose(0, 1)).reshape(-1, lq, h)  # (BH, Lq, h)
    kp = (call.k @ call.w_k.transpose(0, 1)).reshape(-1, lk, h)  # (BH, Lk, h)
    v = call.v.reshape(-1, lk, call.v.shape[-1])  # (BH, Lk, dv)
    out = AdditiveFunction.apply(qp, kp, v, call.w_v, mask_tiles(call))
    return out.reshape(batch + (lq, out.shape[-1])), None
