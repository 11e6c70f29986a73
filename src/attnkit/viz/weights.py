"""Attention weights as the pictures take them: one validated grid of layers × heads with its
token lists and panel labels, a model's weights for a text, and atomic file writing.

Used by :mod:`attnkit.viz.heatmap` (PNG / SVG / PDF) and :mod:`attnkit.viz.html` (one offline
HTML file). Shape legend: ``N`` layers, ``H`` heads, ``Lq`` query tokens, ``Lk`` key tokens.

Accepted weights (NumPy arrays, torch tensors, or a sequence of per-layer arrays/tensors):

* ``(Lq, Lk)`` — one head;
* ``(H, Lq, Lk)`` — the heads of one layer;
* ``(N, H, Lq, Lk)`` — layers × heads;
* a sequence of ``N`` per-layer ``(H, Lq, Lk)`` or ``(1, H, Lq, Lk)`` (a batch of one, as in
  ``BertModel(..., output_attentions=True).attentions``).

Weights are finite and in [0, 1] (softmax rows; a fully masked row is all zeros). Rows need not
sum to 1 (a subset of keys, or a masked row).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnkit.checks import show
from attnkit.files import check_writable, write_atomic

__all__ = [
    "AttentionGrid",
    "Seq2SeqAttentions",
    "attention_grid",
    "check_output_path",
    "lm_attentions",
    "model_attentions",
    "seq2seq_attentions",
    "write_atomic",
]

_TOLERANCE = 1e-4  # float16/bfloat16 softmax rows may exceed 1 by a rounding step


@dataclass(frozen=True)
class AttentionGrid:
    """Validated weights ``(N, H, Lq, Lk)`` float32 with ``q_tokens`` (Lq), ``k_tokens`` (Lk),
    ``layer_labels`` (N) and ``head_labels`` (H) as str; ``cross`` is True when separate key
    tokens were given (cross-attention)."""

    weights: np.ndarray
    q_tokens: list[str]
    k_tokens: list[str]
    layer_labels: list[str]
    head_labels: list[str]
    cross: bool

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(N, H, Lq, Lk)."""
        n, h, lq, lk = self.weights.shape
        return n, h, lq, lk


def _to_numpy(name: str, x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        if x.is_complex():
            raise TypeError(f"{name}: expected real weights, got dtype {x.dtype}")
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected floating-point weights, got dtype {x.dtype}")
        return x.detach().cpu().float().numpy()
    if isinstance(x, np.ndarray):
        if x.dtype.kind != "f":
            raise TypeError(f"{name}: expected floating-point weights, got dtype {x.dtype}")
        return x
    raise TypeError(
        f"{name}: expected a NumPy array, a torch tensor or a sequence of them, got "
        f"{type(x).__name__}"
    )


def _stack(name: str, attentions: Any) -> np.ndarray:
    """Any accepted layout -> (N, H, Lq, Lk) float32 (no value checks yet)."""
    if isinstance(attentions, (list, tuple)):
        if not attentions:
            raise ValueError(f"{name}: expected at least one layer, got an empty sequence")
        layers = []
        for i, a in enumerate(attentions):
            a = _to_numpy(f"{name}[{i}]", a)
            if a.ndim == 4 and a.shape[0] == 1:
                a = a[0]
            if a.ndim != 3:
                raise ValueError(
                    f"{name}[{i}]: expected a layer's weights (H, Lq, Lk) or (1, H, Lq, Lk), "
                    f"got shape {tuple(a.shape)}"
                )
            if layers and a.shape != layers[0].shape:
                raise ValueError(
                    f"{name}[{i}]: shape {tuple(a.shape)} differs from {name}[0]'s "
                    f"{tuple(layers[0].shape)}"
                )
            layers.append(a)
        w = np.stack(layers)
    else:
        w = _to_numpy(name, attentions)
        if w.ndim not in (2, 3, 4):
            raise ValueError(
                f"{name}: expected (Lq, Lk), (H, Lq, Lk) or (N, H, Lq, Lk) weights, got shape "
                f"{tuple(w.shape)}"
            )
        w = w.reshape((1,) * (4 - w.ndim) + w.shape)
    if 0 in w.shape:
        raise ValueError(f"{name}: expected non-empty weights, got shape {tuple(w.shape)}")
    return np.ascontiguousarray(w, dtype=np.float32)


def _tokens(name: str, tokens: Any, length: int, axis: str) -> list[str]:
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name}: expected a sequence of str (one per token), got {show(tokens)}")
    out = list(tokens)
    bad = [i for i, t in enumerate(out) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"{name}: expected str tokens, got {show(out[bad[0]])} at index {bad[0]}")
    if len(out) != length:
        raise ValueError(
            f"{name}: expected {length} tokens ({axis} of the weights), got {len(out)}"
        )
    return out


