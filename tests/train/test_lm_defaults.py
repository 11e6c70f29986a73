"""Language-model defaults that go all the way (issue 31): ``attnkit train --task lm`` without
recipe flags trains the race's best recipe, GPT-2-shaped, which ``export --to hf`` writes and
transformers loads and generates with (stopping at the position table, never [UNK]); a prompt
suggested from the data; ``--eval-batches`` as nanoGPT's estimate, the exact score in
``evaluate``. Real processes and a real transformers load."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnkit.cli import main
from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.stream import random_windows
from attnkit.train.inference import session
from attnkit.train.inference.lm_generate import suggested_prompt
from attnkit.train.loop.trainer import train

SRC = Path(__file__).resolve().parents[2] / "src"
TEXT = "ALICE:\nthe cat sat on the mat.\n\nBOB:\na dog ran in the park, and sat.\n\n" * 30
SIZES = ("--d-model", "16", "--nhead", "2", "--layers", "1", "--dim-feedforward", "32")


def attnkit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "attnkit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm-defaults")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    done = attnkit(root, "train", "--task", "lm", "--data", "text.txt", "--max-steps", "3",
                   *SIZES, "--out", "run")  # fmt: skip
    root.joinpath("train.out").write_text(done.stdout)
    return root


def test_the_default_lm_recipe_is_the_races_best(run):
    c = json.loads((run / "run" / "best" / "config.json").read_text())["train"]
    assert c["schedule"] == "cosine" and c["lr"] == 4e-3 and c["min_lr"] == pytest.approx(4e-4)
    assert c["betas"] == [0.9, 0.99] and c["weight_decay"] == 0.1 and c["warmup"] == 100
    assert c["bias"] is False and c["positions"] == "learned" and c["tokenizer"] == "char"
    assert c["block_size"] == 128 and c["dropout"] == 0.0 and c["batch_size"] == 8
    seq2seq = TrainConfig(task="translate", data="x.tsv", max_steps=1).resolved()
    assert (seq2seq.schedule, seq2seq.betas, seq2seq.bias) == ("noam", (0.9, 0.98), True)


def test_train_suggests_a_prompt_from_the_data(run):
    line = next(s for s in (run / "train.out").read_text().splitlines() if "generate:" in s)
    assert shlex.split(line)[-1] in ("ALICE:", "BOB:") and "humpty" not in line  # a speaker
    assert suggested_prompt(["xx y\nBOB:\nthe end"]) == "BOB:"  # a stream sample: mid-line start
    assert suggested_prompt(["hello world, how are you today", "x"]) == "hello world, how are"


def test_export_generates_in_transformers_within_the_table(run):
    tf = pytest.importorskip("transformers")
    done = attnkit(run, "export", "--ckpt", "run", "--to", "hf", "hf")
    assert "GPT2LMHeadModel" in done.stdout and "max_length=128" in done.stdout
    model = tf.AutoModelForCausalLM.from_pretrained(run / "hf").eval()
    tok = tf.AutoTokenizer.from_pretrained(run / "hf")
    g = model.generation_config
    assert g.max_length == model.config.n_positions == 128
    assert {tk.PAD, tk.BOS, tk.UNK} <= set(g.suppress_tokens)
    ids = tok(["ALICE:"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, num_beams=1)  # the config's own length
        assert out.shape[1] <= 128 and (out.shape[1] == 128 or out[0, -1] == tk.EOS)
        sampled = model.generate(ids, max_new_tokens=100, do_sample=True, top_k=200)
    assert sampled.shape[1] <= ids.shape[1] + 100 and tk.UNK not in sampled[0].tolist()


def test_generate_samples_by_default_and_never_writes_unk(run):
    a = attnkit(run, "generate", "--ckpt", "run", "--prompt", "ALICE:", "--seed", "1").stdout
    b = attnkit(run, "generate", "--ckpt", "run", "--prompt", "ALICE:", "--seed", "2").stdout
    assert a != b  # sampled (temperature 0.8, top-k 200), not greedy
    assert "[UNK]" not in a + b and a.startswith("ALICE:") and b.startswith("ALICE:")


def test_eval_batches_estimates_without_touching_training(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    base = dict(task="lm", data=str(data), d_model=16, nhead=2, layers=1, dim_feedforward=32,
                block_size=16, max_steps=4, eval_every=2, log_every=1)  # fmt: skip
    quiet = lambda _: None  # noqa: E731
    train(TrainConfig(**base), tmp_path / "exact", echo=quiet)
    train(TrainConfig(**base, eval_batches=2), tmp_path / "est", echo=quiet)
    logs = {n: [json.loads(s) for s in (tmp_path / n / "log.jsonl").read_text().splitlines()]
            for n in ("exact", "est")}  # fmt: skip
    losses = {n: [r["loss"] for r in rows if "loss" in r] for n, rows in logs.items()}
    assert losses["exact"] == losses["est"]  # the estimate draws from its own generator
    est = [r for r in logs["est"] if "val_loss" in r]
    assert [r["val_batches"] for r in est] == [2, 2] and all(r["eval_s"] >= 0 for r in est)
    # the estimate at step 4, recomputed: the same windows, torch's cross-entropy in float64
    loaded = session.load(tmp_path / "est" / "step-00000004")
    held = tk.encode(loaded.tokenizer, loaded.jsonl("heldout.jsonl")[0])
    windows = torch.tensor(random_windows(held, 16, 2 * 8, 0, 4))
    with torch.no_grad():
        logits = loaded.model(windows[:, :-1]).double()
    ref = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert abs(est[-1]["val_loss"] - ref) <= 1e-6
    exact = [r for r in logs["exact"] if "val_loss" in r][-1]["val_loss"]
    assert abs(exact - est[-1]["val_loss"]) > 1e-9  # an estimate, not the full split
    code = main(["evaluate", "--ckpt", str(tmp_path / "est" / "step-00000004")])
    assert code == 0  # evaluate scores the whole held-out split
    # best/ on the whole split when asked: scored when the estimate beats the best so far
    train(TrainConfig(**base, eval_batches=2, best_metric="exact"), tmp_path / "both", echo=quiet)
    rows = [json.loads(s) for s in (tmp_path / "both" / "log.jsonl").read_text().splitlines()]
    full = {r["step"]: r["val_loss"] for r in logs["exact"] if "val_loss" in r}
    scored = {r["step"]: r["val_loss_exact"] for r in rows if "val_loss_exact" in r}
    assert 2 in scored  # the first evaluation has nothing to beat
    for step, value in scored.items():  # the same model as the exact run's at that step
        assert abs(value - full[step]) <= 1e-9
    record = json.loads((tmp_path / "both" / "best" / "best.json").read_text())
    assert record["metric"] == "exact" and record["value"] == min(scored.values())
