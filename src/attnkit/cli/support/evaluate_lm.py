"""``attnkit evaluate`` on a language model: nats per token over the whole held-out stream (or
``--data FILE`` read as one stream), bits per character for a char-level tokenizer, the add-one
unigram baseline beside it, and ``perplexity=VALUE`` last (see
:mod:`attnkit.train.inference.lm_eval`)."""

from __future__ import annotations

import argparse
import math

from attnkit.cli.support.common import UsageError


def _char_level(tok) -> bool:
    from tokenizers import decoders

    return isinstance(tok.decoder, decoders.Fuse)


def run(loaded, ns: argparse.Namespace) -> int:
    """Score the checkpoint ``loaded`` as ``ns`` says (``--data``, ``--split``, ``--stride``);
    0 on success."""
    from attnkit.train.config import recipe_summary
    from attnkit.train.data import tokenizer as tk
    from attnkit.train.data.sources import DataError, read_text
    from attnkit.train.data.stream import split_text
    from attnkit.train.inference import metrics
    from attnkit.train.inference.lm_eval import score_stream, unigram_nats

    c = loaded.train_config.resolved()
    if ns.beam != 1 or ns.length_penalty != 0:  # was silently ignored
        option = "--beam" if ns.beam != 1 else "--length-penalty"
        raise UsageError(
            f"{option}: a language model is scored token by token, not decoded; leave it out"
        )
    if ns.data is None and c.lines:  # a lines-mode model: its held-out lines, as trained
        if ns.stride is not None:
            raise UsageError(
                "--stride: a model trained with --lines is scored on its held-out lines "
                "window by window; use --data FILE to score a file as a stream with a stride"
            )
        items = loaded.jsonl("heldout.jsonl" if ns.split == "heldout" else "train_sample.jsonl")
        items = items[: ns.n] if ns.n is not None else items
        print(f"checkpoint {loaded.path} (task lm, step {loaded.step}); {len(items)} lines")
        ppl = metrics.perplexity(loaded.model, loaded.tokenizer, items, c.block_size, c.pack)
        print(f"perplexity={ppl:.4f}")
        return 0
    if ns.data is not None:
        text, source = read_text(ns.data), ns.data
    else:
        name = "heldout.jsonl" if ns.split == "heldout" else "train_sample.jsonl"
        text, source = "".join(loaded.jsonl(name)), f"the {ns.split} text of {loaded.path}"
    tok = loaded.tokenizer
    ids = tk.encode(tok, text)
    if ns.n is not None:
        ids = ids[: ns.n]
    if len(ids) < 2:
        raise UsageError(f"evaluate: {source} has fewer than 2 tokens")
    if ns.stride is not None and ns.stride > c.block_size:  # was silently the block size
        raise UsageError(
            f"--stride: expected at most the model's window, --block-size {c.block_size} (a "
            f"stride of {c.block_size} scores non-overlapping windows), got {ns.stride}"
        )
    stride = c.block_size if ns.stride is None else ns.stride
    print(
        f"checkpoint {loaded.path} (task lm, step {loaded.step}); {len(ids):,} tokens of "
        f"{source}, windows of {c.block_size} tokens every {stride}"
    )
    print(recipe_summary(c))
    char = _char_level(tok)
    score = score_stream(
        loaded.model, ids, c.block_size, stride, characters=len(text), char_level=char
    )
    try:  # the baseline: add-one unigram counts of the training text, when it is readable
        train_text = split_text(read_text(c.data), c.valid_fraction).train
        base_from = "the training text"
    except (DataError, ValueError, TypeError):
        train_text, base_from = "".join(loaded.jsonl("train_sample.jsonl")), "the training sample"
    base = unigram_nats(tk.encode(tok, train_text), ids, tok.get_vocab_size())
    print(f"unigram baseline (add-one counts of {base_from}): {base:.4f} nats/token, "
          f"perplexity {math.exp(base):.2f}")  # fmt: skip
    print(f"tokens scored: {score.tokens:,}")
    print(f"nats/token={score.nats_per_token:.4f}")
    if score.bits_per_char is not None:
        print(f"bits/char={score.bits_per_char:.4f}")
    print(f"perplexity={score.perplexity:.4f}")
    return 0
