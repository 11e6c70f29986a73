"""``attnkit translate`` and the text as the model made it (issue 31): no collapsing of Unicode
whitespace (U+202F before "?"), only line breaks escaped, on stdout and in --output; and
``--strict`` with byte-level BPE, where unknown means characters never seen in training.
Real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.inference import session
from attnkit.train.loop.trainer import train

SRC = Path(__file__).resolve().parents[2] / "src"
PAIRS = "".join(f"I like the {w}.\tJ'aime le {w}.\nIs it {w} ?\tEst-ce {w}\u202f?\n" for w in
                ("cat", "dog", "sun", "sea", "tree", "bird", "road", "rain"))  # fmt: skip


def attnkit(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "attnkit", *args]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bpe")
    (root / "pairs.tsv").write_text(PAIRS, encoding="utf-8")
    c = TrainConfig(task="translate", data=str(root / "pairs.tsv"), tokenizer="bpe",
                    vocab_size=300, d_model=16, nhead=2, layers=1, dim_feedforward=32,
                    valid_fraction=0.2, max_steps=2, eval_every=2, save_every=2)  # fmt: skip
    train(c, root / "run", echo=lambda _: None)
    return root / "run"


def test_strict_refuses_characters_never_seen_in_training(bpe_run):
    done = attnkit("translate", "--ckpt", str(bpe_run), "--strict", "I like 日本 and ☃.")
    assert done.returncode == 2 and not done.stdout, done.stderr
    err = done.stderr.strip().splitlines()[-1]  # after the line naming the checkpoint
    assert "Traceback" not in done.stderr and err.startswith("attnkit translate: error: ")
    assert "--strict:" in err and "never seen in training" in err
    assert "'日本'" in err and "'☃'" in err
    warned = attnkit("translate", "--ckpt", str(bpe_run), "I like 日本 and ☃.")
    assert warned.returncode == 0 and "warning:" in warned.stderr and "'日本'" in warned.stderr
    clean = attnkit("translate", "--ckpt", str(bpe_run), "--strict", "I like the sea.")
    assert clean.returncode == 0 and "warning" not in clean.stderr, clean.stderr


def test_the_training_characters_are_recorded_with_the_tokenizer(bpe_run):
    loaded = session.load(bpe_run, best=True)
    seen = loaded.characters()
    assert seen == "".join(sorted(set(PAIRS.replace("\t", "").replace("\n", ""))))
    assert tk.unknown_words(loaded.tokenizer, "Est-ce 日本\u202f?", seen) == ["日本"]
    assert tk.unknown_words(loaded.tokenizer, "Est-ce 日本\u202f?", None) == []  # not recorded


def test_the_model_text_is_written_as_produced(bpe_run, tmp_path):
    out = tmp_path / "out.txt"
    code = (  # the decoder's output replaced by a text with U+202F, a tab and a line break
        "import sys\n"
        "from attnkit.train.inference import metrics\n"
        "metrics.translate = lambda model, tok, src, *a: ['Est-ce\\u202fvrai\\u00a0?\\nOui'] "
        "* len(src)\n"
        "from attnkit.cli import main\n"
        f"sys.exit(main(['translate', '--ckpt', {str(bpe_run)!r}, 'Is it true ?']"
        f" + sys.argv[1:]))\n"
    )
    done = attnkit(code=code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Est-ce\u202fvrai\u00a0?\\x0aOui\n"  # only the line break escaped
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", code, "--output", str(out)], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="utf-8") == "Est-ce\u202fvrai\u00a0?\\x0aOui\n"
