"""``attnkit explain --model``: any transformers model (tiny random ones saved with
save_pretrained), with ``--word`` or, without it, every token's most-attended tokens per layer
(head-averaged); checked against transformers' ``"eager"`` weights within 1e-5. Also: the
``model:`` line names the model, ``--png`` announces its file, and off a terminal no word or
path is broken across lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

from support.tiny_hf_dirs import TEXT, eager_attentions, save_tiny

from attnkit.cli import main

TOL = 1e-5


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-explain")
    return {k: save_tiny(k, root / f"tiny-{k}") for k in ("gpt2", "roberta", "bart")}


def explain(capsys, *argv) -> tuple[str, str]:
    code = main(["explain", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def check_ranking(items: list[dict], row: np.ndarray, k: int) -> None:
    """Our top-k (dicts of token, index, weight) against a reference row: the k largest
    weights in order within TOL; the same indices wherever the ranking is not a near-tie."""
    order = np.argsort(-row, kind="stable")
    assert len(items) == min(k, row.size)
    for n, a in enumerate(items):
        assert abs(a["weight"] - row[order[n]]) <= TOL
        gaps = [abs(row[order[n]] - row[order[m]]) for m in (n - 1, n + 1) if 0 <= m < row.size]
        if min(gaps) > TOL:
            assert a["index"] == order[n]


@pytest.mark.parametrize("kind", ["gpt2", "roberta", "bart"])
def test_every_token_per_layer_matches_eager(saved, capsys, kind):
    out, _ = explain(capsys, TEXT, "--model", saved[kind], "--json", "--top-k", 2)
    report = json.loads(out)
    ref = eager_attentions(saved[kind], TEXT)
    w = ref["encoder" if kind == "bart" else "self"]  # an encoder-decoder: its encoder
    avg = w.mean(axis=1)  # (N, L, L), head-averaged
    assert report["model"] == f"tiny-{kind}"
    assert (report["num_layers"], report["num_heads"]) == w.shape[:2]
    assert len(report["rows"]) == w.shape[-1]
    for i, per_layer in enumerate(report["rows"]):
        for n, items in enumerate(per_layer):
            check_ranking(items, avg[n, i], 2)
    if kind == "bart":
        assert any("encoder" in note for note in report["notes"])


def test_one_word_matches_eager(saved, capsys):
    out, _ = explain(capsys, TEXT, "--model", saved["gpt2"], "--word", "it", "--json")
    report = json.loads(out)
    ref = eager_attentions(saved["gpt2"], TEXT)["self"]
    q = TEXT.split().index("it")  # the word-level tokenizer: one token per word, no specials
    assert report["query_index"] == q and report["tokens"][q] == "it"
    for n in range(ref.shape[0]):
        for h in range(ref.shape[1]):
            check_ranking(report["heads"][n][h], ref[n, h, q], 3)
        check_ranking(report["averaged"][n], ref[n, :, q].mean(0), 3)
    assert report["model"] == "tiny-gpt2"


def test_png_is_announced_and_json_stays_clean(saved, capsys, tmp_path):
    png = tmp_path / "all.png"
    out, err = explain(capsys, TEXT, "--model", saved["roberta"], "--png", png, "--json")
    assert png.stat().st_size > 0
    assert json.loads(out)["model"] == "tiny-roberta"  # stdout: one JSON object
    assert f"wrote {png}" in err
    png2 = tmp_path / "word.svg"
    out, _ = explain(capsys, TEXT, "--model", saved["roberta"], "--word", "it", "--png", png2)
    assert png2.read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert f"wrote {png2}" in out.splitlines()[0]


def test_off_a_terminal_no_word_or_path_is_broken(saved, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    long_dir = tmp_path / ("a-model-directory-with-a-rather-long-name-" * 3 + "gpt2")
    save_tiny("gpt2", long_dir)
    text = TEXT + " " + "/some/long/path/that/would/not/fit/in/eighty/columns/at/all/file.txt"
    out, _ = explain(capsys, text, "--model", long_dir, "--word", "it")
    lines = out.splitlines()
    assert f"model:  {long_dir.name}" in lines  # the name on one line, not a path
    assert any(text in line for line in lines)  # the text and its path on one line
    assert "site-packages" not in out
    out, _ = explain(capsys, text, "--model", long_dir)
    assert any(text in line for line in out.splitlines())
    for token in ("because", "street", "animal"):
        assert any(token in line for line in out.splitlines())


def test_default_model_line_names_it(capsys):
    from attnkit.models import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as e:
        pytest.skip(f"the default model is not installed: {e}")
    out, _ = explain(capsys, TEXT, "--model", "default", "--word", "it", "--top-k", 1)
    assert "model:  all-MiniLM-L6-v2" in out.splitlines()
    out, _ = explain(capsys, TEXT, "--model", "default", "--json", "--top-k", 1)
    report = json.loads(out)
    assert report["model"] == "all-MiniLM-L6-v2"
    assert report["tokens"][0] == "[CLS]" and len(report["rows"]) == len(report["tokens"])


def test_bad_top_k_is_refused_before_any_file_is_written(saved, capsys, tmp_path):
    png = tmp_path / "never.png"
    code = main(["explain", TEXT, "--model", str(saved["gpt2"]), "--top-k", "0", "--png", str(png)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith("--top-k: expected a positive int, got 0"), err
    assert not png.exists()
