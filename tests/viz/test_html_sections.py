"""attnkit.viz.html.render_sections and the page's note: several kinds of attention (own tokens,
own shapes) in one file, read back independently (tests/support/html_page.py) within the
documented storage bound; bad input refused before any work."""

from __future__ import annotations

import numpy as np
import pytest
from support.html_page import decode_sections, decode_weights

from attnkit.viz import html


def _rows(shape, seed):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(shape) * 2
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def test_sections_round_trip_within_the_bound():
    enc, dec, cross = _rows((2, 3, 5, 5), 0), _rows((1, 3, 4, 4), 1), _rows((1, 3, 4, 5), 2)
    src, out = list("abcde"), ["x", "y", "z", "</s>"]
    doc = html.render_sections(
        [
            html.Section("encoder self-attention", enc, src, note="rows: text"),
            html.Section("decoder self-attention", dec, out, layer_labels=[7]),
            html.Section("cross-attention", cross, out, src, note="row t: produced t"),
        ],
        title="m: text",
        bits=16,
    )
    meta, sections = decode_sections(doc)
    assert meta["title"] == "m: text" and meta["bits"] == 16
    for (_, got), want in zip(sections, (enc, dec, cross), strict=True):
        bound = want.max(-1, keepdims=True) / 131070
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= bound * (1 + 1e-6) + 1e-9)
    assert [s["name"] for s, _ in sections][2] == "cross-attention"
    assert sections[1][0]["layers"] == ["7"] and sections[2][0]["cross"] is True
    assert sections[0][0]["note"] == "rows: text" and sections[1][0]["note"] == ""


def test_one_section_page_keeps_the_flat_format_with_a_note():
    w = _rows((1, 2, 3, 3), 3)
    meta, got = decode_weights(html.render(w, list("abc"), note="what rows are"))
    assert meta["note"] == "what rows are" and "sections" not in meta
    assert np.all(np.abs(got - w) <= w.max(-1, keepdims=True) / 510 + 1e-7)


def test_bad_sections_are_refused():
    w = _rows((1, 1, 2, 2), 4)
    with pytest.raises(ValueError, match="sections: expected a non-empty sequence"):
        html.render_sections([])
    with pytest.raises(TypeError, match=r"sections\[1\]: expected a Section, got tuple"):
        html.render_sections([html.Section("a", w, ["p", "q"]), ("b", w)])
    with pytest.raises(ValueError, match="q_tokens: expected 2 tokens"):
        html.render_sections([html.Section("a", w, ["p"])])
    with pytest.raises(TypeError, match="note: expected a str"):
        html.render(w, ["p", "q"], note=3)
    with pytest.raises(ValueError, match="bits: expected 8 or 16"):
        html.render_sections([html.Section("a", w, ["p", "q"])], bits=4)
