"""How much of an evaluation file a run was trained on: the training items of a run rebuilt from
its configuration (the synthetic generator, or the training file minus the held-out split), and
the items of another file found among them.

Evaluating on pairs the model was trained on measures memory, not translation; ``attnkit
evaluate --data`` warns with the count (:func:`training_overlap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnkit.train.config import TrainConfig
from attnkit.train.data.sources import SYNTHETIC, read_pairs, read_text_lines, synthetic_split

__all__ = ["Overlap", "training_items", "training_overlap"]


@dataclass(frozen=True)
class Overlap:
    """``shared`` of the ``total`` evaluated items occur in the training data; ``against``
    says what they were compared with (the whole training split, or only the sample stored with
    the checkpoint when the training file is gone)."""

    shared: int
    total: int
    against: str

    def warning(self, name: str) -> str | None:
        """One line for the user, or None when nothing is shared."""
        if not self.shared:
            return None
        return (
            f"warning: {self.shared} of the {self.total} examples of {name} are also in "
            f"{self.against}: their scores measure memory, not generalisation"
        )


def _key(item) -> tuple | str:
    return tuple(item) if isinstance(item, (list, tuple)) else item


def training_items(c: TrainConfig, heldout: Sequence) -> list | None:
    """The training items of a run with (resolved) config ``c`` whose held-out split was
    ``heldout``: pairs (seq2seq tasks) or lines (lm); None when its data file is gone."""
    if c.task in SYNTHETIC:
        train, _ = synthetic_split(
            c.task, c.train_size, c.valid_size, c.vocab, c.min_length, c.length, c.seed
        )
        return train
    if c.data is None or not Path(c.data).is_file():
        return None
    if c.task == "lm":
        held = set(heldout)
        return [s for s in read_text_lines(c.data) if s not in held]
    held_sources = {_key(x)[0] for x in heldout}
    return [p for p in read_pairs(c.data) if p[0] not in held_sources]


def training_overlap(
    c: TrainConfig, heldout: Sequence, train_sample: Sequence, items: Sequence
) -> Overlap:
    """How many of ``items`` (pairs or lines) occur in the training data of the run with config
    ``c``, held-out split ``heldout`` and stored ``train_sample``."""
    train = training_items(c, heldout)
    against = f"the training data of this run ({c.data or c.task})"
    if train is None:
        train = train_sample
        against = (
            f"the sample of {len(train_sample)} training examples stored with the checkpoint "
            f"(the training file {c.data} is gone, so more may be shared)"
        )
    seen = {_key(x) for x in train}
    return Overlap(sum(_key(x) in seen for x in items), len(items), against)
