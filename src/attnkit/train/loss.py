"""The one token cross-entropy of training and evaluation: the sum of the token losses of every
target that is not padding, optionally divided by their number. The padding id (``pad_id``) is
the caller's tokenizer's: this module imports no tokenizer.

Every loss in :mod:`attnkit.train` goes through :func:`token_cross_entropy`: the trainer's step
(sum, normalised later over all micro-batches and processes),
:func:`attnkit.train.data.packing.packed_loss` (mean), the held-out NLL of
:mod:`attnkit.train.inference.metrics` (sum, in float64) and the per-sequence losses of packed
batches (per token).

:func:`chunked_head_loss` computes the same sum from the hidden states before the generator, a
chunk of rows at a time, each chunk recomputed in the backward pass: the full (N, V) logits,
their log-softmax and their gradient never exist at once (for the long-context LM, L = 8192 and
V = 2000, that is three (L, V) float32 tensors of 62.5 MiB each).

Shape legend: ``N`` target positions (any leading shape flattened), ``V`` vocabulary, ``E``
model width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnkit import checks

__all__ = ["REDUCTIONS", "chunked_head_loss", "token_cross_entropy"]

REDUCTIONS = ("sum", "mean", "none")


def token_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    pad_id: int,
    label_smoothing: float = 0.0,
    reduction: str = "sum",
    dtype: torch.dtype | None = None,
    count: int | None = None,
) -> tuple[Tensor, int]:
    """(loss, number of non-PAD targets) of logits (..., V) against targets (...); PAD is
    ``pad_id``, the id of the tokenizer's padding token.

    ``reduction``: "sum" (a 0-dim tensor: the summed token losses), "mean" (that sum divided by
    the number of non-PAD targets, 0 when there is none) or "none" (the token losses, shaped
    like ``targets``, 0 at PAD). PAD targets count in neither the loss nor the number.
    ``label_smoothing`` in [0, 1) as in :func:`torch.nn.functional.cross_entropy`; ``dtype``
    casts the logits first (e.g. float64 for evaluation sums). ``count``: the number of non-PAD
    targets when the caller counted them on the host, so that nothing is read back from a GPU
    (it is then returned as given)."""
    checks.nonnegative_int("pad_id", pad_id)
    checks.probability("label_smoothing", label_smoothing)
    checks.choice("reduction", reduction, REDUCTIONS)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets: expected the shape {tuple(logits.shape[:-1])} of logits without its last "
            f"dimension, got {tuple(targets.shape)}"
        )
    flat = logits.reshape(-1, logits.shape[-1])
    if dtype is not None:
        flat = flat.to(dtype)
    if count is None:
        count = int((targets != pad_id).sum())
    loss = F.cross_entropy(
        flat,
        targets.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
        reduction="none" if reduction == "none" else "sum",
    )
    if reduction == "none":
        return loss.reshape(targets.shape), count
    if reduction == "mean":
        return loss / max(count, 1), count
    return loss, count


def _chunk_sum(
    hidden: Tensor, targets: Tensor, head: torch.nn.Module, pad_id: int, smoothing: float
) -> Tensor:
    return token_cross_entropy(head(hidden), targets, pad_id=pad_id, label_smoothing=smoothing)[0]


def chunked_head_loss(
    hidden: Tensor,
    targets: Tensor,
    head: torch.nn.Module,
    *,
    pad_id: int,
    label_smoothing: float = 0.0,
    chunk: int = 1024,
) -> tuple[Tensor, int]:
    """(summed token cross-entropy of ``head(hidden)`` against ``targets``, number of non-PAD
    targets): the "sum" of :func:`token_cross_entropy`, computed ``chunk`` positions at a
    time. hidden (..., E), targets (...); ``head`` maps (n, E) to (n, V) logits (e.g. a final
    LayerNorm and the generator). Each chunk's logits are freed after its loss and recomputed
    in the backward pass (``torch.utils.checkpoint``, ``use_reentrant=False``), so at most one
    chunk's (chunk, V) logits exist at a time. The head must be deterministic (no dropout)."""
    checks.positive_int("chunk", chunk)
    checks.nonnegative_int("pad_id", pad_id)
    checks.probability("label_smoothing", label_smoothing)
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets: expected the shape {tuple(hidden.shape[:-1])} of hidden without its last "
            f"dimension, got {tuple(targets.shape)}"
        )
    h = hidden.reshape(-1, hidden.shape[-1])
    y = targets.reshape(-1)
    total = h.new_zeros(())
    for s in range(0, h.shape[0], chunk):
        part = checkpoint(
            _chunk_sum,
            h[s : s + chunk],
            y[s : s + chunk],
            head,
            pad_id,
            label_smoothing,
            use_reentrant=False,
        )
        total = total + part
    return total, int((y != pad_id).sum())
