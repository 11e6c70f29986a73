"""Packed sequences: several sequences share one row of ``max_len`` tokens; document ids keep
attention inside each sequence and positions restart at every sequence.

A row holds whole sequences one after the other, then padding up to the longest row of the
batch. The model receives per-token document ids and position ids (B, L) and builds structured
masks from them (:class:`attnkit.masks.Document`; decoder self-attention ``document & causal``,
cross-attention target ids against source ids), so the ``blocksparse`` backend skips every block
that mixes two sequences and no dense L x L mask is built. (Two conditions, both the
dispatcher's: the model's attention dropout is 0, as the trainer sets it with ``--pack``, since
blocksparse has no dropout; and rows are long enough to leave empty blocks, e.g. 512 tokens of
sentences: ``auto`` runs short rows with the dense backend and its small mask, which is faster
there.) Rows of sentences train fastest when short: :func:`default_row_length` (twice the
longest sequence, rounded up to a multiple of 32) is the trainer's default. Padding at a row's
end has its own document id (and the target padding another id than the source padding, so
padded target rows attend to nothing in cross-attention); its targets are PAD, the only
positions the loss ignores.

Per sequence the computation is that of the sequence alone: same positions, same keys, same
targets (a language-model sequence ``x`` is trained on inputs ``x[:-1]`` and targets ``x[1:]``,
so the target of its last input is its own EOS, never the next sequence's first token; an
encoder-decoder pair on source ``src`` and decoder input / target ``tgt[:-1]`` / ``tgt[1:]``).

Order: :func:`pack_rows` places sequences with first-fit-decreasing (a pure function of the
sizes); :func:`epoch_packed_batches` cuts the (seed, epoch) permutation of the examples into
batches of a token budget, so a run's data position stays (epoch, batch index) and a resumed run
draws exactly the batches of an uninterrupted one.

Shape legend: ``R`` rows of a packed batch, ``L`` / ``S`` / ``T`` row lengths (lm, source,
target), ``V`` vocabulary.

    sizes = [(len(s), len(t) - 1) for s, t in pairs]   # (source, decoder) tokens per pair
    batch = pack_seq2seq(pairs, max_len=default_row_length(sizes))
    loss, ntok = packed_loss(model, batch)            # mean NLL per target token
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnkit import checks
from attnkit.devices import to_run_device
from attnkit.train.data.tokenizer import PAD
from attnkit.train.loss import token_cross_entropy

__all__ = [
    "PackSpec",
    "PackedBatch",
    "default_row_length",
    "epoch_packed_batches",
    "pack_examples",
    "pack_lm",
    "pack_rows",
    "pack_seq2seq",
    "packed_logits",
    "packed_loss",
    "sequence_losses",
    "split_long",
]


@dataclass
class PackedBatch:
    """One packed batch (tensors are int64).

    Attributes:
        inputs: (R, L) decoder input ids (lm tokens, or ``tgt[:-1]`` of each pair), PAD after
            the last sequence of a row.
        targets: (R, L) the id to predict at each input position, PAD where nothing is.
        doc_ids: (R, L) sequence number inside the row (0, 1, ...), non-decreasing; the row's
            padding has the next number.
        position_ids: (R, L) position of each token inside its own sequence (0 at its start).
        src, src_doc_ids, src_position_ids: (R, S) source ids, document ids and positions of an
            encoder-decoder batch (None for lm); source padding has its own id, and target
            padding one more, so padded targets see no source key.
        rows: per row, the indices (into the list given to the pack function) of the sequences
            it holds, in order.
    """

    inputs: Tensor
    targets: Tensor
    doc_ids: Tensor
    position_ids: Tensor
    rows: list[list[int]]
    src: Tensor | None = None
    src_doc_ids: Tensor | None = None
    src_position_ids: Tensor | None = None

    @property
    def kind(self) -> str:
        """ "lm" or "seq2seq"."""
        return "lm" if self.src is None else "seq2seq"

    @property
    def num_tokens(self) -> int:
        """Target tokens the loss counts (every non-PAD target)."""
        return int((self.targets != PAD).sum())


@dataclass(frozen=True)
class PackSpec:
    """How a run packs: rows of ``max_len`` tokens, batches of at most ``tokens`` ids (counted
    as the example lengths :func:`epoch_packed_batches` receives)."""

    max_len: int
    tokens: int


def _check_max_len(max_len: object) -> int:
    return checks.positive_int("max_len", max_len)


def pack_rows(sizes: Sequence, max_len: int) -> list[list[int]]:
    """First-fit-decreasing: indices of the items placed in each row, every item exactly once.

    ``sizes``: per item, its size (int) or its sizes on each side of a row (a tuple, e.g.
    (source tokens, target tokens): an item fits where every side fits). Items are taken by
    decreasing largest side (ties: by index) and put into the first row with room; inside a row
    they keep that order. A pure function of the arguments. ValueError naming ``max_len`` when
    an item is longer than a row.
    """
    max_len = _check_max_len(max_len)
    arr = np.asarray(sizes, dtype=np.int64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"sizes: expected ints or tuples of ints, got shape {arr.shape}")
    if len(arr) == 0:
        return []
    if int(arr.min()) < 0:
        raise ValueError(f"sizes: expected sizes >= 0, got {int(arr.min())}")
    big = arr.max(1)
    if int(big.max()) > max_len:
        i = int(big.argmax())
        raise ValueError(
            f"max_len: a row holds {max_len} tokens, but sequence {i} needs {int(big[i])}; "
            f"use --max-len {int(big.max())} or more"
        )
    order = np.argsort(-big, kind="stable")
    rows: list[list[int]] = []
    free: list[np.ndarray] = []
    for i in order.tolist():
        need = arr[i]
        for r, room in enumerate(free):
            if bool((need <= room).all()):
                rows[r].append(i)
                room -= need
                break
        else:
            rows.append([i])
            free.append(max_len - need)
    return rows


ROW_MULTIPLE = 32
"""Default packed rows are a multiple of this many tokens (:func:`default_row_length`)."""


def default_row_length(sizes: Sequence) -> int:
    """The row length ``--pack`` uses when no ``--max-len`` is given: the smallest multiple of
    :data:`ROW_MULTIPLE` (32) that holds twice the longest sequence (on its longest side).

    ``sizes``: per sequence, its size (int) or sizes per side (tuple), as :func:`pack_rows`
    takes them. Why: attention inside a row costs about (row length) per token with the dense
    backend and its small document mask, while padding at a row's end shrinks as the row grows
    relative to its sequences; rows of one to four times the longest sentence pair train
    eng-fra fastest (``benchmarks/bench_train.py --child pack-lengths``, three runs: rows of
    16-64 tokens 1.3-1.5x the padded peer, 128 1.2-1.3x, 256 and 512 0.8-1.1x). ValueError
    for no or empty sizes.
    """
    arr = np.asarray(sizes, dtype=np.int64)
    if arr.size == 0:
        raise ValueError("sizes: expected at least one sequence size")
    longest = int(arr.max())
    if longest < 1:
        raise ValueError(f"sizes: expected a sequence of at least 1 token, got {longest}")
    return ROW_MULTIPLE * -(-2 * longest // ROW_MULTIPLE)


def split_long(seq: list[int], max_len: int) -> list[list[int]]:
    """A language-model sequence cut into pieces of at most ``max_len + 1`` ids that overlap by
    one id (each piece trains ``len - 1`` positions; together they predict every id of ``seq``
    after the first once): ``seq`` itself when it fits."""
    max_len = _check_max_len(max_len)
    if len(seq) <= max_len + 1:
        return [seq]
    return [seq[s : s + max_len + 1] for s in range(0, len(seq) - 1, max_len)]


def _fill(rows: list[list[int]], seqs: list[list[int]], width: int, pad_doc: int) -> tuple:
    """(ids, doc ids, positions) (R, width) of the rows: ``seqs[i]`` is item i's ids on this
    side; the padding after a row's k items gets document id ``k + pad_doc``. Filled on the
    host, then copied to the run's device (:func:`attnkit.devices.to_run_device`)."""
    r = len(rows)
    ids = np.full((r, width), PAD, dtype=np.int64)
    docs = np.empty((r, width), dtype=np.int64)
    pos = np.zeros((r, width), dtype=np.int64)
    for ri, row in enumerate(rows):
        lens = [len(seqs[i]) for i in row]
        n = sum(lens)
        ids[ri, :n] = np.fromiter(itertools.chain.from_iterable(seqs[i] for i in row), np.int64, n)
        docs[ri, :n] = np.repeat(np.arange(len(row)), lens)
        pos[ri, :n] = np.arange(n) - np.repeat(np.cumsum([0] + lens[:-1]), lens)
        docs[ri, n:] = len(row) + pad_doc
    return to_run_device(torch.from_numpy(ids), torch.from_numpy(docs), torch.from_numpy(pos))


