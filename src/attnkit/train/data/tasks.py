"""From a :class:`~attnkit.train.config.TrainConfig` to token ids: the split, the tokenizer
trained on the training split, the training examples, and the model that fits the task.

Sequence-to-sequence examples are (source ids + [EOS], [BOS] + target ids + [EOS]). lm examples
(the default, stream mode, :mod:`attnkit.train.data.stream`) are the windows of ``block_size + 1``
ids at every offset of the training text's token stream (:attr:`TaskData.stream`); in lines
mode (``--lines``) windows of ``block_size + 1`` ids from the training lines joined by [EOS]
(stride ``block_size // 2``).

Packed runs (``pack``): lm examples are the training lines, each its ids + [EOS] (cut into pieces
of at most ``max_len + 1`` ids when longer), so no sequence sees another; seq2seq examples stay
pairs and must fit a row. :attr:`TaskData.pack` then says how batches are cut and packed: the
same number of ids per batch as the unpacked run on average (``batch_size`` examples for
seq2seq, ``batch_size`` windows of ``block_size + 1`` ids for lm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.packing import PackSpec, default_row_length, split_long
from attnkit.train.data.sources import (
    SYNTHETIC,
    DataError,
    read_pairs,
    read_text,
    read_text_lines,
    split_heldout,
    synthetic_split,
)
from attnkit.train.data.stream import StreamWindows, split_text

__all__ = [
    "TaskData",
    "build_model",
    "lm_sequences",
    "lm_stream",
    "lm_windows",
    "prepare",
    "seq2seq_example",
]

SAMPLE = 200
"""Training examples stored with a checkpoint, to measure how well the model fits its data."""


@dataclass
class TaskData:
    """A task ready to train: ``examples`` (lists of ids: (src, tgt) pairs or (window,)),
    ``heldout`` and ``train_sample`` as text (pairs for seq2seq, lines for lm; a stream run:
    one string each, the held-out tail and the training text's last part of the same length
    (at most :data:`SAMPLE_CHARS` characters)). ``stream``: a stream run's training windows
    (then also ``examples``), else None."""

    kind: str  # "seq2seq" or "lm"
    tokenizer: Tokenizer
    examples: list[tuple[list[int], ...]]
    heldout: list
    train_sample: list
    pack: PackSpec | None = None
    stream: StreamWindows | None = None
    characters: str = ""  # issue 31: every character of the training texts, sorted
    heldout_ids: np.ndarray | None = None  # a stream run: the held-out tail's ids (--eval-batches)


SAMPLE_CHARS = 100_000
"""Characters of training text stored with a stream run's checkpoint (``--split train``)."""


def _prepare_stream(c: TrainConfig, tokenizer: Tokenizer | None) -> TaskData:
    """A stream run's data (see :mod:`attnkit.train.data.stream`)."""
    part = split_text(read_text(c.data), c.valid_fraction)
    tok = tokenizer or tk.train([part.train], c.tokenizer, c.vocab_size)
    ids = np.array(tk.encode(tok, part.train), dtype=np.int64)
    try:
        windows = StreamWindows(ids, c.block_size)
    except ValueError as e:
        raise DataError(f"{c.data}: {e}") from None
    sample = part.train[-min(len(part.valid), SAMPLE_CHARS) :]
    chars = tk.characters([part.train])
    held = np.array(tk.encode(tok, part.valid), dtype=np.int64)
    return TaskData("lm", tok, windows, [part.valid], [sample], None, windows, chars, held)


def seq2seq_example(tok: Tokenizer, src: str, tgt: str) -> tuple[list[int], list[int]]:
    """(source ids + [EOS], [BOS] + target ids + [EOS])."""
    return tk.encode(tok, src) + [tk.EOS], [tk.BOS] + tk.encode(tok, tgt) + [tk.EOS]


def lm_stream(tok: Tokenizer, lines: list[str]) -> list[int]:
    """The ids of ``lines``, each followed by [EOS]."""
    out: list[int] = []
    for line in lines:
        out += tk.encode(tok, line) + [tk.EOS]
    return out


def lm_windows(stream: list[int], block: int, stride: int) -> list[list[int]]:
    """Windows of block + 1 ids (input = window[:-1], target = window[1:]) every ``stride``
    ids; the last window is shorter when the stream does not fill it."""
    if len(stream) < 2:
        return []
    starts = range(0, max(len(stream) - block, 1), stride)
    return [stream[s : s + block + 1] for s in starts]


def _sample(items: list, n: int, seed: int) -> list:
    rng = np.random.default_rng([seed, 0x5A3])
    idx = np.sort(rng.permutation(len(items))[: min(n, len(items))])
    return [items[i] for i in idx]


def _split_file(items: list, c: TrainConfig, what: str, key=None) -> tuple[list, list]:
    """(training, held-out) items; with ``key``, items of equal key (e.g. one source sentence
    with several translations) fall on the same side, so no held-out source is trained on."""
    keys = list(dict.fromkeys(items if key is None else map(key, items)))
    if len(keys) < 2:
        raise DataError(
            f"{c.data}: {len(keys)} distinct {what}; a training and a held-out split need at "
            "least 2"
        )
    held_idx = split_heldout(len(keys), c.valid_fraction, c.seed).tolist()
    held_keys = {keys[i] for i in held_idx}
    side = [(x if key is None else key(x)) in held_keys for x in items]
    return [x for x, h in zip(items, side) if not h], [x for x, h in zip(items, side) if h]


