"""Positional information: sinusoidal and learned position encodings, rotary embeddings (RoPE)
and ALiBi score biases.

Shape legend
------------
``B``  batch     ``L``  sequence length     ``E``  model width (d_model)
``H``  heads     ``d``  head width          ``Lq`` / ``Lk``  query / key lengths

Positions start at ``offset`` (0 by default): when decoding one token at a time with a cache,
pass the number of positions already seen so the new token gets its true position.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit import checks, tensor_checks
from attnkit.masks import ALiBi as ALiBiMask
from attnkit.masks import alibi_slopes
from attnkit.nn.dropout import Dropout

__all__ = [
    "ALiBi",
    "ALiBiMask",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "apply_rotary",
    "rotate_half",
    "sinusoidal_table",
]


def _check_input(name: str, x: object, width: int, what: str, like: Tensor | None = None) -> Tensor:
    """``x`` a floating tensor (..., width); with ``like``, of its dtype and device."""
    x = tensor_checks.floating_tensor(name, x)
    if x.dim() < 2 or x.shape[-1] != width:
        raise ValueError(
            f"{name}: expected shape {what} with last dim {width}, got {tuple(x.shape)}"
        )
    if like is not None:
        tensor_checks.like(name, x, like, "the parameters")
    return x


# ---------------------------------------------------------------------------------------------
# sinusoidal (Vaswani et al., seed 003)
# ---------------------------------------------------------------------------------------------
def sinusoidal_table(
    length: int,
    d_model: int,
    offset: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Sinusoidal positions (length, d_model) for positions ``offset .. offset + length - 1``.

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d_model))``,
    ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))``; computed in float64, then cast.
    An odd ``d_model`` has one more sine column than cosine columns.
    """
    length = checks.nonnegative_int("length", length)
    d_model = checks.positive_int("d_model", d_model)
    offset = checks.nonnegative_int("offset", offset)
    dtype = tensor_checks.float_dtype("dtype", dtype, allow_none=False)
    device = tensor_checks.device("device", device)
    pos = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), two_i / d_model)
    pe = torch.empty(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype=dtype, device=device)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal positions of Vaswani et al. (seed 003) to its input, then
    applies dropout.

    The table is a non-persistent buffer (not in ``state_dict``) of ``max_len`` rows; a longer
    input (or a larger ``offset``) extends it on demand, and it is rebuilt in the input's dtype
    and device when they differ (or when ``.to()`` / ``.double()`` converted it), so float64
    inputs get float64-accurate positions.

    Args:
        d_model: E, width of the inputs.
        max_len: rows built up front.
        dropout: dropout probability applied after the addition.
    """

    pe: Tensor

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = checks.positive_int("d_model", d_model)
        checks.positive_int("max_len", max_len)
        self.dropout = Dropout(checks.probability("dropout", dropout))
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)
        self._built_dtype = self.pe.dtype  # .double() on a float32 table would only upcast it

    def table(self, length: int, offset: int = 0, like: Tensor | None = None) -> Tensor:
        """Rows ``offset .. offset + length - 1`` of the table: (length, E), in ``like``'s dtype
        and device when given."""
        length = checks.nonnegative_int("length", length)
        offset = checks.nonnegative_int("offset", offset)
        need = offset + length
        dtype = self.pe.dtype if like is None else like.dtype
        device = self.pe.device if like is None else like.device
        stale = self.pe.dtype != self._built_dtype  # converted by .to() / .double() / .half()
        if need > self.pe.shape[0] or stale or self.pe.dtype != dtype or self.pe.device != device:
            rows = self.pe.shape[0] if need <= self.pe.shape[0] else max(need, 2 * self.pe.shape[0])
            self.pe = sinusoidal_table(rows, self.d_model, dtype=dtype, device=device)
            self._built_dtype = dtype
        return self.pe[offset:need]

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (..., L, E) -> x + PE[offset : offset + L], (..., L, E)."""
        _check_input("x", x, self.d_model, "(..., L, d_model)")
        return self.dropout(x + self.table(x.shape[-2], offset, like=x))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.pe.shape[0]}"