def _width(rows: list[list[int]], lens: list[int]) -> int:
    return max(sum(lens[i] for i in row) for row in rows)


def pack_lm(seqs: list[list[int]], max_len: int) -> PackedBatch:
    """Pack language-model sequences (each at least 2 ids, e.g. a line's ids + [EOS]) into rows
    of at most ``max_len`` positions; sequence ``x`` occupies ``len(x) - 1`` positions (inputs
    ``x[:-1]``, targets ``x[1:]``). Rows are as long as the longest one (<= max_len)."""
    max_len = _check_max_len(max_len)
    if not seqs:
        raise ValueError("seqs: expected at least one sequence")
    for i, s in enumerate(seqs):
        if len(s) < 2:
            raise ValueError(f"seqs: sequence {i} has {len(s)} ids; a sequence needs at least 2")
    lens = [len(s) - 1 for s in seqs]
    rows = pack_rows(lens, max_len)
    width = _width(rows, lens)
    x, docs, pos = _fill(rows, [s[:-1] for s in seqs], width, 0)
    y, _, _ = _fill(rows, [s[1:] for s in seqs], width, 0)
    return PackedBatch(x, y, docs, pos, rows)


def pack_seq2seq(examples: list[tuple[list[int], list[int]]], max_len: int) -> PackedBatch:
    """Pack encoder-decoder examples (source ids, target ids starting with BOS and ending with
    EOS: :func:`attnkit.train.data.tasks.seq2seq_example`) into rows of at most ``max_len`` source
    tokens and ``max_len`` decoder inputs: pair i puts ``src`` into the source row and
    ``tgt[:-1]`` / ``tgt[1:]`` into the decoder input / target rows, at the same row index and
    document number. Rows are as long as the longest one (source and target separately)."""
    max_len = _check_max_len(max_len)
    if not examples:
        raise ValueError("examples: expected at least one (source, target) pair")
    for i, e in enumerate(examples):
        if len(e) != 2 or len(e[0]) < 1 or len(e[1]) < 2:
            raise ValueError(
                f"examples: pair {i} must be (source ids (>= 1), target ids (>= 2: BOS ... EOS))"
            )
    src_lens = [len(s) for s, _ in examples]
    tgt_lens = [len(t) - 1 for _, t in examples]
    rows = pack_rows(list(zip(src_lens, tgt_lens, strict=True)), max_len)
    src, sdocs, spos = _fill(rows, [s for s, _ in examples], _width(rows, src_lens), 0)
    t_width = _width(rows, tgt_lens)
    x, docs, pos = _fill(rows, [t[:-1] for _, t in examples], t_width, 1)
    y, _, _ = _fill(rows, [t[1:] for _, t in examples], t_width, 1)
    return PackedBatch(x, y, docs, pos, rows, src, sdocs, spos)


