"""One NaN/inf/overflow policy for the dot-product backends (``dense``, ``math``, ``blocksparse``).

P1 a row with no allowed key gives output 0 (and gradient 0).
P2 only the mask's allowed set masks: every finite bias value is a real bias, never a sentinel.
P3 finite inputs give the float64 result within the dtype's tolerance (softmax subtracts the
   row max).
P4 float16/bfloat16 compute scores, softmax and accumulation in float32 and round once.
P5 when ``max|q| * max|k| * d * scale + max|bias| >= finfo(compute).max / 16`` the call is
   computed in float64 and rounded, and so is a call that needs gradients when that bound times
   finfo(compute).eps reaches 2**-10; a bias cast to the compute dtype saturates at
   +-finfo.max (never -inf, which would mean "not allowed": ``Mask.bias_tile(..., dtype)``).
   With ``softcap`` c, q.k is still computed before the cap (the overflow bound on it stays),
   but the softmax sees c * tanh(s / c) + bias, within c + max|bias|: the softmax's overflow
   and the fused backward's "scores too large" checks use that bound (:func:`softmax_bound`).
   Finite float64 inputs whose scores could leave float64's range (the tight bound reaches
   finfo(float64).max) are refused with a ValueError naming q, k: float64 is the widest dtype.
P6 NaN or +-inf in q, k or v at a position a row attends to makes that whole output row NaN;
   a float mask (bias) holding NaN or +inf is refused with a ValueError naming ``mask`` (the
   input scan sees it at no extra cost; -inf is "not allowed", P2). The kernels never see
   non-finite keys or values: :func:`prepare` replaces them by 0 before computing and :func:`finish`
   sets the affected rows to NaN, so rows that do not attend to them are exact. Gradients of
   calls with non-finite inputs are unspecified.

(The same rules in words: the docs site's guide "Conventions and the numerics policy",
``docs/guides/conventions.md``.)

:func:`decision` is the one place the policy is decided for a call: :func:`input_scan` reads
max|q|, max|k| and the finiteness of q, k and v in one exact pass per tensor
(:mod:`attnkit.kernels.policy.scan`), then :func:`decide` applies the cheap P5 bound and, only when
it cannot settle the call, the tight one. The policy is one stage of dispatch
(:func:`attnkit.kernels.dispatch.run`), run once per call: :func:`prepare` decides and hands the
backend the call (non-finite q, k, v replaced by 0) with its
:class:`~attnkit.kernels.policy.decision.NumericsDecision`; :func:`finish` rounds the result to the
call's dtype and sets the rows P6 names to NaN. Backends never call the policy themselves.

The device path (:func:`device_path`; CUDA and every device but the CPU) decides without
reading a value back to the host (no ``.item()``, ``.tolist()``, ``bool(tensor)``): the compute
dtype from the call's dtype (P4), no scan, no float64 fallback; P1 is kept by the backends with
device-side selects, and :func:`finish` sets every output row that is not finite to NaN (an
overflow or a NaN/inf input then shows as NaN rows, never as a finite wrong value). What this
changes against the host path is written in the conventions guide; :func:`use_path` forces
either path (``"host"``: the exact scanning policy on a GPU, at the cost of host syncs;
``"device"``: the device path on the CPU, for tests).

Shape legend: ``...`` batch dims of q, ``Lq``/``Lk`` query/key lengths, ``d`` widths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import Tensor

from attnkit.kernels.call.base import AttentionCall, ungrouped
from attnkit.kernels.policy import kv_bounds
from attnkit.kernels.policy.decision import DECISION, NumericsDecision
from attnkit.kernels.policy.mask_bias import bias_bound, nonfinite_bias, refuse_nonfinite_bias
from attnkit.kernels.policy.precision import Float64Reason, dot_reason, warn_float64
from attnkit.kernels.policy.scan import absmax, absmax3

HALF = (torch.float16, torch.bfloat16)

OVERFLOW_MARGIN = 16.0
"""P5: a call whose score bound reaches finfo(compute).max / OVERFLOW_MARGIN runs in float64."""

GRAD_SCORE_ERROR = 2.0**-10
"""P5 for gradients: a call that needs a backward runs in float64 when the score bound times
eps(compute) reaches this. The fused backward recomputes exp(s - logsumexp) from scores it
computes again; at |s| * eps near 1 that recomputation is off by factors of e (inf at worst)."""

_ROW_CHUNK = 2**22
"""Most mask entries evaluated at once when finding the rows that attend to non-finite values."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """P4: the dtype scores, softmax and accumulation use for inputs of ``dtype``."""
    return torch.float32 if dtype in HALF else dtype


# ---------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------
@functools.cache
def _limits(dtype: torch.dtype) -> tuple[float, float]:
    """(finfo.max / OVERFLOW_MARGIN, GRAD_SCORE_ERROR / finfo.eps) of a compute dtype: the
    score bounds of P5 (overflow; exact fused backward)."""
    fi = torch.finfo(dtype)
    return fi.max / OVERFLOW_MARGIN, GRAD_SCORE_ERROR / fi.eps


def softmax_bound(call: AttentionCall, qk: float, bias: float) -> float:
    """A bound of the scores the softmax sees, from a bound ``qk`` of |q.k| * scale and one of
    |bias|: qk + bias, or at most softcap + bias when the call caps its scores."""
    cap = getattr(call, "softcap", None)
    return (qk if cap is None else min(qk, cap)) + bias


def _needs_float64(call: AttentionCall, bound: float, dtype: torch.dtype, qk: float = 0) -> bool:
    """P5: scores bounded by ``bound`` (q.k by ``qk``) could overflow ``dtype``, or are too
    large for an exact fused backward."""
    fi = torch.finfo(dtype)
    if not max(bound, qk) < fi.max / OVERFLOW_MARGIN:
        return True
    return not bound * fi.eps < GRAD_SCORE_ERROR and call.needs_grad


def _row_norm_bound(call: AttentionCall) -> float:
    """max_i |q_i| * max_j |k_j| * scale (row 2-norms in float64): a bound of |q_i . k_j| * scale
    up to d times tighter than max|q| * max|k| * d * scale."""
    qn, kn = (
        torch.linalg.vector_norm(t.detach().double(), dim=-1).amax() for t in (call.q, call.k)
    )
    return float(qn * kn) * abs(call.scale)


def input_scan(
    call: AttentionCall, scan: Callable[[Tensor], float] | None = None
) -> tuple[float, float, bool]:
    """(max|q|, max|k|, q, k and v all finite) for a dot-product call, from one exact pass per
    tensor (:func:`attnkit.kernels.policy.scan.absmax3`; ``scan`` replaces it per tensor, e.g. by
    the torch reference :func:`~attnkit.kernels.policy.scan.absmax_torch` in tests). k and v whose
    bounds a cache keeps (:mod:`attnkit.kernels.policy.kv_bounds`) are not read: only q is."""
    if scan is None and (kv := kv_bounds.known(call.k, call.v)) is not None:
        qm = absmax(call.q)  # a cache's keys and values: their bounds are kept, scan q only
        return qm, kv.max_abs_k, math.isfinite(qm) and kv.finite
    if scan is None:  # with the scan plan dispatch remembered for the signature, if any
        qm, km, vm = absmax3(call.q, call.k, call.v, call.memo.scan_plan)
    else:
        qm, km, vm = scan(call.q), scan(call.k), scan(call.v)
    return qm, km, math.isfinite(qm) and math.isfinite(km) and math.isfinite(vm)


def decide(call: AttentionCall, qm: float, km: float, finite: bool) -> NumericsDecision:
    """The :class:`~attnkit.kernels.policy.decision.NumericsDecision` for ``call`` from the scan's
    max|q| and max|k| and the finiteness of q, k, v (:func:`input_scan`): the cheap bound
    max|q| max|k| d scale + max|bias| first; only when it reaches a threshold of P5 the tight
    bound (row 2-norms, Cauchy-Schwarz), which costs a pass over q and k in float64."""
    bm, bad_bias = 0.0, False
    if call.mask is not None and call.mask.has_bias:
        extra = [bias_bound(call.mask, call.q_len, call.kv_len), nonfinite_bias(call.mask)]
        bm, bad_bias = torch.stack([e.double().cpu() for e in extra]).tolist()
        if bad_bias:
            raise refuse_nonfinite_bias()
    dtype = compute_dtype(call.q.dtype)  # call.q.dtype: the call's dtype, read per call
    qk, tight = qm * km * call.q.shape[-1] * abs(call.scale), False
    bound = softmax_bound(call, qk, bm)
    overflow, grad_limit = _limits(dtype)
    if max(bound, qk) < overflow and bound < grad_limit:  # the common case: nothing more to do
        return _plain(dtype, finite)
    reason = None
    if dtype != torch.float64 and _needs_float64(call, bound, dtype, qk):
        qk, tight = _row_norm_bound(call), True  # Cauchy-Schwarz: check again
        bound = softmax_bound(call, qk, bm)
        if _needs_float64(call, bound, dtype, qk):
            decided = bound if qk < overflow else qk  # q.k itself overflows (before a cap)
            reason = dot_reason(qm, km, bm, decided, dtype, overflow)
            dtype = torch.float64
    if finite and dtype == torch.float64 and not max(bound, qk) < torch.finfo(dtype).max:
        if not tight:
            qk, tight = _row_norm_bound(call), True
            bound = softmax_bound(call, qk, bm)
        _refuse_float64_overflow(max(bound, qk))
    ok = True
    if not bound * torch.finfo(dtype).eps < GRAD_SCORE_ERROR and call.needs_grad:
        if not tight:
            bound = softmax_bound(call, _row_norm_bound(call), bm)
        ok = bound * torch.finfo(dtype).eps < GRAD_SCORE_ERROR
    return NumericsDecision(dtype, finite, ok, reason)


def _refuse_float64_overflow(bound: float) -> None:
    """ValueError when scores bounded by ``bound`` (the tight bound) could overflow float64, the
    widest compute dtype: a row of scores that overflowed would read as a row without keys
    (output 0) or as NaN, never as its result."""
    fmax = torch.finfo(torch.float64).max
    if not bound < fmax:
        raise ValueError(
            f"q, k: expected scores within float64's range ({fmax:.3g}), got a bound of "
            f"{bound:.3g} on |q.k| * scale (+ bias) (row norms); float64 is the widest "
            "dtype attnkit computes in: scale q or k down"
        )


@functools.cache
def _plain(dtype: torch.dtype, finite: bool) -> NumericsDecision:
    """The decision of the common case (no float64, fused backward exact), made once."""
    return NumericsDecision(dtype, finite)


def plain_decision(dtype: torch.dtype) -> NumericsDecision:
    """The decision of the common case for a compute dtype: finite inputs, scores below
    :func:`plain_bound` (no float64, fused backward exact)."""
    return _plain(dtype, True)


def plain_bound(dtype: torch.dtype, needs_grad: bool) -> float:
    """A bound of |q.k| * scale below which :func:`decide` settles a call without a bias or
    cap of compute ``dtype`` on its common case (:func:`plain_decision`): P5's overflow limit,
    and for a call that needs gradients also the fused backward's (above it :func:`decide`
    looks further)."""
    overflow, grad_limit = _limits(dtype)
    return min(overflow, grad_limit) if needs_grad else overflow


Path = Literal["auto", "device", "host"]
_PATH: list[Path] = ["auto"]


def device_path(device: torch.device) -> bool:
    """True when calls on ``device`` take the policy's device path (no host sync): every device
    but the CPU, unless :func:`use_path` forces one path. The one place this is decided."""
    path = _PATH[0]
    if path == "auto":
        return device.type != "cpu"
    return path == "device"


def forced_path() -> Path:
    """The path :func:`use_path` forces (``"auto"``: none, calls go by device)."""
    return _PATH[0]


@contextlib.contextmanager
def use_path(path: Path) -> Iterator[None]:
    """Within the block, decide calls on the ``"device"`` path (no host sync, also on the CPU)
    or the ``"host"`` path (the exact scan, also on a GPU: the opt-in check), or by device
    (``"auto"``, the default). Not thread-local: a setting for tests and for a program's run."""
    if path not in ("auto", "device", "host"):
        raise ValueError(f"path: expected 'auto', 'device' or 'host', got {path!r}")
    before, _PATH[0] = _PATH[0], path
    try:
        yield
    finally:
        _PATH[0] = before


