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
