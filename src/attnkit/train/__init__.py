"""Training Transformers on tasks (copy, reverse, sort, lm, translate) built on
:mod:`attnkit.nn` / :mod:`attnkit.models`.

Layers, bottom first: ``config`` (:class:`TrainConfig`) and ``loss`` (the one token
cross-entropy); :mod:`attnkit.train.data` (files, synthetic tasks, tokenisers, streams, packed
rows, batches); :mod:`attnkit.train.inference` (evaluation, decoding, scoring: what the verbs
that use a trained model import); :mod:`attnkit.train.loop` (the training run, checkpoints,
several processes). Each imports only the layers below it.

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
        "load": "attnkit.train.inference.session",
        "train": "attnkit.train.loop.trainer",
    },
)

if TYPE_CHECKING:  # pragma: no cover
    from attnkit.train.config import TrainConfig
    from attnkit.train.inference.session import load
    from attnkit.train.loop.trainer import train

__all__ = ["TrainConfig", "load", "train"]