@functools.cache
def on_device(dtype: torch.dtype) -> NumericsDecision:
    """The device path's decision for calls of ``dtype``: P4's compute dtype, nothing read."""
    return NumericsDecision(compute_dtype(dtype), True, checked="device")


@functools.cache
def in_kernel(dtype: torch.dtype) -> NumericsDecision:
    """The decision handed to a backend that checks P5/P6 inside its kernel (``decode``)."""
    return NumericsDecision(compute_dtype(dtype), True, checked="kernel")


def decision(call: AttentionCall) -> NumericsDecision:
    """The policy's decision for a dot-product call: the one entry point (:func:`input_scan`,
    then :func:`decide`; :func:`on_device` on the device path), made once per call (kept in
    ``call.memo``)."""
    return call.memo.get(DECISION, _decided, call)


def _decided(call: AttentionCall) -> NumericsDecision:
    """:func:`decision` made now."""
    if device_path(call.q.device):
        return on_device(call.q.dtype)
    return decide(call, *input_scan(call))


def numerics(call: AttentionCall) -> tuple[torch.dtype, bool]:
    """(compute dtype, all inputs finite) of :func:`decision`."""
    d = decision(call)
    return d.compute, d.finite


def float64_reason(call: AttentionCall) -> Float64Reason | None:
    """Why :func:`decision` computes ``call`` in float64 (P5), None when it does not."""
    return decision(call).float64_reason


