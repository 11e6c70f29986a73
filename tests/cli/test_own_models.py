"""attnkit's own trained models in the viewer (issue 31): ``view``/``explain --model`` on a run
directory (language model and encoder-decoder) and on its transformers exports (GPT-2 and
PegasusForCausalLM), and ``generate --view``. The weights are checked against transformers'
eager attention of the export, an independent implementation of the same function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")
from support.html_page import decode_sections  # noqa: E402
from support.tiny_runs import train_lm, train_translate  # noqa: E402

from attnkit.cli import main  # noqa: E402
from attnkit.train.data import tokenizer as tk  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
TOL = 1e-5  # float32 attention rows of two implementations, 16-bit page encoding below 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("own")
    train_lm(root / "lm")
    train_lm(root / "lm-sin", positions="sinusoidal", block_size=32)
    train_translate(root / "tr")
    for name in ("lm", "lm-sin"):
        assert (
            main(["export", "--ckpt", str(root / name), "--to", "hf", str(root / f"{name}-hf")])
            == 0
        )
    return {p.name: p for p in root.iterdir()}


def page(capsys, tmp_path: Path, *argv: str) -> list[tuple[dict, np.ndarray]]:
    out = tmp_path / "page.html"
    code = main([*argv, "--bits", "16", "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 0, err
    return decode_sections(out.read_text(encoding="utf-8"))[1]


def eager(hf_dir: Path, text: str) -> np.ndarray:
    """transformers' eager self-attention of a causal-LM export on ``text``: (N, H, L, L)."""
    model = tf.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    ids = tf.AutoTokenizer.from_pretrained(hf_dir)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        att = model(ids, output_attentions=True).attentions
    return torch.stack([a[0] for a in att]).double().numpy()


@pytest.mark.parametrize("run", ["lm", "lm-sin"])
def test_view_of_a_run_and_of_its_export_match_eager(runs, capsys, tmp_path, run):
    text = "ALICE:\nthe cat"
    [(meta, ours)] = page(capsys, tmp_path, "view", text, "--model", str(runs[run]))
    [(meta_hf, theirs)] = page(capsys, tmp_path, "view", text, "--model", str(runs[f"{run}-hf"]))
    ref = eager(runs[f"{run}-hf"], text)  # GPT-2 (learned) or PegasusForCausalLM (sinusoidal)
    assert ours.shape == ref.shape == (2, 2, len(text), len(text))  # one token per character
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TOL)
    np.testing.assert_allclose(theirs, ref, rtol=0, atol=TOL)
    assert "causal" in meta["note"] and "causal" in meta_hf["note"]
    assert np.triu(ours, 1).max() == 0.0  # nothing attends to a later token


def test_view_of_an_encoder_decoder_run_has_three_sections(runs, capsys, tmp_path):
    sections = page(capsys, tmp_path, "view", "the cat sat.", "--model", str(runs["tr"]))
    titles = [m["title"] if "title" in m else m.get("name") for m, _ in sections]
    assert len(sections) == 3, titles
    enc, dec, cross = (w for _, w in sections)
    assert enc.shape[-1] == enc.shape[-2] == cross.shape[-1]  # source tokens (+ [EOS])
    assert dec.shape[-1] == dec.shape[-2] == cross.shape[-2]  # one row per produced token
    for w in (enc, dec, cross):
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-3)


def test_explain_takes_a_run_directory(runs, capsys):
    code = main(["explain", "--model", str(runs["lm"]), "ALICE: the cat"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "layer 1" in out and "lm" in out


def test_generate_view_in_a_real_process(runs, tmp_path):
    out = tmp_path / "gen.html"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "generate", "--ckpt", str(runs["lm"]), "--prompt",
         "ALICE:", "--max-new-tokens", "10", "--view", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stderr and done.stdout.startswith("ALICE:")
    [(meta, w)] = decode_sections(out.read_text(encoding="utf-8"))[1]
    n = len(tk.encode(tk.load(runs["lm"] / "best" / "tokenizer.json"), done.stdout.rstrip("\n")))
    assert w.shape[-1] == w.shape[-2] == n  # the prompt and the 10 generated tokens
    bad = subprocess.run(
        [sys.executable, "-m", "attnkit", "generate", "--ckpt", str(runs["lm"]), "--prompt",
         "ALICE:", "--view", str(tmp_path / "gen.txt")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert bad.returncode == 2 and "--view" in bad.stderr and ".html" in bad.stderr
    assert "Traceback" not in bad.stderr and not bad.stdout
