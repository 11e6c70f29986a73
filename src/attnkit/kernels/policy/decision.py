"""The policy's decision for one call (:class:`NumericsDecision`), what dispatch's policy stage
hands to ``Backend.run(call, decision)``, and its key in the call's memo (:data:`DECISION`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from attnkit.kernels.call.memo import MemoKey
from attnkit.kernels.policy.precision import Float64Reason

__all__ = ["DECISION", "Checked", "DecisionKey", "NumericsDecision"]

Checked = Literal["scan", "device", "kernel"]
"""How a :class:`NumericsDecision` was reached (see its ``checked`` field)."""


@dataclass(frozen=True)
class NumericsDecision:
    """How the NaN/inf/overflow policy (:mod:`attnkit.kernels.policy.numerics`, or the additive
    one of :mod:`attnkit.kernels.policy.additive`) runs one call: decided once per call by
    dispatch's policy stage and handed to ``Backend.run(call, decision)``.

    compute: the dtype scores, softmax and accumulation use (P4; float64 when P5 says so).
    finite: q, k and v hold no NaN or +-inf (False: P6 replaced them by 0 in the call the
        backend receives, and sets the rows that read them to NaN afterwards). True when the
        values were not read (``checked`` "device" or "kernel").
    fused_backward_ok: a fused backward (which recomputes exp(s - logsumexp)) is exact for the
        call's scores in ``compute``; False: backends differentiate an explicit softmax.
    float64_reason: why ``compute`` is float64 for a call of a lower precision (what the
        :class:`~attnkit.kernels.policy.precision.PrecisionWarning` says), else None.
    checked: how the decision was reached.
        "scan": from an exact host-side scan of the inputs (CPU; every promise P1-P6 as the
        conventions guide states it).
        "device": from the dtype and device alone, without reading a value back to the host
        (CUDA and other accelerators): the backend keeps P1 with device-side selects, and the
        policy's last step sets every output row that is not finite to NaN
        (:func:`attnkit.kernels.policy.numerics.finish`).
        "kernel": the backend checks P5/P6 itself while it computes (``decode``) and returns
        None when they fail; dispatch then redoes the call under a "scan" decision.
    """

    compute: torch.dtype
    finite: bool
    fused_backward_ok: bool = True
    float64_reason: Float64Reason | None = None
    checked: Checked = "scan"


class DecisionKey(MemoKey[NumericsDecision]):
    """The key of the policy's decision in a call's memo: one instance, :data:`DECISION`
    (compared by identity, so a lookup runs no Python code)."""

    __slots__ = ()


DECISION = DecisionKey()
"""The call's :class:`NumericsDecision` in ``call.memo`` (set by
:func:`attnkit.kernels.policy.numerics.decision`, once per call)."""
