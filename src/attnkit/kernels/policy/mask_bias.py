"""A mask's floating tensors (additive biases) and a bound of its bias, read through the mask's
structure: what the NaN/inf/overflow policy (:mod:`attnkit.kernels.policy.numerics`, and the
additive one), a call's ``needs_grad`` and dispatch's call signatures need to know about a bias.

Shape legend: ``Lq``/``Lk`` query/key lengths.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.masks import Mask

__all__ = ["bias_bound", "nonfinite_bias", "refuse_nonfinite_bias"]


def _finite_abs_max(t: Tensor) -> Tensor:
    """max |t| over the finite entries (0 when there are none), float64 scalar tensor."""
    t = t.detach()
    return (
        torch.where(torch.isfinite(t), t, 0).abs().amax().double() if t.numel() else t.new_zeros(())
    )


def bias_bound(mask: Mask | None, q_len: int, kv_len: int) -> Tensor:
    """An upper bound of |bias| over the finite bias values of ``mask`` (float64 scalar tensor,
    on the CPU unless a bias tensor lives elsewhere): the sum over its biased leaves (``&`` adds
    biases)."""
    total = torch.zeros((), dtype=torch.float64, device="cpu")
    for leaf in () if mask is None else mask.leaves():
        if not leaf.has_bias:
            continue
        slopes = getattr(leaf, "slopes", getattr(leaf, "slope", None))
        tensors = [t for t in leaf.tensors() if t.is_floating_point()]
        if isinstance(slopes, (float, Tensor)):  # alibi: |slope| * distance
            if not isinstance(slopes, Tensor):
                slopes = torch.tensor(slopes, device="cpu")
            s = slopes.to(torch.float64).abs().amax()
            total = total + s * max(q_len, kv_len)
        elif tensors:
            total = total + sum(_finite_abs_max(t) for t in tensors)
        else:
            b = leaf.materialize_bias(q_len, kv_len)
            total = total + (0 if b is None else _finite_abs_max(b))
    return total


def refuse_nonfinite_bias() -> ValueError:
    """The error for a float mask (bias) holding NaN or +inf (P6)."""
    return ValueError(
        "mask: the float mask (an additive bias) holds NaN or +inf; expected finite values, "
        "or -inf where a key may not be attended"
    )


def bias_tensors(mask: Mask | None) -> tuple[Tensor, ...]:
    """:meth:`Mask.bias_tensors <attnkit.masks.Mask.bias_tensors>`, () for no mask."""
    return () if mask is None else mask.bias_tensors()


def nonfinite_bias(mask: Mask | None, device: torch.device | str = "cpu") -> Tensor:
    """True (0-dim bool, on ``device`` when the mask has no bias tensor) when a bias tensor of
    ``mask`` holds NaN or +inf."""
    flags = [(t.detach().isnan() | (t.detach() == math.inf)).any() for t in bias_tensors(mask)]
    return torch.stack(flags).any() if flags else torch.zeros((), dtype=torch.bool, device=device)
