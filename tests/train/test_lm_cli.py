"""The language-model verbs end to end (issue 20): a char-level stream model trained from the
command line, evaluated (nats/token, bits/char, the unigram baseline, perplexity=VALUE last;
--stride, --data), generating multi-line text with a warning for unknown prompt characters,
and one-line usage errors for bad recipe flags."""

from __future__ import annotations

import math

import pytest

from tests.train.conftest import RHYME
from tests.train.test_train_cli import TINY_ARGS, run

ARGS = ["--tokenizer", "char", "--block-size", "16", "--max-steps", "4", "--schedule",
        "cosine", "--lr", "3e-3", "--warmup", "1", "--betas", "0.9,0.99",
        "--weight-decay", "0.1", "--no-bias"]  # fmt: skip


@pytest.fixture
def char_run(capsys, tmp_path, rhyme_file):
    out = tmp_path / "lm"
    code, _, err = run(capsys, "train", "--task", "lm", "--data", rhyme_file, "--out", out,
                       *ARGS, *TINY_ARGS)  # fmt: skip
    assert code == 0, err
    return out


def _metrics(out: str) -> dict[str, float]:
    return {k: float(v) for k, _, v in (s.partition("=") for s in out.splitlines()) if _ == "="}


def test_evaluate_reports_bits_per_char(capsys, char_run, tmp_path):
    code, out, err = run(capsys, "evaluate", "--ckpt", char_run)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("perplexity=") and "unigram baseline" in out
    m = _metrics(out)
    assert m["bits/char"] == pytest.approx(m["nats/token"] / math.log(2), abs=1e-3)
    assert m["perplexity"] == pytest.approx(math.exp(m["nats/token"]), rel=1e-3)
    code, out2, err = run(capsys, "evaluate", "--ckpt", char_run, "--stride", "4")
    assert code == 0, err
    assert "every 4" in out2
    other = tmp_path / "other.txt"
    other.write_text("jack and jill\nwent up the hill\n", encoding="utf-8")
    code, out3, err = run(capsys, "evaluate", "--ckpt", char_run, "--data", other)
    assert code == 0, err
    assert "31 tokens" in out3 and "tokens scored: 30" in out3  # 31 characters
    assert _metrics(out3)["perplexity"] > 0
    code, _, err = run(capsys, "evaluate", "--ckpt", char_run, "--stride", "0")
    assert code == 2 and err.count("\n") == 1 and "--stride" in err
    # was accepted and scored with a stride of 16 (the block size) instead
    code, out, err = run(capsys, "evaluate", "--ckpt", char_run, "--stride", "17")
    assert (
        code == 2
        and out == ""
        and err
        == (
            "attnkit evaluate: error: --stride: expected at most the model's window, --block-size "
            "16 (a stride of 16 scores non-overlapping windows), got 17\n"
        )
    )


def test_generate_writes_lines_and_warns_for_unknown_text(capsys, char_run):
    sampling = ["--max-new-tokens", "60", "--temperature", "1.0", "--top-p", "0.95"]
    prompt = ["--prompt", "jack\u20ac"]
    code, out, err = run(capsys, "generate", "--ckpt", char_run, *prompt, *sampling)
    assert code == 0, err
    assert out.startswith("jack\u20ac") and len(out) > len("jack\u20ac") + 20
    assert "warning: --prompt" in err and "\u20ac" in err
    assert "[UNK]" not in out and "[EOS]" not in out


def test_word_model_generates_detokenised_text(capsys, tmp_path, rhyme_file):
    out = tmp_path / "w"
    code, _, err = run(capsys, "train", "--task", "lm", "--data", rhyme_file, "--out", out,
                       "--block-size", "8", "--max-steps", "2", *TINY_ARGS)  # fmt: skip
    assert code == 0, err
    code, text, err = run(capsys, "generate", "--ckpt", out, "--prompt", "humpty dumpty",
                          "--max-new-tokens", "30", "--temperature", "1.0")  # fmt: skip
    assert code == 0, err
    assert " ," not in text and " '" not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--betas", "0.9"], "--betas: expected two numbers B1,B2"),
        (["--schedule", "noam", "--lr", "1e-3"], "--lr: the noam schedule sets its own peak"),
        (["--eval-batches", "0"], "--eval-batches: expected a positive int"),
        (["--lines", "--eval-batches", "2"], "--eval-batches: the estimate from random held-out"),
    ],
)
def test_bad_recipe_flags_are_one_line(capsys, tmp_path, rhyme_file, args, message):
    argv = ["train", "--task", "lm", "--data", rhyme_file, "--out", tmp_path / "o", *args]
    if "--schedule" not in args:
        argv += ["--max-steps", "2"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_rhyme_fixture_has_lines():
    assert RHYME.count("\n") > 4
