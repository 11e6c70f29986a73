"""Greedy (or sampled) and beam search with a KV cache, for any model behind a small protocol.

A model exposes decoding through a :class:`Stepper`: an object that takes the next tokens of
every row, returns their logits and remembers them in its cache, and can reorder its rows (beam
search). :class:`~attnkit.models.seq2seq.Seq2SeqTransformer` (``model.stepper(src)``) and
:class:`~attnkit.models.lm.TransformerLM` (``model.stepper(rows)``) both provide one, so the
same functions decode an encoder–decoder and a decoder-only model.

Shape legend
------------
``B``  sequences decoded     ``K``  beam size     ``N``  rows of the stepper (B, or B*K for beams)
``P``  prefix length (bos, or a prompt)           ``T``  generated tokens      ``V``  vocabulary

Rows of a beam stepper are grouped by sequence: rows ``b*K .. b*K + K - 1`` belong to
sequence ``b``. Generated tokens never include the prefix; after ``eos_id`` a row holds ``pad_id``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from attnkit.checks import finite_float, positive_int

__all__ = ["Stepper", "beam_search", "greedy_search", "mask_banned"]


class Stepper(Protocol):
    """What the decoding functions need from a model (one decoding session)."""

    def step(self, tokens: Tensor) -> Tensor:
        """The next tokens (N, T) of every row -> logits (N, T, V); appends them to the cache."""
        ...

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N,) of the cache, in that order (beam search)."""
        ...


def mask_banned(logits: Tensor, banned: Sequence[int]) -> Tensor:
    """A copy of logits (..., V) with -inf at the ``banned`` ids (tokens never generated)."""
    logits = logits.clone()
    for i in banned:
        logits[..., i] = -math.inf
    return logits


def _check_prefix(prefix: object) -> Tensor:
    if not isinstance(prefix, Tensor) or prefix.dim() != 2 or 0 in prefix.shape:
        shape = tuple(prefix.shape) if isinstance(prefix, Tensor) else type(prefix).__name__
        raise ValueError(f"prefix: expected a non-empty integer tensor (B, P), got {shape}")
    if prefix.is_floating_point() or prefix.dtype == torch.bool:
        raise TypeError(f"prefix: expected integer token ids, got dtype {prefix.dtype}")
    return prefix


def _sample(logits: Tensor, temperature: float, top_k: int | None, gen) -> Tensor:
    """Next ids (N,) from logits (N, V): argmax when temperature == 0, else a sample of
    softmax(logits / temperature) restricted to the top_k ids."""
    if temperature == 0.0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits.double(), dim=-1)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


