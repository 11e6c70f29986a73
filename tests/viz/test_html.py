"""attnkit.viz.html without a browser: the document's structure and safety (CSP, escaping,
JSON that cannot leave its script element, no URL anywhere), the stored weights decoded
independently against the documented error bound, atomic saving, the notebook view, bad input,
and ``attnkit view``."""

from __future__ import annotations

import base64
import hashlib
import html as htmllib
import json
import re
import zlib

import numpy as np
import pytest
import torch
from support.html_page import Document, decode_weights, parts

from attnkit.cli import main
from attnkit.viz import html

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "</script><script>alert(2)</script>",
    "<!--",
    "a\u2028b",
    "c\u2029d",
    "&amp;",
    "\"quoted'",
    "\x1b[31mred",
    "]]>",
]


def softmax_rows(shape, seed=0, scale=2.0):
    s = np.random.default_rng(seed).standard_normal(shape) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


def test_document_is_self_contained_and_locked_down():
    doc = html.render(softmax_rows((2, 3, 6, 6)), list("abcdef"), title="t")
    assert doc.startswith("<!DOCTYPE html>")
    p = parts(doc)
    tags = p["doc"].tags
    # the CSP is the first thing in <head>, before any script or style
    names = [t for t, _ in tags]
    csp_at = next(
        i for i, (t, a) in enumerate(tags) if a.get("http-equiv") == "Content-Security-Policy"
    )
    assert csp_at < names.index("style") and csp_at < names.index("script")
    csp = dict(tags[csp_at][1])["content"]
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives["default-src"] == ["'none'"]
    assert directives["base-uri"] == ["'none'"] and directives["form-action"] == ["'none'"]
    # exactly the page's own script and style are allowed, by hash
    code = [t for a, t in p["scripts"] if "type" not in a]
    assert len(code) == 1

    def sha(text: str) -> str:
        digest = hashlib.sha256(text.encode()).digest()
        return "'sha256-" + base64.b64encode(digest).decode() + "'"

    assert directives["script-src"] == [sha(code[0])]
    assert directives["style-src"] == [sha(p["style"])]
    # data scripts are not executable types
    types = sorted(a.get("type", "") for a, _ in p["scripts"])
    assert types == ["", "application/json", "application/octet-stream"]
    # no URL, no inline handler, no inline style attribute anywhere in the markup
    for tag, attrs in tags:
        for name in attrs:
            assert name not in ("src", "href", "srcset", "action", "style", "srcdoc"), (tag, name)
            assert not name.startswith("on"), (tag, name)
    assert not re.search(r"https?:|//[a-z]", doc.replace("http-equiv", ""), re.I)
    for forbidden in (
        "eval(",
        "new Function",
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "fetch(",
        "XMLHttpRequest",
        "import(",
    ):
        assert forbidden not in code[0], forbidden


def test_hostile_tokens_and_title_stay_data():
    tokens = HOSTILE
    title = "</title><script>alert(3)</script> <!-- \u2028"
    doc = html.render(softmax_rows((1, 2, len(tokens), len(tokens))), tokens, title=title)
    p = parts(doc)
    assert p["title"] == title  # the parser reads back exactly the title: it was escaped
    meta = json.loads(p["attnkit-meta"])
    assert meta["q_tokens"] == tokens and meta["k_tokens"] == tokens and meta["title"] == title
    raw_meta = doc.split('id="attnkit-meta">', 1)[1].split("</script>", 1)[0]
    assert raw_meta == p["attnkit-meta"]  # the element ends where the JSON ends
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in raw_meta
    assert "\u2028" not in doc and "\u2029" not in doc
    assert doc.lower().count("<script") == 3 and doc.lower().count("</script") == 3
    assert "<!--" not in doc
    assert sum(1 for t, _ in p["doc"].tags if t == "img") == 0


@pytest.mark.parametrize("bits", [8, 16])
def test_stored_weights_within_the_documented_bound(bits):
    w = softmax_rows((2, 3, 17, 23), seed=bits, scale=4.0)
    w[0, 1, 5] = 0.0  # a fully masked row stays zero
    w[1, 2, :, 7] = 0.0
    q_tokens = [f"q{i}" for i in range(17)]
    k_tokens = [f"k{i}" for i in range(23)]
    doc = html.render(torch.from_numpy(w), q_tokens, k_tokens, bits=bits)
    meta, got = decode_weights(doc)
    assert meta["shape"] == [2, 3, 17, 23] and meta["bits"] == bits and meta["cross"] is True
    row_max = w.astype(np.float64).max(-1, keepdims=True)
    bound = row_max / (2 * ((1 << bits) - 1))
    err = np.abs(got - w)
    assert (err <= bound * (1 + 1e-6) + 1e-12).all()
    np.testing.assert_allclose(got.max(-1), row_max[..., 0], rtol=1e-7)  # row maxima exact
    assert (got[0, 1, 5] == 0).all() and (got[1, 2, :, 7] == 0).all()
    assert err.max() > 0 if bits == 8 else True  # 8 bits really is lossy: the bound matters
    tq, tk = meta["thumbs"]["shape"]
    off, length = meta["thumbs"]["block"]
    thumbs = zlib.decompress(base64.b64decode(parts(doc)["attnkit-data"])[off : off + length])
    assert (tq, tk) == (17, 23) and len(thumbs) == 2 * 3 * 17 * 23


