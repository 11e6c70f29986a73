"""What a run reports: metrics.csv (the numbers of log.jsonl as columns, truncated on resume
like the log), TensorBoard event files with --tensorboard (read back with TensorBoard's own
reader), and the plain progress lines of a run whose output is not a terminal."""

from __future__ import annotations

import csv
import json
import re
import time

import pytest

from attnkit.train.config import TrainConfig
from attnkit.train.loop.progress import CSV_COLUMNS, CsvLog
from attnkit.train.loop.trainer import train


def quiet(_: str) -> None:
    pass


def csv_rows(run) -> list[dict]:
    with (run / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_metrics_csv_matches_the_log_and_survives_resume(tmp_path, tiny):
    run = tmp_path / "run"
    cpu0 = time.process_time()
    train(TrainConfig(**tiny, max_steps=8), run, echo=quiet)
    cpu = time.process_time() - cpu0
    log = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
    # cpu_s: this process's CPU seconds inside the run, growing, within what train() took
    spent = [r["cpu_s"] for r in log if "loss" in r]
    assert len(spent) == 8 and 0 < spent[0] and spent == sorted(spent) and spent[-1] <= cpu
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


def test_resumed_metrics_csv_keeps_its_older_columns(tmp_path):
    """A run written before a column existed (here cpu_s) continues in its own columns."""
    path = tmp_path / "metrics.csv"
    old = [c for c in CSV_COLUMNS if c != "cpu_s"]
    first = {c: "" for c in old} | {"step": "1", "loss": "2.5", "elapsed_s": "0.5"}
    path.write_text(",".join(old) + "\n" + ",".join(first[c] for c in old) + "\n")
    log = CsvLog(path, keep_until=1)
    log.write({"step": 2, "loss": 1.25, "elapsed_s": 1.0, "cpu_s": 0.75})
    log.close()
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [tuple(r) for r in rows] == [tuple(old)] * 2  # no cell without a column
    assert [(r["step"], r["loss"], r["elapsed_s"]) for r in rows] == [
        ("1", "2.5", "0.5"),
        ("2", "1.25", "1.0"),
    ]


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