def pack_examples(kind: str, examples: list, max_len: int) -> PackedBatch:
    """A packed batch of training examples of ``kind`` "lm" ((ids,) tuples: :func:`pack_lm`)
    or "seq2seq" ((src, tgt) pairs: :func:`pack_seq2seq`)."""
    if kind == "lm":
        return pack_lm([e[0] for e in examples], max_len)
    return pack_seq2seq(examples, max_len)


def packed_logits(model: torch.nn.Module, batch: PackedBatch) -> Tensor:
    """Logits (R, L, V) of a packed batch: a TransformerLM (lm) or Seq2SeqTransformer called
    with the batch's document and position ids."""
    if not isinstance(batch, PackedBatch):
        raise TypeError(f"batch: expected a PackedBatch, got {type(batch).__name__}")
    if batch.src is None:
        return model(batch.inputs, doc_ids=batch.doc_ids, position_ids=batch.position_ids)
    return model(
        batch.src,
        batch.inputs,
        src_doc_ids=batch.src_doc_ids,
        tgt_doc_ids=batch.doc_ids,
        src_position_ids=batch.src_position_ids,
        tgt_position_ids=batch.position_ids,
    )


def packed_loss(
    model: torch.nn.Module, batch: PackedBatch, label_smoothing: float = 0.0
) -> tuple[Tensor, int]:
    """(mean cross-entropy per target token (a 0-dim tensor, differentiable), number of target
    tokens) of a packed batch; only PAD targets (a row's end) are ignored. Equals the loss of
    the same sequences in a padded batch (``attnkit.train.data.batches.batch_logits``)."""
    checks.probability("label_smoothing", label_smoothing)
    return token_cross_entropy(
        packed_logits(model, batch),
        batch.targets,
        pad_id=PAD,
        label_smoothing=label_smoothing,
        reduction="mean",
    )


def sequence_losses(model: torch.nn.Module, batch: PackedBatch) -> Tensor:
    """Summed NLL of every packed sequence, (N,) in the order given to the pack function."""
    nll, _ = token_cross_entropy(
        packed_logits(model, batch), batch.targets, pad_id=PAD, reduction="none"
    )
    n = sum(len(r) for r in batch.rows)
    out = nll.new_zeros(n)
    for ri, row in enumerate(batch.rows):
        sums = torch.zeros(len(row) + 2, dtype=nll.dtype).index_add(0, batch.doc_ids[ri], nll[ri])
        out = out.index_put((torch.tensor(row),), sums[: len(row)])
    return out


def epoch_packed_batches(sizes: np.ndarray, tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Example indices of every packed batch of ``epoch``, in order (a function of the
    arguments): a permutation seeded with (seed, epoch) cut into consecutive runs of at most
    ``tokens`` tokens (``sizes`` (N,) per example; a run holds at least one example). Lengths
    are mixed inside a batch, which is what packing wants; :func:`pack_rows` then places them."""
    tokens = checks.positive_int("tokens", tokens)
    sizes = np.asarray(sizes, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, 0xFAC])
    perm = rng.permutation(len(sizes))
    out, start, total = [], 0, 0
    for k, i in enumerate(perm.tolist()):
        if k > start and total + int(sizes[i]) > tokens:
            out.append(perm[start:k])
            start, total = k, 0
        total += int(sizes[i])
    if start < len(perm):
        out.append(perm[start:])
    return out
