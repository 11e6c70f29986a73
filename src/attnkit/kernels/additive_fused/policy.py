"""The NaN/inf/overflow policy (README "Conventions", P1-P6) for additive attention calls,
shared by every backend that serves them (``additive_fused`` and ``math``).

Additive scores are e_ij = w_v . tanh(W_q q_i + W_k k_j) (+ bias_ij). What differs from the
dot-product policy of :mod:`attnkit.kernels.numerics`:

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

:func:`run_additive` applies the policy around a backend's ``impl(call, compute_dtype)``.

Shape legend: ``...`` batch dims of q, ``Lq``/``Lk`` query/key lengths.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.kernels.base import AttentionCall, lift_mask_tensor
from attnkit.kernels.mask_bias import bias_bound, nonfinite_bias, refuse_nonfinite_bias
from attnkit.kernels.numerics import OVERFLOW_MARGIN, compute_dtype, nonfinite_rows
from attnkit.kernels.precision import Float64Reason, warn_float64

ROW_CHUNK = 2**22
"""Most mask entries evaluated at once when finding the rows that have an allowed key."""

Impl = Callable[[AttentionCall, torch.dtype], tuple[Tensor, Tensor | None]]


def input_stats(call: AttentionCall) -> dict[str, float]:
    """max|q|, max|W_q|, max|k|, max|W_k|, sum|w_v|, max|v| (NaN/inf when a tensor holds
    NaN/inf) and ``bias_bad`` (1.0 when a bias tensor holds NaN or +inf), with one host sync."""
    names = ("q", "w_q", "k", "w_k", "v")
    parts = [torch.stack(torch.aminmax(getattr(call, n).detach())).double() for n in names]
    parts.append(call.w_v.detach().abs().sum(dtype=torch.float64).reshape(1))
    parts.append(nonfinite_bias(call.mask).double().reshape(1))
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
    return torch.where(torch.isfinite(t), t, torch.zeros((), dtype=t.dtype))


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


def run_additive(call: AttentionCall, impl: Impl) -> tuple[Tensor, Tensor | None]:
    """Run ``impl(call, compute_dtype) -> (output, weights or None)`` for an additive call under
    the policy: non-finite inputs replaced by 0 before ``impl`` and the rows that read them set
    to NaN after (P6); the compute dtype chosen by P4/P5; results in the call's dtype."""
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
    if dtype == torch.float64 and call.dtype != torch.float64:
        warn_float64(float64_reason(work, stats))  # once per process
    out, weights = impl(work, dtype)
    out = out.to(call.dtype)
    weights = None if weights is None else weights.to(call.dtype)
    if not finite:
        bad = nonfinite_rows(call)
        if not all(bool(torch.isfinite(t).all()) for t in (call.w_q, call.w_k, call.w_v)):
            bad = bad | rows_with_keys(call)
        bad = bad[..., None]
        out = torch.where(bad, math.nan, out)
        weights = None if weights is None else torch.where(bad, math.nan, weights)
    return out, weights
