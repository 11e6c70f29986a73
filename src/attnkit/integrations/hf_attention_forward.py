"""The attention function and the mask function attnkit registers with transformers (see
:mod:`attnkit.integrations.transformers`; imports transformers, so only that module imports it).

Shape legend (transformers' layout): ``B`` batch, ``H`` query heads, ``G`` key/value heads
(G divides H), ``Lq`` queries, ``Lk`` keys (cached ones included), ``d`` head width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.functional import grouped_query_attention, scaled_dot_product_attention
from attnkit.integrations.hf_masks import HFMask, recover
from attnkit.kernels.dispatch import check_backend_name
from attnkit.masks import Causal, KeyColumns, KeyPadding, Mask, from_tensor

__all__ = [
    "UnsupportedFeatureError",
    "attention_forward",
    "make_attention_forward",
    "mask_function",
]


class UnsupportedFeatureError(ValueError):
    """A model asks attnkit's attention for a feature it cannot serve (the message names the
    model and the feature). attnkit never falls back to another implementation silently."""


REFUSED = {
    "head_mask": "a head mask",
    "layer_head_mask": "a head mask",
}
"""Keyword arguments that change the attention's math and that attnkit refuses when set."""


def _model(module: torch.nn.Module) -> str:
    cfg = getattr(module, "config", None)
    mt = getattr(cfg, "model_type", None)
    return f"{mt} ({type(module).__name__})" if mt else type(module).__name__


def _refuse(module: torch.nn.Module, kwargs: dict) -> None:
    for name, what in REFUSED.items():
        value = kwargs.get(name)
        if value is None:
            continue
        shown = f"{name}={value}" if not isinstance(value, Tensor) else f"{name}=<tensor>"
        raise UnsupportedFeatureError(
            f"attn_implementation='attnkit': model {_model(module)} uses {what} ({shown}), "
            "which attnkit's attention does not support; use attn_implementation='eager' "
            "for this model"
        )


def wants_weights(kwargs: dict) -> bool:
    """True when the caller asked for attention weights: ``output_attentions=True`` in the call
    or in the model config (transformers records them through its output collector)."""
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - older transformers pass output_attentions
        return False
    col = _active_collector.get()
    return bool(col) and any(str(k).endswith("attentions") for k in col)


def _mask_for(module, attention_mask, kwargs, b: int, lq: int, lk: int) -> Mask | Tensor | None:
    """The attnkit mask for scores (B, H, Lq, Lk)."""
    if isinstance(attention_mask, HFMask):
        m = attention_mask
        if (m.q_len, m.kv_len) != (lq, lk) or m.batch not in (1, b):
            raise ValueError(
                f"attention_mask: built for B={m.batch}, Lq={m.q_len}, Lk={m.kv_len} "
                f"({m.structure}), but {_model(module)} attends with B={b}, Lq={lq}, Lk={lk}"
            )
        return m.mask
    if isinstance(attention_mask, Tensor):
        return attention_mask  # a custom 4-D mask the model passed through: bool or additive
    if attention_mask is not None:
        raise TypeError(
            f"attention_mask: expected attnkit's mask, a bool/float tensor or None, got "
            f"{type(attention_mask).__name__} (was the model built with another "
            "attn_implementation's masks?)"
        )
    # No mask at all: the model built none (transformers' sdpa rule: causal when the module is
    # causal and there is more than one query); new queries come after cached keys.
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return Causal("bottom_right") if is_causal and lq > 1 else None


def _with_bias(mask: Mask | Tensor | None, kwargs: dict) -> Mask | Tensor | None:
    """The mask with T5's ``position_bias`` (1 or B, H, Lq, Lk) added to the scores (a float
    mask: its gradient flows back to the relative-position embedding)."""
    pb = kwargs.get("position_bias")
    if pb is None:
        return mask
    if not isinstance(pb, Tensor) or not pb.is_floating_point() or pb.dim() != 4:
        raise TypeError(
            f"position_bias: expected a float (B, H, Lq, Lk) tensor, got "
            f"{getattr(pb, 'shape', type(pb).__name__)}"
        )
    if isinstance(mask, Tensor):
        if mask.dtype == torch.bool:
            return from_tensor(pb) & from_tensor(mask)
        return pb + mask
    return from_tensor(pb) if mask is None else from_tensor(pb) & mask


def _query_free(mask: object) -> bool:
    """True when ``mask`` is the same for every query row: None, key padding / key columns, or
    an intersection of those."""
    if mask is None:
        return True
    if not isinstance(mask, Mask) or mask.has_bias:
        return False
    return all(isinstance(leaf, (KeyPadding, KeyColumns)) for leaf in mask.leaves()) and all(
        type(m).__name__ == "Intersection" for m in _inner_nodes(mask)
    )