@torch.no_grad()
def greedy_search(
    stepper: Stepper,
    prefix: Tensor,
    max_new_tokens: int,
    *,
    eos_id: int | None,
    pad_id: int,
    banned: Sequence[int] = (),
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Greedy decoding (or sampling) with the stepper's KV cache.

    Args:
        stepper: a fresh :class:`Stepper` of B rows.
        prefix: (B, P) ids fed first (the bos column, or a prompt).
        max_new_tokens: T_max >= 1 tokens at most.
        eos_id: a row ends after generating it (None: rows end only at T_max).
        pad_id: written after a row's eos.
        banned: ids never generated (e.g. pad and bos).
        temperature: 0 = argmax; > 0 samples from softmax(logits / temperature).
        top_k: sample only among the k most likely ids (None = all).
        generator: torch.Generator for sampling (None: the global one).
    Returns:
        (B, T) generated ids, T <= max_new_tokens; stops when every row has ended.
    """
    prefix = _check_prefix(prefix)
    positive_int("max_new_tokens", max_new_tokens)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature: expected a number, got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: expected a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        positive_int("top_k", top_k)
    b = prefix.shape[0]
    done = torch.zeros(b, dtype=torch.bool, device=prefix.device)
    token, out = prefix, []
    for _ in range(max_new_tokens):
        logits = mask_banned(stepper.step(token)[:, -1], banned)
        nxt = _sample(logits, float(temperature), top_k, generator)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out.append(nxt)
        if eos_id is not None:
            done = done | (nxt == eos_id)
        if bool(done.all()):
            break
        token = nxt[:, None]
    return torch.stack(out, dim=1)


@torch.no_grad()
def beam_search(
    stepper: Stepper,
    prefix: Tensor,
    beam_size: int,
    max_new_tokens: int,
    *,
    eos_id: int | None,
    pad_id: int,
    banned: Sequence[int] = (),
    length_penalty: float = 0.0,
    return_all: bool = False,
) -> tuple[Tensor, Tensor]:
    """Beam search with the stepper's KV cache (reordered as beams are chosen).

    A hypothesis ends at ``eos_id`` or after ``max_new_tokens`` tokens; the best one per sequence
    maximises ``sum(log p) / len ** length_penalty`` (len counts the eos; 0 = the plain sum).
    ``banned`` ids are never generated. With ``beam_size`` at least the number of possible
    hypotheses the search is exhaustive.

    Args:
        stepper: a fresh :class:`Stepper` of B*K rows (K = beam_size), grouped by sequence.
        prefix: (B, P) ids fed first to every beam of a sequence.
    Returns:
        (tokens (B, T), padded with pad_id after eos; scores (B,) normalised); with
        ``return_all`` tokens (B, K, T) and scores (B, K), best first (a slot with score -inf
        holds no hypothesis: fewer than K exist).
    """
    prefix = _check_prefix(prefix)
    positive_int("beam_size", beam_size)
    positive_int("max_new_tokens", max_new_tokens)
    finite_float("length_penalty", length_penalty)
    b, k, dev = prefix.shape[0], beam_size, prefix.device
    # only beam 0 is live at the start, so the first step expands one hypothesis
    scores: Tensor | None = None  # (B, K), in the logits' dtype
    done = torch.zeros(b, k, dtype=torch.bool, device=dev)
    lens = torch.zeros(b, k, dtype=torch.long, device=dev)
    seqs = torch.empty(b, k, 0, dtype=torch.long, device=dev)
    token = prefix.repeat_interleave(k, dim=0)
    base = (torch.arange(b, device=dev) * k)[:, None]
    for _ in range(max_new_tokens):
        logits = mask_banned(stepper.step(token)[:, -1], banned)
        logp = torch.log_softmax(logits, dim=-1).view(b, k, -1)
        if scores is None:
            scores = torch.full((b, k), -math.inf, dtype=logp.dtype, device=dev)
            scores[:, 0] = 0.0
        v = logp.shape[-1]
        # a finished hypothesis continues only with pad_id, at no cost
        pad_only = torch.full_like(logp[0, 0], -math.inf)
        pad_only[pad_id] = 0.0
        logp = torch.where(done[..., None], pad_only, logp)
        cand = (scores[..., None] + logp).view(b, k * v)
        scores, idx = cand.topk(k, dim=-1)  # (B, K)
        beam, tok = idx // v, idx % v
        seqs = torch.cat(
            [seqs.gather(1, beam[..., None].expand(-1, -1, seqs.shape[-1])), tok[..., None]],
            dim=-1,
        )
        was_done = done.gather(1, beam)
        lens = lens.gather(1, beam) + (~was_done).long()
        # a slot with score -inf holds no hypothesis (fewer than K exist): count it as done
        done = was_done | (scores == -math.inf)
        if eos_id is not None:
            done = done | (tok == eos_id)
        stepper.reorder((base + beam).view(-1))
        if bool(done.all()):
            break
        token = tok.view(b * k, 1)
    lens = lens.masked_fill(scores == -math.inf, 0)
    norm = scores / lens.clamp_min(1).to(scores.dtype) ** float(length_penalty)
    order = norm.argsort(dim=-1, descending=True, stable=True)  # (B, K)
    norm, lens = norm.gather(1, order), lens.gather(1, order)
    seqs = seqs.gather(1, order[..., None].expand(-1, -1, seqs.shape[-1]))
    seqs = seqs.masked_fill(torch.arange(seqs.shape[-1], device=dev) >= lens[..., None], pad_id)
    if return_all:
        return seqs[..., : int(lens.max())], norm
    return seqs[:, 0, : int(lens[:, 0].max())], norm[:, 0]
