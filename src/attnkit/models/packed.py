"""Packed inputs of the token models: per-token document ids and position ids (B, L), checked
and turned into positions that restart at every document.

Several sequences share one row; ``doc_ids`` says which sequence each token belongs to (the
models build :class:`attnkit.masks.Document` masks from them, so attention never crosses a
sequence) and ``position_ids`` where it stands inside its sequence (sinusoidal positions are
looked up per token instead of per column).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit.masks import causal, document, from_key_padding_mask
from attnkit.nn.positional import SinusoidalPositionalEncoding

__all__ = [
    "check_ids",
    "embed_at",
    "forward_packed",
    "positions_from_docs",
    "set_attention_dropout",
]


def check_ids(name: str, x: object, like: Tensor, like_name: str) -> Tensor:
    """``x`` an integer tensor of ``like``'s shape (B, L) with values >= 0 (TypeError /
    ValueError naming ``name`` otherwise)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of ints, got {type(x).__name__}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor, got dtype {x.dtype}")
    if x.shape != like.shape:
        raise ValueError(
            f"{name}: expected the shape of {like_name} {tuple(like.shape)}, got {tuple(x.shape)}"
        )
    if x.device != like.device:
        raise ValueError(f"{name}: expected device {like.device} like {like_name}, got {x.device}")
    if int(x.min()) < 0:
        raise ValueError(f"{name}: expected values >= 0, got {int(x.min())}")
    return x.to(torch.long)


def set_attention_dropout(model: nn.Module, p: float | None) -> None:
    """Dropout ``p`` on the attention weights of every attention module of ``model`` (None:
    leave them as built). With p = 0 the structured-mask kernels (``blocksparse``, which has no
    dropout) serve training calls too; other dropouts (embeddings, residuals, feed-forward)
    are unchanged."""
    from attnkit.nn.attention import MultiHeadAttention

    if p is None:
        return
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.dropout = p


def positions_from_docs(doc_ids: Tensor) -> Tensor:
    """(B, L) position of each token inside its run of equal document ids (0 where a run
    starts): ``[[0, 0, 0, 1, 1, 2]] -> [[0, 1, 2, 0, 1, 0]]``."""
    b, length = doc_ids.shape
    idx = torch.arange(length, device=doc_ids.device).expand(b, length)
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


def embed_at(positional: SinusoidalPositionalEncoding, x: Tensor, position_ids: Tensor) -> Tensor:
    """x (B, L, E) + the sinusoidal rows of ``position_ids`` (B, L), then the module's dropout:
    the same values as ``positional(x, offset)`` when the ids are offset, offset + 1, ..."""
    table = positional.table(int(position_ids.max()) + 1, like=x)
    return positional.dropout(x + table[position_ids])


def forward_packed(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    src_lengths: Tensor | None,
    sdoc: Tensor | None,
    tdoc: Tensor | None,
    spos: Tensor | None,
    tpos: Tensor | None,
) -> Tensor:
    """:meth:`Seq2SeqTransformer.forward <attnkit.models.seq2seq.Seq2SeqTransformer.forward>`
    with document ids (sdoc (B, S), tdoc (B, T)) and / or position ids (spos, tpos): logits
    (B, T, V). ``src`` and ``tgt`` are already checked."""
    if (sdoc is None) != (tdoc is None):
        given, missing = ("src", "tgt") if tdoc is None else ("tgt", "src")
        raise ValueError(f"{missing}_doc_ids: expected with {given}_doc_ids (packed rows)")
    if sdoc is not None and src_lengths is not None:
        raise ValueError("src_lengths: packed rows (src_doc_ids) take no src_lengths")
    if sdoc is not None:
        sdoc = check_ids("src_doc_ids", sdoc, src, "src")
        tdoc = check_ids("tgt_doc_ids", tdoc, tgt, "tgt")
    spos = None if spos is None else check_ids("src_position_ids", spos, src, "src")
    tpos = None if tpos is None else check_ids("tgt_position_ids", tpos, tgt, "tgt")
    if sdoc is None:  # positions only: the usual masks
        src_mask = model.source_mask(src, src_lengths)
        tgt_mask = causal() & from_key_padding_mask(tgt == model.config.pad_id)
        cross = src_mask
    else:
        spos = positions_from_docs(sdoc) if spos is None else spos
        tpos = positions_from_docs(tdoc) if tpos is None else tpos
        src_mask, tgt_mask = document(sdoc), document(tdoc) & causal()
        cross = document(tdoc, sdoc)
    x = model.src_embed(src) * math.sqrt(model.config.d_model)
    x = model.positional(x) if spos is None else embed_at(model.positional, x, spos)
    memory = model.transformer.encode(x, src_mask)
    y = model.tgt_embed(tgt) * math.sqrt(model.config.d_model)
    y = model.positional(y) if tpos is None else embed_at(model.positional, y, tpos)
    return model.generator(model.transformer.decode(y, memory, tgt_mask, cross))
