"""A text file as one token stream, the way nanoGPT trains a language model.

The file is read exactly as written (newlines included: every tokenizer keeps them as tokens;
no [EOS] is inserted between lines). The first ``1 - valid_fraction`` of its characters are the
training text, the rest, a contiguous tail, is held out (nanoGPT: ``data[:int(n * 0.9)]``).

Training examples are the windows of ``block + 1`` ids that start at every offset of the
training stream (:class:`StreamWindows`); a batch is ``batch_size`` offsets drawn uniformly with
replacement (nanoGPT's ``get_batch``) by a generator seeded with (seed, epoch), where an epoch
is :data:`EPOCH_BATCHES` batches (:func:`stream_batches`): the batches are a pure function of
(seed, epoch, index), so a resumed run draws exactly the windows an uninterrupted run draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EPOCH_BATCHES",
    "StreamWindows",
    "TextSplit",
    "random_windows",
    "split_text",
    "stream_batches",
]

EPOCH_BATCHES = 1000
"""Batches drawn per epoch of a stream run (an epoch is only a unit of the seeded order)."""


@dataclass(frozen=True)
class TextSplit:
    """A text cut in two: ``train`` = text[:cut], ``valid`` = text[cut:] (the contiguous tail)."""

    train: str
    valid: str
    cut: int


def split_text(text: str, valid_fraction: float) -> TextSplit:
    """The training head and held-out tail of ``text``: cut = int(len(text) * (1 - fraction)),
    nanoGPT's ``int(n * 0.9)`` for the default 0.1. ValueError naming ``valid_fraction`` when a
    side would be empty."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction: expected a number in (0, 1), got {valid_fraction}")
    cut = int(len(text) * (1.0 - valid_fraction))
    if cut <= 0 or cut >= len(text):
        raise ValueError(
            f"valid_fraction: {valid_fraction} of {len(text)} characters leaves an empty "
            "training or held-out part"
        )
    return TextSplit(text[:cut], text[cut:], cut)


class StreamWindows(Sequence):
    """The windows of ``block + 1`` ids of a token stream, one per start offset:
    ``windows[i] == (ids[i : i + block + 1].tolist(),)`` (the shape of an lm training example),
    for i in ``range(len(ids) - block)``; nothing is copied up front."""

    def __init__(self, ids: np.ndarray, block: int) -> None:
        if len(ids) < block + 1:
            raise ValueError(
                f"block_size: the training stream has {len(ids)} tokens, fewer than "
                f"block_size + 1 = {block + 1}; use a smaller --block-size or more data"
            )
        self.ids, self.block = np.asarray(ids, dtype=np.int64), block

    def __len__(self) -> int:
        return len(self.ids) - self.block

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range [0, {len(self)})")
        return (self.ids[i : i + self.block + 1].tolist(),)


def stream_batches(
    windows: int, batch_size: int, seed: int, epoch: int, count: int = EPOCH_BATCHES
) -> list[np.ndarray]:
    """``count`` batches of ``batch_size`` window offsets in [0, windows), drawn uniformly with
    replacement by a generator seeded with (seed, epoch): a pure function of the arguments."""
    rng = np.random.default_rng([seed, epoch, 0x57EA])
    offsets = rng.integers(0, windows, size=(count, batch_size))
    return list(offsets)


def random_windows(
    ids: np.ndarray, block: int, count: int, seed: int, step: int
) -> list[list[int]]:
    """``count`` windows of ``block + 1`` ids at offsets drawn uniformly from the held-out
    stream ``ids`` (nanoGPT's ``estimate_loss``: ``get_batch('val')`` ``eval_iters`` times), by
    a generator of its own seeded with (seed, step): the training batches and a resumed run's
    draws are unchanged. A stream shorter than a window gives one window of all of it."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) <= block + 1:
        return [ids.tolist()] if len(ids) >= 2 else []
    rng = np.random.default_rng([seed, step, 0xE5A1])
    offsets = rng.integers(0, len(ids) - block, size=count)
    return [ids[o : o + block + 1].tolist() for o in offsets]
