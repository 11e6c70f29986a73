"""What every backend declares, and the interface between dispatch and a backend.

Each backend is a :class:`Backend` that says, for a call (an
:class:`~attnkit.kernels.call.base.AttentionCall`), every reason it cannot serve it
(:meth:`Backend.not_supported_reasons`, empty = can serve) and runs it (:meth:`Backend.run`).

The interface between dispatch and a backend (:func:`attnkit.kernels.dispatch.run` is the only
caller of ``run``)::

    dispatch.run(call, backend)
      1. numerics.prepare(call, backend.kernel_checks) -> (work, decision)   once per call
         (additive calls: policy.additive.prepare); ``work`` is ``call`` with non-finite
         q, k, v replaced by 0 when ``decision.finite`` is False
      2. backend.decision_reasons(work, decision): non-empty -> dispatch hands the call to
         ``BACKENDS[backend.fallback]`` (k, v repeated to H heads when that one lacks
         ``supports_gqa``), and so on; ``explain_dispatch`` prints these reasons
      3. backend.run(work, decision) -> (out, weights | None), or None when the backend checked
         the policy in its kernel (``kernel_checks``) and it failed: dispatch then redoes the
         call on ``BACKENDS[backend.fallback]`` under the full decision (``prepare(call)``:
         the scan on the host path)
      4. numerics.finish(call, decision, out, weights): the call's dtype, P6's NaN rows

``run(call, decision)`` computes in ``decision.compute`` (a
:class:`~attnkit.kernels.policy.decision.NumericsDecision`: compute dtype, finite,
fused_backward_ok, float64_reason, checked), never asks the policy itself, never falls back to
another backend itself, and on ``decision.checked == "device"`` never reads a tensor value back to
the host (``.item()``, ``.tolist()``, ``bool(t)``, ``.cpu()``): P1 by device-side selects. It may
return the output in ``decision.compute`` or the call's dtype (step 4 rounds it).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy.decision import NumericsDecision

__all__ = ["Backend", "fused_backward_reasons"]


def fused_backward_reasons(decision: NumericsDecision) -> list[str]:
    """Why a backend with a fused, recomputing backward refuses ``decision`` (its scores are too
    large for that backward to be exact, policy P5), for ``Backend.decision_reasons``."""
    if decision.fused_backward_ok:
        return []
    dtype = str(decision.compute).removeprefix("torch.")
    return [
        f"the scores are too large for a fused backward to be exact, even in {dtype} "
        "(|score| x eps >= 2**-10): an explicit softmax gives exact gradients"
    ]


class Backend:
    """A kernel backend: declares what it supports and runs calls it supports."""

    name: ClassVar[str] = "?"
    kinds: ClassVar[tuple[str, ...]] = ("dot",)
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.float64)
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    supports_grad: ClassVar[bool] = True
    supports_weights: ClassVar[bool] = False
    supports_dropout: ClassVar[bool] = False
    supports_bias: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = False
    """Takes grouped calls (k, v with G < H heads, see :class:`AttentionCall`) without copies."""
    supports_softcap: ClassVar[bool] = False
    """Applies ``softcap`` (c * tanh(s / c) on the scaled scores, before mask and bias)."""
    supports_sinks: ClassVar[bool] = False
    """Applies ``sinks`` (one logit per query head in every row's softmax denominator)."""
    kernel_checks: ClassVar[bool] = False
    """Checks P5/P6 inside its kernel: gets a decision without the input scan, and returns None
    from :meth:`run` when the check fails (dispatch redoes the call on ``fallback``)."""
    fallback: ClassVar[str | None] = None
    """The backend dispatch hands a call to when :meth:`decision_reasons` refuses the decision,
    or :meth:`run` returns None."""

    def available(self) -> str | None:
        """None when usable in this installation, else the reason it is not."""
        return None

    def not_supported_reasons(self, call: AttentionCall) -> list[str]:
        """Every reason this backend cannot serve ``call`` (empty list = it can)."""
        r = []
        why = self.available()
        if why:
            r.append(why)
        if call.kind not in self.kinds:
            r.append(f"score kind {call.kind!r} not in {self.kinds}")
        if call.dtype not in self.dtypes:
            r.append(f"dtype {call.dtype} not in {[str(d) for d in self.dtypes]}")
        if call.q.device.type not in self.devices:
            r.append(f"device {call.q.device.type!r} not in {self.devices}")
        if call.return_weights and not self.supports_weights:
            r.append("cannot return attention weights")
        if call.dropout_p > 0 and not self.supports_dropout:
            r.append("no dropout")
        if call.needs_grad and not self.supports_grad:
            r.append("no backward (inputs require grad)")
        if call.mask is not None and call.mask.has_bias and not self.supports_bias:
            r.append("no additive score bias")
        if call.grouped and not self.supports_gqa:
            r.append("no grouped k/v heads (supports_gqa)")
        if call.softcap is not None and not self.supports_softcap:
            r.append(f"no attention-logit softcapping (softcap={call.softcap:g})")
        if call.sinks is not None and not self.supports_sinks:
            r.append("no attention sinks (sinks)")
        r.extend(self.extra_reasons(call))
        return r

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        """Backend-specific reasons it *cannot* serve the call, beyond the declared capabilities."""
        return []

    def speed_reasons(self, call: AttentionCall) -> list[str]:
        """Reasons the backend *could* serve the call but would be slower than the next one.

        ``backend="auto"`` honours them; ``backend=NAME`` ignores them, so a user can force a
        backend that is correct but not the fastest choice."""
        return []

    def choice_notes(self, call: AttentionCall) -> list[str]:
        """When ``auto`` chose this backend by a tuned constant: which, and what it measured
        (``explain_dispatch`` prints them); empty otherwise."""
        return []

    def decision_reasons(self, call: AttentionCall, decision: NumericsDecision) -> list[str]:
        """Reasons this backend cannot run ``call`` under the policy's ``decision`` (e.g. a
        fused backward that would be inexact): dispatch then hands it to ``fallback``."""
        return []

    def fallback_notes(self, call: AttentionCall) -> list[str]:
        """When the backend may hand a call back at run time (``kernel_checks``): what then
        happens, for ``explain_dispatch``; empty otherwise."""
        return []

    def run(
        self, call: AttentionCall, decision: NumericsDecision
    ) -> tuple[Tensor, Tensor | None] | None:
        """Compute (output (..., Lq, dv), weights (..., Lq, Lk) or None) under ``decision``
        (the module docstring says what dispatch did before and does after)."""
        raise NotImplementedError
