"""Tiny training settings shared by the training tests (seconds per run, not minutes)."""

from __future__ import annotations

import pytest

TINY = dict(
    task="reverse",
    train_size=400,
    valid_size=16,
    vocab=6,
    length=5,
    min_length=2,
    d_model=16,
    nhead=2,
    layers=1,
    dim_feedforward=32,
    dropout=0.1,
    batch_size=16,
    warmup=10,
    log_every=1,
    eval_every=6,
    save_every=4,
)

RHYME = """humpty dumpty sat on a wall
humpty dumpty had a great fall
all the king's horses and all the king's men
couldn't put humpty together again
jack and jill went up the hill
to fetch a pail of water
jack fell down and broke his crown
and jill came tumbling after
"""


@pytest.fixture
def tiny() -> dict:
    return dict(TINY)


@pytest.fixture
def rhyme_file(tmp_path):
    p = tmp_path / "rhyme.txt"
    p.write_text(RHYME, encoding="utf-8")
    return p
