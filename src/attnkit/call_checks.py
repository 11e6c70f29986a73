"""The checks of an attention call's arguments, for :func:`attnkit.calls.parse` (the one caller).

Every check raises before any work, with an error that starts with the argument name the
caller used (TypeError for a wrong type, ValueError for a wrong value). Cheap checks first:
options (flags, probabilities), then tensors (type, dtype, device, rank, batch dims, widths,
lengths), then the mask (the only check that may build small tensors).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch
from torch import Tensor

from attnkit import checks
from attnkit import tensor_checks as tc
from attnkit.kernels.policy import numerics
from attnkit.masks import Mask, from_tensor

__all__ = [
    "Projections",
    "bias",
    "check_additive_weights",
    "check_general_weight",
    "check_grouped",
    "check_mask",
    "check_projections",
    "check_qkv",
    "check_softcap_sinks",
    "finite_sinks",
    "lift_mask",
    "probe",
    "scale_or_default",
    "weight",
]


def check_qkv(q: object, k: object, v: object, same_width: bool) -> tuple[Tensor, Tensor, Tensor]:
    """q (..., Lq, dk), k (..., Lk, dk or any width), v (..., Lk, dv): floating tensors of one
    dtype and device, identical batch dims, non-empty; errors name q, k or v."""
    q, k, v = tc.floating_tensor("q", q), tc.floating_tensor("k", k), tc.floating_tensor("v", v)
    tc.like("k", k, q, "q")
    tc.like("v", v, q, "q")
    if q.dim() < 2:
        raise ValueError(
            f"q: expected shape (..., Lq, d_k) with at least 2 dims, got {tuple(q.shape)}"
        )
    for name, t, what in (("k", k, "(..., Lk, d_k)"), ("v", v, "(..., Lk, d_v)")):
        if t.dim() != q.dim():
            raise ValueError(
                f"{name}: expected {q.dim()} dims {what} like q {tuple(q.shape)}, "
                f"got {tuple(t.shape)}"
            )
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name}: batch dims {tuple(t.shape[:-2])} do not match q's {tuple(q.shape[:-2])} "
                "(attnkit does not broadcast batch dims; expand them explicitly)"
            )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if 0 in t.shape:
            raise ValueError(f"{name}: expected non-empty dims, got shape {tuple(t.shape)}")
    if same_width and k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected last dim d_k = {q.shape[-1]} like q, got shape {tuple(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v: expected Lk = {k.shape[-2]} rows like k, got shape {tuple(v.shape)}")
    return q, k, v


def lift_mask(mask: Tensor, batch: tuple[int, ...], q_len: int, kv_len: int) -> Mask:
    """A (checked) mask tensor right-aligned against batch + (Lq, Lk), as a mask object."""
    full = mask.reshape((1,) * (len(batch) + 2 - mask.dim()) + tuple(mask.shape))
    return from_tensor(full.expand(full.shape[:-2] + (q_len, kv_len)))


def check_mask(
    mask: object,
    batch: tuple[int, ...],
    q_len: int,
    kv_len: int,
    device: torch.device | None = None,
    name: str = "mask",
) -> Mask | None:
    """The mask argument ``name`` checked against scores of shape batch + (Lq, Lk), as a mask
    object whose batch_shape lines up with ``batch`` (or None).

    A tensor must be bool or floating, on ``device`` (when given) and broadcastable with
    torch's right-aligned rules; a mask object's batch_shape must line up with the leading
    ``batch`` dims and it must accept the lengths. Errors start with ``name``."""
    if mask is None:
        return None
    if not isinstance(batch, (tuple, list, torch.Size)):
        raise TypeError(f"batch: expected a tuple of batch dims, got {type(batch).__name__}")
    target = tuple(batch) + (q_len, kv_len)
    if isinstance(mask, Tensor):
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"{name}: expected a bool or floating tensor, got dtype {mask.dtype}")
        if device is not None and mask.device != device:
            raise ValueError(f"{name}: expected device {device} like q, got {mask.device}")
        if (
            mask.dim() < 2
            or mask.dim() > len(target)
            or any(m not in (1, t) for m, t in zip(mask.shape[::-1], target[::-1]))
        ):
            raise ValueError(
                f"{name}: expected a shape broadcastable to (..., Lq, Lk) = {target}, "
                f"got {tuple(mask.shape)}"
            )
        return lift_mask(mask, tuple(batch), q_len, kv_len)
    if not isinstance(mask, Mask):
        raise TypeError(
            f"{name}: expected a Mask object, a bool/float torch.Tensor or None, "
            f"got {type(mask).__name__}"
        )
    mb = mask.batch_shape
    if len(mb) > len(batch) or any(m not in (1, b) for m, b in zip(mb, batch)):
        raise ValueError(
            f"{name}: its batch shape {mb} does not line up with the leading batch dims "
            f"{tuple(batch)} of the scores {target}"
        )
    try:
        mask.tile(0, 1, 0, 1, q_len, kv_len)  # lets the mask check its own lengths now
    except ValueError as e:
        raise ValueError(f"{name}: " + re.sub(r"^mask( \(t\))?: ", "", str(e))) from None
    return mask


def check_softcap_sinks(
    softcap: object, sinks: object, q: Tensor
) -> tuple[float | None, Tensor | None]:
    """(softcap, sinks) checked against q (..., H, Lq, dk): ``softcap`` None or a positive
    finite number; ``sinks`` None or a floating tensor of shape (H,) with q's dtype and device
    (one logit per query head, so q needs a head dim)."""
    cap = None if softcap is None else checks.positive_float("softcap", softcap)
    if sinks is None:
        return cap, None
    sinks = tc.floating_tensor("sinks", sinks)
    tc.like("sinks", sinks, q, "q")
    if q.dim() < 3:
        raise ValueError(
            f"sinks: one logit per query head needs q with a head dim (..., H, Lq, d_k), "
            f"got q of shape {tuple(q.shape)}"
        )
    if sinks.shape != (q.shape[-3],):
        raise ValueError(
            f"sinks: expected shape (H,) = ({q.shape[-3]},) (H from q {tuple(q.shape)}), "
            f"got {tuple(sinks.shape)}"
        )
    return cap, finite_sinks(sinks)


def finite_sinks(sinks: Tensor) -> Tensor:
    """``sinks`` (H,) when every logit is finite; ValueError naming ``sinks`` otherwise (a NaN
    sink would make its head's output NaN, as :mod:`attnkit.reference` refuses it too). Checked
    on every call, remembered signatures included: the values change between calls; not on the
    policy's device path (:func:`attnkit.kernels.policy.numerics.device_path`), where reading the
    check back would be a host sync and a non-finite sink shows as NaN rows instead."""
    if numerics.device_path(sinks.device):
        return sinks
    if not bool(torch.isfinite(sinks).all()):
        raise ValueError(f"sinks: expected finite logits, got {checks.show(sinks.detach())}")
    return sinks


def scale_or_default(scale: object, d_k: int) -> float:
    """``scale`` checked (any finite number: negative and 0 are accepted, as by torch's SDPA),
    or 1/sqrt(d_k) when None."""
    return 1.0 / math.sqrt(d_k) if scale is None else checks.finite_float("scale", scale)


def check_grouped(q, k, v) -> tuple[Tensor, Tensor, Tensor]:
    """q (..., H, Lq, dk), k (..., G, Lk, dk), v (..., G, Lk, dv), G dividing H."""
    q, k, v = (tc.floating_tensor(n, t) for n, t in (("q", q), ("k", k), ("v", v)))
    if q.dim() < 3:
        raise ValueError(f"q: expected shape (..., H, Lq, d_k), got {tuple(q.shape)}")
    for n, t in (("k", k), ("v", v)):
        tc.like(n, t, q, "q")
        if t.dim() != q.dim() or t.shape[:-3] != q.shape[:-3]:
            raise ValueError(
                f"{n}: expected shape (..., G, Lk, d) with the batch dims of q "
                f"{tuple(q.shape)}, got {tuple(t.shape)}"
            )
    h, g = q.shape[-3], k.shape[-3]
    if h % g:
        raise ValueError(f"k: expected G heads dividing q's H = {h}, got shape {tuple(k.shape)}")
    if v.shape[-3] != g:
        raise ValueError(f"v: expected G = {g} heads like k, got shape {tuple(v.shape)}")
    for n, t in (("q", q), ("k", k), ("v", v)):
        if 0 in t.shape:
            raise ValueError(f"{n}: expected non-empty dims, got shape {tuple(t.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected last dim d_k = {q.shape[-1]} like q, got shape {tuple(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v: expected Lk = {k.shape[-2]} rows like k, got shape {tuple(v.shape)}")
    return q, k, v


def weight(name: str, w: object, rows: int | None, cols: int, what: str, ref: Tensor) -> Tensor:
    """A 2-D weight (rows, cols) in nn.Linear layout; rows=None: any positive count."""
    w = tc.floating_tensor(name, w)
    tc.like(name, w, ref, "query")
    if w.dim() != 2 or w.shape[1] != cols or (rows is not None and w.shape[0] != rows):
        want = f"({rows if rows is not None else 'out'}, {cols})"
        raise ValueError(f"{name}: expected shape {what} = {want}, got {tuple(w.shape)}")
    return w


def bias(name: str, b: object, n: int, ref: Tensor) -> Tensor | None:
    if b is None:
        return None
    b = tc.floating_tensor(name, b)
    tc.like(name, b, ref, "query")
    if b.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},), got {tuple(b.shape)}")
    return b


def probe(shape: tuple[int, ...], ref: Tensor, grad: bool) -> Tensor:
    """A stand-in tensor with a call's shape, dtype, device and grad flag (no memory)."""
    return torch.empty((), dtype=ref.dtype, device=ref.device, requires_grad=grad).expand(shape)


def check_general_weight(w: object, q: Tensor, k: Tensor) -> Tensor:
    """Luong's general attention weight w (dq, dk), with q's dtype and device."""
    w = tc.floating_tensor("w", w)
    tc.like("w", w, q, "q")
    if w.shape != (q.shape[-1], k.shape[-1]):
        raise ValueError(
            f"w: expected shape (d_q, d_k) = ({q.shape[-1]}, {k.shape[-1]}), got {tuple(w.shape)}"
        )
    return w


def check_additive_weights(w_q: object, w_k: object, w_v: object, q: Tensor, k: Tensor) -> tuple:
    """(w_q (h, dq), w_k (h, dk), w_v (h,)) of additive attention, with q's dtype and device."""
    w_q, w_k, w_v = (
        tc.floating_tensor(n, t) for n, t in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v))
    )
    for name, t in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        tc.like(name, t, q, "q")
    if w_v.dim() != 1 or w_v.shape[0] == 0:
        raise ValueError(f"w_v: expected shape (h,) with h >= 1, got {tuple(w_v.shape)}")
    h = w_v.shape[0]
    for name, w, d, what in (("w_q", w_q, q.shape[-1], "d_q"), ("w_k", w_k, k.shape[-1], "d_k")):
        if w.shape != (h, d):
            raise ValueError(
                f"{name}: expected shape (h, {what}) = ({h}, {d}) (h from w_v), "
                f"got {tuple(w.shape)}"
            )
    return w_q, w_k, w_v


