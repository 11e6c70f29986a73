"""The defaults of a training run per task: the model and batch sizes of each task
(:data:`TASK_DEFAULTS`), seed 003's recipe (:data:`SEQ2SEQ_RECIPE`) and the language model's
(:data:`LM_RECIPE`, :data:`LM_LR`, :data:`LM_STEPS`). :meth:`attnkit.train.config.TrainConfig.
resolved` fills a config's unset fields from them; ``attnkit train --help`` shows them."""

from __future__ import annotations

__all__ = ["LM_LR", "LM_RECIPE", "LM_STEPS", "SEQ2SEQ_RECIPE", "TASK_DEFAULTS"]

_SYNTHETIC = dict(
    tokenizer="word",
    d_model=64,
    nhead=4,
    layers=2,
    dim_feedforward=256,
    dropout=0.0,
    batch_size=64,
    warmup=100,
    lr_factor=1.0,
)
TASK_DEFAULTS: dict[str, dict] = {
    "copy": _SYNTHETIC,
    "reverse": _SYNTHETIC,
    "sort": _SYNTHETIC,
    "translate": dict(
        tokenizer="bpe",
        d_model=128,
        nhead=4,
        layers=2,
        dim_feedforward=512,
        dropout=0.1,
        batch_size=64,
        warmup=400,
        lr_factor=1.0,
    ),
    "lm": dict(  # benchmarks/lm_race.py's BEST (nanoGPT's CPU recipe, windows of 128)
        tokenizer="char",
        d_model=128,
        nhead=4,
        layers=4,
        dim_feedforward=512,
        dropout=0.0,
        batch_size=8,
        warmup=100,
        lr_factor=1.0,
    ),
}

SEQ2SEQ_RECIPE = dict(
    block_size=64, schedule="noam", betas=(0.9, 0.98), bias=True, positions="sinusoidal",
    weight_decay=0.0,
)  # fmt: skip
"""Seed 003's recipe: the default of every task but lm, and of configs saved before issue 31."""

LM_RECIPE = dict(
    block_size=128, schedule="cosine", betas=(0.9, 0.99), bias=False, positions="learned",
    weight_decay=0.1,
)  # fmt: skip
"""The lm task's recipe (issue 31): the one that measured best in ``benchmarks/lm_race.py``
(nanoGPT's: cosine schedule, betas 0.9/0.99, weight decay 0.1, no biases; windows of 128),
GPT-2-shaped (learned positions, no output bias) so ``attnkit export --to hf`` accepts it."""

LM_LR = 4e-3
"""The lm task's peak learning rate with a cosine or constant schedule (``BEST``; others 1e-3)."""

LM_STEPS = 5000
"""The lm task's ``max_steps`` when neither it nor ``max_minutes`` is given (and always in
``attnkit train --task lm`` without --max-steps): the cosine schedule's length (nanoGPT's
shakespeare_char ``max_iters``)."""