def test_labels_and_per_layer_input():
    w = softmax_rows((3, 2, 4, 4))
    doc = html.render(
        [w[i][None] for i in range(3)], list("abcd"), layer_labels=[1, 4, 5], head_labels=["x", "y"]
    )
    meta, got = decode_weights(doc)
    assert meta["layers"] == ["1", "4", "5"] and meta["heads"] == ["x", "y"]
    assert meta["cross"] is False and got.shape == (3, 2, 4, 4)


def test_long_input_thumbnails_are_block_means():
    n = 200
    w = np.zeros((n, n), np.float32)
    w[:, 0] = 1.0  # every query attends to the first key only
    meta, _ = decode_weights(html.render(w, [str(i) for i in range(n)]))
    assert meta["thumbs"]["shape"] == [64, 64]


def test_bad_input_is_refused():
    w = softmax_rows((3, 3))
    with pytest.raises(ValueError, match="bits: expected 8 or 16, got 7"):
        html.render(w, list("abc"), bits=7)
    with pytest.raises(TypeError, match="bits"):
        html.render(w, list("abc"), bits=True)
    with pytest.raises(TypeError, match="title"):
        html.render(w, list("abc"), title=b"x")
    with pytest.raises(ValueError, match="k_tokens: expected 2 tokens"):
        html.render(softmax_rows((3, 2)), list("abc"), ["x", "y", "z"])
    with pytest.raises(ValueError, match="k_tokens"):
        html.render(softmax_rows((3, 2)), list("abc"))
    with pytest.raises(ValueError, match="height"):
        html.view(w, list("abc"), height=5)


