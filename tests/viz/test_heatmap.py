"""attnkit.viz.heatmap: PNG/SVG/PDF heatmaps, checked without golden files (file type and size,
non-uniform pixels, the drawn array equals the input, axes count, label thinning), and bad input
refused before any drawing; ``attnkit explain --png``."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from attnkit.cli import main
from attnkit.viz import heatmap
from attnkit.viz.heatmap import label_step


def softmax_rows(shape: tuple[int, ...], seed: int = 0, scale: float = 2.0) -> np.ndarray:
    s = np.random.default_rng(seed).standard_normal(shape) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


def read_png(path) -> np.ndarray:
    from matplotlib.image import imread

    return imread(path)


def test_one_head_png_draws_the_weights(tmp_path):
    w = softmax_rows((7, 7))
    tokens = [f"tok{i}" for i in range(7)]
    path = tmp_path / "one.png"
    fig = heatmap(w, tokens, path=path, title="one head")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5_000
    pixels = read_png(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
    assert pixels[..., :3].std() > 0.05  # not a blank image
    assert len(fig.axes) == 2  # the panel and the colour bar
    drawn = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_array_equal(drawn, w)  # the picture shows the input, unchanged
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == tokens
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == tokens
    assert fig._suptitle.get_text() == "one head"


@pytest.mark.parametrize(("suffix", "magic"), [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_grid_layers_by_heads_by_extension(tmp_path, suffix, magic):
    w = softmax_rows((2, 3, 5, 5), seed=1)
    path = tmp_path / f"grid{suffix.upper()}"  # the extension is case-insensitive
    fig = heatmap(w, list("abcde"), path=path)
    assert path.read_bytes().startswith(magic)
    assert len(fig.axes) == 2 * 3 + 1
    titles = [ax.get_title() for ax in fig.axes[:6]]
    assert titles == [f"layer {l} · head {h}" for l in range(2) for h in range(3)]
    for n, ax in enumerate(fig.axes[:6]):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), w[n // 3, n % 3])


def test_torch_and_per_layer_sequences_are_accepted():
    w = torch.from_numpy(softmax_rows((3, 2, 4, 4), seed=2))
    per_layer = [w[i][None] for i in range(3)]  # (1, H, L, L) each, as BertModel returns them
    fig = heatmap(per_layer, list("abcd"), layer_labels=["L0", "L1", "L2"], head_labels=[5, 9])
    assert len(fig.axes) == 3 * 2 + 1
    assert fig.axes[1].get_title() == "L0 · 9"
    np.testing.assert_array_equal(np.asarray(fig.axes[5].images[0].get_array()), w[2, 1].numpy())


def test_cross_attention_uses_both_token_lists():
    w = softmax_rows((3, 6), seed=3)
    fig = heatmap(w, ["q0", "q1", "q2"], [f"k{i}" for i in range(6)])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["q0", "q1", "q2"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [f"k{i}" for i in range(6)]


def test_labels_are_thinned_at_2000_tokens():
    n = 2000
    w = np.zeros((n, n), np.float32)
    w[np.arange(n), np.arange(n)] = 1.0
    tokens = [f"w{i}" for i in range(n)]
    fig = heatmap(w, tokens)
    ax = fig.axes[0]
    xs = [int(round(p)) for p in ax.get_xticks()]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert 10 <= len(labels) <= 100  # readable: far fewer than 2000
    step = xs[1] - xs[0]
    assert step > 1 and xs == list(range(0, n, step))
    assert labels == [tokens[i] for i in xs]  # each label names the token at its position
    assert len(ax.get_yticklabels()) == len(labels)


def test_label_step():
    assert label_step(8, 4.0, 8.0) == 1
    assert label_step(2000, 11.0, 8.0) == 29  # 11 in * 72 / (1.4 * 8) = 70 labels fit
    assert label_step(1, 0.1, 8.0) == 1


def test_hostile_and_odd_tokens_are_plain_text(tmp_path):
    tokens = ["$", "$x", "a\nb", "<img src=x onerror=alert(1)>", "\u2028"]
    fig = heatmap(softmax_rows((5, 5)), tokens, path=tmp_path / "odd.png", title="$ cost\n")
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["$", "$x", "a\\nb", "<img src=x oner…", "\\u2028"]
    assert all(not t.get_parse_math() for t in fig.axes[0].get_xticklabels())


def test_bad_input_is_refused_before_drawing(tmp_path):
    w = softmax_rows((3, 3))
    toks = list("abc")
    cases = [
        (dict(weights=w, q_tokens=toks, path=tmp_path / "x.jpg"), ValueError, "path: expected"),
        (dict(weights=w, q_tokens=toks, path=tmp_path / "no" / "x.png"), FileNotFoundError, "path"),
        (dict(weights=w, q_tokens=["a", "b"]), ValueError, "q_tokens: expected 3 tokens"),
        (dict(weights=w, q_tokens="abc"), TypeError, "q_tokens"),
        (dict(weights=w, q_tokens=["a", 1, "c"]), TypeError, "q_tokens"),
        (dict(weights=w[:2], q_tokens=toks[:2]), ValueError, "k_tokens"),
        (dict(weights=w * np.nan, q_tokens=toks), ValueError, "finite"),
        (dict(weights=w - 0.5, q_tokens=toks), ValueError, "in [0, 1]"),
        (dict(weights=w.astype(np.int64), q_tokens=toks), TypeError, "floating-point"),
        (dict(weights=w[None, None, None], q_tokens=toks), ValueError, "shape"),
        (dict(weights=[], q_tokens=toks), ValueError, "at least one layer"),
        (dict(weights=w, q_tokens=toks, title=3), TypeError, "title"),
        (dict(weights=w, q_tokens=toks, head_labels=["a", "b"]), ValueError, "head_labels"),
    ]
    for kwargs, exc, words in cases:
        with pytest.raises(exc, match=None) as info:
            heatmap(**kwargs)
        assert words in str(info.value), (kwargs.keys(), str(info.value))
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    path = tmp_path / "keep.png"
    path.write_bytes(b"old contents")

    def broken(self, f, **kwargs):
        f.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        heatmap(softmax_rows((3, 3)), list("abc"), path=path)
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.png"]  # no temporary file left


def test_explain_png_writes_the_walkthrough_weights(tmp_path, monkeypatch):
    from attnkit import explain as ex

    heatmap_module = importlib.import_module("attnkit.viz.heatmap")  # the module, not the function

    seen = {}
    real = heatmap_module.heatmap

    def spy(weights, *args, **kwargs):
        seen["weights"] = np.asarray(weights)
        return real(weights, *args, **kwargs)

    monkeypatch.setattr(heatmap_module, "heatmap", spy)
    path = tmp_path / "walk.png"
    assert main(["explain", "--d-model", "16", "--png", str(path)]) == 0
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5_000
    w = ex.walkthrough(ex.DEFAULT_SENTENCE, None, 16, None, None, ex.DEFAULT_SEED)
    scores = (w.x @ w.w_q) @ (w.x @ w.w_k).T / np.sqrt(w.d_k)  # softmax(QK^T / sqrt(d_k))
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    assert seen["weights"].shape == (4, 4)
    np.testing.assert_allclose(seen["weights"], expected, rtol=1e-10, atol=1e-12)


def test_explain_png_refuses_a_bad_path(tmp_path, capsys):
    assert main(["explain", "--png", str(tmp_path / "x.gif")]) == 2
    err = capsys.readouterr().err
    assert "--png" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_explain_png_with_a_model_draws_the_words_rows(tmp_path, monkeypatch):
    try:
        from attnkit.models import default_model_path

        model_dir = default_model_path()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the default model is not installed: {e}")
    from attnkit.models.bert import BertModel

    heatmap_module = importlib.import_module("attnkit.viz.heatmap")
    seen = {}
    real = heatmap_module.heatmap

    def spy(weights, q_tokens, k_tokens=None, **kwargs):
        seen.update(weights=np.asarray(weights), q=q_tokens, k=k_tokens)
        return real(weights, q_tokens, k_tokens, **kwargs)

    monkeypatch.setattr(heatmap_module, "heatmap", spy)
    text = "The animal didn't cross the street because it was too tired"
    path = tmp_path / "it.png"
    argv = ["explain", text, "--model", "default", "--word", "it", "--png", str(path)]
    assert main(argv) == 0
    assert path.read_bytes()[:4] == b"\x89PNG"
    model = BertModel.from_pretrained(model_dir)
    batch = model.tokenize([text])
    tokens = batch.tokens[0]
    with torch.inference_mode():
        att = model(batch.input_ids, None, None, output_attentions=True).attentions
    row = tokens.index("it")
    expected = torch.stack([a[0, :, row, :] for a in att]).numpy()  # (layers, heads, L)
    assert seen["k"] == tokens and seen["q"] == [f"head {h}" for h in range(12)]
    np.testing.assert_allclose(seen["weights"][:, 0], expected, rtol=1e-5, atol=1e-7)
