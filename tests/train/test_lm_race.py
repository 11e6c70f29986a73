"""``make lm-bench`` stays runnable: the race (plain-PyTorch peer and attnkit side by side) on
a small text for a few steps prints both sides, the ratio and the targets; the peer's schedule
is nanoGPT's get_lr."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.benchmarks import bench_module
from tests.train.conftest import RHYME

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_race_smoke(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text(RHYME * 4, encoding="utf-8")
    cmd = [sys.executable, str(BENCH / "lm_race.py"), "--steps", "3", "--rows", "same",
           "--data", str(data)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plain-PyTorch GPT" in out and "attnkit" in out and "x the peer" in out
    assert "loss as stated" in out and "no worse than the peer + 0.03" in out
    vals = [float(s.split(" val ")[1].split()[0]) for s in out.splitlines() if "nats/char (" in s]
    assert len(vals) == 2 and all(0 < v < 20 and math.isfinite(v) for v in vals)


def test_peer_schedule_is_nanogpts():
    sys.path.insert(0, str(BENCH))
    try:
        import lm_peer
    finally:
        sys.path.remove(str(BENCH))
    r = lm_peer.Recipe()
    assert lm_peer.lr_at(0, r) == pytest.approx(1e-3 / 101)
    assert lm_peer.lr_at(100, r) == pytest.approx(1e-3)
    assert lm_peer.lr_at(1050, r) == pytest.approx(1e-4 + 0.5 * 0.9e-3)
    assert lm_peer.lr_at(2000, r) == pytest.approx(1e-4)


def test_best_child_stops_at_its_budget(tmp_path):
    """The best row's child: a time budget (seconds) stops it before its planned steps, after
    the step that crossed the budget (the trainer checks it after each step)."""
    data = tmp_path / "t.txt"
    data.write_text(RHYME * 40, encoding="utf-8")
    cmd = [sys.executable, str(BENCH / "lm_race.py"), "--child", "best", "--steps", "100000",
           "--budget", "3", "--data", str(data)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 1 <= r["steps"] < 100000 and math.isfinite(r["val_nats"])
    # the budget (not the step count) stopped it: the run reached 3 s, and the last step started
    # before the budget ran out (1 s of slack for the bookkeeping between steps on a loaded machine)
    assert r["train_s"] >= 3.0 - 1e-3
    assert r["train_s"] - r["last_step_s"] < 3.0 + 1.0
    assert r["cpu_s"] > 0


def _race():
    return bench_module("lm_race")


def test_same_row_verdicts():
    """Last stop's numbers: 0.056 nats/char better than the peer fails the target as stated
    and meets the restatement; the speed is the ratio of wall rates, and per CPU second."""
    lm_race = _race()
    peer = {"steps": 2000, "steps_per_s": 4.0, "train_s": 500.0, "cpu_s": 400.0, "val_nats": 1.902}
    ours = {"steps": 2000, "steps_per_s": 5.0, "train_s": 400.0, "cpu_s": 200.0, "val_nats": 1.846}
    speed, stated, restated = lm_race.same_targets(ours, peer)
    assert "1.25x the peer's steps/s" in speed and "(target >= 1.2x: met)" in speed
    assert "2.00x per CPU second" in speed
    assert "-0.0560" in stated and "NOT met" in stated
    assert "-0.0560" in restated and restated.endswith(": met)")
    worse = lm_race.same_targets(ours | {"val_nats": 1.94}, peer)  # 0.038 worse
    assert "+0.0380" in worse[2] and worse[2].endswith("NOT met)")
    slower = lm_race.same_targets(ours | {"steps_per_s": 4.4}, peer)
    assert "1.10x" in slower[0] and "(target >= 1.2x: NOT met)" in slower[0]
