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
from attnkit.masks import Mask

__all__ = ["AttentionFn", "default_attention"]

AttentionFn = Callable[..., tuple[Tensor, Tensor | None]]
"""``attention_fn(q, k, v, mask, *, dropout_p, return_weights) -> (out, weights | None)``:
q (B, H, Lq, d), k and v (B, G, Lk, d) with G dividing H (query head h reads key/value head
h // (H / G)); ``mask`` None, a mask object or a tensor broadcastable to (B, H, Lq, Lk), already
checked by the module (True = may attend; Lk counts the cached keys); ``dropout_p`` the dropout
on the weights (0.0 in eval mode); returns out (B, H, Lq, d) and, when ``return_weights``, the
weights (B, H, Lq, Lk) (else None). A module built with ``softcap`` or ``sinks`` also passes
``softcap=c`` (float) and ``sinks=`` its (H,) parameter, as
:func:`attnkit.functional.scaled_dot_product_attention` takes them."""


def default_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The default ``attention_fn`` (shapes in :data:`AttentionFn`):
    :func:`attnkit.functional.grouped_query_attention` (scale 1/sqrt(d), the fastest backend;
    k and v reach a backend that declares ``supports_gqa``, such as ``dense`` with SDPA's
    ``enable_gqa``, with their G heads, uncopied); with G = H it calls
    :func:`~attnkit.functional.scaled_dot_product_attention` directly. Both remember their
    checks and choice per call signature. ``softcap`` and ``sinks`` (H,): as in those
    functions."""
    grouped = k.shape[-3] != q.shape[-3]
    fn = functional.grouped_query_attention if grouped else functional.scaled_dot_product_attention
    kw = dict(dropout_p=dropout_p, return_weights=return_weights, softcap=softcap, sinks=sinks)
    res = fn(q, k, v, mask, **kw)
    return res if return_weights else (res, None)
