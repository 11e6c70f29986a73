"""One optimiser step and one evaluation of the training loop (:mod:`attnkit.train.loop.trainer`).

The loss of a step is :func:`attnkit.train.loss.token_cross_entropy` summed over the batch's
target tokens (PAD ignored), normalised once over all micro-batches and processes
(:func:`optimizer_step`). With ``checkpoint`` (``attnkit train --checkpoint``) a language model
runs every layer under activation checkpointing and its loss through :class:`LMHeadLoss`, which
never holds the full (L, V) logits at once: same loss and gradients, less memory.

Held-out examples are evaluated the way training sees them: lm windows of ``block_size``, or
with ``--pack`` one sequence per held-out line, packed into rows with document masks and
positions restarting per line (:func:`heldout_examples`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from attnkit.devices import current
from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.batches import batch_logits, collate_lm, target_count
from attnkit.train.data.packing import PackSpec, pack_lm
from attnkit.train.data.stream import random_windows
from attnkit.train.data.tasks import TaskData, lm_sequences, lm_stream, lm_windows, seq2seq_example
from attnkit.train.inference.lm_eval import stream_windows
from attnkit.train.inference.metrics import exact_match, heldout_loss, translate
from attnkit.train.inference.scoring import corpus_bleu, group_references
from attnkit.train.loop.distributed import Dist
from attnkit.train.loop.precision import autocast
from attnkit.train.loss import chunked_head_loss, token_cross_entropy

__all__ = [
    "CHUNK",
    "LMHeadLoss",
    "evaluate",
    "heldout_examples",
    "loss_sum",
    "mean_loss",
    "optimizer_step",
    "training_module",
]

CHUNK = 1024
"""Positions per chunk of :class:`LMHeadLoss` (1024 x V float32 logits at a time)."""


class LMHeadLoss(nn.Module):
    """A :class:`~attnkit.models.lm.TransformerLM` (``lm``) whose forward returns the summed,
    label-smoothed token cross-entropy of a batch, the generator and the loss computed
    :data:`CHUNK` positions at a time (:func:`attnkit.train.loss.chunked_head_loss`). Its
    parameters are the LM's, so DistributedDataParallel can wrap it like the LM."""

    def __init__(self, lm: nn.Module, label_smoothing: float, chunk: int = CHUNK) -> None:
        super().__init__()
        self.lm, self.label_smoothing, self.chunk = lm, label_smoothing, chunk

    def forward(
        self,
        tokens: Tensor,
        targets: Tensor,
        doc_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """tokens, targets (B, L) (doc_ids, position_ids (B, L) for packed rows) -> the summed
        token loss (0-dim)."""
        h = self.lm.hidden(tokens, doc_ids, position_ids)
        loss, _ = chunked_head_loss(
            h,
            targets,
            self.lm.head,
            pad_id=tk.PAD,
            label_smoothing=self.label_smoothing,
            chunk=self.chunk,
        )
        return loss


def training_module(model: nn.Module, kind: str, c: TrainConfig) -> nn.Module:
    """The module a training step calls: ``model`` itself, or with ``c.checkpoint`` and an LM,
    the LM with checkpointed layers inside :class:`LMHeadLoss` (the encoder-decoder keeps its
    plain forward)."""
    if not c.checkpoint or kind != "lm":
        return model
    model.checkpoint_layers = True
    return LMHeadLoss(model, c.label_smoothing)


def loss_sum(
    model: nn.Module, kind: str, batch: list, smoothing: float, pack: PackSpec | None = None
) -> tuple[Tensor, int]:
    """(the summed, label-smoothed cross-entropy of the batch's target tokens: a differentiable
    0-dim tensor; the number of target tokens). PAD targets count in neither. ``model``: the
    task's model or an :class:`LMHeadLoss` (possibly inside DistributedDataParallel)."""
    if isinstance(getattr(model, "module", model), LMHeadLoss):
        if pack is not None:
            b = pack_lm([e[0] for e in batch], pack.max_len)
            return model(b.inputs, b.targets, b.doc_ids, b.position_ids), target_count(kind, batch)
        x, y = collate_lm(batch)
        return model(x, y), target_count(kind, batch)
    logits, y = batch_logits(model, kind, batch, pack)
    count = target_count(kind, batch)  # on the host: packed or padded, the same targets
    return token_cross_entropy(logits, y, pad_id=tk.PAD, label_smoothing=smoothing, count=count)


def optimizer_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    data: TaskData,
    c: TrainConfig,
    d: Dist,
    micro: list[np.ndarray],
    time_up: Callable[[], bool],
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[Tensor, int, bool]:
    """One optimiser step on this rank's micro-batches ``micro`` (arrays of example indices);
    returns (this rank's summed token loss of the step: a float64 0-dim tensor on the run's
    device, left there so that the host does not wait for the GPU; its target tokens over all
    ranks; whether any rank's ``time_up()`` said to stop). :func:`mean_loss` turns the first
    into the step's mean token loss over all ranks, when the trainer logs it.

    Normalisation. With W ranks, K micro-batches each, L_rk the summed token losses of
    micro-batch k on rank r and N = sum N_rk the step's target tokens on all ranks, the step
    minimises the mean token loss of all W*K micro-batches taken as one batch:
    ``sum_rk L_rk / N``. Each micro-batch back-propagates its own sum L_rk (under DDP's
    ``no_sync`` except the last, whose backward all-reduces the accumulated gradients and, as
    DDP does, divides them by W); one all-reduce of (sum L, N, stop) follows, and the gradients
    are multiplied by W / N. So W processes x K micro-batches of B sequences give the update
    of one process with one batch of W*K*B sequences, whatever the padding and however unevenly
    the tokens fall between micro-batches (a mean per micro-batch would weight them equally and
    differ); only the order of float additions differs.
    """
    opt.zero_grad(set_to_none=True)
    loss_total, ntok = None, 0
    wide = torch.float32 if current().type == "mps" else torch.float64
    for k, ids in enumerate(micro):
        batch = [data.examples[i] for i in ids]
        with d.sync(model, last=k == len(micro) - 1):
            with autocast(current(), c.bf16, c.fp16):
                loss, n = loss_sum(model, data.kind, batch, c.label_smoothing, data.pack)
            (loss if scaler is None else scaler.scale(loss)).backward()
        part = loss.detach().to(wide)  # float64 where the device has it (not MPS)
        loss_total, ntok = part if loss_total is None else loss_total + part, ntok + n
    count, stops = d.all_sum([ntok, float(time_up())])
    if scaler is not None:  # fp16: gradients back to their true scale (inf/NaN noted)
        scaler.unscale_(opt)
    scale = d.world_size / max(count, 1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(scale)
    if c.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
    if scaler is None:
        opt.step()
    else:  # skips the step when a gradient overflowed, and adapts the scale
        scaler.step(opt)
        scaler.update()
    return loss_total, int(count), stops > 0


def mean_loss(loss_total: Tensor, count: int, d: Dist) -> float:
    """The step's mean token loss over all ranks from this rank's summed loss
    (:func:`optimizer_step`); every rank calls it at the same steps (one all-reduce)."""
    return d.all_sum([float(loss_total)])[0] / max(count, 1.0)


def heldout_examples(data: TaskData, c: TrainConfig) -> list:
    """The held-out examples as training sees them: (src, tgt) pairs; a stream run's held-out
    tail in windows of ``block_size + 1`` ids (non-overlapping targets); lm windows of
    ``block_size + 1`` ids of the held-out lines joined by [EOS]; or, when the run packs, one
    sequence per held-out line (its ids + [EOS], cut at ``max_len`` as training cuts them)."""
    if data.stream is not None:  # the held-out tail as one stream, no [EOS]
        ids = tk.encode(data.tokenizer, data.heldout[0])
        return [(ids[a : b + 1],) for a, b, _ in stream_windows(len(ids), c.block_size)]
    if data.kind == "lm" and data.pack is not None:
        seqs = (p for line in data.heldout for p in lm_sequences(data.tokenizer, line, c.max_len))
        return [(p,) for p in seqs if len(p) >= 2]
    if data.kind == "lm":
        stream = lm_stream(data.tokenizer, data.heldout)
        return [(w,) for w in lm_windows(stream, c.block_size, c.block_size)]
    return [seq2seq_example(data.tokenizer, s, t) for s, t in data.heldout]


def evaluate(
    model: nn.Module,
    data: TaskData,
    c: TrainConfig,
    held: list,
    step: int,
    best: float | None = None,
) -> dict:
    """The evaluation row of the log at ``step``: held-out loss (packed as training packs;
    with ``c.eval_batches``, nanoGPT's estimate from that many random batches of held-out
    windows, and ``val_batches`` says so; ``best_metric`` "exact": ``val_loss_exact``, the whole
    split's loss, when the estimate is below ``best``, the best whole-split loss so far),
    perplexity (lm) or exact match (synthetic tasks), and held-out BLEU when it decides the
    best checkpoint (``c.best_metric``)."""
    model.eval()
    whole = held
    if c.eval_batches is not None and data.heldout_ids is not None:  # nanoGPT's estimate
        n = c.eval_batches * c.batch_size
        held = [(w,) for w in random_windows(data.heldout_ids, c.block_size, n, c.seed, step)]
    row: dict = {"step": step, "val_loss": heldout_loss(model, data.kind, held, pack=data.pack)}
    if c.eval_batches is not None:
        row["val_batches"] = c.eval_batches
    if c.best_metric == "exact" and held is whole:
        row["val_loss_exact"] = row["val_loss"]
    elif c.best_metric == "exact" and (best is None or row["val_loss"] < best):
        row["val_loss_exact"] = heldout_loss(model, data.kind, whole, pack=data.pack)
    if data.kind == "lm":
        row["val_ppl"] = float(np.exp(row["val_loss"]))
    elif c.task != "translate":
        hyps = translate(model, data.tokenizer, [s for s, _ in data.heldout])
        row["val_exact"] = exact_match(hyps, [t for _, t in data.heldout])
    if c.best_metric == "bleu":  # greedy, each distinct source once, all its references
        groups = group_references(data.heldout)
        hyps = translate(model, data.tokenizer, list(groups.sources))
        row["val_bleu"] = corpus_bleu(hyps, groups.streams())
    model.train()
    return row
