"""Which ``attnkit train`` options a run ignores or, resumed, cannot change: refused by name
before any work.

Some options only mean something for some tasks or settings (``--block-size`` for the language
model, ``--vocab`` for the synthetic tasks, ``--vocab-size`` for the BPE tokenizer, ...). Given
where they have no effect, they used to be dropped silently; the user believed they had set
something. The library's config cannot tell a value the user gave from a task default it filled
in, so the verb checks the options the user gave (``given``) against the resolved config.
A resumed run keeps what defines it (every field but ``RUN_FIELDS``): an option that would
change it was refused only after the checkpoint and its model were loaded, by field name
(``d_model: 32 != 64``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attnkit.cli.support.common import UsageError

__all__ = ["SCOPES", "refuse_changed", "refuse_ignored", "shown"]

_SYNTHETIC = ("copy", "reverse", "sort")

SCOPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "block_size": ("the lm task", lambda c: c.task == "lm"),
    "lines": ("the lm task", lambda c: c.task == "lm"),
    "data": ("the lm and translate tasks", lambda c: c.task not in _SYNTHETIC),
    "valid_fraction": ("the lm and translate tasks", lambda c: c.task not in _SYNTHETIC),
    "vocab": ("the synthetic tasks (copy, reverse, sort)", lambda c: c.task in _SYNTHETIC),
    "length": ("the synthetic tasks (copy, reverse, sort)", lambda c: c.task in _SYNTHETIC),
    "min_length": ("the synthetic tasks (copy, reverse, sort)", lambda c: c.task in _SYNTHETIC),
    "train_size": ("the synthetic tasks (copy, reverse, sort)", lambda c: c.task in _SYNTHETIC),
    "valid_size": ("the synthetic tasks (copy, reverse, sort)", lambda c: c.task in _SYNTHETIC),
    "vocab_size": ("--tokenizer bpe", lambda c: c.tokenizer == "bpe"),
    "max_len": ("--pack and the lm task", lambda c: c.pack or c.task == "lm"),
}
"""TrainConfig field -> (what it is for, in words; whether it has an effect on a resolved
config)."""


def refuse_ignored(given: Mapping[str, object], config: Any, names: Mapping[str, str]) -> None:
    """A UsageError naming the first option in ``given`` (TrainConfig field -> value the user
    gave) that the resolved ``config`` ignores; ``names`` maps a field to its option."""
    for field, (scope, applies) in SCOPES.items():
        if field in given and not applies(config):
            what = f"--tokenizer {config.tokenizer}" if field == "vocab_size" else config.task
            raise UsageError(
                f"{names[field]}: is for {scope}; it has no effect with {what}, leave it out"
            )


def refuse_changed(
    given: Mapping[str, object], config: Any, resumed: Any, names: Mapping[str, str]
) -> None:
    """A UsageError naming the first option in ``given`` that would change what defines the
    run of checkpoint ``resumed`` (its resolved TrainConfig against the resolved ``config``)."""
    from attnkit.train.config import RUN_FIELDS

    before = resumed.train_config.resolved()
    for field in given:
        was, now = getattr(before, field), getattr(config, field)
        if field in RUN_FIELDS or field not in names or was == now:
            continue
        flag = names[field]
        raise UsageError(
            f"{flag}: the run of {resumed.path} was trained with {shown(was)}, got "
            f"{shown(now)}; a resumed run keeps its configuration (leave {flag} out, or "
            "train a new run without --resume)"
        )


def shown(value: object) -> str:
    """A value as the user types it: (0.9, 0.99) -> 0.9,0.99; True -> on; 300.0 -> 300;
    None -> none (also the defaults ``attnkit train --help`` shows)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)
