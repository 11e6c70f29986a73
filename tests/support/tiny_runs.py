"""Tiny ``attnkit train`` runs made in seconds, for the tests that read a run directory as
``--model`` (a character language model and a translation model, 2 layers of width 16,
3 steps): ``train_lm(root / "lm")``, ``train_translate(root / "tr")``."""

from __future__ import annotations

from pathlib import Path

from attnkit.train.config import TrainConfig
from attnkit.train.loop.trainer import train

TEXT = "ALICE:\nthe cat sat on the mat.\n\nBOB:\na dog ran in the park, and sat.\n\n" * 30
PAIRS = "".join(f"the cat {w}.\tle chat {w}.\nthe dog {w}.\tle chien {w}.\n" for w in
                ("sat", "ran", "ate", "slept", "jumped", "sang", "left", "came"))  # fmt: skip
TINY = dict(d_model=16, nhead=2, layers=2, dim_feedforward=32, max_steps=3, eval_every=3,
            save_every=3, log_every=3)  # fmt: skip


def _quiet(_: str) -> None:
    pass


def train_lm(run: Path, **extra) -> Path:
    """A tiny character language model trained on :data:`TEXT` into ``run`` (TrainConfig
    fields in ``extra`` override :data:`TINY`)."""
    data = run.parent / "text.txt"
    if not data.exists():
        data.write_text(TEXT, encoding="utf-8")
    train(TrainConfig(task="lm", data=str(data), **{**TINY, **extra}), run, echo=_quiet)
    return run


def train_translate(run: Path) -> Path:
    """A tiny translation model trained on :data:`PAIRS` into ``run``."""
    data = run.parent / "pairs.tsv"
    if not data.exists():
        data.write_text(PAIRS, encoding="utf-8")
    c = TrainConfig(task="translate", data=str(data), valid_fraction=0.2, **TINY)
    train(c, run, echo=_quiet)
    return run
