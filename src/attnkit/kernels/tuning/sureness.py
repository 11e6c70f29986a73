"""How sure ``attnkit tune`` was of one decision, as a value stored beside the tuning.

A decision races candidates alternately (A B A B ...) and looks at the per-pair speed ratios of
the chosen value against the built-in one: :class:`Sureness` keeps their median, their spread
(half the interquartile range), how many pairs, and a verdict in plain words ("clear: ...",
"tie: kept the built-in default"). ``attnkit info`` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Sureness"]


@dataclass(frozen=True)
class Sureness:
    """``ratio``: the median per-pair speed ratio the verdict rests on (for a race against the
    built-in value: built-in time / chosen time); ``spread``: half the interquartile range of
    the per-pair ratios; ``repeats``: the pairs raced; ``verdict``: the decision in words."""

    ratio: float
    spread: float
    repeats: int
    verdict: str

    def __post_init__(self) -> None:
        for name in ("ratio", "spread"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int):
            raise TypeError(f"repeats: expected int, got {type(self.repeats).__name__}")
        if self.repeats < 0:
            raise ValueError(f"repeats: expected >= 0, got {self.repeats}")
        if not isinstance(self.verdict, str) or not self.verdict:
            raise TypeError(f"verdict: expected a non-empty str, got {self.verdict!r}")

    def words(self) -> str:
        """The verdict with its evidence, e.g. ``"clear: faster beyond the noise (median
        ratio 1.32x +/- 0.04 over 9 races)"``."""
        if self.repeats == 0:
            return self.verdict
        return (
            f"{self.verdict} (median ratio {self.ratio:.2f}x +/- {self.spread:.2f} "
            f"over {self.repeats} races)"
        )

    def record(self) -> dict[str, object]:
        """The JSON form the tuning file stores."""
        return {
            "ratio": self.ratio,
            "spread": self.spread,
            "repeats": self.repeats,
            "verdict": self.verdict,
        }
