"""``make lm-bench-gpu`` stays runnable without a GPU: its plan (--dry-run), its arithmetic
(nanoGPT's flops per step and MFU, best loss, time to the target) and the whole pipeline on
the CPU with a tiny model (--tiny)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.benchmarks import BENCH, bench_module
from tests.train.conftest import RHYME


@pytest.fixture(scope="module")
def race():
    return bench_module("lm_race_gpu")


def test_the_recipe_is_nanogpts_train_shakespeare_char(race):
    r = race.GPU_RECIPE
    assert (r["layers"], r["nhead"], r["d_model"], r["block_size"], r["batch_size"]) == (
        6, 6, 384, 256, 64,
    )  # fmt: skip
    assert (r["dropout"], r["lr"], r["min_lr"], r["warmup"], r["betas"][1]) == (
        0.2, 1e-3, 1e-4, 100, 0.99,
    )  # fmt: skip


def test_flops_per_step_follow_nanogpts_estimate(race):
    # nanoGPT reports 10.65M parameters for this model (65 characters; wpe not counted)
    n = 10.65e6
    per_token = 6 * n + 12 * 6 * 6 * 64 * 256
    assert race.flops_per_step(race.GPU_RECIPE, 65) == pytest.approx(per_token * 256 * 64, 1e-3)


def test_summary_best_reach_and_mfu(race):
    r = {"curve": [(250, 30.0, 1.9), (500, 55.0, 1.47), (750, 80.0, 1.46), (1000, 100.0, 1.50)],
         "train_s": 100.0, "vocab": 65}  # fmt: skip
    s = race.summary(r, race.GPU_RECIPE, 1000, 989.0)
    assert (s["best"], s["best_step"], s["reach_s"], s["ms"]) == (1.46, 750, 55.0, 100.0)
    assert s["mfu"] == pytest.approx(race.flops_per_step(race.GPU_RECIPE, 65) * 10 / 989e12)
    never = race.summary(dict(r, curve=[(250, 30.0, 1.9)]), race.GPU_RECIPE, 1000, None)
    assert never["reach_s"] is None and never["mfu"] is None


def test_verdicts(race):
    ours = {"best": 1.47, "reach_s": 50.0}
    assert all("NOT" not in v for v in race.verdicts(ours, {"best": 1.46, "reach_s": 60.0}, 300))
    lines = race.verdicts(ours, {"best": 1.44, "reach_s": 40.0}, 400)
    assert all("NOT met" in v for v in lines)


def test_dry_run_prints_the_plan_and_trains_nothing(race, capsys, monkeypatch):
    monkeypatch.setattr(race, "_spawn", lambda *a: pytest.fail("trained"))
    assert race.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "5000 steps on cuda, compiled, bf16 autocast" in out and "'d_model': 384" in out


def test_tiny_race_on_the_cpu(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text(RHYME * 8, encoding="utf-8")
    cmd = [sys.executable, str(BENCH / "lm_race_gpu.py"), "--tiny", "--steps", "4",
           "--eval-every", "2", "--data", str(data)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plain-PyTorch GPT  best val" in out and "attnkit            best val" in out
    assert "best val: attnkit - peer" in out and "both sides" in out
