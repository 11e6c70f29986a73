"""What a run reports: metrics.csv (the numbers of log.jsonl as columns, truncated on resume
like the log), TensorBoard event files with --tensorboard (read back with TensorBoard's own
reader), and the plain progress lines of a run whose output is not a terminal."""

from __future__ import annotations

import csv
import json
import re

import pytest

from attnkit.train.config import TrainConfig
from attnkit.train.progress import CSV_COLUMNS
from attnkit.train.trainer import train


def quiet(_: str) -> None:
    pass


def csv_rows(run) -> list[dict]:
    with (run / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_metrics_csv_matches_the_log_and_survives_resume(tmp_path, tiny):
    run = tmp_path / "run"
    train(TrainConfig(**tiny, max_steps=8), run, echo=quiet)
    log = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
    rows = csv_rows(run)
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == len(log)
    for r, want in zip(rows, log):
        for key, value in want.items():
            assert float(r[key]) == pytest.approx(float(value), rel=1e-12, abs=1e-12), key
    # resume from step 4: the rows after it are replaced, not duplicated
    cfg = TrainConfig(**tiny, max_steps=10)
    train(cfg, run, resume=run / "step-00000004", echo=quiet)
    steps = [(int(r["step"]), r["loss"] != "") for r in csv_rows(run)]
    assert len(steps) == len(set(steps))
    assert [s for s, is_train in steps if is_train] == list(range(1, 11))


def test_tensorboard_event_files(tmp_path, tiny):
    pytest.importorskip("tensorboard", reason="the optional extra attnkit[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    train(TrainConfig(**tiny, max_steps=6), run, echo=quiet, tensorboard=True)
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/loss", "val/exact"} <= tags
    log = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
    want = [(r["step"], r["loss"]) for r in log if "loss" in r]
    got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)  # float32


def test_plain_lines_when_not_a_terminal(tmp_path, tiny):
    lines: list[str] = []
    train(TrainConfig(**{**tiny, "log_every": 2}, max_steps=6), tmp_path / "r", progress="lines",
          echo=lines.append)  # fmt: skip
    steps = [s for s in lines if re.match(r"^step \d+/6  loss", s)]
    assert [int(s.split()[1].split("/")[0]) for s in steps] == [2, 4, 6]
    for s in steps:
        assert re.fullmatch(
            r"step \d/6  loss \d+\.\d{4}  lr \d\.\d\de-\d\d  [\d,]+ tok/s  elapsed \d+:\d\d  "
            r"ETA \d+:\d\d(  val loss \d+\.\d{4})?",
            s,
        ), s
    evals = [s for s in lines if re.match(r"^step 6/6  val loss \d+\.\d{4}  exact", s)]
    assert len(evals) == 1  # the evaluation at eval_every=6
    with pytest.raises(ValueError, match="progress: expected one of"):
        train(TrainConfig(**tiny, max_steps=1), tmp_path / "x", progress="fancy", echo=quiet)
