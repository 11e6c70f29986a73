"""Scoring a language model on a token stream the way LM papers report it: mean nats per token
over the whole stream, perplexity, and bits per character for a char-level tokenizer; sliding
windows with a stride (transformers' "Perplexity of fixed-length models" guide).

Every token of the stream after the first is scored exactly once. Windows of at most ``block``
input tokens start every ``stride`` tokens (``stride`` at most ``block``; the default
``block`` gives non-overlapping windows, each token predicted from its own window's start, as
training's held-out loss); a window scores only the targets no earlier window scored, so with
a stride S < block every target after the first window sees at least block - S tokens of
context. Sums are in float64.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attnkit.checks import positive_int
from attnkit.train.data.tokenizer import PAD, SPECIALS
from attnkit.train.loss import token_cross_entropy

__all__ = ["StreamScore", "score_stream", "stream_windows", "unigram_nats"]


@dataclass(frozen=True)
class StreamScore:
    """The score of a token stream: ``nats`` summed over ``tokens`` scored tokens,
    ``characters`` of text they cover (None when unknown); ``bits_per_char`` only for
    char-level tokenizers (one token per character), else None."""

    nats: float
    tokens: int
    characters: int | None = None
    char_level: bool = False

    @property
    def nats_per_token(self) -> float:
        """Mean negative log-likelihood per scored token (nats)."""
        return self.nats / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        """exp(nats per token)."""
        return math.exp(self.nats_per_token)

    @property
    def bits_per_char(self) -> float | None:
        """nats per token / ln 2 for a char-level tokenizer (a token is a character)."""
        return self.nats_per_token / math.log(2) if self.char_level else None


def stream_windows(n: int, block: int, stride: int | None = None) -> list[tuple[int, int, int]]:
    """The windows that score a stream of ``n`` >= 2 ids: (start, end, first) with inputs
    ids[start:end] (at most ``block``), targets ids[start + 1 : end + 1], of which the
    positions first..end-1 are scored; together they score every target 1..n-1 once."""
    positive_int("block", block)
    stride = block if stride is None else min(positive_int("stride", stride), block)
    if n < 2:
        raise ValueError(f"ids: expected at least 2 tokens to score, got {n}")
    out, start, done = [], 0, 0
    while True:
        end = min(start + block, n - 1)
        out.append((start, end, max(done, start)))
        done = end
        if end == n - 1:
            return out
        start += stride


@torch.no_grad()
def score_stream(
    model: nn.Module,
    ids: list[int] | np.ndarray,
    block: int,
    stride: int | None = None,
    *,
    batch_size: int = 32,
    characters: int | None = None,
    char_level: bool = False,
) -> StreamScore:
    """Score the stream ``ids`` (a TransformerLM's vocabulary) with :func:`stream_windows`;
    ``batch_size`` windows per forward (model in eval mode for the call)."""
    positive_int("batch_size", batch_size)
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    wins = stream_windows(len(ids_t), block, stride)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(wins), batch_size):
            chunk = wins[i : i + batch_size]
            width = max(end - start for start, end, _ in chunk)
            x = torch.full((len(chunk), width), PAD, dtype=torch.long)
            y = torch.full((len(chunk), width), PAD, dtype=torch.long)
            for r, (start, end, first) in enumerate(chunk):
                x[r, : end - start] = ids_t[start:end]
                y[r, first - start : end - start] = ids_t[first + 1 : end + 1]
            logits = model(x)
            s, n = token_cross_entropy(logits, y, pad_id=PAD, dtype=torch.float64)
            total, count = total + float(s), count + n
    finally:
        model.train(was_training)
    return StreamScore(total, count, characters, char_level)


def unigram_nats(train_ids: list[int], eval_ids: list[int], vocab_size: int) -> float:
    """The baseline a language model must beat: mean nats per token of ``eval_ids[1:]``
    (the tokens :func:`score_stream` scores) under add-one (Laplace) unigram counts of
    ``train_ids`` over the ``vocab_size - 4`` ordinary tokens (specials excluded)."""
    counts = Counter(int(i) for i in train_ids)
    v = vocab_size - len(SPECIALS)
    total = sum(counts.values()) + v
    nats = -sum(math.log((counts.get(int(i), 0) + 1) / total) for i in eval_ids[1:])
    return nats / max(len(eval_ids) - 1, 1)
