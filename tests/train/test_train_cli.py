"""attnkit train / evaluate / translate / generate: --help with examples, the built-in default,
the metric=value last line, sacrebleu's signature on eng-fra-5k, one-line errors (exit 2)."""

from __future__ import annotations

import json
import re

import pytest

from attnkit.cli import main
from attnkit.explain.shared import shared_dir

ENG_FRA = shared_dir() / "data" / "eng-fra-5k.tsv"
TINY_ARGS = [
    "--d-model",
    "16",
    "--nhead",
    "2",
    "--layers",
    "1",
    "--dim-feedforward",
    "32",
    "--batch-size",
    "16",
    "--no-progress",
]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("verb", ["train", "evaluate", "translate", "generate"])
def test_help_has_an_example(capsys, verb):
    code, out, _ = run(capsys, verb, "--help")
    assert code == 0
    assert "examples:" in out and f"attnkit {verb} " in out.split("examples:")[1]


def test_top_level_help_lists_the_verbs(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for verb in ("train", "evaluate", "translate", "generate"):
        assert f"attnkit {verb}" in out


def test_default_train_then_evaluate_and_translate(capsys, tmp_path):
    out_dir = tmp_path / "copy"
    code, out, err = run(
        capsys,
        "train",
        "--out",
        out_dir,
        "--max-steps",
        "3",
        "--train-size",
        "300",
        "--valid-size",
        "20",
        *TINY_ARGS,
    )
    assert code == 0, err
    assert "no --task given: training the built-in copy task (vocabulary 10, length 10" in out
    assert (out_dir / "step-00000003" / "model.safetensors").is_file()
    code, out, err = run(capsys, "evaluate", "--ckpt", out_dir, "--n", "12")
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("exact_match=") and 0.0 <= float(last.split("=")[1]) <= 1.0
    assert "12 examples" in out
    code, out, err = run(capsys, "translate", "--ckpt", out_dir, "1 2 3", "4 5", "--beam", "2")
    assert code == 0, err
    assert len(out.splitlines()) == 2  # one line per sentence (an untrained model may say "")
    code, _, err = run(capsys, "generate", "--ckpt", out_dir, "--prompt", "1 2")
    assert code == 2 and "encoder-decoder" in err and len(err.strip().splitlines()) == 1


def test_lm_train_evaluate_generate(capsys, tmp_path, rhyme_file):
    out_dir = tmp_path / "lm"
    code, _, err = run(
        capsys,
        "train",
        "--task",
        "lm",
        "--data",
        rhyme_file,
        "--out",
        out_dir,
        "--max-steps",
        "3",
        "--block-size",
        "8",
        "--valid-fraction",
        "0.25",
        *TINY_ARGS,
    )
    assert code == 0, err
    code, out, err = run(capsys, "evaluate", "--ckpt", out_dir)
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("perplexity=")
    code, out, err = run(
        capsys,
        "generate",
        "--ckpt",
        out_dir,
        "--prompt",
        "humpty dumpty sat on",
        "--max-new-tokens",
        "4",
    )
    assert code == 0, err
    assert out.startswith("humpty dumpty sat on")
    code, out, err = run(
        capsys,
        "generate",
        "--ckpt",
        out_dir,
        "--prompt",
        "humpty",
        "--temperature",
        "0.8",
        "--top-k",
        "3",
        "--seed",
        "1",
    )
    assert code == 0, err
    code, _, err = run(capsys, "translate", "--ckpt", out_dir, "humpty")
    assert code == 2 and "language model" in err


@pytest.mark.skipif(not ENG_FRA.is_file(), reason=f"{ENG_FRA} is absent (shared test data)")
def test_translate_eng_fra_prints_sacrebleu_signatures(capsys, tmp_path):
    out_dir = tmp_path / "fra"
    code, _, err = run(
        capsys,
        "train",
        "--task",
        "translate",
        "--data",
        ENG_FRA,
        "--out",
        out_dir,
        "--max-steps",
        "2",
        "--vocab-size",
        "300",
        *TINY_ARGS,
    )
    assert code == 0, err
    heldout = [json.loads(s) for s in (out_dir / "step-00000002" / "heldout.jsonl").open()]
    sample = [json.loads(s) for s in (out_dir / "step-00000002" / "train_sample.jsonl").open()]
    assert 200 <= len(heldout) <= 300  # 5 % of the 5,000 pairs' distinct sources
    assert len(sample) == 200 and not {s for s, _ in heldout} & {s for s, _ in sample}
    code, out, err = run(capsys, "evaluate", "--ckpt", out_dir, "--n", "10", "--beam", "2")
    assert code == 0, err
    # each distinct source once, with all its references (nrefs:var when the count varies)
    assert re.search(r"BLEU \S+  \(nrefs:(var|\d+)\|case:mixed\|eff:no\|tok:13a\|smooth:exp", out)
    assert re.search(r"TER \S+  \(nrefs:(var|\d+)\|case:lc\|tok:tercom", out)
    assert "distinct sources, each decoded once" in out
    assert "chrF" in out and "nc:6|nw:0|space:no|version:" in out
    assert out.strip().splitlines()[-1].startswith("bleu=")
    code, out, err = run(
        capsys,
        "translate",
        "--ckpt",
        out_dir,
        "I am tired.",
        "--beam",
        "4",
        "--length-penalty",
        "0.6",
    )
    assert code == 0, err
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, match",
    [
        (["evaluate", "--ckpt", "{tmp}/missing"], "missing: no such checkpoint"),
        (["evaluate", "--ckpt", "{tmp}"], "not an attnkit checkpoint"),
        (
            ["train", "--task", "translate", "--data", "{tmp}/notab.tsv", "--out", "{tmp}/o"],
            "notab.tsv:2: expected 'source<TAB>target'",
        ),
        (
            ["train", "--task", "lm", "--data", "{tmp}/latin1.txt", "--out", "{tmp}/o"],
            "latin1.txt:2: not UTF-8",
        ),
        (["train", "--task", "lm", "--out", "{tmp}/o"], "--data: the lm task needs a data file"),
        (["train", "--d-model", "0", "--out", "{tmp}/o"], "--d-model: expected a positive int"),
        (
            ["train", "--task", "translate", "--data", "{tmp}/empty.tsv", "--out", "{tmp}/o"],
            "empty.tsv: the file is empty",
        ),
        (["train", "--resume", "{tmp}", "--out", "{tmp}/o"], "not an attnkit checkpoint"),
        (["translate", "--ckpt", "{tmp}", "x", "--beam", "0"], "--beam: expected a positive"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, tmp_path, argv, match):
    (tmp_path / "notab.tsv").write_text("a\tb\nno tab\n")
    (tmp_path / "latin1.txt").write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    (tmp_path / "empty.tsv").write_text("")
    code, out, err = run(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and match in err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_resume_finds_and_hashes_the_checkpoint_once(capsys, tmp_path, monkeypatch):
    """``train --resume`` resolves the checkpoint once (one SHA-256 pass over its files) and
    hands that value to the run: the verb and the run do not each read it again."""
    from attnkit.train import checkpoint

    run_dir = tmp_path / "rev"
    first = ["--max-steps", "2", "--save-every", "2", "--eval-every", "2", "--train-size", "200"]
    code, _, err = run(capsys, "train", "--task", "reverse", "--out", run_dir, *first, *TINY_ARGS)
    assert code == 0, err
    verified, real = [], checkpoint.verify
    monkeypatch.setattr(checkpoint, "verify", lambda p: verified.append(p) or real(p))
    code, out, err = run(capsys, "train", "--resume", run_dir, "--max-steps", "3", "--no-progress")
    assert code == 0, err
    assert "resuming reverse from" in out
    assert verified == [run_dir / "step-00000002"]


def _option_help(help_text: str, option: str) -> str:
    """The help of ``option`` in ``attnkit train --help`` as one line."""
    lines = help_text.splitlines()
    start = next(i for i, s in enumerate(lines) if s.strip().startswith(option + " "))
    out = [lines[start]]
    for s in lines[start + 1 :]:
        if s.strip().startswith("-") or not s.startswith(" " * 10):
            break
        out.append(s)
    return " ".join(" ".join(out).split())


def test_train_options_are_trainconfig_fields_with_its_defaults(capsys):
    """Every field of TrainConfig is an option of ``attnkit train`` (the task as --task), and
    the help shows the dataclass's own defaults, which cli/train.py never writes down: a
    default changed in TrainConfig is what --help says."""
    import dataclasses

    from attnkit.cli.train import OPTIONS
    from attnkit.train.config import CHOICES, TrainConfig

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert {field for field, _, _ in OPTIONS.values()} | {"task"} == set(fields)
    code, text, _ = run(capsys, "train", "--help")
    assert code == 0
    plain = {"seed", "vocab", "length", "train_size", "valid_size", "vocab_size", "log_every"}
    plain |= {"eval_every", "save_every", "keep", "threads", "accumulate", "clip", "dist_timeout"}
    for opt, (field, _, _) in OPTIONS.items():
        default = fields[field].default
        if field in plain:
            shown = f"{default:g}" if isinstance(default, float) else str(default)
            assert _option_help(text, opt).endswith(f"(default: {shown})"), opt
        if field in CHOICES:
            assert "{" + ",".join(CHOICES[field]) + "}" in _option_help(text, opt), opt
    lm, copy = TrainConfig(task="lm", data="x").resolved(), TrainConfig().resolved()
    assert f"(default: lm {lm.block_size}, others {copy.block_size})" in _option_help(
        text, "--block-size"
    )


def test_the_builtin_copy_task_says_the_values_it_trains_with(capsys, tmp_path):
    from attnkit.train.config import TrainConfig

    c = TrainConfig(length=7).resolved()
    code, out, err = run(
        capsys, "train", "--out", tmp_path / "c", "--length", "7", "--train-size", "50",
        "--max-steps", "1", *TINY_ARGS,
    )  # fmt: skip
    assert code == 0, err
    assert (
        f"(vocabulary {c.vocab}, length 7, shortest {c.min_length}, 50 generated training "
        f"sequences, {c.valid_size} held out) for at most 1 steps" in out
    )


def test_resuming_a_run_with_no_step_left_is_refused_before_any_work(capsys, tmp_path):
    # was: "stopped at step 2 after 0 s (training: 0 target tokens/s)", after evaluating again
    # and writing the last checkpoint over itself (with --max-steps 1 recorded in it)
    run_dir = tmp_path / "rev"
    first = ["--max-steps", "2", "--save-every", "2", "--eval-every", "2", "--train-size", "200"]
    code, _, err = run(capsys, "train", "--task", "reverse", "--out", run_dir, *first, *TINY_ARGS)
    assert code == 0, err
    last = run_dir / "step-00000002"
    before = {p.name: p.read_bytes() for p in last.iterdir()}
    log = (run_dir / "log.jsonl").read_bytes()
    for extra, expected in [
        ([], f"--resume: {last} is at step 2, the run's --max-steps; give a larger"),
        (["--max-steps", "1"], f"--max-steps: expected more than 2 (a total: {last} is at"),
        (["--max-minutes", "1"], f"--resume: {last} is at step 2, the run's --max-steps"),
    ]:
        code, out, err = run(capsys, "train", "--resume", run_dir, *extra, "--no-progress")
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"attnkit train: error: {expected}"), err
    assert {p.name: p.read_bytes() for p in last.iterdir()} == before
    assert (run_dir / "log.jsonl").read_bytes() == log
    code, out, err = run(capsys, "train", "--resume", run_dir, "--max-steps", "3", "--no-progress")
    assert code == 0 and (run_dir / "step-00000003").is_dir(), err


def test_the_printed_commands_run_as_pasted_into_a_shell(capsys, tmp_path):
    # was "attnkit evaluate --ckpt my runs/c p": a path with spaces split into three arguments
    import shlex

    run_dir = tmp_path / "my runs" / "c p"
    first = ["--max-steps", "2", "--eval-every", "2", "--train-size", "200"]
    code, out, err = run(capsys, "train", "--task", "copy", "--out", run_dir, *first, *TINY_ARGS)
    assert code == 0, err
    lines = dict(
        s.split(":", 1) for s in out.splitlines() if s.startswith(("evaluate:", "decode:"))
    )
    for name in ("evaluate", "decode"):
        argv = shlex.split(lines[name])
        assert argv[0] == "attnkit" and argv[argv.index("--ckpt") + 1] == str(run_dir)
        code, _, err = run(capsys, *argv[1:])
        assert code == 0, err
