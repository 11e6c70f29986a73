"""From user arguments to a validated :class:`~attnkit.kernels.call.base.AttentionCall`.

Every check of :mod:`attnkit.functional` lives here, in the order "cheap first": options
(backend name, flags, probabilities), then tensors (type, dtype, device, rank, batch dims,
widths, lengths), then the mask (the only check that may build small tensors). Errors start
with the argument name the caller used.

:func:`dot_call` also remembers the outcome per call signature (see
:mod:`attnkit.kernels.dispatch`): a repeated signature skips the checks and the choice and
only builds the call.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor

from attnkit import checks
from attnkit import tensor_checks as tc
from attnkit.kernels import dispatch
from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall, ungrouped
from attnkit.kernels.dispatch import CACHE, Choice, mask_key
from attnkit.kernels.policy import numerics
from attnkit.kernels.policy.scan import plan3
from attnkit.masks import Mask, from_tensor

__all__ = [
    "additive_call",
    "check_mask",
    "check_qkv",
    "check_softcap_sinks",
    "dot_call",
    "grouped_call",
    "grouped_for",
    "probe",
    "scale_or_default",
    "select_grouped",
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


def _lift(mask: Tensor, batch: tuple[int, ...], q_len: int, kv_len: int) -> Mask:
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
        return _lift(mask, tuple(batch), q_len, kv_len)
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


# ---------------------------------------------------------------------------------------------
# calls: validated (or remembered) -> AttentionCall + backend
# ---------------------------------------------------------------------------------------------
def _signature(tag, q, k, v, mask, scale, dropout_p, return_weights, backend, grad, extra) -> tuple:
    """The key of a call signature: :func:`~attnkit.kernels.dispatch.tensor_key` of q, k and v
    (written out: this runs on every call), the mask's key, the options with their types, the
    requested backend, the grad mode and ``extra`` = (softcap, sinks) (AttributeError /
    TypeError for arguments that are not tensors: the caller then checks them the slow way)."""
    cap, sinks = extra
    sk = None if sinks is None else (type(sinks), *dispatch.tensor_key(sinks))
    return (
        tag,
        type(q), q.shape, q.stride(), q.dtype, q.device, q.requires_grad,
        type(k), k.shape, k.stride(), k.dtype, k.device, k.requires_grad,
        type(v), v.shape, v.stride(), v.dtype, v.device, v.requires_grad,
        mask_key(mask, grad),
        type(scale), scale, type(dropout_p), dropout_p, type(return_weights), return_weights,
        backend,
        grad,
        type(cap), cap, sk,
    )  # fmt: skip


def _remembered(tag, q, k, v, mask, scale, dropout_p, return_weights, backend, extra=(None, None)):
    """(key, remembered choice or None); key None when the signature cannot be remembered."""
    grad = torch.is_grad_enabled()
    try:
        key = _signature(tag, q, k, v, mask, scale, dropout_p, return_weights, backend, grad, extra)
        if key[19] is None:  # a mask that cannot be remembered
            return None, None
        return key, CACHE.get(key, mask)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: check below
        return None, None


def _call(q, k, v, mask, hit: Choice, sinks: Tensor | None = None) -> AttentionCall:
    """The AttentionCall of a remembered signature (the mask tensor lifted as checked before,
    the remembered scan plan in its memo)."""
    if mask is not None and isinstance(mask, Tensor):
        mask = _lift(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2])
    sinks = None if sinks is None else finite_sinks(sinks)
    return AttentionCall.dot(q, k, v, mask, *hit.options, sinks=sinks, scan_plan=hit.scan_plan)


def dot_call(
    q, k, v, mask, scale, dropout_p, return_weights, backend, scaled: bool, softcap=None, sinks=None
):
    """(call, backend) for a dot-product call; a remembered signature skips the checks."""
    tag = "dot" if scaled else "dot-unscaled"
    extra = (softcap, sinks)
    key, hit = _remembered(tag, q, k, v, mask, scale, dropout_p, return_weights, backend, extra)
    if hit is not None:
        return _call(q, k, v, mask, hit, sinks), hit.backend
    backend = dispatch.check_backend_name(backend)
    rw = checks.flag("return_weights", return_weights)
    p = checks.probability("dropout_p", dropout_p)
    q, k, v = check_qkv(q, k, v, same_width=True)
    cap, sinks = check_softcap_sinks(softcap, sinks, q)
    s = scale_or_default(scale, q.shape[-1]) if scaled else 1.0
    m = check_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.device)
    call = AttentionCall(
        kind="dot", q=q, k=k, v=v, mask=m, scale=s, dropout_p=p, return_weights=rw,
        softcap=cap, sinks=sinks,
    )  # fmt: skip
    if rw:
        dispatch.check_weights_limit(math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2])
    b = dispatch.select(call, backend)
    if key is not None:
        CACHE.put(key, b, (s, p, rw, cap), mask, plan3(q, k, v))
    return call, b


# ---------------------------------------------------------------------------------------------
# grouped-query calls: q (..., H, Lq, dk), k and v (..., G, Lk, d), G dividing H
# ---------------------------------------------------------------------------------------------
def select_grouped(
    batch, lq, lk, dk, dv, ref, grad, mask, scale, dropout_p, rw, backend, softcap=None, sinks=None
):
    """The backend for an H-head call (batch = (..., H)), chosen on stand-in tensors with H
    key/value heads, so that the choice is the one of the repeated call and nothing is computed
    before every check has passed."""
    if rw:
        dispatch.check_weights_limit(math.prod(batch), lq, lk)
    qp, kp, vp = (probe(batch + (n, d), ref, grad) for n, d in ((lq, dk), (lk, dk), (lk, dv)))
    call = AttentionCall(
        kind="dot", q=qp, k=kp, v=vp, mask=mask, scale=scale, dropout_p=dropout_p,
        return_weights=rw, softcap=softcap, sinks=sinks,
    )  # fmt: skip
    return dispatch.select(call, backend)


def grouped_for(b: Backend, call: AttentionCall) -> AttentionCall:
    """``call`` as backend ``b`` takes it: grouped k and v as they are when ``b`` declares
    ``supports_gqa`` (no copies), else repeated to q's H heads."""
    return call if b.supports_gqa else ungrouped(call)


