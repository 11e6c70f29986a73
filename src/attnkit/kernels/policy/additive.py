"""The NaN/inf/overflow policy (README "Conventions", P1-P6) for additive attention calls,
shared by every backend that serves them (``additive_fused`` and ``math``).

Additive scores are e_ij = w_v . tanh(W_q q_i + W_k k_j) (+ bias_ij). What differs from the
dot-product policy of :mod:`attnkit.kernels.policy.numerics`:

- P5 bound: |W_q q_i| <= max|q| max|W_q| d_q, |W_k k_j| likewise, |e_ij| <= sum|w_v| (|tanh|
  <= 1) + max|bias|, and the unnormalised accumulator <= max|v| Lk; and the backward's gradient
  of the tanh layer, dS_ij w_v (1 - tanh^2) <= 2 (d_v max|v| + 1) sum|w_v| for cotangents whose
  entries are of order 1 (|dS_ij| <= 2 max_l |dW_il|, dW = dO Vᵀ + d_weights). When one of them
  reaches finfo(compute).max / 16, the call runs in float64 and the result is rounded (without
  the backward term, v ~ 1e10 and w_v ~ 1e30 in float32 gave inf - inf = NaN gradients of q,
  W_q and W_k whose true values are small).
- P6: tanh would saturate an infinite projection to +-1 (a finite score). An infinite input is
  treated as corrupt, like NaN: a row is NaN when q_i, k_j or v_j of a key it may attend to, or
  any entry of W_q, W_k, w_v (they enter every score) is NaN or +-inf. A float mask (bias)
  holding NaN or +inf is refused with a ValueError naming ``mask``. Rows that do not read a
  non-finite value are computed from finite data only (the backends never see NaN/inf: they
  are replaced by 0 first), so they equal the float64 reference; rows without an allowed key
  stay 0 (P1).

:func:`prepare` and :func:`finish` are the policy's stage in dispatch
(:func:`attnkit.kernels.dispatch.run`), as for dot-product calls; :func:`run_additive` runs
them around one implementation. On the device path
(:func:`attnkit.kernels.policy.numerics.device_path`) nothing is read back to the host: float32
compute (P4), no float64 fallback, and every output row that is not finite becomes NaN.
Every tensor the policy creates is made on the call's device.

Shape legend: ``...`` batch dims of q, ``Lq``/``Lk`` query/key lengths.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.kernels.call.base import AttentionCall, lift_mask_tensor
from attnkit.kernels.policy import numerics
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.kernels.policy.mask_bias import bias_bound, nonfinite_bias, refuse_nonfinite_bias
from attnkit.kernels.policy.numerics import OVERFLOW_MARGIN, compute_dtype, nonfinite_rows
from attnkit.kernels.policy.precision import Float64Reason, warn_float64

ROW_CHUNK = 2**22
"""Most mask entries evaluated at once when finding the rows that have an allowed key."""

Impl = Callable[[AttentionCall, NumericsDecision], tuple[Tensor, Tensor | None]]


def input_stats(call: AttentionCall) -> dict[str, float]:
    """max|q|, max|W_q|, max|k|, max|W_k|, sum|w_v|, max|v| (NaN/inf when a tensor holds
    NaN/inf) and ``bias_bad`` (1.0 when a bias tensor holds NaN or +inf), with one host sync."""
    names = ("q", "w_q", "k", "w_k", "v")
    parts = [torch.stack(torch.aminmax(getattr(call, n).detach())).double() for n in names]
    parts.append(call.w_v.detach().abs().sum(dtype=torch.float64).reshape(1))
    parts.append(nonfinite_bias(call.mask, call.q.device).double().reshape(1).to(call.q.device))
    flat = torch.cat(parts).tolist()  # (min, max) of each of names, then sum|w_v|, bias_bad
    stats = {n: max(abs(flat[2 * i]), abs(flat[2 * i + 1])) for i, n in enumerate(names)}
    for i, n in enumerate(names):
        if math.isnan(flat[2 * i]) or math.isnan(flat[2 * i + 1]):
            stats[n] = math.nan
    stats["w_v"], stats["bias_bad"] = flat[-2], flat[-1]
    return stats


def _bounds(call: AttentionCall, stats: dict[str, float]) -> list[tuple[str, float, str]]:
    """P5's bounds (the module docstring) for finite inputs (``stats`` from
    :func:`input_stats`): (what is bounded, its bound, the tensors that drive it)."""
    bias = float(bias_bound(call.mask, call.q_len, call.kv_len))
    return [
        ("|W_q q_i|", stats["q"] * stats["w_q"] * call.q.shape[-1], "q, w_q"),
        ("|W_k k_j|", stats["k"] * stats["w_k"] * call.k.shape[-1], "k, w_k"),
        ("the scores", stats["w_v"] + bias, "w_v" + (", the mask's bias" if bias else "")),
        ("the weighted sum of values", stats["v"] * call.kv_len, "v"),
        (
            "the tanh layer's gradient",
            2 * (stats["v"] * call.v.shape[-1] + 1) * stats["w_v"],
            "v, w_v",
        ),
    ]


def overflow_risk(call: AttentionCall, dtype: torch.dtype, stats: dict[str, float]) -> bool:
    """True when finite inputs (``stats`` from :func:`input_stats`) could overflow ``dtype``
    (P5, the bound in the module docstring)."""
    limit = torch.finfo(dtype).max / OVERFLOW_MARGIN
    return not all(b < limit for _, b, _ in _bounds(call, stats))


def _tensor_words(name: str, stats: dict[str, float]) -> str:
    """``name`` with the statistic of it P5 reads, e.g. "q (max |entry| 1e+30)"."""
    if name not in stats:
        return name
    what = "sum of |entries|" if name == "w_v" else "max |entry|"
    return f"{name} ({what} {stats[name]:.3g})"


def float64_reason(call: AttentionCall, stats: dict[str, float]) -> Float64Reason | None:
    """Why an additive call computes in float64 (the first of P5's bounds it reaches), None when
    it does not."""
    dtype = compute_dtype(call.dtype)
    if dtype == torch.float64 or not all(math.isfinite(x) for x in stats.values()):
        return None  # non-finite inputs: the policy decides on their finite part (P6)
    limit = torch.finfo(dtype).max / OVERFLOW_MARGIN
    name = str(dtype).removeprefix("torch.")
    for what, b, names in _bounds(call, stats):
        if not b < limit:
            return Float64Reason(
                f"the bound of {what}, {b:.2g}, reaches {name}'s overflow limit ({limit:.2g})",
                tuple(_tensor_words(n, stats) for n in names.split(", ")),
                name,
            )
    return None


def choose_dtype(call: AttentionCall, stats: dict[str, float]) -> torch.dtype:
    """P4 (float32 for half types) and P5 (float64 when the compute dtype could overflow)."""
    dtype = compute_dtype(call.dtype)
    if dtype != torch.float64 and overflow_risk(call, dtype, stats):
        return torch.float64
    return dtype


def _finite_or_zero(t: Tensor) -> Tensor:
    """``t`` with NaN/inf replaced by 0 (differentiable in the finite entries)."""
    return torch.where(torch.isfinite(t), t, 0)


def rows_with_keys(call: AttentionCall) -> Tensor:
    """Bool (..., Lq): the rows that have at least one allowed key (mask evaluated in chunks)."""
    shape = call.batch_shape + (call.q_len,)
    mask, lq, lk = call.mask, call.q_len, call.kv_len
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=call.q.device)
    nb, mb = len(call.batch_shape), len(mask.batch_shape)
    rows = max(1, ROW_CHUNK // max(1, lk * math.prod(mask.batch_shape)))
    parts = []
    for q0 in range(0, lq, rows):
        q1 = min(lq, q0 + rows)
        has = lift_mask_tensor(mask.tile(q0, q1, 0, lk, lq, lk), mb, nb).any(-1)
        parts.append(has.to(call.q.device).expand(call.batch_shape + (q1 - q0,)))
    return torch.cat(parts, dim=-1)


def prepare(
    call: AttentionCall, kernel_checks: bool = False, warn: bool = True
) -> tuple[AttentionCall, NumericsDecision]:
    """The policy stage's first half for an additive call: (the call the backend runs, with
    non-finite inputs replaced by 0; the decision: compute dtype by P4/P5, finiteness, why
    float64). ``kernel_checks`` is unused (no additive backend checks in its kernel)."""
    if numerics.device_path(call.q.device):
        return call, numerics.on_device(call.dtype)
    stats = input_stats(call)
    if stats["bias_bad"]:
        raise refuse_nonfinite_bias()
    finite = all(math.isfinite(x) for x in stats.values())
    work = call
    if not finite:
        q, k, v, w_q, w_k, w_v = (_finite_or_zero(t) for t in call.tensors())
        work = dataclasses.replace(call, q=q, k=k, v=v, w_q=w_q, w_k=w_k, w_v=w_v)
        stats = input_stats(work)
    dtype = choose_dtype(work, stats)
    reason = None
    if dtype == torch.float64 and call.dtype != torch.float64:
        reason = float64_reason(work, stats)
        if warn:
            warn_float64(reason)  # once per process
    return work, NumericsDecision(dtype, finite, True, reason)


def finish(
    call: AttentionCall, d: NumericsDecision, out: Tensor, weights: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The policy stage's second half: the call's dtype; P6's NaN rows (on the device path:
    every row that is not finite)."""
    out = out.to(call.dtype)
    weights = None if weights is None else weights.to(call.dtype)
    if d.checked == "device":
        bad = numerics.device_bad_rows(call.q, call.k, call.v, out)
        bad = bad | ~numerics.device_all_finite(call.w_q, call.w_k, call.w_v)
    elif not d.finite:
        bad = nonfinite_rows(call)
        if not all(bool(torch.isfinite(t).all()) for t in (call.w_q, call.w_k, call.w_v)):
            bad = bad | rows_with_keys(call)
        bad = bad[..., None]
    else:
        return out, weights
    out = torch.where(bad, math.nan, out)
    weights = None if weights is None else torch.where(bad, math.nan, weights)
    return out, weights


def run_additive(call: AttentionCall, impl: Impl) -> tuple[Tensor, Tensor | None]:
    """``impl(call, decision)`` between :func:`prepare` and :func:`finish` (code that runs one
    implementation without dispatch)."""
    work, d = prepare(call)
    return finish(call, d, *impl(work, d))