def fused_backward_ok(call: AttentionCall) -> bool:
    """False when ``call`` needs gradients and its scores are so large, even in the compute
    dtype of :func:`numerics`, that a fused backward (which recomputes exp(s - logsumexp) from
    scores it computes again) would be inexact: |s| * eps(compute) >= GRAD_SCORE_ERROR. Backends
    then differentiate through an explicit softmax instead (:func:`decision`)."""
    return decision(call).fused_backward_ok


def _sanitized(call: AttentionCall) -> AttentionCall:
    """The call with non-finite entries of q, k and v replaced by 0."""
    q, k, v = (torch.where(torch.isfinite(t), t, 0) for t in (call.q, call.k, call.v))
    return dataclasses.replace(call, q=q, k=k, v=v)


def _lift(t: Tensor, mask_ndim: int, batch_ndim: int) -> Tensor:
    return t.reshape(t.shape[:mask_ndim] + (1,) * (batch_ndim - mask_ndim) + t.shape[-2:])


def nonfinite_rows(call: AttentionCall) -> Tensor:
    """Bool (..., Lq): rows that have an allowed key and attend to a non-finite q row, k or v
    row, or bias entry (P6). (A grouped call is read with k and v repeated to q's heads.)"""
    call = ungrouped(call)
    q_bad = ~torch.isfinite(call.q.detach()).all(-1)  # (..., Lq)
    kv_bad = ~(torch.isfinite(call.k.detach()).all(-1) & torch.isfinite(call.v.detach()).all(-1))
    mask, lq, lk = call.mask, call.q_len, call.kv_len
    if mask is None:
        return q_bad | kv_bad.any(-1, keepdim=True)
    nb, mb = len(call.batch_shape), len(mask.batch_shape)
    rows = max(1, _ROW_CHUNK // max(1, lk * max(1, math.prod(call.batch_shape))))
    parts = []
    for q0 in range(0, lq, rows):
        q1 = min(lq, q0 + rows)
        allowed = _lift(mask.tile(q0, q1, 0, lk, lq, lk), mb, nb).to(q_bad.device)
        bad = kv_bad[..., None, :]
        if mask.has_bias:
            b = mask.bias_tile(q0, q1, 0, lk, lq, lk)
            if b is not None:
                b = _lift(b.detach(), mb, nb).to(q_bad.device)
                bad = bad | b.isnan() | (b == math.inf)
        hit = (allowed & bad).any(-1) | (q_bad[..., q0:q1] & allowed.any(-1))
        parts.append(hit.expand(call.batch_shape + (q1 - q0,)))
    return torch.cat(parts, dim=-1)


def device_bad_rows(q: Tensor, k: Tensor, v: Tensor, out: Tensor, qk_limit=None) -> Tensor:
    """Bool (..., Lq, 1), on the device, without a host sync: the output rows that are not
    finite (an overflow, or a NaN/inf the kernel passed on), the rows whose q row holds a NaN or
    +-inf, and every row of a batch element and head whose k or v holds one anywhere (one
    max|x| reduction per (batch, head) of k and v, in their own dtype; a grouped call's k/v
    head covers its group of query heads). Other batch elements and heads keep their rows, so a
    row with no allowed key stays 0 there (P1).

    ``qk_limit`` (dot-product calls): also the rows whose bound d * max|q_i| * max|k| of
    |q_i . k_j| reaches it (the score limit of the compute dtype over |scale|, P5's bound).
    Their scores may have overflowed, and a fused kernel need not turn an overflow into NaN
    (torch 2.15's CPU kernel gives 0 for a row whose scores all overflow)."""
    q_max = torch.linalg.vector_norm(q.detach(), math.inf, dim=-1, keepdim=True)  # (..., Lq, 1)
    k_max = torch.linalg.vector_norm(k.detach(), math.inf, dim=(-2, -1), keepdim=True)
    kv_ok = torch.isfinite(k_max) & torch.isfinite(
        torch.linalg.vector_norm(v.detach(), math.inf, dim=(-2, -1), keepdim=True)
    )
    if q.dim() >= 3 and kv_ok.dim() >= 3 and kv_ok.shape[-3] not in (1, q.shape[-3]):
        g = q.shape[-3] // kv_ok.shape[-3]  # grouped heads
        kv_ok, k_max = kv_ok.repeat_interleave(g, dim=-3), k_max.repeat_interleave(g, dim=-3)
    bad = ~torch.isfinite(out).all(-1, keepdim=True) | ~torch.isfinite(q_max) | ~kv_ok
    if qk_limit is not None:
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        bound = q_max.to(acc) * k_max.to(acc) * q.shape[-1]
        bad = bad | ~(bound < qk_limit)
    return bad


def device_all_finite(*tensors: Tensor) -> Tensor:
    """0-dim bool on the device, without a host sync: every entry of ``tensors`` is finite (one
    max|x| reduction per tensor, in its own dtype); for parameters such as additive
    attention's weights, which every row reads."""
    flags = [torch.isfinite(torch.linalg.vector_norm(t.detach(), math.inf)) for t in tensors]
    return torch.stack(flags).all()


def prepare(
    call: AttentionCall, kernel_checks: bool = False, warn: bool = True
) -> tuple[AttentionCall, NumericsDecision]:
    """The policy stage's first half, once per call: (the call the backend runs, the
    decision). Non-finite q, k and v are replaced by 0 (P6) and the call decided again on its
    finite part; a float64 decision (P5) warns once per process (``warn``). ``kernel_checks``:
    the backend checks the policy in its kernel (:func:`in_kernel`; no scan) unless the device
    path applies."""
    if kernel_checks and not device_path(call.q.device):
        return call, in_kernel(call.dtype)
    d = decision(call)
    work = call
    if not d.finite:
        work = _sanitized(call)
        d = dataclasses.replace(decision(work), finite=False)
    if warn and d.compute == torch.float64 and call.dtype != torch.float64:
        warn_float64(d.float64_reason)  # once per process: the call is slower than asked
    return work, d


def finish(
    call: AttentionCall, d: NumericsDecision, out: Tensor, weights: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The policy stage's second half: results in the call's dtype; the rows that read NaN/inf
    set to NaN (P6: from the host-side rows of :func:`nonfinite_rows` after a scan; on the
    device path every row that is not finite, by one device-side select)."""
    dtype = call.q.dtype
    if out.dtype != dtype:
        out = out.to(dtype)
    if weights is not None and weights.dtype != dtype:
        weights = weights.to(dtype)
    if d.checked == "device":
        limit = None
        if call.softcap is None and call.scale != 0:  # a cap bounds the scores itself
            limit = _limits(d.compute)[0] / abs(call.scale)
        bad = device_bad_rows(call.q, call.k, call.v, out, limit)
    elif not d.finite:
        bad = nonfinite_rows(call)[..., None]
    else:
        return out, weights
    out = torch.where(bad, math.nan, out)
    weights = None if weights is None else torch.where(bad, math.nan, weights)
    return out, weights