# ---------------------------------------------------------------------------------------------
# learned
# ---------------------------------------------------------------------------------------------
class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned embedding per position (``max_len`` positions, normal init, std 0.02).

    Args:
        max_len: number of positions that have an embedding; longer inputs raise ValueError.
        d_model: E.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = checks.positive_int("max_len", max_len)
        self.d_model = checks.positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (..., L, E) -> x + weight[offset : offset + L], (..., L, E)."""
        _check_input("x", x, self.d_model, "(..., L, d_model)", like=self.weight)
        offset = checks.nonnegative_int("offset", offset)
        length = x.shape[-2]
        if offset + length > self.max_len:
            raise ValueError(
                f"x: positions {offset}..{offset + length - 1} (offset {offset}, length {length}) "
                f"exceed max_len={self.max_len} of this LearnedPositionalEmbedding"
            )
        return x + self.weight[offset : offset + length]

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


# ---------------------------------------------------------------------------------------------
# rotary (RoPE, Su et al.)
# ---------------------------------------------------------------------------------------------
def rotate_half(x: Tensor) -> Tensor:
    """(..., d) -> (..., d): ``[x1, x2] -> [-x2, x1]``, x1 and x2 the halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin; x (..., L, d), cos and sin (L, d)."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE) applied to queries and keys.

    Convention ("rotate_half", as in GPT-NeoX and Hugging Face Llama): dimension ``i`` of the
    first half and dimension ``i + d/2`` of the second half form a pair rotated by the angle
    ``pos * base^(-2i/d)``, i = 0 .. d/2 - 1. (The original RoFormer pairs adjacent dims
    (2i, 2i+1) instead; the two differ by a fixed permutation of the head dims.) The rotated
    scores ``q_m . k_n`` depend only on ``m - n``. Angles are computed in float64.

    Usage: ``q, k = rope(q, k, q_offset=0, k_offset=0)`` with q (..., Lq, d), k (..., Lk, d),
    usually (B, H, L, d). Query row ``i`` is at position ``q_offset + i``, key row ``j`` at
    ``k_offset + j``. :meth:`rotate` rotates one tensor (e.g. new keys before they go into a cache).

    Args:
        head_dim: d, even.
        base: the frequency base (10000 in the paper).
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        checks.positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim: expected an even int, got {head_dim}")
        base = checks.finite_float("base", base, "a finite number > 1")
        if not base > 1:
            raise ValueError(f"base: expected a finite number > 1, got {base!r}")
        self.head_dim = head_dim
        self.base = float(base)

    def cos_sin(
        self, length: int, offset: int = 0, *, dtype=torch.float32, device=None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin tables, each (length, d), for positions ``offset .. offset + length - 1``
        (computed in float64, then cast to ``dtype``, a floating dtype, on ``device``)."""
        length = checks.nonnegative_int("length", length)
        offset = checks.nonnegative_int("offset", offset)
        dtype = tensor_checks.float_dtype("dtype", dtype, allow_none=False)
        device = tensor_checks.device("device", device)
        half = self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=torch.float64) * 2.0 / self.head_dim)
        pos = torch.arange(offset, offset + length, dtype=torch.float64)
        angle = pos[:, None] * inv_freq[None, :]
        angle = torch.cat((angle, angle), dim=-1)
        return (
            angle.cos().to(dtype=dtype, device=device),
            angle.sin().to(dtype=dtype, device=device),
        )

    def rotate(self, x: Tensor, offset: int = 0, name: str = "x") -> Tensor:
        """Rotate x (..., L, d): row ``i`` by the angles of position ``offset + i``."""
        _check_input(name, x, self.head_dim, "(..., L, head_dim)")
        offset = checks.nonnegative_int(
            name + "_offset" if name in ("q", "k") else "offset", offset
        )
        cos, sin = self.cos_sin(x.shape[-2], offset, dtype=x.dtype, device=x.device)
        return apply_rotary(x, cos, sin)

    def forward(
        self, q: Tensor, k: Tensor, q_offset: int = 0, k_offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        """q (..., Lq, d), k (..., Lk, d) -> rotated (q, k), same shapes."""
        return self.rotate(q, q_offset, "q"), self.rotate(k, k_offset, "k")

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"


# ---------------------------------------------------------------------------------------------
# ALiBi (Press et al.)
# ---------------------------------------------------------------------------------------------
# ``ALiBiMask`` is :class:`attnkit.masks.ALiBi` (one implementation of ALiBi): every key
# allowed, bias ``-slopes[h] * |j - (i + Lk - Lq)|``, batch_shape (1, H) for per-head slopes.


class ALiBi(nn.Module):
    """ALiBi (Press et al., "Train short, test long") for ``num_heads`` heads.

    ``ALiBi(H)()`` (or ``.mask()``) returns an :class:`ALiBiMask` to pass as ``mask=`` to
    attention over (B, H, Lq, d) inputs; it adds ``-slope_h * |i - j|`` to the scores of head h.
    ``slopes``: (H,) float64, the paper's geometric sequence from
    :func:`attnkit.masks.alibi_slopes`.
    """

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        # a plain float64 CPU tensor, not a buffer: masks live on the CPU and .half() or
        # .float() on the model must not round the slopes
        self.slopes = alibi_slopes(num_heads)

    def mask(self) -> ALiBiMask:
        """The score-bias mask (:class:`attnkit.masks.ALiBi`), batch_shape (1, H)."""
        return ALiBiMask(self.slopes)

    def forward(self) -> ALiBiMask:
        return self.mask()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