def _labels(name: str, labels: Any, n: int) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise TypeError(f"{name}: expected a sequence of str or int, got {show(labels)}")
    out = list(labels)
    if len(out) != n or not all(isinstance(x, (str, int)) for x in out):
        raise ValueError(f"{name}: expected {n} labels (str or int), got {show(out)}")
    return [str(x) for x in out]


def attention_grid(
    attentions: Any,
    q_tokens: Sequence[str],
    k_tokens: Sequence[str] | None = None,
    *,
    layer_labels: Sequence[str | int] | None = None,
    head_labels: Sequence[str | int] | None = None,
) -> AttentionGrid:
    """Validate weights and tokens (see the module docstring for the accepted shapes).

    Args:
        attentions: (Lq, Lk), (H, Lq, Lk), (N, H, Lq, Lk) or a sequence of per-layer weights.
        q_tokens: Lq query tokens. k_tokens: Lk key tokens (default: ``q_tokens``, then Lq must
            equal Lk).
        layer_labels / head_labels: N / H panel labels (default "0", "1", ...), e.g. the
            original indices of a subset.

    Raises:
        TypeError: a non-float array, tokens that are not str.
        ValueError: a wrong shape, a token count that differs from the weights' axis,
            NaN/inf, or weights outside [0, 1].
    """
    w = _stack("attentions", attentions)
    n, h, lq, lk = w.shape
    q = _tokens("q_tokens", q_tokens, lq, "Lq, the second-to-last axis")
    if k_tokens is None and lq != lk:
        raise ValueError(
            f"k_tokens: the weights have Lq={lq} != Lk={lk} (cross-attention): give the key tokens"
        )
    k = q if k_tokens is None else _tokens("k_tokens", k_tokens, lk, "Lk, the last axis")
    if not np.isfinite(w).all():
        raise ValueError("attentions: expected finite weights, got NaN or inf")
    lo, hi = float(w.min()), float(w.max())
    if lo < 0.0 or hi > 1.0 + _TOLERANCE:
        raise ValueError(f"attentions: expected weights in [0, 1], got values in [{lo}, {hi}]")
    np.clip(w, 0.0, 1.0, out=w)
    return AttentionGrid(
        w,
        q,
        list(k),
        _labels("layer_labels", layer_labels, n),
        _labels("head_labels", head_labels, h),
        k_tokens is not None,
    )


def model_attentions(model: Any, text: str) -> tuple[list[str], Any]:
    """Run a :class:`~attnkit.models.bert.BertModel` on one text: (its tokens (L), the weights
    (N, H, L, L) as a float32 torch tensor). The text is truncated like ``model.tokenize``."""
    import torch

    batch = model.tokenize([text])
    with torch.inference_mode():
        out = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, True)
    return list(batch.tokens[0]), torch.stack([a[0] for a in out.attentions]).float()


@dataclass(frozen=True)
class Seq2SeqAttentions:
    """An encoder-decoder's weights for one source and one target sequence, float32 tensors:
    ``encoder`` (N_enc, H, S, S), ``decoder`` (N_dec, H, T, T) (causal self-attention) and
    ``cross`` (N_dec, H, T, S) (target positions attending to source positions)."""

    encoder: Any
    decoder: Any
    cross: Any


