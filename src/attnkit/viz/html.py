"""Attention as one self-contained, offline HTML file that stays interactive at 2,000 tokens.

    html_text = render(weights, tokens, title="my model")      # a str: the whole file
    save(html_text, "view.html")                                # written atomically
    view(weights, tokens)                                       # in a notebook: shows inline
    render_sections([Section("encoder", w_enc, src), Section("cross-attention", w_x, out, src)])

The page has three views of the chosen layer and head:

* **head view** — query tokens left, key tokens right, a line per (query, key) whose opacity is
  the weight; at long inputs only each query's top-k lines (k adjustable); hovering a token
  isolates all its lines, shades the other column by weight and lists its largest weights;
* **matrix view** — a canvas heatmap (square-root colour scale) with wheel zoom, drag to pan,
  double-click to zoom in; the exact stored weight, the query token and the key token under the
  cursor; a "save PNG" button;
* **overview** — a layers × heads grid of thumbnails; clicking one opens it.

Query and key tokens may differ (cross-attention: ``k_tokens``). A ``note`` under the title
says what the rows and columns are. :func:`render_sections` puts several kinds of attention
with different tokens in one page (an encoder-decoder's encoder self-attention, decoder
self-attention and cross-attention): a row of section tabs switches between them (the page
reloads itself on the chosen section; the URL's ``#section-N`` names it).

Data: weights are stored with 8 bits per entry (or 16) and a float32 scale per query row,
zlib-compressed per head — see :mod:`attnkit.viz.encoding` for the format and the error bound
(``m_i / 510`` for row ``i`` whose largest weight is ``m_i``). Only the shown head is
decompressed (by the browser's ``DecompressionStream``), so a file opens fast whatever its size.

Safety: nothing is loaded from anywhere (no URL appears in the page; a Content-Security-Policy
meta tag forbids every network source: ``default-src 'none'``); the page's one script and one
style sheet are allowed by their SHA-256 hashes, so no other script could run even if one were
injected (hashes rather than ``'unsafe-inline'``, which would allow any inline script, or a
nonce, which in a static file is a constant anyone can read). Tokens, title and labels travel as
JSON inside ``<script type="application/json">`` with ``<``, ``>``, ``&``, U+2028 and U+2029
escaped (``</script>`` and ``<!--`` cannot occur), and reach the page only through
``textContent`` or canvas text — never ``innerHTML``, never ``eval``. The ``<title>`` is
HTML-escaped. Control characters in tokens are shown escaped (``\\u000a``).

Shape legend: ``N`` layers, ``H`` heads, ``Lq`` query tokens, ``Lk`` key tokens.
"""

from __future__ import annotations

import base64
import hashlib
import html as htmllib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from attnkit.viz.encoding import encode
from attnkit.viz.weights import attention_grid, check_output_path, write_atomic

__all__ = ["FORMAT_VERSION", "HTMLView", "Section", "render", "render_sections", "save", "view"]

FORMAT_VERSION = 1
_SCRIPTS = ("data.js", "matrix.js", "headview.js", "app.js")  # concatenated in this order
_BITS = (8, 16)


