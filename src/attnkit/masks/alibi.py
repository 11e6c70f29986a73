"""ALiBi (Press et al., "Train short, test long") as a score-bias mask, and the paper's slopes.

One implementation serves ``masks.alibi(slope)`` (one slope) and ``nn.ALiBi(num_heads)``
(per-head slopes; ``nn.ALiBiMask`` is this class)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import checks
from attnkit.masks.base import Mask
from attnkit.masks.blocks import FULL, offset

__all__ = ["ALiBi", "alibi", "alibi_slopes"]

_F64_MAX = torch.finfo(torch.float64).max


class ALiBi(Mask):
    """ALiBi as a mask: every key allowed, score bias
    ``bias[h, i, j] = -slopes[h] * |j - (i + Lk - Lq)|``, bottom-right aligned (the last query
    lines up with the last key, as when decoding with a KV cache).

    Args:
        slopes: one finite number (the same bias for every head; batch_shape ()) or a 1-d
            tensor / sequence (H,) of finite per-head slopes (batch_shape (1, H): the head dim
            is the second dim of (B, H, Lq, d) inputs; see :func:`alibi_slopes`).

    The bias is computed in float64 and saturates at -+finfo(float64).max; a backend casting it
    to its compute dtype saturates at that dtype's largest value (``bias_tile(..., dtype=)``),
    so a huge slope such as 1e300 never turns into -inf ("not allowed", policy P5). Combine
    with ``&``: ``ALiBi(alibi_slopes(8)) & causal("bottom_right")`` for a decoder.
    """

    has_bias = True
    alignment = "bottom_right"

    def __init__(self, slopes: float | Tensor | list[float]) -> None:
        if isinstance(slopes, (Tensor, list, tuple)) or getattr(slopes, "ndim", 0) > 0:
            try:
                t = torch.as_tensor(slopes).detach()
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(
                    f"slopes: expected numbers, got {checks.show(slopes)} ({e})"
                ) from None
            if t.dtype == torch.bool or t.is_complex():
                raise TypeError(f"slopes: expected real numbers, got dtype {t.dtype}")
            if t.dim() != 1 or t.numel() < 1:
                raise ValueError(f"slopes: expected a 1-d tensor (H,), got shape {tuple(t.shape)}")
            t = t.to(device="cpu", dtype=torch.float64)
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"slopes: expected finite values, got {checks.show(t.tolist())}")
            self.slopes = t.clone()
            self.batch_shape = (1, int(t.shape[0]))
        else:
            s = checks.finite_float("slopes", slopes)
            self.slopes = torch.tensor(s, dtype=torch.float64, device="cpu")
            self.batch_shape = ()

    @property
    def slope(self) -> float | None:
        """The single slope, or None for per-head slopes."""
        return None if self.batch_shape else float(self.slopes)

    @property
    def num_heads(self) -> int | None:
        """H for per-head slopes, else None."""
        return self.batch_shape[1] if self.batch_shape else None

    def _allowed(self, qi, kj, q_len, kv_len):
        return torch.ones((qi.shape[0], kj.shape[1]), dtype=torch.bool, device="cpu")

    def _bias(self, qi, kj, q_len, kv_len):
        d = (kj - (qi + offset(self.alignment, q_len, kv_len))).abs().to(torch.float64)
        s = self.slopes[None, :, None, None] if self.batch_shape else self.slopes
        return (-s * d).clamp(-_F64_MAX, _F64_MAX)

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        return torch.full((nq, nk), FULL, dtype=torch.int8, device="cpu")  # every key allowed

    def _repr_fields(self):
        if self.batch_shape:
            return {"num_heads": self.batch_shape[1]}
        return {"slope": self.slope}


def alibi(slope: float) -> ALiBi:
    """ALiBi with one slope for every head: ``bias[i, j] = -slope * |j - (i + Lk - Lq)|``
    (bottom-right aligned when Lq != Lk); every key stays allowed. ``slope`` is any finite
    number (the bias saturates instead of overflowing, see :class:`ALiBi`). For the paper's
    per-head slopes use ``ALiBi(alibi_slopes(H))`` or ``attnkit.nn.ALiBi(H)``.
    ``alibi(1)`` on 3 x 4 (the bias; the allowed grid is all ones)::

        -1  0 -1 -2
        -2 -1  0 -1
        -3 -2 -1  0
    """
    return ALiBi(checks.finite_float("slope", slope))


def alibi_slopes(num_heads: int) -> Tensor:
    """The ALiBi head slopes of Press et al.: (num_heads,) float64, 2^(-8 k / n) for k = 1..n
    (with the paper's interleaving when n is not a power of two)."""
    num_heads = checks.positive_int("num_heads", num_heads)

    def pow2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        s = pow2(num_heads)
    else:
        c = 2 ** math.floor(math.log2(num_heads))
        s = pow2(c) + pow2(2 * c)[0::2][: num_heads - c]
    return torch.tensor(s, dtype=torch.float64, device="cpu")
