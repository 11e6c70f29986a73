"""The call record: what every backend sees of one attention call.

A call reaches a backend as one :class:`AttentionCall` (validated, normalised inputs, and the
call's :class:`~attnkit.kernels.call.memo.CallMemo`); the helpers every path shares: grouped
k/v heads repeated (:func:`repeat_heads`, :func:`ungrouped`) and a mask materialised for the
call (:func:`materialize_for`). What a backend declares and how dispatch drives it is
:mod:`attnkit.kernels.call.backend`. The record sits below the policy and the backends: it
imports masks and the call's own values, nothing else of ``kernels``.

Shape legend: ``...`` batch dims (identical for q, k, v), ``Lq``/``Lk`` query/key lengths,
``dk`` query/key width, ``dv`` value width, ``h`` hidden width of additive attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import Tensor

from attnkit.kernels.call.memo import BlockMapKey, CallMemo, DenseMaskKey
from attnkit.masks import Intersection, Mask, TensorMask
from attnkit.masks.blocks import saturate

ScoreKind = Literal["dot", "additive"]


@dataclass(frozen=True)
class AttentionCall:
    """One validated attention call.

    q: (..., Lq, dk), k: (..., Lk, dk), v: (..., Lk, dv). A *grouped* call (grouped-query
    attention, only for backends that declare ``supports_gqa``) has q (..., H, Lq, dk) and
    k, v (..., G, Lk, d) with G dividing H: query head h reads key/value head h // (H / G).
    For ``kind="additive"``: ``w_q`` (h, dk_q), ``w_k`` (h, dk), ``w_v`` (h,) and ``scale`` 1.
    ``mask`` is a mask object whose batch_shape lines up with the leading dims of ``q`` (see
    :mod:`attnkit.masks`) or None.

    ``softcap`` c > 0 (or None): the scaled scores become c * tanh(s / c) before the mask and
    bias are applied (Gemma 2). ``sinks`` (H,) (or None, dot calls with q (..., H, Lq, dk)):
    one logit per query head that joins every row's softmax denominator and is then dropped
    (gpt-oss): w_ij = exp(s_ij) / (exp(sink_h) + sum_l exp(s_il)); a row with no allowed key
    gives 0.

    ``memo`` (not an argument): what the stages of this call computed for later ones
    (:class:`~attnkit.kernels.call.memo.CallMemo`: the scan plan, the numerics decision, dense
    masks, block maps, backend plans); each call object has its own, ``replace()`` included.
    """

    kind: ScoreKind
    q: Tensor
    k: Tensor
    v: Tensor
    mask: Mask | None = None
    scale: float = 1.0
    dropout_p: float = 0.0
    return_weights: bool = False
    w_q: Tensor | None = None
    w_k: Tensor | None = None
    w_v: Tensor | None = None
    softcap: float | None = None
    sinks: Tensor | None = None
    memo: CallMemo = field(default_factory=CallMemo, init=False, compare=False, repr=False)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape[:-2])

    @property
    def q_len(self) -> int:
        return self.q.shape[-2]

    @property
    def kv_len(self) -> int:
        return self.k.shape[-2]

    @property
    def grouped(self) -> bool:
        """True when k and v have fewer heads (dim -3) than q (grouped-query attention)."""
        return self.k.shape[:-2] != self.q.shape[:-2]

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def needs_grad(self) -> bool:
        """True when autograd will need a backward: an input or a mask tensor requires grad."""
        ts = (self.q, self.k, self.v, self.w_q, self.w_k, self.w_v, self.sinks)
        return torch.is_grad_enabled() and (
            any(t is not None and t.requires_grad for t in ts) or self.bias_needs_grad
        )

    @property
    def bias_needs_grad(self) -> bool:
        """True when a float mask tensor of the call's mask requires grad (a learned bias)."""
        mask = self.mask
        return (
            torch.is_grad_enabled()
            and mask is not None
            and any(t.requires_grad for t in mask.bias_tensors())
        )

    def tensors(self) -> list[Tensor]:
        ts = (self.q, self.k, self.v, self.w_q, self.w_k, self.w_v)
        return [t for t in ts if t is not None]

    def dense_mask(self, dtype: torch.dtype | None = None) -> tuple[Tensor | None, Tensor | None]:
        """(allowed, bias): the mask materialised and reshaped to broadcast against
        (..., Lq, Lk): bool and float (or None), the bias in ``dtype`` (default: the call's),
        saturated (policy P5). Kept in the call's memo."""
        dtype = dtype or self.dtype
        if self.mask is None:
            return None, None
        return self.memo.get(DenseMaskKey(dtype), lambda: materialize_for(self.mask, self, dtype))

    def block_map(self, block_q: int, block_kv: int) -> Tensor | None:
        """Block classes (int8, batch_shape of the mask + (nq, nk)), kept in the call's memo per
        block size."""
        mask = self.mask
        if mask is None:
            return None
        return self.memo.get(
            BlockMapKey(block_q, block_kv),
            lambda: mask.block_map(self.q_len, self.kv_len, block_q, block_kv),
        )


