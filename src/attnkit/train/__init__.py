"""Training Transformers on tasks (copy, reverse, sort, lm, translate) built on
:mod:`attnkit.nn` / :mod:`attnkit.models`.

Files, in dependency order: ``data`` (reading files, synthetic tasks, the held-out split),
``tokenizer`` (``tokenizers`` models trained on the split), ``config`` (:class:`TrainConfig`),
``loss`` (the one token cross-entropy, and its chunked form), ``packing`` (packed rows),
``tasks`` (config -> ids and model), ``batches`` (length buckets as a function of seed and
epoch), ``schedule`` (warm-up), ``state`` (optimiser and RNG state as tensors + JSON),
``checkpoint`` (atomic directories, verification), ``session`` (what a checkpoint holds, loading
it), ``metrics`` (exact match, BLEU/chrF, perplexity, decoding helpers), ``progress`` (the bar),
``distributed`` (torchrun), ``steps`` (one optimiser step, one evaluation, activation
checkpointing), ``trainer`` (the loop).

    from attnkit.train import TrainConfig, train, load
    ckpt = train(TrainConfig(task="copy", max_steps=600), "runs/copy")
    model = load(ckpt).model
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.lazy import lazy_exports

# imported on first use: attnkit.train.config (read by ``attnkit train --help``) stays torch-free
__getattr__ = lazy_exports(
    __name__,
    {
        "TrainConfig": "attnkit.train.config",
        "load": "attnkit.train.session",
        "train": "attnkit.train.trainer",
    },
)

if TYPE_CHECKING:  # pragma: no cover
    from attnkit.train.config import TrainConfig
    from attnkit.train.session import load
    from attnkit.train.trainer import train

__all__ = ["TrainConfig", "load", "train"]
