"""Length-bucketed batches, a pure function of (seed, epoch), and their padded tensors.

An epoch's order: a permutation of the examples seeded with (seed, epoch); consecutive pools of
``batch_size * 32`` examples are sorted by length and cut into batches (so a batch holds
examples of similar length and little padding); the batches are then shuffled with the same
generator. The data position of a run is (epoch, index of the next batch in that order), so a
resumed run draws exactly the batches an uninterrupted run would have drawn.

With packing (``pack``: a :class:`~attnkit.train.data.packing.PackSpec`) an epoch's batches come
from :func:`attnkit.train.data.packing.epoch_packed_batches` (a permutation cut by a token
budget, again a function of (seed, epoch)) and :func:`batch_logits` packs each batch into rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnkit.devices import to_run_device
from attnkit.train.data.packing import PackSpec, epoch_packed_batches, pack_examples, packed_logits
from attnkit.train.data.tokenizer import PAD

__all__ = [
    "batch_logits",
    "collate_lm",
    "collate_seq2seq",
    "epoch_batches",
    "pad",
    "target_count",
]

POOL = 32


def epoch_batches(
    lengths: np.ndarray, batch_size: int, seed: int, epoch: int, pack: PackSpec | None = None
) -> list[np.ndarray]:
    """Example indices of every batch of ``epoch``, in order (a function of the arguments);
    with ``pack``, batches of at most ``pack.tokens`` ids of mixed lengths."""
    if pack is not None:
        return epoch_packed_batches(lengths, pack.tokens, seed, epoch)
    rng = np.random.default_rng([seed, epoch, 0xBA7C])
    n = len(lengths)
    perm = rng.permutation(n)
    batches = []
    pool = batch_size * POOL
    for s in range(0, n, pool):
        chunk = perm[s : s + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def pad(seqs: list[list[int]]) -> Tensor:
    """(B, L_max) long tensor of ``seqs`` right-padded with PAD, on the run's device: filled
    on the host, then copied in one go (:func:`attnkit.devices.to_run_device`)."""
    width = max(len(s) for s in seqs)
    out = np.full((len(seqs), width), PAD, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return to_run_device(torch.from_numpy(out))[0]


def collate_seq2seq(examples: list[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor, Tensor]:
    """(src (B, S), tgt_in (B, T), tgt_out (B, T)): tgt_in = [BOS] + y, tgt_out = y + [EOS]."""
    src = pad([e[0] for e in examples])
    tgt = pad([e[1] for e in examples])
    return src, tgt[:, :-1], tgt[:, 1:]


def collate_lm(examples: list[tuple[list[int]]]) -> tuple[Tensor, Tensor]:
    """(inputs (B, L), targets (B, L)) from windows of L + 1 ids."""
    w = pad([e[0] for e in examples])
    return w[:, :-1], w[:, 1:]


def batch_logits(
    model, kind: str, examples: list, pack: PackSpec | None = None
) -> tuple[Tensor, Tensor]:
    """(logits (B, T, vocab), targets (B, T)) of one batch of examples: a language model
    (``kind`` "lm") on its windows, an encoder-decoder on (source, [BOS] + target); with
    ``pack``, the examples packed into rows of ``pack.max_len`` (B rows; PAD targets at the
    rows' ends)."""
    if pack is not None:
        batch = pack_examples(kind, examples, pack.max_len)
        return packed_logits(model, batch), batch.targets
    if kind == "lm":
        x, y = collate_lm(examples)
        return model(x), y
    src, tgt_in, y = collate_seq2seq(examples)
    return model(src, tgt_in), y


def target_count(kind: str, examples: list) -> int:
    """The number of target tokens of a batch of training examples (``kind`` "lm": windows,
    each predicting all its ids but the first; else (src, tgt) pairs, predicting tgt[1:]),
    counted on the host: the non-PAD targets :func:`batch_logits` returns."""
    seqs = [e[0] if kind == "lm" else e[1] for e in examples]
    return sum(len(s) - 1 - s[1:].count(PAD) for s in seqs)