def repeat_heads(x: Tensor, n: int) -> Tensor:
    """(..., G, L, d) -> (..., n, L, d) with head h a copy of head h // (n / G) (unchecked: G
    divides n); ``x`` itself when G = n. As ``x.repeat_interleave(n // G, dim=-3)``."""
    g = x.shape[-3]
    if g == n:
        return x
    lead, (length, d) = tuple(x.shape[:-3]), x.shape[-2:]
    return x.unsqueeze(-3).expand(lead + (g, n // g, length, d)).reshape(lead + (n, length, d))


def ungrouped(call: AttentionCall) -> AttentionCall:
    """``call`` with k and v repeated to q's H heads (:func:`repeat_heads`), for a backend or
    path that needs them; ``call`` itself when it is not grouped."""
    if not call.grouped:
        return call
    h = call.q.shape[-3]
    k, v = repeat_heads(call.k, h), repeat_heads(call.v, h)
    return replace(call, k=k, v=v)


def lift_mask_tensor(t: Tensor, mask_batch_ndim: int, batch_ndim: int) -> Tensor:
    """Reshape a mask tensor ``mask_batch_shape + (Lq, Lk)`` so that its batch dims line up with
    the leading dims of a ``batch_ndim``-dimensional batch (singletons appended)."""
    extra = batch_ndim - mask_batch_ndim
    return t.reshape(t.shape[:mask_batch_ndim] + (1,) * extra + t.shape[-2:])


def materialize_for(
    mask: Mask, call: AttentionCall, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor | None]:
    """Materialise ``mask`` for ``call`` as tensors broadcastable to (..., Lq, Lk); the bias in
    ``dtype`` (default: the call's), saturated at +-finfo.max (policy P5). A tensor mask is
    used where it lives (on the call's device), never copied through the host."""
    nb, mb = len(call.batch_shape), len(mask.batch_shape)
    if type(mask) is TensorMask and mask.t.device == call.q.device:
        t = mask.t
        if t.dtype == torch.bool:
            return lift_mask_tensor(t, mb, nb), None
        allowed = lift_mask_tensor(t != -math.inf, mb, nb)
        bias = saturate(torch.where(allowed, lift_mask_tensor(t, mb, nb), 0), dtype or call.dtype)
        return allowed, bias
    if type(mask) is Intersection and any(type(p) is TensorMask for p in mask.leaves()):
        (a, ba), (b, bb) = (materialize_for(p, call, dtype) for p in mask.parts)
        biases = [x for x in (ba, bb) if x is not None]
        if len(biases) == 2:  # biases add up; a sum beyond the dtype saturates (P5)
            big = torch.finfo(biases[0].dtype).max
            biases = [(biases[0] + biases[1]).clamp(-big, big)]
        return a & b, (biases[0] if biases else None)
    allowed = mask.materialize(call.q_len, call.kv_len).to(call.q.device)
    allowed = lift_mask_tensor(allowed, mb, nb)
    bias = mask.materialize_bias(call.q_len, call.kv_len, dtype or call.dtype)
    if bias is not None:
        bias = lift_mask_tensor(bias.to(call.q.device), mb, nb)
    return allowed, bias
