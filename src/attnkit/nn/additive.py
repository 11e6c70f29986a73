"""Additive (Bahdanau) and general (Luong, bilinear) attention modules.

Shape legend
------------
``...`` batch dims, identical for query, key and value
``Lq`` / ``Lk``  query / key lengths
``dq`` query_dim   ``dk`` key_dim   ``dv`` value_dim   ``h`` hidden_dim

Both modules have the forward signature of the other attention modules:
``forward(query, key, value=None, mask=None, *, return_weights=False) -> (output, weights|None)``
with ``value`` defaulting to ``key``. Masks: True = may attend (see :mod:`attnkit.functional`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit import functional as F
from attnkit import tensor_checks as tc
from attnkit.masks import Mask

__all__ = ["AdditiveAttention", "GeneralAttention"]


def _check_input(name: str, x: object, width: int | None, what: str, ref: Tensor) -> Tensor:
    """``x`` (..., L, width) (any width when None) with the dtype and device of ``ref``."""
    x = tc.tensor(name, x)
    if x.dim() < 2 or (width is not None and x.shape[-1] != width):
        last = "" if width is None else f" with last dim {width}"
        raise ValueError(f"{name}: expected shape {what}{last}, got {tuple(x.shape)}")
    tc.like(name, x, ref, "the module's parameters")
    if 0 in x.shape:
        raise ValueError(f"{name}: expected non-empty dims, got shape {tuple(x.shape)}")
    return x


def _uniform(t: Tensor, fan_in: int) -> None:
    """The ``torch.nn.Linear`` default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(t, -bound, bound)


class _ScoredAttention(nn.Module):
    """Shared forward of the single-head scored attention modules: check the inputs, default
    ``value`` to ``key``, then :meth:`_attend` (one :mod:`attnkit.functional` call)."""

    query_dim: int
    key_dim: int
    value_dim: int | None = None  # None: any width

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor | None = None,
        mask: Mask | Tensor | None = None,
        *,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Args:
            query: (..., Lq, dq); key: (..., Lk, dk); value: (..., Lk, dv), default ``key``.
            mask: True = may attend, broadcastable to (..., Lq, Lk), or a mask object.
            return_weights: also return the weights (..., Lq, Lk).

        Returns:
            (output (..., Lq, dv), weights (..., Lq, Lk) or None).
        """
        checks.flag("return_weights", return_weights)
        ref = next(self.parameters())
        query = _check_input("query", query, self.query_dim, "(..., Lq, query_dim)", ref)
        key = _check_input("key", key, self.key_dim, "(..., Lk, key_dim)", ref)
        value = key if value is None else value
        value = _check_input("value", value, self.value_dim, "(..., Lk, value_dim)", ref)
        for name, t in (("key", key), ("value", value)):
            if t.shape[:-2] != query.shape[:-2]:
                raise ValueError(
                    f"{name}: expected batch dims {tuple(query.shape[:-2])} like query, "
                    f"got shape {tuple(t.shape)}"
                )
        if value.shape[-2] != key.shape[-2]:
            raise ValueError(
                f"value: expected Lk = {key.shape[-2]} rows like key, "
                f"got shape {tuple(value.shape)}"
            )
        b, lq, lk = tuple(query.shape[:-2]), query.shape[-2], key.shape[-2]
        F.check_mask(mask, b, lq, lk, query.device)
        res = self._attend(query, key, value, mask, return_weights)
        return res if return_weights else (res, None)

    def _attend(self, query, key, value, mask, return_weights):
        raise NotImplementedError


class AdditiveAttention(_ScoredAttention):
    """Bahdanau attention (seed 004): ``e_ij = w_vᵀ tanh(W_q q_i + W_k k_j)``,
    ``a_ij = softmax_j(e_ij)``, ``out_i = sum_j a_ij v_j``.

    Parameters (``torch.nn.Linear`` weight layout, no biases): ``w_q`` (h, dq), ``w_k`` (h, dk),
    ``w_v`` (h,).

    Args:
        query_dim: dq.
        key_dim: dk.
        hidden_dim: h, width of the tanh layer.
        value_dim: dv, last dim of ``value`` (default ``key_dim``, as value defaults to key);
            the output has this width.
    """

    def __init__(
        self, query_dim: int, key_dim: int, hidden_dim: int, value_dim: int | None = None
    ) -> None:
        super().__init__()
        self.query_dim = checks.positive_int("query_dim", query_dim)
        self.key_dim = checks.positive_int("key_dim", key_dim)
        self.hidden_dim = checks.positive_int("hidden_dim", hidden_dim)
        self.value_dim = (
            key_dim if value_dim is None else checks.positive_int("value_dim", value_dim)
        )
        self.w_q = nn.Parameter(torch.empty(hidden_dim, query_dim))
        self.w_k = nn.Parameter(torch.empty(hidden_dim, key_dim))
        self.w_v = nn.Parameter(torch.empty(hidden_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _uniform(self.w_q, self.query_dim)
        _uniform(self.w_k, self.key_dim)
        _uniform(self.w_v, self.hidden_dim)

    def _attend(self, query, key, value, mask, return_weights):
        return F.additive_attention(
            query, key, value, self.w_q, self.w_k, self.w_v, mask, return_weights=return_weights
        )

    def extra_repr(self) -> str:
        return (
            f"query_dim={self.query_dim}, key_dim={self.key_dim}, hidden_dim={self.hidden_dim}, "
            f"value_dim={self.value_dim}"
        )


class GeneralAttention(_ScoredAttention):
    """Luong's "general" (bilinear) attention: ``e_ij = q_i W k_jᵀ``, softmax over j, weighted
    sum of the values. No scaling.

    Parameter: ``weight`` (dq, dk).

    Args:
        query_dim: dq.
        key_dim: dk.
    """

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.query_dim = checks.positive_int("query_dim", query_dim)
        self.key_dim = checks.positive_int("key_dim", key_dim)
        self.weight = nn.Parameter(torch.empty(query_dim, key_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _uniform(self.weight, self.key_dim)

    def _attend(self, query, key, value, mask, return_weights):
        return F.general_attention(
            query, key, value, self.weight, mask, return_weights=return_weights
        )

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}"
