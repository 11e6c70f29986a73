"""The attention function :class:`~attnkit.nn.attention.MultiHeadAttention` receives (as
Flax's ``attention_fn`` and torchtune's ``MultiHeadAttention`` do): its documented signature
:data:`AttentionFn` and the default, :func:`default_attention`.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads (divides H), ``Lq`` query
length, ``Lk`` key length (cached keys included), ``d`` head width.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from attnkit import functional
from attnkit.kernels import BACKENDS
from attnkit.masks import Mask

__all__ = ["AttentionFn", "default_attention"]

_ANY_GQA = any(getattr(b, "supports_gqa", False) for b in BACKENDS.values())
"""Whether some backend takes grouped k/v heads without copying them (SDPA's enable_gqa)."""

AttentionFn = Callable[..., tuple[Tensor, Tensor | None]]
"""``attention_fn(q, k, v, mask, *, dropout_p, return_weights) -> (out, weights | None)``:
q (B, H, Lq, d), k and v (B, G, Lk, d) with G dividing H (query head h reads key/value head
h // (H / G)); ``mask`` None, a mask object or a tensor broadcastable to (B, H, Lq, Lk), already
checked by the module (True = may attend; Lk counts the cached keys); ``dropout_p`` the dropout
on the weights (0.0 in eval mode); returns out (B, H, Lq, d) and, when ``return_weights``, the
weights (B, H, Lq, Lk) (else None)."""


def default_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    return_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The default ``attention_fn`` (shapes in :data:`AttentionFn`):
    :func:`attnkit.functional.grouped_query_attention` (scale 1/sqrt(d), the fastest backend,
    SDPA's native grouped-query path where it applies); with G = H it calls
    :func:`~attnkit.functional.scaled_dot_product_attention` directly (the same computation,
    which remembers its checks and choice per call signature)."""
    h = q.shape[-3]
    if k.shape[-3] != h and not _ANY_GQA:
        # no backend takes grouped k/v without copies yet: repeat them here so the call goes
        # through scaled_dot_product_attention, which remembers its checks per signature
        k, v = functional.repeat_kv_heads(k, h), functional.repeat_kv_heads(v, h)
    grouped = k.shape[-3] != h
    fn = functional.grouped_query_attention if grouped else functional.scaled_dot_product_attention
    res = fn(q, k, v, mask, dropout_p=dropout_p, return_weights=return_weights)
    return res if return_weights else (res, None)
