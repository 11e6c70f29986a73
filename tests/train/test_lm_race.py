"""``make lm-bench`` stays runnable: the race (plain-PyTorch peer and attnkit side by side) on
a small text for a few steps prints both sides, the ratio and the targets; the peer's schedule
is nanoGPT's get_lr."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

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
