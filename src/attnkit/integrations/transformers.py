"""attnkit inside HuggingFace transformers: ``attn_implementation="attnkit"``.

Usage::

    import attnkit.integrations.transformers as ak_hf
    ak_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attnkit")
    # or, for a model already built: model.set_attn_implementation("attnkit")

:func:`register` adds two functions under one name (default ``"attnkit"``):

- an attention function (``transformers.AttentionInterface``) that runs
  :func:`attnkit.functional.grouped_query_attention`: grouped-query heads (k and v are not
  repeated per query head when decoding one token), the model's scaling, dropout in training,
  the KV cache (keys cached before the new queries: bottom-right causal alignment), T5's
  relative position bias (a float mask whose gradient reaches the bias embedding), and the
  attention weights when the caller asks for ``output_attentions`` (the same weights as
  ``"eager"``, before dropout, subject to attnkit's weights limit), Gemma 2's attention-logit
  softcapping (``softcap``) and gpt-oss's attention sinks (``s_aux``). Features attnkit cannot
  serve (head masks) raise :class:`UnsupportedFeatureError` naming the model and the feature:
  never a silent fallback.
- a mask function (``transformers.masking_utils.AttentionMaskInterface``) that returns attnkit
  mask objects instead of dense (B, 1, Lq, Lk) tensors: causal, sliding windows, padding,
  packed sequences (``position_ids`` restarts), bidirectional encoders and their combinations
  are recovered from transformers' mask functions (see :mod:`attnkit.integrations.hf_masks`),
  so the block-sparse kernel skips what a window or a document boundary masks. A mask function
  attnkit does not recognise is evaluated exactly (``attnkit.masks.Predicate``, block map cached
  per shape) with a one-time :class:`UnrecognisedMaskWarning`.

Rows with no allowed key (left-padding positions under a causal mask) give output 0, where
``"eager"`` averages every value; real tokens never attend to them, so their outputs agree.

transformers is imported when a function of this module is first called, never by the rest of
attnkit. It is checked then (:mod:`attnkit.integrations.versions`): a transformers without a
feature the integration needs raises :class:`UnsupportedTransformersError` naming the installed
version and the tested range (:func:`tested_range`); one newer than the tested range warns once
(:class:`UntestedTransformersWarning`) and goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnkit.integrations.versions import (
    UnsupportedTransformersError,
    UntestedTransformersWarning,
    tested_range,
)

if TYPE_CHECKING:  # real imports happen on first use (see __getattr__)
    from attnkit.integrations.hf_attention_forward import (
        UnsupportedFeatureError,
        attention_forward,
        mask_function,
    )
    from attnkit.integrations.hf_masks import HFMask, UnrecognisedMaskWarning

__all__ = [
    "NAME",
    "HFMask",
    "UnrecognisedMaskWarning",
    "UnsupportedFeatureError",
    "UnsupportedTransformersError",
    "UntestedTransformersWarning",
    "attention_forward",
    "is_registered",
    "mask_function",
    "register",
    "tested_range",
]

NAME = "attnkit"
"""The default ``attn_implementation`` name."""


_BUILTIN = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise ImportError(
            "attnkit.integrations.transformers needs HuggingFace transformers: "
            "pip install 'attnkit[hf]'"
        ) from e
    from attnkit.integrations.versions import check_transformers

    check_transformers(transformers)
    return transformers


def register(name: str = NAME, backend: str = "auto") -> str:
    """Register attnkit's attention and mask functions with transformers under ``name``
    (``AttentionInterface`` and ``AttentionMaskInterface``, library-wide); return ``name``.

    ``backend``: ``"auto"`` (attnkit's dispatch chooses per call, see
    :func:`attnkit.functional.explain_dispatch`) or a backend name to force (e.g.
    ``register("attnkit-dense", backend="dense")``); a forced backend that cannot serve a call
    raises ValueError with its reasons.

    Afterwards ``from_pretrained(..., attn_implementation=name)``, ``from_config(cfg,
    attn_implementation=name)`` and ``model.set_attn_implementation(name)`` use attnkit.
    Calling it again is harmless."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, got {type(name).__name__}")
    if not name or "|" in name or name in _BUILTIN:
        raise ValueError(
            f"name: expected a new attention implementation name (not one of {_BUILTIN}, "
            f"no '|'), got {name!r}"
        )
    from attnkit.kernels.dispatch import check_backend_name

    backend = check_backend_name(backend)
    transformers = _require_transformers()
    from transformers.masking_utils import AttentionMaskInterface

    from attnkit.integrations import hf_attention_forward

    fn = hf_attention_forward.make_attention_forward(backend)
    transformers.AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, hf_attention_forward.mask_function)
    return name


def is_registered(name: str = NAME) -> bool:
    """True when ``name`` is registered with transformers' attention and mask interfaces."""
    transformers = _require_transformers()
    from transformers.masking_utils import AttentionMaskInterface

    return (
        name in transformers.AttentionInterface._global_mapping
        and name in AttentionMaskInterface._global_mapping
    )


def __getattr__(attr: str) -> Any:
    """Lazy access to the functions and errors (importing transformers on first use)."""
    if attr in ("attention_forward", "mask_function", "UnsupportedFeatureError"):
        _require_transformers()
        from attnkit.integrations import hf_attention_forward

        return getattr(hf_attention_forward, attr)
    if attr in ("UnrecognisedMaskWarning", "HFMask"):
        _require_transformers()
        from attnkit.integrations import hf_masks

        return getattr(hf_masks, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
