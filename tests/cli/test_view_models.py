"""``attnkit view --model DIR`` on tiny random transformers models saved with save_pretrained
(GPT-2, RoBERTa, DistilBERT, BART, and BERT on attnkit's own BERT): the page's weights, read
back independently (tests/support/html_page.py), match transformers' ``"eager"`` attention
(``output_attentions=True``) within 1e-5 with 16-bit storage (its bound, m / 131070, is below
7.7e-6); an encoder-decoder gets three sections, its cross-attention rows labelled with the
tokens each step produced; the title names the model; the page's path is announced."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("transformers")

from support.html_page import decode_sections, parts
from support.tiny_hf_dirs import TEXT, eager_attentions, save_tiny

from attnkit.cli import main

TOL = 1e-5


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-view")
    kinds = ("gpt2", "roberta", "distilbert", "bart", "bert")
    return {k: save_tiny(k, root / f"tiny-{k}") for k in kinds}


def view(capsys, tmp_path, model, *extra) -> tuple[str, dict, list]:
    out = tmp_path / "page.html"
    code = main(["view", TEXT, "--model", str(model), "--bits", "16", "-o", str(out), *extra])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert f"wrote {out} (" in stdout  # the file is announced with its path
    doc = out.read_text(encoding="utf-8")
    meta, sections = decode_sections(doc)
    return doc, meta, sections


def close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", ["gpt2", "roberta", "distilbert", "bert"])
def test_one_section_models_match_eager(saved, capsys, tmp_path, kind):
    doc, meta, [(section, got)] = view(capsys, tmp_path, saved[kind])
    ref = eager_attentions(saved[kind], TEXT)["self"]
    close(got, ref)
    assert meta["title"].startswith(f"tiny-{kind}: {TEXT[:20]}")
    assert parts(doc)["title"].startswith(f"tiny-{kind}: ")
    assert "default model" not in doc
    assert meta["layers"] == ["0", "1"] and meta["heads"] == ["0", "1", "2", "3"]
    assert meta["note"].startswith("rows: each token")
    assert ("causal" in meta["note"]) == (kind == "gpt2")


def test_encoder_decoder_has_three_sections(saved, capsys, tmp_path):
    doc, meta, sections = view(capsys, tmp_path, saved["bart"], "--heads", "1,3")
    ref = eager_attentions(saved["bart"], TEXT)
    names = [s["name"] for s, _ in sections]
    assert names == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    for (s, got), key in zip(sections, ("encoder", "decoder", "cross"), strict=True):
        close(got, ref[key][:, [1, 3]])
        assert s["heads"] == ["1", "3"]
    (enc, _), (dec, _), (cross, _) = sections
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(saved["bart"])
    produced = [tok.convert_ids_to_tokens(int(i)) for i in ref["output_ids"][1:]]
    assert cross["q_tokens"] == produced  # row t: the token step t produced
    assert dec["q_tokens"][0] == tok.convert_ids_to_tokens(int(ref["output_ids"][0]))
    assert cross["k_tokens"] == enc["q_tokens"] and cross["cross"] is True
    assert "produced output token t" in cross["note"]
    assert meta["title"].startswith("tiny-bart: ")


def test_layers_out_of_range_and_missing_models_are_one_line(saved, capsys, tmp_path):
    cases = [
        (
            ["--model", str(saved["gpt2"]), "--layers", "0-5"],
            "--layers: expected indices in [0, 1]",
        ),
        (["--model", "no-such-model-anywhere"], "add --download"),
        (["--model", str(tmp_path)], "config.json: file not found"),
    ]
    for extra, words in cases:
        out = tmp_path / "x.html"
        assert main(["view", "a", "-o", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
        assert not out.exists()


def test_a_cached_model_name_is_found_without_downloading(saved, tmp_path):
    """A model in the Hugging Face cache layout (models--org--name/snapshots/<commit>, refs/main)
    is found by its name with the network disabled, and the title uses that name."""
    import shutil

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = cache / "models--tiny-org--tiny-gpt" / "snapshots" / commit
    shutil.copytree(saved["gpt2"], snap)
    (cache / "models--tiny-org--tiny-gpt" / "refs").mkdir()
    (cache / "models--tiny-org--tiny-gpt" / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = tmp_path / "cached.html"
    argv = [sys.executable, "-m", "attnkit", "view", TEXT, "--model", "tiny-org/tiny-gpt"]
    done = subprocess.run(
        [*argv, "--bits", "16", "-o", str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    meta, [(_, got)] = decode_sections(out.read_text(encoding="utf-8"))
    assert meta["title"].startswith("tiny-org/tiny-gpt: ")
    close(got, eager_attentions(saved["gpt2"], TEXT)["self"])


def test_a_softcapping_model_is_shown_with_eager_weights(capsys, tmp_path):
    """Gemma 2's attention-logit softcapping (served by attnkit's attention since sinks and
    softcapping joined every backend): view and explain run, and the page's weights match
    transformers' eager attention."""
    import torch
    import transformers as tf
    from support.tiny_hf_dirs import tokenizer_of

    torch.manual_seed(0)
    cfg = tf.Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
        attn_logit_softcapping=50.0, final_logit_softcapping=None, query_pre_attn_scalar=8,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=1,
    )  # fmt: skip
    path = tmp_path / "tiny-gemma2"
    tf.Gemma2ForCausalLM(cfg).save_pretrained(path)
    tokenizer_of("gpt").save_pretrained(path)
    out = tmp_path / "g.html"
    assert main(["view", TEXT, "--model", str(path), "--bits", "16", "-o", str(out)]) == 0
    assert main(["explain", TEXT, "--model", str(path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    _, [(_, got)] = decode_sections(out.read_text(encoding="utf-8"))
    close(got, eager_attentions(path, TEXT)["self"])