def seq2seq_attentions(model: Any, src: Any, tgt: Any) -> Seq2SeqAttentions:
    """Run a :class:`~attnkit.models.Seq2SeqTransformer` with teacher forcing on ``src`` (1, S)
    and ``tgt`` (1, T) token ids (``tgt`` starts with ``bos_id``, e.g. a generated translation)
    and collect every attention layer's weights.

    Each layer's :class:`~attnkit.nn.MultiHeadAttention` is asked for ``return_weights=True``
    through forward hooks, removed afterwards; the model and its outputs are unchanged.
    """
    import torch

    from attnkit.models.seq2seq import Seq2SeqTransformer

    if not isinstance(model, Seq2SeqTransformer):
        raise TypeError(f"model: expected a Seq2SeqTransformer, got {type(model).__name__}")
    for name, ids in (("src", src), ("tgt", tgt)):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
            got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"{name}: expected token ids of shape (1, L), got {got}")
    t = model.transformer
    modules = {
        "encoder": [layer.self_attn for layer in t.encoder.layers],
        "decoder": [layer.self_attn for layer in t.decoder.layers],
        "cross": [layer.multihead_attn for layer in t.decoder.layers],
    }
    return Seq2SeqAttentions(**_collect(modules, lambda: model(src, tgt)))


def lm_attentions(model: Any, ids: Any) -> Any:
    """Run a :class:`~attnkit.models.lm.TransformerLM` on token ids (1, L) and collect every
    layer's causal self-attention weights: a float32 tensor (N, H, L, L). As
    :func:`seq2seq_attentions`, through forward hooks removed afterwards."""
    import torch

    from attnkit.models.lm import TransformerLM

    if not isinstance(model, TransformerLM):
        raise TypeError(f"model: expected a TransformerLM, got {type(model).__name__}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids: expected token ids of shape (1, L), got {got}")
    modules = {"self": [layer.self_attn for layer in model.layers]}
    return _collect(modules, lambda: model(ids))["self"]


def _collect(modules: dict[str, list], call: Any) -> dict[str, Any]:
    """Run ``call()`` with every attention module of ``modules`` asked for its weights
    (``return_weights=True``, forward hooks): name -> (N, H, Lq, Lk) float32 per group."""
    import torch

    found: dict[int, Any] = {}

    def ask(module, args, kwargs):
        return args, {**kwargs, "return_weights": True}

    def keep(module, args, kwargs, out):
        found[id(module)] = out[1][0].float()  # (H, Lq, Lk) of the batch's one sequence

    hooks = []
    try:
        for group in modules.values():
            for m in group:
                hooks.append(m.register_forward_pre_hook(ask, with_kwargs=True))
                hooks.append(m.register_forward_hook(keep, with_kwargs=True))
        with torch.no_grad():  # (not inference_mode: the returned tensors stay usable anywhere)
            call()
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.stack([found[id(m)] for m in group]) for k, group in modules.items()}


def check_output_path(name: str, path: str | os.PathLike, suffixes: Sequence[str]) -> Path:
    """``path`` as a Path whose suffix (case-insensitive) is one of ``suffixes`` and whose
    directory exists and takes new files — checked before any work. ValueError /
    FileNotFoundError / IsADirectoryError / PermissionError naming ``name``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a file path, got {show(path)}")
    p = Path(path).expanduser()
    if p.suffix.lower() not in suffixes:
        raise ValueError(
            f"{name}: expected a file name ending in {', '.join(suffixes)}, got {str(p)!r}"
        )
    if p.is_dir():
        raise IsADirectoryError(f"{name}: {str(p)!r} is a directory, expected a file name")
    if not p.parent.is_dir():
        raise FileNotFoundError(f"{name}: the directory {str(p.parent)!r} does not exist")
    check_writable(name, p.parent)
    return p