def test_save_is_atomic_and_checks_the_path(tmp_path, monkeypatch):
    doc = html.render(softmax_rows((3, 3)), list("abc"))
    path = tmp_path / "v.html"
    html.save(doc, path)
    assert path.read_text(encoding="utf-8") == doc
    with pytest.raises(ValueError, match="path: expected a file name ending in .html"):
        html.save(doc, tmp_path / "v.txt")
    with pytest.raises(FileNotFoundError):
        html.save(doc, tmp_path / "missing" / "v.html")
    import attnkit.viz.weights as weights_module

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(weights_module.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        html.save("<p>new</p>", path)
    assert path.read_text(encoding="utf-8") == doc  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["v.html"]  # no temporary file left


def test_notebook_view_is_an_iframe_srcdoc():
    v = html.view(softmax_rows((3, 3)), ["<b>", "&", "</script>"], title="nb")
    frame = v._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and frame.endswith("</iframe>")
    d = Document(frame)
    assert [t for t, _ in d.tags] == ["iframe"]  # the page is an attribute value, not markup
    attrs = d.tags[0][1]
    assert attrs["srcdoc"] == v.html
    assert attrs["sandbox"] == "allow-scripts allow-downloads"
    assert htmllib.unescape(frame.split('srcdoc="', 1)[1].split('"', 1)[0]) == v.html


# --- attnkit view -----------------------------------------------------------------------------
def _default_model_or_skip():
    try:
        from attnkit.models import default_model_path

        return default_model_path()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the default model is not installed: {e}")


def test_cli_view_writes_a_model_page(tmp_path, capsys):
    _default_model_or_skip()
    out = tmp_path / "view.html"
    text = "the cat sat on the mat </script>"
    src = tmp_path / "text.txt"
    src.write_text(text + "\n", encoding="utf-8")
    argv = ["view", "--file", str(src), "--layers", "1,3-4", "--heads", "0-1", "-o", str(out)]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    meta, got = decode_weights(out.read_text(encoding="utf-8"))
    assert meta["layers"] == ["1", "3", "4"] and meta["heads"] == ["0", "1"]
    assert meta["q_tokens"][0] == "[CLS]" and meta["q_tokens"][-1] == "[SEP]"
    assert "<" in meta["q_tokens"] and "/" in meta["q_tokens"]
    # against the model's own weights, through the library (independent of the page code)
    from attnkit.models import default_model_path
    from attnkit.models.bert import BertModel

    model = BertModel.from_pretrained(default_model_path())
    batch = model.tokenize([text])
    with torch.inference_mode():
        att = model(batch.input_ids, None, None, output_attentions=True).attentions
    ref = torch.stack([att[i][0, :2] for i in (1, 3, 4)]).double().numpy()
    bound = ref.max(-1, keepdims=True) / 510
    assert (np.abs(got - ref) <= bound * (1 + 1e-6) + 1e-7).all()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["view", "-o", "{d}/x.html"], "give the SENTENCE"),
        (["view", "a", "--file", "{d}/t.txt", "-o", "{d}/x.html"], "not both"),
        (["view", "--file", "{d}/empty.txt", "-o", "{d}/x.html"], "is empty"),
        (["view", "--file", "{d}/latin1.txt", "-o", "{d}/x.html"], "not UTF-8"),
        (["view", "--file", "{d}/none.txt", "-o", "{d}/x.html"], "none.txt"),
        (["view", "a", "-o", "{d}/x.txt"], "-o: expected a file name ending in .html"),
        (["view", "a", "-o", "{d}/no/x.html"], "does not exist"),
        (
            ["view", "a", "--layers", "7", "-o", "{d}/x.html"],
            "--layers: expected indices in [0, 5]",
        ),
        (["view", "a", "--heads", "x", "-o", "{d}/x.html"], "--heads: expected indices like"),
        (["view", "a", "--heads", "3-1", "-o", "{d}/x.html"], "--heads"),
        (["view", "a", "--model", "{d}/nomodel", "-o", "{d}/x.html"], "nomodel"),
    ],
)
def test_cli_view_user_errors_are_one_line(tmp_path, capsys, args, words):
    if "--layers" in args or "--heads" in args:
        _default_model_or_skip()
    (tmp_path / "t.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    argv = [a.replace("{d}", str(tmp_path)) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("attnkit view: error:") and words in err, err
    assert not (tmp_path / "x.html").exists()


def test_seq2seq_attentions_are_the_layers_own_weights():
    from attnkit.models import Seq2SeqConfig, Seq2SeqTransformer
    from attnkit.viz.weights import seq2seq_attentions

    torch.manual_seed(1)
    cfg = Seq2SeqConfig(
        src_vocab_size=25, tgt_vocab_size=27, d_model=24, nhead=3, num_encoder_layers=2,
        num_decoder_layers=3, dim_feedforward=32, dropout=0.0,
    )  # fmt: skip
    model = Seq2SeqTransformer(cfg).eval()
    src = torch.tensor([[4, 9, 3, 17, 8, 22, 5]])
    tgt = torch.tensor([[cfg.bos_id, 11, 12, 26]])
    with torch.no_grad():
        plain = model(src, tgt)
    # what each cross-attention module receives, recorded without changing any call
    seen = []
    hooks = [
        layer.multihead_attn.register_forward_pre_hook(lambda m, a: seen.append((m, a[0], a[1])))
        for layer in model.transformer.decoder.layers
    ]
    att = seq2seq_attentions(model, src, tgt)
    for h in hooks:
        h.remove()
    assert att.encoder.shape == (2, 3, 7, 7) and att.decoder.shape == (3, 3, 4, 4)
    assert att.cross.shape == (3, 3, 4, 7)
    for m in model.modules():  # every hook of seq2seq_attentions is gone
        assert not m._forward_hooks and not m._forward_pre_hooks
    with torch.no_grad():
        np.testing.assert_array_equal(model(src, tgt).numpy(), plain.numpy())
    # the cross-attention weights, recomputed in float64 from the projections by hand
    assert len(seen) == 3
    for layer, (m, x, memory) in enumerate(seen):
        d = m.embed_dim // m.num_heads
        with torch.no_grad():
            q = m.in_proj.q(x).double().view(4, m.num_heads, d).transpose(0, 1)
            k = m.in_proj.k(memory).double().view(7, m.num_heads, d).transpose(0, 1)
            ref = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1)
        np.testing.assert_allclose(
            att.cross[layer].numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-6
        )
    decoder = att.decoder.numpy()
    assert (np.triu(decoder, k=1) == 0).all()  # causal: no weight on later target positions
    np.testing.assert_allclose(decoder.sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match=r"src: expected token ids of shape \(1, L\)"):
        seq2seq_attentions(model, src.repeat(2, 1), tgt)
    with pytest.raises(TypeError, match="model"):
        seq2seq_attentions(torch.nn.Linear(2, 2), src, tgt)
