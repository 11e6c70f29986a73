"""Training with --pack / --window: configuration checks, a clear error for a pair longer than a
row, bit-identical resume of a packed windowed run, and tiny end-to-end CLI runs (lm with
--pack --window 64 then generate; translate with --pack).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnkit.cli import main
from attnkit.train.config import TrainConfig
from attnkit.train.data.sources import DataError
from tests.support.train_log import resumed_logs


# ---------------------------------------------------------------------------------------------
# config, training, CLI
# ---------------------------------------------------------------------------------------------
def test_config_checks(rhyme_file):
    with pytest.raises(ValueError, match="^window: local attention is for the lm task"):
        TrainConfig(task="reverse", window=4).resolved()
    with pytest.raises(ValueError, match="^max_len: expected a positive int, got 0"):
        TrainConfig(task="lm", data=str(rhyme_file), max_len=0).resolved()
    with pytest.raises(TypeError, match="^pack: "):
        TrainConfig(pack="yes").resolved()
    c = TrainConfig(task="lm", data=str(rhyme_file), max_len=32).resolved()
    assert c.block_size == 32
    assert TrainConfig(task="translate", data="x.tsv", pack=True).resolved().max_len is None


def test_too_long_pair_is_a_clear_error(tmp_path):
    from attnkit.train.data.tasks import prepare

    tsv = tmp_path / "p.tsv"
    tsv.write_text("a b c d e f g h\tx\nhi\tsalut\nyes\toui\n", encoding="utf-8")
    c = TrainConfig(task="translate", data=str(tsv), pack=True, max_len=4, tokenizer="word")
    with pytest.raises(DataError, match=r"p\.tsv: training example \d+ has \d+ tokens.*--max-len"):
        prepare(c.resolved())


def test_packed_resume_is_bit_identical(tmp_path, tiny, rhyme_file):
    tiny.update(task="lm", data=str(rhyme_file), max_len=12, valid_fraction=0.25, pack=True)
    tiny.update(window=3, keep=10, batch_size=2)
    want, got = resumed_logs(tiny, tmp_path)
    assert len(want) == 8 + 2 and got == want  # every loss, and the evaluations at 6 and 8


TINY_ARGS = ["--d-model", "16", "--nhead", "2", "--layers", "1", "--dim-feedforward", "32"]


def test_cli_lm_pack_window_then_generate(capsys, tmp_path, rhyme_file):
    out = tmp_path / "lm"
    argv = ["train", "--task", "lm", "--data", rhyme_file, "--pack", "--window", "64"]
    argv += ["--out", out, "--max-steps", "3", "--no-progress", "--batch-size", "4", *TINY_ARGS]
    argv += ["--checkpoint"]
    assert main([str(a) for a in argv]) == 0
    cfg = json.loads(next(out.glob("step-*/config.json")).read_text())
    assert cfg["train"]["pack"] is True and cfg["train"]["window"] == 64
    assert cfg["train"]["checkpoint"] is True
    assert cfg["model"]["window"] == 64
    assert cfg["model"].get("attention_dropout") is None  # None: = dropout
    capsys.readouterr()
    assert main(["generate", "--ckpt", str(out), "--prompt", "humpty dumpty"]) == 0
    assert capsys.readouterr().out.startswith("humpty dumpty")


def test_cli_translate_pack(capsys, tmp_path):
    tsv = tmp_path / "pairs.tsv"
    words = ["cat", "dog", "sun", "tree", "house", "red", "big", "the", "a", "sees"]
    g = np.random.default_rng(0)
    lines = []
    for i in range(120):
        s = " ".join(g.choice(words, size=int(g.integers(2, 7))))
        lines.append(f"{s} {i}\t{s[::-1]} {i}")
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "tr"
    argv = ["train", "--task", "translate", "--data", tsv, "--pack", "--max-len", "64"]
    argv += ["--out", out, "--max-steps", "3", "--log-every", "1", "--no-progress", *TINY_ARGS]
    assert main([str(a) for a in argv]) == 0
    rows = [json.loads(s) for s in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
