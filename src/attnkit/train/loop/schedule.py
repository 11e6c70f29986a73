"""Learning-rate schedules; steps count from 1 (the first optimiser update), and the step is a
schedule's only state (a checkpoint stores it).

``noam`` (Vaswani et al. 2017, section 5.3, with a factor)::

    lr(step) = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

It rises linearly for ``warmup`` steps, peaks at factor · (d_model · warmup)^-0.5, then decays
as step^-0.5.

``cosine`` (nanoGPT's ``get_lr`` with ``it = step - 1``)::

    it < warmup:        lr · (it + 1) / (warmup + 1)
    it > total:         min_lr
    else:               min_lr + (lr - min_lr) · (1 + cos(π · (it - warmup) / (total - warmup))) / 2

``constant``: the same linear warm-up, then ``lr``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnkit.checks import choice, nonnegative_int, positive_float, positive_int
from attnkit.train.config import CHOICES

__all__ = ["SCHEDULES", "Schedule", "noam_lr"]

SCHEDULES = CHOICES["schedule"]


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The learning rate of update ``step`` (>= 1)."""
    positive_int("step", step)
    positive_int("d_model", d_model)
    positive_int("warmup", warmup)
    positive_float("factor", factor)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule (see the module docstring): ``kind`` in :data:`SCHEDULES`;
    ``warmup`` steps; noam: ``d_model`` and ``factor``; cosine/constant: peak ``lr``,
    ``min_lr``; cosine: ``total`` steps (the decay ends there)."""

    kind: str
    warmup: int
    d_model: int = 1
    factor: float = 1.0
    lr: float = 1e-3
    min_lr: float = 1e-4
    total: int = 1

    def __post_init__(self) -> None:
        choice("kind", self.kind, SCHEDULES)
        nonnegative_int("warmup", self.warmup)
        positive_int("total", self.total)

    def __call__(self, step: int) -> float:
        """The learning rate of update ``step`` (>= 1)."""
        positive_int("step", step)
        if self.kind == "noam":
            return noam_lr(step, self.d_model, max(self.warmup, 1), self.factor)
        it = step - 1
        if it < self.warmup:
            return self.lr * (it + 1) / (self.warmup + 1)
        if self.kind == "constant":
            return self.lr
        if it > self.total:
            return self.min_lr
        ratio = (it - self.warmup) / max(self.total - self.warmup, 1)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.lr - self.min_lr)
