"""Text generation for ``attnkit generate``: next-token sampling with temperature, top-k and
top-p (nucleus) filtering, a token at a time so the caller can print as it goes, with the
context cropped to the model's training window (nanoGPT's ``generate``: a model trained on
windows of ``block`` tokens never sees a position beyond them). A KV cache serves the tokens
while the context fits the window (and always for a local-attention model, ``--window``, with
sinusoidal positions; a learned position table has no row beyond the window, so such a model
crops too).

Filtering follows transformers' ``TopKLogitsWarper`` and ``TopPLogitsWarper``: logits divided
by the temperature; top-k keeps the k largest; top-p keeps the smallest set of most likely
tokens whose probabilities sum to at least p (always the most likely one); the rest get -inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn

from attnkit.checks import positive_int, probability

__all__ = ["filter_logits", "generate_ids", "suggested_prompt"]


def filter_logits(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """logits (..., V) / temperature (> 0) with all but the top-k / top-p tokens set to -inf
    (see the module docstring)."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature: expected a number, got {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature: expected a finite number > 0, got {temperature!r}")
    x = logits / temperature
    if top_k is not None:
        k = min(positive_int("top_k", top_k), x.shape[-1])
        kth = torch.topk(x, k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None:
        p = probability("top_p", top_p, allow_one=True)
        if p <= 0:
            raise ValueError(f"top_p: expected a number in (0, 1], got {top_p!r}")
        srt, idx = torch.sort(x, dim=-1, descending=True)
        cum = srt.softmax(-1).cumsum(-1)
        drop = cum - srt.softmax(-1) >= p  # the mass before this token already reaches p
        drop[..., 0] = False
        x = x.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return x


def generate_ids(
    model: nn.Module,
    prompt: Sequence[int],
    max_new_tokens: int,
    block: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    banned: Sequence[int] = (),
    stop: int | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` ids continuing ``prompt`` (a TransformerLM's ids): each
    from the logits of the last ``block`` ids (greedy when temperature == 0, else sampled
    after :func:`filter_logits`); ``banned`` ids are never produced; stops after ``stop``.
    The arguments are checked when this is called, before the first id is computed."""
    positive_int("max_new_tokens", max_new_tokens)
    positive_int("block", block)
    if not prompt:
        raise ValueError("prompt: expected at least one token")
    if isinstance(temperature, (int, float)) and temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0 (0 = greedy), got {temperature}")
    if temperature != 0:
        filter_logits(torch.zeros(1), temperature, top_k, top_p)  # the same checks, up front
    elif isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature: expected a number, got {temperature!r}")
    return _generate(model, list(prompt), max_new_tokens, block, temperature, top_k, top_p,
                     banned, stop, generator)  # fmt: skip


@torch.no_grad()
def _generate(model, ids, max_new_tokens, block, temperature, top_k, top_p, banned, stop,
              generator) -> Iterator[int]:  # fmt: skip
    """The KV cache while the context fits ``block`` (always, for a local-attention model,
    whose cache keeps only its window, unless its positions are learned: no row past the
    table); beyond, the last ``block`` ids recomputed per token."""
    model.eval()
    c = model.config
    local = getattr(c, "window", None) is not None and getattr(c, "positions", "") != "learned"
    cache = model.new_cache()
    logits = model.decode_step(torch.tensor([ids[-block:]]), cache)[0, -1]
    for k in range(max_new_tokens):
        logits = logits.float()
        if banned:
            logits[list(banned)] = float("-inf")
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        ids.append(nxt)
        yield nxt
        if (stop is not None and nxt == stop) or k == max_new_tokens - 1:
            return
        if local or cache.length < block:
            logits = model.decode_step(torch.tensor([[nxt]]), cache)[0, -1]
        else:
            logits = model(torch.tensor([ids[-block:]]))[0, -1]


def suggested_prompt(texts: Iterable[str], words: int = 4) -> str:
    """A prompt from a run's training text (``train_sample.jsonl``): the first line of at most
    ``words`` words that ends with ":" (a speaker, "ROMEO:" in tiny Shakespeare), else the first
    line with a letter or digit cut to ``words`` words. A single text is a stream run's sample,
    which starts mid-line: its first line is skipped. "\\n" (a new line) when no line has a
    letter or digit."""
    texts = list(texts)
    lines = [ln.strip() for t in texts for ln in t.split("\n")][:1000]
    if len(texts) == 1 and len(lines) > 1:
        lines = lines[1:]
    lines = [ln for ln in lines if any(ch.isalnum() for ch in ln)]
    for line in lines:
        if line.endswith(":") and len(line.split()) <= words:
            return line
    return " ".join(lines[0].split()[:words]) if lines else "\n"
