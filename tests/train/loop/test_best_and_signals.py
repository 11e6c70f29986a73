"""Checkpoints users can rely on: ``best/`` (the evaluation with the lowest held-out loss,
re-measured from its weights), the one reading rule (best for reading verbs, last for
--resume), --early-stop, SIGINT/SIGTERM sent to a real training process (a resumable checkpoint
and the exact resume command), untrusted config.json refused before any allocation, and the
plain progress lines and metrics.csv of a run whose stdout is not a terminal."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.train.best import Best
from attnkit.train.checkpoint import CheckpointError, find_checkpoint, list_checkpoints, verify
from attnkit.train.config import TrainConfig
from attnkit.train.data.tasks import seq2seq_example
from attnkit.train.inference import session
from attnkit.train.inference.metrics import heldout_loss
from attnkit.train.loop.progress import CSV_COLUMNS
from attnkit.train.loop.trainer import train

SRC = Path(__file__).resolve().parents[3] / "src"


def quiet(_: str) -> None:
    pass


def rows(run: Path) -> list[dict]:
    return [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines() if s]


def test_best_rule_in_unit():
    b = Best("loss")
    b, up = b.update({"step": 2, "val_loss": 3.0})
    assert up and (b.value, b.step, b.stale) == (3.0, 2, 0)
    b, up = b.update({"step": 4, "val_loss": 3.0})  # a tie is no improvement
    assert not up and b.stale == 1 and b.patience_out(1) and not b.patience_out(2)
    b, up = b.update({"step": 6, "val_loss": 2.5})
    assert up and (b.value, b.step, b.stale) == (2.5, 6, 0)
    h, up = Best("bleu").update({"step": 1, "val_bleu": 10.0})
    h, up = h.update({"step": 2, "val_bleu": 12.0})
    assert up and h.value == 12.0  # higher is better for BLEU
    assert Best.from_dict(b.to_dict(), "loss") == b
    assert Best.from_dict(b.to_dict(), "bleu") == Best("bleu")  # another metric starts over


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from tests.train.conftest import TINY

    out = tmp_path_factory.mktemp("best") / "run"
    cfg = TrainConfig(**{**TINY, "eval_every": 2, "save_every": 4, "keep": 1}, max_steps=12)
    train(cfg, out, echo=quiet)
    return out


def test_best_holds_the_lowest_held_out_loss(run_dir):
    evals = [r for r in rows(run_dir) if "val_loss" in r]
    want = min(evals, key=lambda r: r["val_loss"])  # the first of equal minima
    record = json.loads((run_dir / "best" / "best.json").read_text())
    assert record["step"] == want["step"] and record["value"] == want["val_loss"]
    verify(run_dir / "best")
    loaded = session.load(run_dir, best=True)
    assert loaded.path == run_dir / "best" and loaded.step == want["step"]
    assert "best checkpoint" in loaded.describe() and f"step {want['step']}" in loaded.describe()
    # re-measured from the stored weights, as training measured it (float64 sums)
    held = [seq2seq_example(loaded.tokenizer, s, t) for s, t in loaded.jsonl("heldout.jsonl")]
    assert heldout_loss(loaded.model, "seq2seq", held) == pytest.approx(
        want["val_loss"], rel=1e-6, abs=1e-9
    )


def test_reading_verbs_load_best_resume_loads_last(run_dir, capsys):
    assert find_checkpoint(run_dir, best=True) == run_dir / "best"
    assert find_checkpoint(run_dir) == list_checkpoints(run_dir)[-1] == run_dir / "step-00000012"
    assert find_checkpoint(run_dir / "step-00000012", best=True) == run_dir / "step-00000012"
    assert main(["evaluate", "--ckpt", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {run_dir / 'best'} (the best checkpoint of the run" in out


def test_early_stop_follows_the_rule(tmp_path, tiny):
    out = tmp_path / "es"
    cfg = TrainConfig(**{**tiny, "eval_every": 1, "lr_factor": 30.0}, max_steps=40, early_stop=2)
    last = train(cfg, out, echo=quiet)
    b, expected = Best("loss"), 40
    for r in (r for r in rows(out) if "val_loss" in r):
        b, _ = b.update(r)
        if b.patience_out(2):
            expected = r["step"]
            break
    assert last.name == f"step-{expected:08d}"


def test_best_by_bleu(tmp_path, tiny):
    out = tmp_path / "bleu"
    cfg = TrainConfig(**{**tiny, "eval_every": 3}, max_steps=12, best_metric="bleu")
    train(cfg, out, echo=quiet)
    evals = [r for r in rows(out) if "val_bleu" in r]
    assert len(evals) == 4
    want = max(evals, key=lambda r: r["val_bleu"])  # the first of equal maxima
    record = json.loads((out / "best" / "best.json").read_text())
    assert record["metric"] == "bleu" and record["step"] == want["step"]
    assert record["value"] == want["val_bleu"]
    with pytest.raises(ValueError, match="best_metric: BLEU needs an encoder-decoder task"):
        TrainConfig(task="lm", data="x.txt", best_metric="bleu").resolved()


def test_untrusted_config_refused_before_building(tmp_path, tiny, capsys):
    ckpt = train(TrainConfig(**tiny, max_steps=2), tmp_path / "r", echo=quiet)

    def rewrite(cfg: dict) -> None:
        (ckpt / "config.json").write_text(json.dumps(cfg))
        manifest = json.loads((ckpt / "manifest.json").read_text())
        digest = hashlib.sha256((ckpt / "config.json").read_bytes()).hexdigest()
        manifest["files"]["config.json"] = digest  # a matching manifest: the hash proves nothing
        (ckpt / "manifest.json").write_text(json.dumps(manifest))

    original = json.loads((ckpt / "config.json").read_text())
    huge = json.loads(json.dumps(original))
    huge["model"]["d_model"] = 10**7  # building this would need terabytes
    rewrite(huge)
    with pytest.raises(CheckpointError, match=r"weights do not match config.json: shape mismatch"):
        session.load(ckpt)
    code = main(["translate", "--ckpt", str(ckpt), "1 2"])
    err = capsys.readouterr().err
    assert code == 2 and "shape mismatch" in err and "10000000" in err and "internal" not in err
    del huge["model"]
    rewrite(huge)
    with pytest.raises(CheckpointError, match=r"has no 'model' section \(the model's sizes\)"):
        session.load(ckpt)
    rewrite(original)
    session.load(ckpt)  # the original still loads


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "attnkit", "train", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


TRAIN_ARGS = [
    "--task", "reverse", "--train-size", "400", "--valid-size", "16", "--vocab", "6",
    "--length", "5", "--d-model", "16", "--nhead", "2", "--layers", "1",
    "--dim-feedforward", "32", "--batch-size", "16", "--log-every", "1", "--eval-every", "7",
    "--save-every", "1000", "--max-steps", "100000",
]  # fmt: skip
LINE = re.compile(
    r"^step (\d+)/100000  loss \d+\.\d{4}  lr \d\.\d\de-\d\d  [\d,]+ tok/s  elapsed \d+:\d\d  "
    r"ETA \S+(  val loss \d+\.\d{4})?(  eval \d+% of time)?$"
)


def _wait_for_step(p: subprocess.Popen, step: int) -> list[str]:
    seen = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        m = LINE.match(seen[-1])
        if m and int(m.group(1)) >= step:
            return seen
    p.kill()
    pytest.fail(f"the run did not reach step {step}: {seen[-5:]}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_writes_a_resumable_checkpoint(tmp_path, sig):
    p = _start([*TRAIN_ARGS, "--out", "run"], tmp_path)
    seen = _wait_for_step(p, 9)
    p.send_signal(sig)
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    lines = seen + rest.splitlines()
    steps = [l for l in lines if l.startswith("step ") and "/100000  loss" in l]
    assert steps and all(LINE.match(s) for s in steps), steps[:3]
    assert any("val loss" in s for s in lines)  # the evaluation at step 7 is reported
    m = re.search(r"interrupted \((\w+)\) after step (\d+): checkpoint (\S+) written; "
                  r"continue with: (attnkit train --resume \S+)$", err.strip())  # fmt: skip
    assert m, err
    assert m.group(1) == sig.name
    stopped = int(m.group(2))
    ckpt = tmp_path / m.group(3)
    assert ckpt.name == f"step-{stopped:08d}" and stopped >= 9
    verify(ckpt)
    metrics = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert tuple(metrics[0]) == CSV_COLUMNS
    assert [int(r["step"]) for r in metrics if r["loss"]] == list(range(1, stopped + 1))
    # the printed command continues the run (here 2 more steps)
    cmd = shlex.split(m.group(4))[1:] + ["--max-steps", str(stopped + 2), "--no-progress"]
    q = _start(cmd[1:], tmp_path)
    out, err = q.communicate(timeout=240)
    assert q.returncode == 0, err
    assert f"step {stopped + 2}" in out and (tmp_path / "run" / f"step-{stopped + 2:08d}").is_dir()


def test_second_signal_stops_at_once(tmp_path):
    p = _start([*TRAIN_ARGS, "--out", "run"], tmp_path)
    _wait_for_step(p, 3)
    p.send_signal(signal.SIGINT)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err
    for ckpt in list_checkpoints(tmp_path / "run"):
        verify(ckpt)  # whatever was written is complete
