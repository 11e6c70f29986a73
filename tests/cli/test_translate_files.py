"""attnkit translate from files and stdin: one output line per input line in input order
(batched decoding equals decoding each sentence alone), --output written atomically, the n-best
TSV (its first hypothesis is the beam's answer, scores best first), the unknown-word warning and
--strict, bad options named before any work; and attnkit plot of a real run."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.train.config import TrainConfig
from attnkit.train.data.tasks import seq2seq_example
from attnkit.train.inference import session
from attnkit.train.loop.trainer import train

SENTENCES = ["0 1 2", "3 4 5 0 1", "2 2", "5 4 3 2 1", "1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tr") / "copy"
    cfg = TrainConfig(
        task="copy",
        vocab=6,
        length=5,
        train_size=400,
        valid_size=16,
        d_model=16,
        nhead=2,
        layers=1,
        dim_feedforward=32,
        batch_size=16,
        warmup=10,
        eval_every=10,
        max_steps=20,
    )
    train(cfg, out, echo=lambda _: None)
    return out


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_by_one(run_dir: Path, sentences: list[str]) -> list[str]:
    """Independent of batching: each sentence decoded alone with the model's greedy search."""
    from attnkit.train.data.tokenizer import decode

    loaded = session.load(run_dir, best=True)
    out = []
    for s in sentences:
        src = torch.tensor([seq2seq_example(loaded.tokenizer, s, "")[0]])
        ids = loaded.model.greedy_decode(src, max_len=2 * src.shape[1] + 10)
        out.append(decode(loaded.tokenizer, ids[0].tolist()))
    return out


def test_stdin_batched_equals_one_by_one(run_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(s + "\n" for s in SENTENCES)))
    code, out, err = run(capsys, "translate", "--ckpt", run_dir, "--batch-size", "2")
    assert code == 0, err
    assert out.splitlines() == one_by_one(run_dir, SENTENCES)
    assert f"checkpoint {run_dir / 'best'}" in err  # says which checkpoint it loaded
    monkeypatch.setattr("sys.stdin", io.StringIO("0 1 2\n"))
    code, out2, _ = run(capsys, "translate", "--ckpt", run_dir, "-")
    assert code == 0 and out2.splitlines() == one_by_one(run_dir, ["0 1 2"])


def test_input_output_files_keep_line_order_and_blank_lines(run_dir, capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("0 1 2\n\n5 4 3 2 1\n", encoding="utf-8")
    dst = tmp_path / "out.txt"
    code, out, err = run(capsys, "translate", "--ckpt", run_dir, "--input", src, "--output", dst)
    assert code == 0, err
    assert out == "" and "wrote 3 line(s)" in err
    a, b = one_by_one(run_dir, ["0 1 2", "5 4 3 2 1"])
    assert dst.read_text(encoding="utf-8").split("\n") == [a, "", b, ""]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_n_best_tsv(run_dir, capsys):
    code, out, err = run(
        capsys, "translate", "--ckpt", run_dir, *SENTENCES[:2], "--beam", "4", "--n-best", "3"
    )
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert all(len(r) == 4 for r in rows)
    for n in (1, 2):
        mine = [r for r in rows if r[0] == str(n)]
        assert 1 <= len(mine) <= 3 and [r[1] for r in mine] == [
            str(i + 1) for i in range(len(mine))
        ]
        scores = [float(r[2]) for r in mine]
        assert scores == sorted(scores, reverse=True)
    # rank 1 is what the plain beam search returns, with its score
    loaded = session.load(run_dir, best=True)
    src = torch.tensor([seq2seq_example(loaded.tokenizer, SENTENCES[0], "")[0]])
    ids, score = loaded.model.beam_search(src, 4, 2 * src.shape[1] + 10)
    from attnkit.train.data.tokenizer import decode

    assert rows[0][3] == decode(loaded.tokenizer, ids[0].tolist())
    assert float(rows[0][2]) == pytest.approx(float(score[0]), abs=5e-4)


def test_unknown_words_warn_or_fail(run_dir, capsys):
    code, out, err = run(capsys, "translate", "--ckpt", run_dir, "0 x 1 yy x")
    assert code == 0 and len(out.splitlines()) == 1
    assert "warning: 3 input word(s) are not in the model's vocabulary (first: 'x', 'yy')" in err
    code, out, err = run(capsys, "translate", "--ckpt", run_dir, "0 x 1", "--strict")
    assert code == 2 and out == "" and "--strict: 1 input word(s)" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["a", "--beam", "2", "--n-best", "3"], "--n-best: expected at most --beam (2)"),
        (["a", "--input", "x.txt"], "--input: give either SENTENCE arguments or --input"),
        (["--input", "{tmp}/missing.txt"], "--input:"),
        (["a", "--batch-size", "0"], "--batch-size: expected a positive int, got 0"),
        (["a", "-"], "'-' (standard input) must be the only SENTENCE"),
        (["a", "--output", "{tmp}/no/such/dir/out.txt"], "--output:"),
    ],
)
def test_bad_options_are_named(run_dir, capsys, tmp_path, args, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run(capsys, "translate", "--ckpt", run_dir, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_plot_runs(run_dir, capsys, tmp_path):
    png = tmp_path / "curves.png"
    code, out, err = run(capsys, "plot", run_dir, run_dir, "-o", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "2 run(s)" in out
    code, _, err = run(capsys, "plot", tmp_path, "-o", png)
    assert code == 2 and "no log.jsonl" in err
    code, _, err = run(capsys, "plot", run_dir, "-o", tmp_path / "c.gif")
    assert code == 2 and "--output: expected a file name ending in .png" in err


def test_evaluate_data_warns_about_training_pairs(run_dir, capsys, tmp_path):
    import json

    trained = [json.loads(s) for s in (run_dir / "best" / "train_sample.jsonl").open()][:2]
    held = [json.loads(s) for s in (run_dir / "best" / "heldout.jsonl").open()][:1]
    data = tmp_path / "mixed.tsv"
    rows = [*trained, *held, trained[0]]  # a repeated source: scored once, all its references
    data.write_text("".join(f"{s}\t{t}\n" for s, t in rows), encoding="utf-8")
    code, out, err = run(capsys, "evaluate", "--ckpt", run_dir, "--data", data)
    assert code == 0, err
    assert f"warning: 3 of the 4 examples of {data} are also in the training data" in err
    assert "3 distinct sources, each decoded once" in out
