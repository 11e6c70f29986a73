"""attnkit.explain.render: the walkthrough, a seed example and a model attention report on a
terminal: they fit 100 columns, show shapes and marks, and print hostile text (rich markup,
terminal control characters in the user's words, paths or a model's vocabulary) as text."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from attnkit import explain as ex
from attnkit.explain.model_attention import Attended, ModelAttentionReport
from attnkit.explain.render import render_model_attention
from attnkit.explain.shared import shared_dir

SEEDS = shared_dir() / "seeds"


# ---------------------------------------------------------------------------------------------
# the walkthrough and the seed examples
# ---------------------------------------------------------------------------------------------
def test_render_walkthrough_fits_100_columns():
    console = Console(width=100, record=True, color_system=None)
    ex.render_walkthrough(ex.walkthrough(), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "(4 × 512)" in text and "(512 × 512)" in text and "(4 × 4)" in text
    assert "] (512)" in text and "Checks" in text and "MISMATCH" not in text


def test_fmt_vector():
    a = np.arange(512) / 4
    assert ex.fmt_vector(a) == "[0.0000, 0.2500, 0.5000, ..., 127.7500] (512)"
    assert ex.fmt_vector([1.0, -2.0], decimals=1) == "[1.0, -2.0]"


def test_render_example_without_seed_files(tmp_path):
    result = ex.seed_example("bahdanau-vs-dot", tmp_path / "nowhere")
    console = Console(width=100, record=True, color_system=None)
    ex.render_example(result, console)
    assert "no tutorial text found" in console.export_text()


def test_render_example_fits_100_columns():
    console = Console(width=100, record=True, color_system=None)
    ex.render_example(ex.seed_example("bahdanau-vs-dot", SEEDS), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "0.1192" in text and "✗" in text and "✓" in text


def test_render_shows_hostile_words_and_paths_as_text(tmp_path):
    """Markup and control characters in the user's words or the seeds path are shown, never
    interpreted (a "[/]" word used to raise rich's MarkupError)."""
    w = ex.walkthrough("[/] [bold]b \x1b[31mc d\\", word="[bold]b", d_model=2)
    console = Console(width=100, record=True, force_terminal=True, color_system=None)
    ex.render_walkthrough(w, console)
    out = console.export_text()
    assert "\x1b" not in out
    assert "[/] [bold]b \\x1b[31mc d\\" in out and "One word: '[bold]b'" in out
    seeds = tmp_path / "[red]\x1b[2J"
    seeds.mkdir()
    console = Console(width=100, record=True, force_terminal=True, color_system=None)
    ex.render_example(ex.seed_example("bahdanau-vs-dot", seeds), console)
    out = console.export_text()
    assert "\x1b" not in out and "[red]\\x1b[2J" in out


# ---------------------------------------------------------------------------------------------
# the model attention report
# ---------------------------------------------------------------------------------------------
def test_render_model_attention_fits_100_columns(it_report):
    r = it_report
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False, color_system=None)
    render_model_attention(r, console)
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 100
    for layer in range(6):
        top = r.averaged[layer][0]
        assert f"{top.token}" in out and f"{top.weight:.2f}" in out
    assert "h11" in out and "head-averaged" in out
    with pytest.raises(TypeError, match="report"):
        render_model_attention(r.to_dict(), console)


def test_render_shows_hostile_tokens_as_text():
    """Tokens from a model's vocabulary, the text and the word are printed with control
    characters escaped and rich markup not interpreted (even on a colour terminal)."""
    toks = ["[CLS]", "\x1b[31mred", "[bold]x", "[/]", "\x9b2J\u202e", "[SEP]"]
    items = [Attended(t, i, 0.2) for i, t in enumerate(toks[1:5], start=1)]
    r = ModelAttentionReport(
        model="/m/\x1b]0;pwned\x07", text="\x1b[31mred [bold]x [/] \x9b2J\u202e", word="[bold]x",
        tokens=toks, word_pieces=["[bold]x"], word_indices=[2], query_index=2, top_k=4,
        skip_special=False, num_layers=1, num_heads=1, heads=[[items]], averaged=[items],
        special_weight=[0.2], notes=["note with \x1b[2J"],
    )  # fmt: skip
    buf = io.StringIO()
    render_model_attention(r, Console(file=buf, width=200, force_terminal=True, color_system=None))
    out = buf.getvalue()
    for raw in ("\x1b]", "\x1b[31m", "\x1b[2J", "\x9b", "\u202e", "\x07"):
        assert raw not in out, repr(raw)
    for shown in ("\\x1b[31mred", "[bold]x", "[/]", "\\x9b2J\\u202e", "\\x1b]0;pwned\\x07",
                  "note with \\x1b[2J", "what '[bold]x' attends to"):  # fmt: skip
        assert shown in out, shown