def prepare(c: TrainConfig, tokenizer: Tokenizer | None = None) -> TaskData:
    """Read or generate the data of a resolved config, split it, train the tokenizer on the
    training split (unless ``tokenizer`` is given: a resumed run keeps its own) and encode the
    training examples. DataError for unusable data."""
    if c.task == "lm" and not c.lines:
        return _prepare_stream(c, tokenizer)
    if c.task in SYNTHETIC:
        train, held = synthetic_split(
            c.task, c.train_size, c.valid_size, c.vocab, c.min_length, c.length, c.seed
        )
    elif c.task == "translate":
        train, held = _split_file(read_pairs(c.data), c, "sources", key=lambda p: p[0])
    else:
        train, held = _split_file(read_text_lines(c.data), c, "non-blank lines")
    if c.task == "lm":
        tok = tokenizer or tk.train(train, c.tokenizer, c.vocab_size)
        if c.pack:
            examples = [(p,) for line in train for p in lm_sequences(tok, line, c.max_len)]
        else:
            stream = lm_stream(tok, train)
            examples = [(w,) for w in lm_windows(stream, c.block_size, max(c.block_size // 2, 1))]
        if not examples:
            raise DataError(f"{c.data}: the training split has fewer than 2 tokens")
        spec = PackSpec(c.max_len, c.batch_size * (c.block_size + 1)) if c.pack else None
        sample, chars = _sample(train, SAMPLE, c.seed), tk.characters(train)
        return TaskData("lm", tok, examples, held, sample, spec, characters=chars)
    texts = [s for pair in train for s in pair]
    tok = tokenizer or tk.train(texts, c.tokenizer, c.vocab_size, symbols=c.task in SYNTHETIC)
    examples = [seq2seq_example(tok, s, t) for s, t in train]
    spec = _seq2seq_pack(examples, c) if c.pack else None
    sample, chars = _sample(train, SAMPLE, c.seed), tk.characters(texts)
    return TaskData("seq2seq", tok, examples, held, sample, spec, characters=chars)


def lm_sequences(tok: Tokenizer, line: str, max_len: int) -> list[list[int]]:
    """A line's ids + [EOS] as packed lm sequences: one, or pieces of at most max_len + 1 ids."""
    return split_long(tk.encode(tok, line) + [tk.EOS], max_len)


def _seq2seq_pack(examples: list, c: TrainConfig) -> PackSpec:
    """The pack spec of seq2seq examples: rows of ``c.max_len`` or, when None, of
    :func:`~attnkit.train.data.packing.default_row_length` of the examples (a function of the
    tokenizer and the training split, so a resumed run gets the same); DataError when an
    example does not fit a row."""
    if c.max_len is None:
        return PackSpec(
            default_row_length([(len(s), len(t) - 1) for s, t in examples]), _budget(examples, c)
        )
    for i, (s, t) in enumerate(examples):
        if max(len(s), len(t) - 1) > c.max_len:
            longest = max(max(len(s), len(t) - 1) for s, t in examples)
            raise DataError(
                f"{c.data or c.task}: training example {i + 1} has {max(len(s), len(t) - 1)} "
                f"tokens on one side, more than a packed row of --max-len {c.max_len}; use "
                f"--max-len {longest} or more"
            )
    return PackSpec(c.max_len, _budget(examples, c))


def _budget(examples: list, c: TrainConfig) -> int:
    """Ids per packed batch: ``batch_size`` examples of the mean size."""
    mean = sum(len(s) + len(t) for s, t in examples) / len(examples)
    return max(1, round(c.batch_size * mean))


def model_config(c: TrainConfig, kind: str, vocab_size: int, max_len: int) -> dict:
    """The model's config (as a dict) for a resolved training config."""
    common = dict(
        d_model=c.d_model,
        nhead=c.nhead,
        dim_feedforward=c.dim_feedforward,
        dropout=c.dropout,
        max_len=max_len,
        pad_id=tk.PAD,
        bos_id=tk.BOS,
        eos_id=tk.EOS,
    )
    common.update(norm_first=c.norm_first, activation=c.activation)
    if kind == "lm":
        if c.positions == "learned":  # a table of the training window, as nanoGPT's wpe
            common.update(max_len=c.block_size)
        return dict(
            positions=c.positions,
            vocab_size=vocab_size,
            num_layers=c.layers,
            window=c.window,
            tie_embeddings=c.tie_embeddings,
            bias=c.bias,
            **common,
        )
    return dict(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        num_encoder_layers=c.layers,
        num_decoder_layers=c.layers,
        tie_embeddings="all" if c.tie_embeddings else "none",
        **common,
    )


def build_model(kind: str, config: dict) -> torch.nn.Module:
    """A TransformerLM (kind "lm") or Seq2SeqTransformer from its config dict."""
    if kind == "lm":
        return TransformerLM(LMConfig(**config))
    return Seq2SeqTransformer(Seq2SeqConfig(**config))
