"""The learning-rate schedule of Vaswani et al. (2017), section 5.3, with a factor:

    lr(step) = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

It rises linearly for ``warmup`` steps, peaks at factor · (d_model · warmup)^-0.5, then decays
as step^-0.5. Steps count from 1 (the first optimiser update). The schedule's only state is the
step, which a checkpoint stores.
"""

from __future__ import annotations

from attnkit.checks import positive_float, positive_int

__all__ = ["noam_lr"]


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The learning rate of update ``step`` (>= 1)."""
    positive_int("step", step)
    positive_int("d_model", d_model)
    positive_int("warmup", warmup)
    positive_float("factor", factor)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