def _inner_nodes(mask: Mask) -> list[Mask]:
    out, todo = [], [mask]
    while todo:
        m = todo.pop()
        if m.parts:
            out.append(m)
            todo.extend(m.parts)
    return out


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: HFMask | Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function interface served by attnkit.

    Args:
        module: the model's attention module (for its name, ``is_causal`` and ``training``).
        query: (B, H, Lq, d); key: (B, G, Lk, d); value: (B, G, Lk, dv), G dividing H.
        attention_mask: what attnkit's mask function built (:class:`HFMask`), a custom 4-D
            bool/additive tensor broadcastable to (B, H, Lq, Lk), or None.
        dropout: dropout probability on the weights (the model passes 0 in eval mode).
        scaling: score scale; default 1/sqrt(d).
        kwargs: transformers' extras: ``position_bias`` (1 or B, H, Lq, Lk) is added to the
            scores (T5); ``softcap`` caps the scaled scores (Gemma 2's
            ``attn_logit_softcapping``); ``s_aux`` (or ``sinks``) (H,) are attention sinks
            (gpt-oss); features attnkit cannot serve (head masks) raise
            :class:`UnsupportedFeatureError`; ``output_attentions`` asks for the weights.

    Returns:
        (output (B, Lq, H, dv), weights (B, H, Lq, Lk) when the caller asked for attentions
        (before dropout; subject to attnkit's weights limit) else None).
    """
    return _attend(module, query, key, value, attention_mask, dropout, scaling, "auto", kwargs)


def make_attention_forward(backend: str = "auto") -> Callable:
    """:func:`attention_forward` with attnkit's ``backend`` forced (``"auto"``: attnkit's
    dispatch chooses per call; a name from ``attnkit.kernels.BACKENDS``: that backend, which
    raises ValueError with its reasons for a call it cannot serve)."""
    backend = check_backend_name(backend)
    if backend == "auto":
        return attention_forward

    def attention_forward_forced(module, query, key, value, attention_mask, dropout=0.0,
                                 scaling=None, **kwargs):  # fmt: skip
        return _attend(module, query, key, value, attention_mask, dropout, scaling, backend, kwargs)

    attention_forward_forced.__doc__ = f"attention_forward with backend={backend!r}."
    return attention_forward_forced


def _sinks(kwargs: dict) -> Tensor | None:
    """The attention sinks a model passes (gpt-oss: ``s_aux``; ``sinks`` accepted too)."""
    s = kwargs.get("s_aux")
    return kwargs.get("sinks") if s is None else s


def _attend(module, query, key, value, attention_mask, dropout, scaling, backend, kwargs):
    _refuse(module, kwargs)
    b, h, lq, _ = query.shape
    g, lk = key.shape[-3], key.shape[-2]
    mask = _with_bias(_mask_for(module, attention_mask, kwargs, b, lq, lk), kwargs)
    rw = wants_weights(kwargs)
    softcap, sinks = kwargs.get("softcap"), _sinks(kwargs)
    if sinks is not None and isinstance(sinks, Tensor) and sinks.dtype != query.dtype:
        sinks = sinks.to(query.dtype)  # a float32 parameter in a bf16 model, as eager casts
    options = dict(
        scale=None if scaling is None else float(scaling),
        dropout_p=float(dropout or 0.0),
        return_weights=rw,
        backend=backend,
        softcap=softcap,
    )
    if lq == 1 and g != h and h % g == 0 and _query_free(mask) and sinks is None:
        # one new query (decoding): its H heads become H/G queries of each key/value head,
        # so k and v are read as they are, never repeated (the mask does not depend on the
        # query, so every pseudo-query gets the same row)
        q = query.reshape(b, g, h // g, query.shape[-1])
        res = scaled_dot_product_attention(q, key, value, mask, **options)
        out, weights = res if rw else (res, None)
        out = out.reshape(b, h, 1, out.shape[-1])
        weights = None if weights is None else weights.reshape(b, h, 1, lk)
        return out.transpose(1, 2).contiguous(), weights
    res = grouped_query_attention(query, key, value, mask, sinks=sinks, **options)
    out, weights = res if rw else (res, None)
    return out.transpose(1, 2).contiguous(), weights


def mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: Tensor | None = None,
    **kwargs,
) -> HFMask:
    """transformers' mask-function interface (``AttentionMaskInterface``) served by attnkit:
    the structure of ``mask_function`` ``&`` the 2-D padding ``attention_mask`` (B, >= Lk)
    as an attnkit mask object (see :mod:`attnkit.integrations.hf_masks`), never a dense
    (B, 1, Lq, Lk) tensor. Extra keywords (``dtype``, ``config``, ``use_vmap``, skip flags,
    ``local_size``, ``device``) do not change the mask and are ignored."""
    if mask_function is None:
        from transformers.masking_utils import causal_mask_function as mask_function
    return recover(
        mask_function,
        attention_mask,
        batch_size,
        q_length,
        kv_length,
        int(q_offset),
        int(kv_offset),
    )
