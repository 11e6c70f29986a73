"""Evaluation: held-out loss, exact match (synthetic tasks), perplexity (lm); and the decoding
helpers ``translate`` and ``continue_text`` the CLI uses. BLEU, chrF and TER are in
:mod:`attnkit.train.inference.scoring`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from attnkit.train.data import tokenizer as tk
from attnkit.train.data.batches import batch_logits, pad
from attnkit.train.data.packing import PackSpec
from attnkit.train.data.tasks import lm_sequences, lm_stream, lm_windows, seq2seq_example
from attnkit.train.loss import token_cross_entropy

__all__ = [
    "continue_text",
    "exact_match",
    "heldout_loss",
    "perplexity",
    "translate",
    "translate_nbest",
]


@torch.no_grad()
def heldout_loss(
    model, kind: str, examples: list, batch_size: int = 64, pack: PackSpec | None = None
) -> float:
    """Mean NLL per target token (nats, no label smoothing, summed in float64) of ``examples``
    (model in eval), ``batch_size`` examples at a time; with ``pack``, each batch packed into
    rows of ``pack.max_len`` (document masks, positions restarting per sequence), as training
    packs them."""
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        logits, y = batch_logits(model, kind, examples[i : i + batch_size], pack)
        s, n = token_cross_entropy(logits, y, pad_id=tk.PAD, dtype=torch.float64)
        total, count = total + float(s), count + n
    return total / max(count, 1)


@torch.no_grad()
def translate(
    model,
    tok: Tokenizer,
    sources: list[str],
    beam: int = 1,
    length_penalty: float = 0.0,
    max_len: int | None = None,
    batch_size: int = 64,
) -> list[str]:
    """Detokenized outputs of a Seq2SeqTransformer for ``sources`` (greedy when beam == 1).
    ``max_len`` defaults to 2 × the longest source + 10 tokens."""
    out = []
    for i in range(0, len(sources), batch_size):
        chunk = [seq2seq_example(tok, s, "")[0] for s in sources[i : i + batch_size]]
        src = pad(chunk)
        limit = max_len or 2 * src.shape[1] + 10
        if beam == 1:
            ids = model.greedy_decode(src, max_len=limit)
        else:
            ids, _ = model.beam_search(src, beam, limit, length_penalty=length_penalty)
        out += [tk.decode(tok, row.tolist()) for row in ids]
    return out


@torch.no_grad()
def translate_nbest(
    model,
    tok: Tokenizer,
    sources: list[str],
    beam: int,
    n_best: int,
    length_penalty: float = 0.0,
    max_len: int | None = None,
    batch_size: int = 64,
) -> list[list[tuple[str, float]]]:
    """The ``n_best`` best beam-search hypotheses of each source, best first, as (detokenized
    text, score = sum of log-probabilities / length ** ``length_penalty``); fewer when the beam
    holds fewer finished hypotheses. ValueError when ``n_best`` exceeds ``beam``."""
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best: expected an int in [1, beam={beam}], got {n_best}")
    out = []
    for i in range(0, len(sources), batch_size):
        chunk = [seq2seq_example(tok, s, "")[0] for s in sources[i : i + batch_size]]
        src = pad(chunk)
        limit = max_len or 2 * src.shape[1] + 10
        ids, scores = model.beam_search(
            src, beam, limit, length_penalty=length_penalty, return_all=True
        )
        for rows, row_scores in zip(ids, scores):  # (K, T), (K,)
            hyps = [
                (tk.decode(tok, r.tolist()), float(sc))
                for r, sc in zip(rows, row_scores)
                if math.isfinite(float(sc))
            ]
            out.append(hyps[:n_best])
    return out


def exact_match(hyps: list[str], refs: Sequence[str | Sequence[str]]) -> float:
    """Fraction of outputs equal to their reference, or to one of their references when an
    entry of ``refs`` is a sequence of them (after stripping spaces at both ends)."""
    if len(hyps) != len(refs) or not refs:
        raise ValueError(f"refs: expected {len(hyps)} references, got {len(refs)}")
    hits = 0
    for h, r in zip(hyps, refs):
        options = [r] if isinstance(r, str) else r
        hits += h.strip() in {x.strip() for x in options}
    return hits / len(refs)


@torch.no_grad()
def perplexity(model, tok: Tokenizer, lines: list[str], block: int, packed: bool = False) -> float:
    """exp(mean NLL per token) of ``lines`` (joined by [EOS]) in windows of ``block`` tokens,
    each window predicted from its own start (non-overlapping); ``packed`` (a model trained
    with ``--pack``): each line on its own (its ids + [EOS], cut every ``block`` tokens), packed
    into rows of ``block`` with document masks, as that model was trained."""
    if packed:
        seqs = [(p,) for line in lines for p in lm_sequences(tok, line, block)]
        seqs = [s for s in seqs if len(s[0]) >= 2]
        if not seqs:
            raise ValueError("lines: no tokens to score")
        return math.exp(heldout_loss(model, "lm", seqs, pack=PackSpec(block, 1)))
    windows = lm_windows(lm_stream(tok, lines), block, block)
    if not windows:
        raise ValueError("lines: no tokens to score")
    return math.exp(heldout_loss(model, "lm", [(w,) for w in windows]))


@torch.no_grad()
def continue_text(
    model,
    tok: Tokenizer,
    prompt: str,
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """The lm's continuation of ``prompt`` (detokenized, without the prompt)."""
    ids = tk.encode(tok, prompt)
    if not ids:
        raise ValueError(f"prompt: {prompt!r} has no tokens")
    device = next(model.parameters()).device  # the sampler draws where the model runs
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(
        torch.tensor([ids], device=device),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        generator=gen,
    )
    return tk.decode(tok, out[0].tolist())