@lru_cache(maxsize=1)
def _assets() -> tuple[str, str]:
    """(the page's script, its style sheet) from the package's ``viz/assets``."""
    root = resources.files("attnkit.viz") / "assets"
    js = "\n".join(
        f"// --- {name}\n" + (root / name).read_text(encoding="utf-8") for name in _SCRIPTS
    )
    script = '(() => {\n"use strict";\n' + js + "\n})();\n"
    return script, (root / "view.css").read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _json_for_script(obj: Any) -> str:
    """JSON that cannot end its <script> element or open a comment: ASCII only (U+2028/9
    escaped by ``ensure_ascii``), and ``<``, ``>``, ``&`` as \\u escapes."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _plain(text: str) -> str:
    """Text safe to encode as UTF-8 (lone surrogates replaced)."""
    return text.encode("utf-8", "replace").decode("utf-8")


_BODY = """\
<header>
<h1 id="title"></h1>
<p id="subtitle"></p>
<p id="note" hidden></p>
<nav id="sections" aria-label="kinds of attention" hidden></nav>
<div class="controls">
<div role="tablist" aria-label="views">
<button type="button" role="tab" id="tab-head" aria-selected="false">head view</button>
<button type="button" role="tab" id="tab-matrix" aria-selected="false">matrix view</button>
<button type="button" role="tab" id="tab-overview" aria-selected="false">overview</button>
</div>
<span id="selectors">
<label>layer <select id="sel-layer"></select></label>
<label>head <select id="sel-head"></select></label>
</span>
</div>
<p id="status">loading&#8230;</p>
</header>
<main>
<section id="headview" hidden>
<div class="bar"><label>lines per query (top-k) <input id="hv-k" type="number" min="1"></label>
<span class="hint">line opacity = weight; hover a token to isolate its lines</span></div>
<p id="hv-readout" class="readout">hover a token to see its largest weights</p>
<div class="hv-heads"><span>query tokens</span><span>key tokens</span></div>
<div id="hv-scroll"><div id="hv-inner"><canvas id="hv-canvas"></canvas>
<div id="hv-left"></div><div id="hv-right"></div></div></div>
</section>
<section id="matrix" hidden>
<div class="bar"><button type="button" id="m-zoom-in">zoom in</button>
<button type="button" id="m-zoom-out">zoom out</button>
<button type="button" id="m-reset">fit</button>
<button type="button" id="m-save">save PNG</button>
<span class="hint">rows: queries, columns: keys; wheel to zoom, drag to pan, double-click to
zoom in; colour: square root of weight / the head's largest weight</span></div>
<p id="m-readout" class="readout">point at a cell to read its weight</p>
<canvas id="m-canvas"></canvas>
</section>
<section id="overview" hidden>
<p class="hint">rows: layers, columns: heads; each thumbnail is scaled to its own largest weight;
click one to open it</p>
<div id="ov-grid"></div>
</section>
</main>
<noscript><p>This page needs JavaScript to draw the attention weights.</p></noscript>
"""


@dataclass(frozen=True)
class Section:
    """One kind of attention in a page of :func:`render_sections`: its ``name`` (a tab), the
    weights (as :func:`render` takes them), ``q_tokens`` (Lq), ``k_tokens`` (Lk, default the
    query tokens), a ``note`` saying what rows and columns are, and layer/head labels."""

    name: str
    attentions: Any
    q_tokens: Sequence[str]
    k_tokens: Sequence[str] | None = None
    note: str = ""
    layer_labels: Sequence[str | int] | None = None
    head_labels: Sequence[str | int] | None = None


def _check_text(name: str, value: Any) -> str:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name}: expected a str or None, got {type(value).__name__}")
    return _plain(value or "")


def _check_bits(bits: Any) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits: expected 8 or 16, got {bits!r}")
    if bits not in _BITS:
        raise ValueError(f"bits: expected 8 or 16, got {bits}")
    return bits


def _section_meta(s: Section, bits: int, offset: int) -> tuple[dict, bytes]:
    """One section's metadata (block offsets shifted by ``offset``) and its encoded bytes."""
    g = attention_grid(
        s.attentions, s.q_tokens, s.k_tokens, layer_labels=s.layer_labels, head_labels=s.head_labels
    )
    enc = encode(g.weights, bits)
    meta = {
        "name": _plain(s.name),
        "note": _plain(s.note),
        "shape": list(g.shape),
        "cross": g.cross,
        "q_tokens": g.q_tokens,
        "k_tokens": g.k_tokens,
        "layers": g.layer_labels,
        "heads": g.head_labels,
        "blocks": [[off + offset, n] for off, n in enc.blocks],
        "thumbs": {"block": [enc.thumbs[0] + offset, enc.thumbs[1]], "shape": enc.thumb_shape},
    }
    return meta, enc.data


def render(
    attentions: Any,
    q_tokens: Sequence[str],
    k_tokens: Sequence[str] | None = None,
    *,
    title: str | None = None,
    layer_labels: Sequence[str | int] | None = None,
    head_labels: Sequence[str | int] | None = None,
    bits: int = 8,
    note: str | None = None,
) -> str:
    """The whole HTML file (a str) showing ``attentions``.

    Args:
        attentions: (Lq, Lk), (H, Lq, Lk), (N, H, Lq, Lk) or a sequence of per-layer
            (H, Lq, Lk) / (1, H, Lq, Lk) weights (NumPy or torch), finite, in [0, 1].
        q_tokens: Lq query tokens. k_tokens: Lk key tokens (default ``q_tokens``; give them for
            cross-attention).
        title: the page's title (plain text).
        layer_labels / head_labels: N / H labels shown for layers and heads (default 0, 1, ...;
            e.g. the original indices of a subset).
        bits: 8 (default) or 16 bits per stored weight (see :mod:`attnkit.viz.encoding`).
        note: a line under the title saying what the rows and columns are (plain text).

    Raises:
        TypeError / ValueError: bad weights, tokens, labels, title or bits (before any work).
    """
    title_text = _check_text("title", title)
    note_text = _check_text("note", note)
    bits = _check_bits(bits)
    section = Section("", attentions, q_tokens, k_tokens, note_text, layer_labels, head_labels)
    meta, data = _section_meta(section, bits, 0)
    del meta["name"]
    return _page({"version": FORMAT_VERSION, "title": title_text, "bits": bits, **meta}, data)


