"""attnkit train refuses, by name and before any work, an option the run would ignore (was:
dropped silently, e.g. --block-size or --data with the copy task, --vocab-size with the word
tokenizer, --vocab with translate); where the option has an effect it is accepted."""

from __future__ import annotations

import pytest

from attnkit.cli import main
from attnkit.cli.support.train_scope import SCOPES, refuse_ignored
from attnkit.train.config import TrainConfig

IGNORED = [  # (option, value, the run's other options, what the error says it is for)
    ("--block-size", "8", ["--task", "copy"], "the lm task"),
    ("--lines", None, ["--task", "reverse"], "the lm task"),
    ("--data", "{d}/pairs.tsv", ["--task", "sort"], "the lm and translate tasks"),
    ("--valid-fraction", "0.2", ["--task", "copy"], "the lm and translate tasks"),
    ("--vocab", "5", ["--task", "translate", "--data", "{d}/pairs.tsv"], "the synthetic tasks"),
    ("--length", "5", ["--task", "lm", "--data", "{d}/text.txt"], "the synthetic tasks"),
    ("--min-length", "2", ["--task", "lm", "--data", "{d}/text.txt"], "the synthetic tasks"),
    ("--train-size", "9", ["--task", "translate", "--data", "{d}/pairs.tsv"], "the synthetic"),
    ("--valid-size", "9", ["--task", "lm", "--data", "{d}/text.txt"], "the synthetic tasks"),
    ("--vocab-size", "300", ["--task", "lm", "--data", "{d}/text.txt"], "--tokenizer bpe"),
    ("--max-len", "30", ["--task", "copy"], "--pack and the lm task"),
]


def test_the_table_covers_the_cases():
    assert {o[2:].replace("-", "_") for o, *_ in IGNORED} == set(SCOPES)


@pytest.mark.parametrize("option, value, rest, scope", IGNORED, ids=[c[0] for c in IGNORED])
def test_an_ignored_option_is_refused_naming_it(capsys, tmp_path, option, value, rest, scope):
    (tmp_path / "pairs.tsv").write_text("a b\tc d\ne f\tg h\ni j\tk l\n")
    (tmp_path / "text.txt").write_text("the cat sat on the mat\n" * 20)
    argv = ["train", *rest, option, *([] if value is None else [value])]
    argv = [a.format(d=tmp_path) for a in argv] + ["--max-steps", "1", "--out", f"{tmp_path}/r"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"attnkit train: error: {option}: is for {scope}"), err
    assert "leave it out" in err and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "given, config",
    [
        ({"block_size": 8, "lines": True}, dict(task="lm", data="x")),
        ({"vocab": 5, "length": 6, "min_length": 2}, dict(task="reverse")),
        ({"data": "x", "valid_fraction": 0.2}, dict(task="translate", data="x")),
        ({"vocab_size": 300}, dict(task="translate", data="x")),  # bpe: translate's default
        ({"vocab_size": 300}, dict(task="copy", tokenizer="bpe")),
        ({"max_len": 30}, dict(task="copy", pack=True)),
        ({"max_len": 30}, dict(task="lm", data="x")),
    ],
)
def test_an_option_with_an_effect_is_accepted(given, config):
    c = TrainConfig(**{**config, **given}).resolved()
    refuse_ignored(given, c, {f: f"--{f}" for f in SCOPES})  # no error


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    argv = ["train", "--task", "reverse", "--out", str(d / "run"), "--max-steps", "2",
            "--train-size", "100", "--d-model", "16", "--nhead", "2", "--layers", "1",
            "--dim-feedforward", "32", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    return d / "run"


@pytest.mark.parametrize(
    "option, was, now",
    [
        (["--d-model", "32"], "16", "32"),
        (["--betas", "0.9,0.95"], "0.9,0.98", "0.9,0.95"),
        (["--no-tie-embeddings"], "on", "off"),
        (["--dropout", "0.2"], "0", "0.2"),
    ],
)
def test_an_option_that_would_change_a_resumed_run_is_refused_naming_it(
    capsys, resumable, option, was, now
):
    # was "config.json: the checkpoint comes from another configuration (checkpoint !=
    # requested: d_model: 16 != 32)", by field name, after the model had been loaded
    capsys.readouterr()
    code = main(["train", "--resume", str(resumable), "--max-steps", "3", *option])
    out, err = capsys.readouterr()
    flag = "--tie-embeddings" if option[0] == "--no-tie-embeddings" else option[0]
    ckpt = sorted(resumable.glob("step-*"))[-1]
    assert code == 2 and out == "", err
    assert err == (
        f"attnkit train: error: {flag}: the run of {ckpt} was trained with {was}, got {now}; a "
        f"resumed run keeps its configuration (leave {flag} out, or train a new run without "
        "--resume)\n"
    )


def test_run_options_and_unchanged_values_still_resume(capsys, resumable):
    argv = ["train", "--resume", str(resumable), "--max-steps", "3", "--d-model", "16"]
    assert main([*argv, "--log-every", "1", "--no-progress"]) == 0, capsys.readouterr().err