def _check_grouped(q, k, v) -> tuple[Tensor, Tensor, Tensor]:
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


def grouped_call(
    q, k, v, mask, scale, dropout_p, return_weights, backend, softcap=None, sinks=None
):
    """(call, backend) for grouped-query attention with G < H key/value heads: the call holds
    k and v with G heads when the backend declares ``supports_gqa``, else repeated to H. The
    choice is the one for the repeated call; a remembered signature skips checks and choice."""
    extra = (softcap, sinks)
    key, hit = _remembered("gqa", q, k, v, mask, scale, dropout_p, return_weights, backend, extra)
    if hit is not None:
        return grouped_for(hit.backend, _call(q, k, v, mask, hit, sinks)), hit.backend
    backend = dispatch.check_backend_name(backend)
    rw = checks.flag("return_weights", return_weights)
    p = checks.probability("dropout_p", dropout_p)
    q, k, v = _check_grouped(q, k, v)
    cap, sinks = check_softcap_sinks(softcap, sinks, q)
    s = scale_or_default(scale, q.shape[-1])
    batch, lq, lk = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2]
    m = check_mask(mask, batch, lq, lk, q.device)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    b = select_grouped(
        batch, lq, lk, q.shape[-1], v.shape[-1], q, grad, m, s, p, rw, backend, cap, sinks
    )
    if key is not None:
        CACHE.put(key, b, (s, p, rw, cap), mask, plan3(q, k, v))
    call = AttentionCall(
        kind="dot", q=q, k=k, v=v, mask=m, scale=s, dropout_p=p, return_weights=rw,
        softcap=cap, sinks=sinks,
    )  # fmt: skip
    return grouped_for(b, call), b


def additive_call(q, k, v, w_q, w_k, w_v, mask, return_weights, backend):
    backend = dispatch.check_backend_name(backend)
    rw = checks.flag("return_weights", return_weights)
    q, k, v = check_qkv(q, k, v, same_width=False)
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
    m = check_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.device)
    call = AttentionCall(
        kind="additive", q=q, k=k, v=v, mask=m, return_weights=rw, w_q=w_q, w_k=w_k, w_v=w_v
    )
    if rw:
        dispatch.check_weights_limit(math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2])
    return call, backend


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
