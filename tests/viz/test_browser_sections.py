"""Pages with several kinds of attention, notes and labels, in headless chromium (fixtures:
``tests/viz/conftest.py``): section tabs switch the tokens shown, the note says what rows are,
layer labels are not doubled, the readout is never an empty strip, and a page written by
``attnkit view --model`` for a transformers model names the model in its title."""

from __future__ import annotations

import numpy as np
import pytest
from support.browser import assert_weight, hover_cell, structured

from attnkit.viz import html


def _sections_page() -> tuple[str, list]:
    """A three-section page like an encoder-decoder's (different tokens per section)."""
    src = [f"s{i}" for i in range(7)]
    out = [f"o{i}" for i in range(5)]
    sections = [
        html.Section("encoder self-attention", structured((2, 3, 7, 7), 6), src, note="enc"),
        html.Section("decoder self-attention", structured((2, 3, 5, 5), 7), out, note="dec"),
        html.Section(
            "cross-attention",
            structured((2, 3, 5, 7), 8),
            out,
            src,
            note="row t: the step that produced output token t",
            layer_labels=["decoder layer 0", "decoder layer 1"],
        ),
    ]
    return html.render_sections(sections, title="tiny-bart: a text"), sections


def test_sections_switch_and_say_what_rows_are(open_page):
    doc, sections = _sections_page()
    p = open_page(doc)
    p.wait_drawn("head:0:0")
    tabs = p.js("[...document.querySelectorAll('#sections button')].map(b => b.textContent)")
    assert tabs == [s.name for s in sections]
    assert p.js("document.getElementById('note').textContent") == "enc"
    assert p.js("document.getElementById('note').hidden") is False
    left = "[...document.querySelectorAll('#hv-left .tok')].map(s => s.textContent)"
    assert p.js(left) == list(sections[0].q_tokens)
    p.page.click("#sections button >> nth=2")  # the page reloads on the chosen section
    p.page.wait_for_function("attnkitView.section === 2", timeout=20_000)
    p.wait_drawn("head:0:0")
    assert p.js(left) == list(sections[2].q_tokens)
    right = "[...document.querySelectorAll('#hv-right .tok')].map(s => s.textContent)"
    assert p.js(right) == list(sections[2].k_tokens)
    assert p.js("document.getElementById('note').textContent").startswith("row t: the step")
    options = p.js("[...document.querySelectorAll('#sel-layer option')].map(o => o.textContent)")
    assert options == ["decoder layer 0", "decoder layer 1"]  # not "layer decoder layer 0"
    p.page.click("#tab-matrix")
    p.wait_drawn("matrix:0:0")
    w = np.asarray(sections[2].attentions)[0, 0]
    shown = hover_cell(p, 4, 6)
    assert "\u201co4\u201d" in shown["text"] and "\u201cs6\u201d" in shown["text"]
    assert_weight(shown, w, 4, 6)
    assert p.errors == [] and p.dialogs == [] and set(p.requests) == {p.url}


def test_no_empty_strip_before_the_first_hover(open_page):
    w = structured((1, 2, 9, 9), seed=9)
    p = open_page(html.render(w, [f"t{i}" for i in range(9)], layer_labels=[4]))
    p.wait_drawn("head:0:0")
    hint = p.js("document.getElementById('hv-readout').textContent")
    assert hint.strip() and "hover" in hint  # the strip says what it is for
    assert p.js("document.querySelector('#sel-layer option').textContent") == "layer 4"
    assert p.js("document.getElementById('note').hidden") is True  # no note given: none shown
    assert p.js("document.getElementById('sections').hidden") is True
    p.page.hover("#hv-left .tok >> nth=2")
    assert p.js("document.getElementById('hv-readout').textContent").startswith("query 2")
    p.page.mouse.move(1, 1)
    p.page.hover("#title")
    p.page.wait_for_function(
        "document.getElementById('hv-readout').textContent.includes('hover')", timeout=5_000
    )
    p.check_clean()


def test_a_transformers_model_page_from_the_cli(open_page, tmp_path, capsys):
    """``attnkit view --model DIR`` on a tiny BART saved by transformers: the title names the
    model (its directory), the three kinds of attention are tabs, the cross-attention's rows
    are the tokens each step produced."""
    pytest.importorskip("transformers")
    from support.html_page import decode_sections
    from support.tiny_hf_dirs import TEXT, save_tiny

    from attnkit.cli import main

    model = save_tiny("bart", tmp_path / "tiny-bart")
    out = tmp_path / "bart.html"
    assert main(["view", TEXT, "--model", str(model), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    doc = out.read_text(encoding="utf-8")
    _, sections = decode_sections(doc)
    p = open_page(doc)
    p.wait_drawn("head:0:0")
    assert p.page.title().startswith("tiny-bart: the animal")
    assert p.js("document.getElementById('title').textContent").startswith("tiny-bart: ")
    tabs = p.js("[...document.querySelectorAll('#sections button')].map(b => b.textContent)")
    assert tabs == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    p.page.click("#sections button >> nth=2")
    p.page.wait_for_function("attnkitView.section === 2", timeout=20_000)
    p.wait_drawn("head:0:0")
    left = p.js("[...document.querySelectorAll('#hv-left .tok')].map(s => s.textContent)")
    assert left == sections[2][0]["q_tokens"]
    assert "produced" in p.js("document.getElementById('note').textContent")
    assert p.errors == [] and p.dialogs == [] and set(p.requests) == {p.url}
