"""--resume is bit-identical: stop at step k, resume, and every logged loss (and held-out loss)
equals, to the last bit, that of an uninterrupted run; for the encoder-decoder and the LM, with
dropout on, resuming in the same run directory (from the checkpoint resolved once, as
``attnkit train --resume`` hands it to the run) or a new one (from a path)."""

from __future__ import annotations

import pytest

from attnkit.train.checkpoint import resolve
from attnkit.train.config import TrainConfig
from attnkit.train.loop.trainer import train
from tests.support.train_log import logged


def quiet(_: str) -> None:
    pass


@pytest.mark.parametrize("task", ["reverse", "lm"])
def test_resume_is_bit_identical(tmp_path, tiny, rhyme_file, task):
    if task == "lm":
        tiny.update(task="lm", data=str(rhyme_file), block_size=8, valid_fraction=0.25)
    tiny["keep"] = 10
    full = train(TrainConfig(max_steps=14, **tiny), tmp_path / "full", echo=quiet)
    # stop at step 6 (a checkpoint at 4 and one at the end), resume from the end ...
    train(TrainConfig(max_steps=6, **tiny), tmp_path / "a", echo=quiet)
    resumed = resolve(tmp_path / "a")
    assert (resumed.path, resumed.run_dir, resumed.step) == (
        tmp_path / "a/step-00000006",
        tmp_path / "a",
        6,
    )
    train(TrainConfig(max_steps=14, **tiny), tmp_path / "a", resume=resumed, echo=quiet)
    # ... and from the checkpoint of step 4 into a new directory
    train(
        TrainConfig(max_steps=14, **tiny),
        tmp_path / "b",
        resume=tmp_path / "full/step-00000004",
        echo=quiet,
    )
    want = logged(full.parent / "log.jsonl")
    got_a = logged(tmp_path / "a" / "log.jsonl")
    got_b = logged(tmp_path / "b" / "log.jsonl")
    assert len(want) >= 14
    assert got_a == want  # the log was cut back to step 6, then continued
    assert got_b and all(want[k] == v for k, v in got_b.items())
    assert min(s for s, _ in got_b) == 5
