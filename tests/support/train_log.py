"""Reading a training run's JSONL log in tests."""

from __future__ import annotations

import json
from pathlib import Path


def logged(path: Path, keys: tuple[str, ...] = ("loss", "val_loss", "lr")) -> dict:
    """{(step, key): value} for every ``keys`` entry of every line of the log at ``path``."""
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for key in keys:
            if key in row:
                out[(row["step"], key)] = row[key]
    return out


def resumed_logs(
    tiny: dict, tmp_path: Path, stop: int = 5, steps: int = 8, keys=("loss", "val_loss")
) -> tuple[dict, dict]:
    """(logged values of an uninterrupted run of ``steps``, those of a run stopped at ``stop``
    and resumed to ``steps`` in the same directory), the stopped run's final evaluation left
    out: equal when resuming is bit-identical."""
    from attnkit.train.config import TrainConfig
    from attnkit.train.loop.trainer import train

    def quiet(_: str) -> None:
        pass

    full = train(TrainConfig(max_steps=steps, **tiny), tmp_path / "full", echo=quiet)
    train(TrainConfig(max_steps=stop, **tiny), tmp_path / "a", echo=quiet)
    train(TrainConfig(max_steps=steps, **tiny), tmp_path / "a", resume=tmp_path / "a", echo=quiet)
    want = logged(full.parent / "log.jsonl", keys)
    got = logged(tmp_path / "a" / "log.jsonl", keys)
    del got[(stop, "val_loss")]
    return want, got
