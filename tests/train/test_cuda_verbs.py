"""Every verb with --device cuda in a real process, on a real GPU (skipped without one): train
(every task, bf16 where the GPU has it, --compile), evaluate, translate, generate, and a GPU
run's checkpoint read back on the CPU. The same code paths run on the CPU with an emulated GPU
in tests/train/loop/test_fake_gpu.py, so CI catches a tensor created on the wrong device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.conftest import RHYME

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SRC = str(Path(__file__).resolve().parents[2] / "src")
MODEL = ["--d-model", "32", "--nhead", "2", "--layers", "1", "--dim-feedforward", "64",
         "--no-progress"]  # fmt: skip
TINY = [*MODEL, "--max-steps", "6", "--eval-every", "3", "--save-every", "3"]


def attnkit(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "attnkit", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture(scope="module")
def rhyme(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "rhyme.txt"
    p.write_text(RHYME, encoding="utf-8")
    return p


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_train_seq2seq_tasks(task, device, tmp_path):
    attnkit("train", "--task", task, "--train-size", "200", *TINY, "--out", tmp_path / "r",
            "--device", device)  # fmt: skip
    attnkit("translate", "--ckpt", tmp_path / "r", "1 2 3", "--device", device)
    attnkit("translate", "--ckpt", tmp_path / "r", "1 2 3", "--beam", "3", "--device", device)
    attnkit("evaluate", "--ckpt", tmp_path / "r", "--device", device)
    attnkit("evaluate", "--ckpt", tmp_path / "r", "--device", "cpu")  # a GPU run on the CPU


@pytest.mark.parametrize(
    "extra", [[], ["--pack", "--lines"], ["--checkpoint"], ["--compile"], ["--fp16"]]
)
def test_train_lm_then_generate_and_evaluate(extra, rhyme, tmp_path):
    bf16 = ["--bf16"] if torch.cuda.is_bf16_supported() and "--fp16" not in extra else []
    attnkit("train", "--task", "lm", "--data", rhyme, "--tokenizer", "char", "--block-size", "16",
            *TINY, *extra, *bf16, "--out", tmp_path / "lm", "--device", "cuda")  # fmt: skip
    attnkit("generate", "--ckpt", tmp_path / "lm", "--prompt", "humpty", "--device", "cuda")
    attnkit("evaluate", "--ckpt", tmp_path / "lm", "--device", "cuda")


def test_resume_on_the_gpu_is_bit_exact(rhyme, tmp_path):
    import json

    args = ["train", "--task", "lm", "--data", rhyme, "--tokenizer", "char", "--block-size",
            "16", *MODEL, "--dropout", "0.2", "--log-every", "1", "--device", "cuda"]  # fmt: skip
    attnkit(*args, "--max-steps", "6", "--save-every", "3", "--out", tmp_path / "full")
    attnkit(*args, "--max-steps", "3", "--save-every", "3", "--out", tmp_path / "half")
    attnkit(*args, "--max-steps", "6", "--save-every", "3", "--resume", tmp_path / "half")

    def losses(run):
        rows = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    assert losses(tmp_path / "full") == losses(tmp_path / "half")


def test_bf16_without_gpu_support_is_a_clear_error(tmp_path):
    if torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has bf16")
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-m", "attnkit", "train", *TINY, "--bf16", "--out",
                           str(tmp_path / "r"), "--device", "cuda"], capture_output=True,
                          text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2 and "bf16: this GPU" in done.stderr
