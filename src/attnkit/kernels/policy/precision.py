"""The float64 fallback made visible: when the overflow policy (P5,
:mod:`attnkit.kernels.policy.numerics` and :mod:`attnkit.kernels.policy.additive`) computes a call
in float64, the first such call of the process warns with :class:`PrecisionWarning`, saying which
bound, which tensors and what it costs; ``explain_dispatch`` prints the same reason ("runs in
float64 because ...").

Silence it with ``warnings.filterwarnings("ignore", category=attnkit.PrecisionWarning)``.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass

import torch

__all__ = ["COST", "Float64Reason", "PrecisionWarning", "dot_reason", "warn_float64"]

COST = (
    "float64 arithmetic takes about 2-4x the time of float32 on a CPU and twice the memory for "
    "the scores"
)
"""What the fallback costs, as the warning states it."""


class PrecisionWarning(UserWarning):
    """A call ran in float64 instead of its own dtype because float32 could overflow or lose the
    accuracy its backward needs (attnkit's policy P5). Raised once per process; silence it with
    ``warnings.filterwarnings("ignore", category=attnkit.PrecisionWarning)``."""


@dataclass(frozen=True)
class Float64Reason:
    """Why a call runs in float64.

    ``bound``: which bound was reached, in words (e.g. "the score bound max|q| max|k| d |scale| +
    max|bias| = 4.6e+39 reaches float32's limit 2.1e+37"). ``tensors``: the inputs that drive
    it, each with its largest magnitude (e.g. ("q (max |entry| 1.2e+19)", "k (...)")).
    ``dtype``: the dtype the call would have computed in (torch dtype name)."""

    bound: str
    tensors: tuple[str, ...]
    dtype: str

    def __str__(self) -> str:
        return f"runs in float64 because {self.bound} (driven by {', '.join(self.tensors)})"


_LOCK = threading.Lock()
_warned = False
_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),  # attnkit
    os.path.dirname(os.path.abspath(torch.__file__)),  # torch (nn.Module.__call__, autograd)
)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first caller outside attnkit and torch (the user's line)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


def warn_float64(reason: Float64Reason | None) -> None:
    """Warn (once per process) that a call runs in float64, with ``reason`` and the cost."""
    global _warned
    with _LOCK:
        if _warned:
            return
        _warned = True
    why = str(reason) if reason is not None else "runs in float64 (policy P5)"
    warnings.warn(
        f"attnkit: a call {why}. Cost: {COST}. Only the first such call warns; silence it with "
        "warnings.filterwarnings('ignore', category=attnkit.PrecisionWarning)",
        PrecisionWarning,
        stacklevel=_user_stacklevel(),
    )


def dot_reason(
    qm: float, km: float, bm: float, bound: float, dtype: torch.dtype, overflow_limit: float
) -> Float64Reason:
    """The reason for a dot-product call: max|q| ``qm``, max|k| ``km``, bias bound ``bm``, the
    score ``bound`` that decided, ``dtype`` the compute dtype it left, ``overflow_limit``
    finfo(dtype).max / OVERFLOW_MARGIN."""
    name = str(dtype).removeprefix("torch.")
    if not bound < overflow_limit:
        what = (
            f"the bound of its scores, {bound:.2g}, reaches {name}'s overflow limit "
            f"({overflow_limit:.2g})"
        )
    else:
        eps = torch.finfo(dtype).eps
        what = (
            f"it needs gradients and the bound of its scores, {bound:.2g}, times {name}'s "
            f"rounding error {eps:.2g} is too large for an exact backward"
        )
    tensors = [f"q (max |entry| {qm:.3g})", f"k (max |entry| {km:.3g})"]
    if bm > 0:
        tensors.append(f"the mask's bias (max |bias| {bm:.3g})")
    return Float64Reason(what, tuple(tensors), name)
