"""What ``attnkit tune`` works with, as values: the :class:`Budget` of a run, what one
measurement settled (:class:`Found`, with how sure it was) and the whole result (:class:`Tuned`).
The measurements are in :mod:`attnkit.autotune`, which re-exports these."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnkit.kernels.tuning.sureness import Sureness
from attnkit.kernels.tuning.values import Tuning

__all__ = ["Budget", "Found", "Tuned"]


@dataclass(frozen=True)
class Budget:
    """How much to measure: ``length`` the sequence length of the crossover calls, ``reps``
    the timed repeats per candidate of a cost measurement (fastest kept; a race between
    candidates runs :func:`attnkit.kernels.tuning.timing.pairs` of ``reps`` alternate pairs and
    decides on their median ratio), ``margin`` how much faster (ratio, beyond the races' spread) a
    candidate must be to replace the safer choice."""

    length: int = 2048
    reps: int = 3
    margin: float = 1.05

    @classmethod
    def quick(cls) -> Budget:
        """A smoke-test budget (seconds, not tens of seconds; numbers only indicative)."""
        return cls(length=256, reps=2)


@dataclass(frozen=True)
class Found:
    """What one measurement settled: constant name -> value, what it saw (one line), the
    seconds it took (filled in by :func:`attnkit.autotune.tune`), and constant name -> how
    sure the decision was (:class:`~attnkit.kernels.tuning.sureness.Sureness`)."""

    values: dict[str, object]
    detail: str
    seconds: float = 0.0
    sureness: dict[str, Sureness] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Tuned:
    """The result of :func:`tune`: the tuning (defaults for what was not measured), each
    measurement's name and :class:`Found`, and the seconds it took."""

    tuning: Tuning
    found: tuple[tuple[str, Found], ...]
    seconds: float