def render_sections(sections: Sequence[Section], *, title: str | None = None, bits: int = 8) -> str:
    """One HTML file showing several kinds of attention (:class:`Section`), a tab each; the
    page opens on the first. Arguments and errors as :func:`render`; ValueError for no
    sections, TypeError for an item that is not a :class:`Section`."""
    title_text = _check_text("title", title)
    bits = _check_bits(bits)
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence) or not sections:
        raise ValueError(f"sections: expected a non-empty sequence of Section, got {sections!r}")
    bad = [i for i, s in enumerate(sections) if not isinstance(s, Section)]
    if bad:
        got = type(sections[bad[0]]).__name__
        raise TypeError(f"sections[{bad[0]}]: expected a Section, got {got}")
    metas, chunks, offset = [], [], 0
    for s in sections:
        _check_text("Section.name", s.name)
        _check_text("Section.note", s.note)
        meta, data = _section_meta(s, bits, offset)
        metas.append(meta)
        chunks.append(data)
        offset += len(data)
    meta = {"version": FORMAT_VERSION, "title": title_text, "bits": bits, "sections": metas}
    return _page(meta, b"".join(chunks))


def _page(meta: dict, data: bytes) -> str:
    """The HTML file around the metadata and the encoded weights."""
    script, style = _assets()
    csp = (
        f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
        "base-uri 'none'; form-action 'none'"
    )
    page_title = (  # escaped, and ASCII: any other character as a reference (&#8232;)
        htmllib.escape(meta["title"] or "attention", quote=True)
        .encode("ascii", "xmlcharrefreplace")
        .decode("ascii")
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            '<meta name="generator" content="attnkit.viz.html">\n',
            f"<title>{page_title}</title>\n<style>{style}</style>\n</head>\n<body>\n",
            _BODY,
            '<script type="application/json" id="attnkit-meta">',
            _json_for_script(meta),
            '</script>\n<script type="application/octet-stream" id="attnkit-data">',
            base64.b64encode(data).decode("ascii"),
            f"</script>\n<script>{script}</script>\n</body>\n</html>\n",
        ]
    )


def save(html_text: str, path: str | os.PathLike) -> None:
    """Write a rendered page to ``path`` (.html or .htm) atomically (UTF-8)."""
    if not isinstance(html_text, str):
        raise TypeError(f"html_text: expected a str, got {type(html_text).__name__}")
    target = check_output_path("path", path, (".html", ".htm"))
    data = html_text.encode("utf-8")
    write_atomic(target, lambda f: f.write(data))


class HTMLView:
    """A rendered page; in a notebook it displays itself inline (an ``<iframe srcdoc>``, so
    the page's own Content-Security-Policy applies and nothing is fetched)."""

    def __init__(self, html_text: str, height: int = 760) -> None:
        self.html = html_text
        self.height = height

    def _repr_html_(self) -> str:
        doc = htmllib.escape(self.html, quote=True)
        return (
            f'<iframe srcdoc="{doc}" sandbox="allow-scripts allow-downloads" '
            f'title="attention" width="100%" height="{self.height}" frameborder="0"></iframe>'
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the page to ``path`` atomically (see :func:`save`)."""
        save(self.html, path)

    def __repr__(self) -> str:
        return f"HTMLView({len(self.html):,} characters)"


def view(
    attentions: Any,
    q_tokens: Sequence[str],
    k_tokens: Sequence[str] | None = None,
    *,
    title: str | None = None,
    layer_labels: Sequence[str | int] | None = None,
    head_labels: Sequence[str | int] | None = None,
    bits: int = 8,
    height: int = 760,
    note: str | None = None,
) -> HTMLView:
    """:func:`render` wrapped in an :class:`HTMLView` (shows inline in Jupyter; ``.save(path)``
    writes the file). ``height``: the iframe's height in pixels."""
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise ValueError(f"height: expected an int >= 100 (pixels), got {height!r}")
    page = render(
        attentions,
        q_tokens,
        k_tokens,
        title=title,
        layer_labels=layer_labels,
        head_labels=head_labels,
        bits=bits,
        note=note,
    )
    return HTMLView(page, height)