class Projections(NamedTuple):
    """Multi-head attention's checked inputs and projections (``torch.nn.Linear`` layout):
    H query heads over G key/value heads of widths dk, dv."""

    query: Tensor
    key: Tensor
    value: Tensor
    heads: int
    kv_heads: int
    dk: int
    dv: int
    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    b_q: Tensor | None
    b_k: Tensor | None
    b_v: Tensor | None


def check_projections(
    query: object, key: object, value: object, num_heads: object, num_kv_heads: object,
    w_q: object, w_k: object, w_v: object, w_o: object, b_q: object, b_k: object, b_v: object,
    b_o: object,
) -> Projections:  # fmt: skip
    """query (B, Lq, E), key (B, Lk, E_k), value (B, Lk, E_v); H = ``num_heads`` and G =
    ``num_kv_heads`` (None: H) dividing it; w_q (H*dk, E), w_k (G*dk, E_k), w_v (G*dv, E_v),
    w_o (E_out, H*dv) and the biases (out,), all with query's dtype and device."""
    query, key, value = (
        tc.floating_tensor(n, t) for n, t in (("query", query), ("key", key), ("value", value))
    )
    for n, t, what in (("query", query, "Lq"), ("key", key, "Lk"), ("value", value, "Lk")):
        tc.like(n, t, query, "query")
        if t.dim() != 3 or 0 in t.shape:
            raise ValueError(f"{n}: expected a non-empty (B, {what}, E), got {tuple(t.shape)}")
    bsz, lk = query.shape[0], key.shape[1]
    for n, t in (("key", key), ("value", value)):
        if t.shape[0] != bsz or t.shape[1] != lk:
            raise ValueError(
                f"{n}: expected (B, Lk, .) with B = {bsz} like query and Lk = {lk} like key, "
                f"got {tuple(t.shape)}"
            )
    h = checks.positive_int("num_heads", num_heads)
    g = h if num_kv_heads is None else checks.positive_int("num_kv_heads", num_kv_heads)
    if h % g:
        raise ValueError(f"num_kv_heads: expected a divisor of num_heads={h}, got {g}")
    w_q = weight("w_q", w_q, None, query.shape[2], "(num_heads*d_k, E)", query)
    dk = _per_head("w_q", w_q, "num_heads", h, "d_k")
    what = f"(num_kv_heads*d_k, E_k) with num_kv_heads={g}, d_k={dk} (from w_q)"
    w_k = weight("w_k", w_k, g * dk, key.shape[2], what, query)
    w_v = weight("w_v", w_v, None, value.shape[2], "(num_kv_heads*d_v, E_v)", query)
    dv = _per_head("w_v", w_v, "num_kv_heads", g, "d_v")
    w_o = weight("w_o", w_o, None, h * dv, "(E_out, num_heads*d_v)", query)
    b_q, b_k = bias("b_q", b_q, h * dk, query), bias("b_k", b_k, g * dk, query)
    b_v = bias("b_v", b_v, g * dv, query)
    bias("b_o", b_o, w_o.shape[0], query)
    return Projections(query, key, value, h, g, dk, dv, w_q, w_k, w_v, b_q, b_k, b_v)


def _per_head(name: str, w: Tensor, heads_name: str, heads: int, width: str) -> int:
    """The rows per head of the projection ``w`` (heads * width rows), else ValueError."""
    if w.shape[0] % heads:
        raise ValueError(
            f"{name}: expected {heads_name}*{width} rows, a multiple of {heads_name}={heads}, "
            f"got shape {tuple(w.shape)}"
        )
    return w.shape[0] // heads
