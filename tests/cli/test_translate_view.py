"""``attnkit translate --view``: the decoder's cross-attention for the decoded translation as one
offline HTML file. The page is read back independently (tests/support/html_page.py) and its
weights compared with the model's own cross-attention weights, recomputed here by running each
decoder layer's attention module on the teacher-forced translation."""

from __future__ import annotations

import numpy as np
import torch
from support.html_page import decode_weights, parts

from attnkit.cli import main
from attnkit.train.data.tasks import seq2seq_example
from attnkit.train.inference import session

TINY = ["--d-model", "16", "--nhead", "2", "--layers", "2", "--dim-feedforward", "32"]
TINY += ["--batch-size", "16", "--no-progress", "--train-size", "200", "--valid-size", "10"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def cross_weights(model, src_ids: list[int], tgt_ids: list[int]) -> np.ndarray:
    """(layers, heads, T, S) cross-attention weights: the decoder run layer by layer, each
    layer's cross-attention module asked for its weights directly."""
    src, tgt = torch.tensor([src_ids]), torch.tensor([tgt_ids])
    found = []

    def keep(module, args, kwargs, out):
        found.append(out[1][0].double().numpy())

    def ask(module, args, kwargs):
        return args, {**kwargs, "return_weights": True, "average_weights": False}

    layers = model.transformer.decoder.layers
    hooks = [m.multihead_attn.register_forward_pre_hook(ask, with_kwargs=True) for m in layers]
    hooks += [m.multihead_attn.register_forward_hook(keep, with_kwargs=True) for m in layers]
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        for h in hooks:
            h.remove()
    return np.stack(found)


def test_translate_view_writes_the_cross_attention(capsys, tmp_path):
    run_dir = tmp_path / "copy"
    code, _, err = run(capsys, "train", "--out", run_dir, "--max-steps", "3", *TINY)
    assert code == 0, err
    page = tmp_path / "view.html"
    code, out, err = run(capsys, "translate", "--ckpt", run_dir, "1 2 3", "--view", page)
    assert code == 0, err
    translation = out.splitlines()[0]
    doc = page.read_text(encoding="utf-8")
    meta, weights = decode_weights(doc)
    loaded = session.load(run_dir)
    src_ids, tgt_ids = seq2seq_example(loaded.tokenizer, "1 2 3", translation)
    produced = [loaded.tokenizer.id_to_token(i) for i in tgt_ids[1:]]  # the output, then [EOS]
    tgt_ids = tgt_ids[:-1]  # teacher forcing: [BOS] + the translation
    assert meta["cross"] is True
    assert meta["shape"] == [2, 2, len(tgt_ids), len(src_ids)]
    assert meta["k_tokens"][:3] == ["1", "2", "3"]
    # row t is labelled with the token step t produced (not with the token it read)
    assert meta["q_tokens"] == produced and produced[-1] == "[EOS]"
    assert meta["q_tokens"][:-1] == translation.split()
    assert "produced output token t" in meta["note"]
    assert meta["layers"] == ["0", "1"]  # the page adds "layer": no "layer decoder layer 0"
    ref = cross_weights(loaded.model.eval(), src_ids, tgt_ids)
    bound = ref.max(-1, keepdims=True) / 510 + 1e-6  # 8-bit storage, documented bound m/510
    assert np.all(np.abs(weights - ref) <= bound)
    assert "Content-Security-Policy" in doc and parts(doc)["title"].startswith("cross-attention")


def test_translate_view_errors_are_one_line_before_any_work(capsys, tmp_path):
    run_dir = tmp_path / "copy"
    assert run(capsys, "train", "--out", run_dir, "--max-steps", "2", *TINY)[0] == 0
    for extra, words in (
        (["1 2", "3", "--view", tmp_path / "v.html"], "--view: expected one SENTENCE"),
        (["1 2", "--view", tmp_path / "v.txt"], "--view: expected a file name ending in .html"),
        (["1 2", "--view", tmp_path / "no" / "v.html"], "--view: the directory"),
    ):
        code, out, err = run(capsys, "translate", "--ckpt", run_dir, *extra)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        assert out == ""  # refused before decoding anything
