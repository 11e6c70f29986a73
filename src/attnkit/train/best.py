"""The best evaluation of a run so far, which decides what ``best/`` holds and when
``--early-stop N`` ends a run.

Metrics (``--best-metric``): ``loss``, the held-out loss (lower is better, every task), or
``bleu``, held-out BLEU of greedy decoding (higher is better, encoder-decoder tasks). The record
travels with every checkpoint (``state.json``), so a resumed run keeps its best and its count of
evaluations without improvement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["METRICS", "Best"]


@dataclass(frozen=True)
class _Metric:
    key: str  # the evaluation row's key
    label: str  # words for the user
    higher_is_better: bool


METRICS: dict[str, _Metric] = {
    "loss": _Metric("val_loss", "held-out loss", False),
    "bleu": _Metric("val_bleu", "held-out BLEU", True),
    "exact": _Metric("val_loss_exact", "held-out loss (whole split)", False),
}


@dataclass(frozen=True)
class Best:
    """``metric`` (a key of :data:`METRICS`); the best ``value`` and its ``step`` (None before
    the first evaluation); ``stale``: evaluations since the last improvement."""

    metric: str = "loss"
    value: float | None = None
    step: int | None = None
    stale: int = 0

    @property
    def label(self) -> str:
        return METRICS[self.metric].label

    def update(self, row: dict) -> tuple[Best, bool]:
        """The record after evaluation ``row`` (with ``step`` and the metric's key), and whether
        it improved on the best so far (ties do not)."""
        m = METRICS[self.metric]
        if (
            m.key not in row
        ):  # "exact": the whole split was not scored (the estimate did not beat it)
            return dataclasses.replace(self, stale=self.stale + 1), False
        value = float(row[m.key])
        better = self.value is None or (
            value > self.value if m.higher_is_better else value < self.value
        )
        if better:
            return Best(self.metric, value, int(row["step"]), 0), True
        return dataclasses.replace(self, stale=self.stale + 1), False

    def patience_out(self, patience: int | None) -> bool:
        """True when ``patience`` (``--early-stop``) evaluations in a row did not improve."""
        return patience is not None and self.stale >= patience

    def describe(self) -> str:
        """``held-out loss 1.2345 at step 400``."""
        if self.value is None:
            return f"{self.label}: not evaluated yet"
        return f"{self.label} {self.value:.4f} at step {self.step}"

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None, metric: str) -> Best:
        """The record stored in a checkpoint (``d``; None for a checkpoint written before
        records were kept). A record of another metric starts over with ``metric``."""
        if not d or d.get("metric") != metric:
            return cls(metric)
        return cls(metric, d.get("value"), d.get("step"), int(d.get("stale", 0)))
