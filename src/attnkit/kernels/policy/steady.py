"""The policy's common case for a remembered call signature, decided in one step: the
:class:`Steady` check.

Most calls a program repeats are float32 calls on the CPU without a mask whose inputs are finite
and far below the overflow bound (P5). For them :func:`attnkit.kernels.policy.numerics.decide`
always reaches the same plain decision, but the general stage pays for building it each time:
the decision memo, the scan's dispatch on dtype and layout, the bound's pieces, the fallback
walk. A :class:`Steady` check is built once per signature (:func:`steady_for`, when dispatch
remembers the choice) with everything the signature fixes: the scan's runs, d * |scale| and
the bound below which :func:`~attnkit.kernels.policy.numerics.decide` settles the call on its
common case (:func:`~attnkit.kernels.policy.numerics.plain_bound`). Per call it runs the same
exact scan (:mod:`attnkit.kernels.policy.scan`'s bit kernel) and compares; anything else (a
NaN or inf, a bound reached, keys and values whose bounds a KV cache keeps, the device path
forced) returns None and the call takes the general stage, which decides it in full. So the
results are the general stage's, bit for bit: the check only skips work whose outcome is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.call.layout import ScanPlan
from attnkit.kernels.policy import kv_bounds, numerics
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.kernels.policy.scan import float32_maxima, planned_kernel32
from attnkit.kernels.tuning import current

__all__ = ["Steady", "steady_for"]


@dataclass(frozen=True, slots=True)
class Steady:
    """The common case of one remembered signature: float32, CPU, no mask, cap or sinks.

    kernel: the bit scan of three float32 run layouts (``absmax3_bits32``).
    runs: (width, rows, stride) of q, k and v, nine ints (the signature's
        :class:`~attnkit.kernels.call.layout.ScanPlan`).
    factor: d * |scale|, so that max|q| * max|k| * factor bounds every score.
    bound: the score bound below which the policy decides ``decision``.
    decision: the plain decision (float32, finite, fused backward exact).
    """

    kernel: Callable[..., tuple[int, int, int]]
    runs: tuple[int, ...]
    factor: float
    bound: float
    decision: NumericsDecision

    def decide(self, q: Tensor, k: Tensor, v: Tensor) -> NumericsDecision | None:
        """The plain decision when q, k and v (..., L, d) of this signature are finite and
        their scores below the bound, from one exact scan; None: decide in full."""
        if numerics.forced_path() == "device" or kv_bounds.known(k, v) is not None:
            return None
        r = self.runs
        try:
            ptrs = q.data_ptr(), k.data_ptr(), v.data_ptr()
        except RuntimeError:  # no storage (functorch-wrapped tensors of the same signature)
            return None
        m = self.kernel(
            ptrs[0], r[0], r[1], r[2], ptrs[1], r[3], r[4], r[5], ptrs[2], r[6], r[7], r[8]
        )
        qm, km, vm = float32_maxima(m)
        # NaN fails every comparison and inf fails `< inf`: both go to the general stage
        if qm * km * self.factor < self.bound and vm < math.inf:
            return self.decision
        return None


def steady_for(call: AttentionCall, backend: Backend, plan: ScanPlan | None) -> Steady | None:
    """The :class:`Steady` check of ``call``'s signature on ``backend``, or None when the
    signature is not of the common case: not a float32 CPU dot-product call without a mask,
    softcap or sinks; no scan plan or numba kernel; inputs large enough for the threaded scan;
    a backend that checks the policy in its kernel or refuses the plain decision."""
    if plan is None or backend.kernel_checks:
        return None
    q, k, v = call.q, call.k, call.v
    if call.kind != "dot" or q.dtype != torch.float32 or not q.is_cpu:
        return None
    if call.mask is not None or call.softcap is not None or call.sinks is not None:
        return None
    if q.numel() + k.numel() + v.numel() >= current().scan_threaded_min:
        return None  # the scan uses torch's threads there (scan.absmax3)
    kernel = planned_kernel32()
    if kernel is None:
        return None
    decision = numerics.plain_decision(torch.float32)
    if backend.decision_reasons(call, decision):
        return None
    runs = tuple(x for s in (plan.q, plan.k, plan.v) for x in (s.width, s.rows, s.stride))
    factor = q.shape[-1] * abs(call.scale)
    bound = numerics.plain_bound(torch.float32, call.needs_grad)
    return Steady(kernel, runs, factor, bound, decision)
