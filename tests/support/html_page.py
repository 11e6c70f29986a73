"""A rendered attnkit HTML page read back independently of attnkit: its elements, its
embedded JSON, and its stored weights decoded following the format documented in
``attnkit.viz.encoding``."""

from __future__ import annotations

import base64
import json
import zlib
from html.parser import HTMLParser

import numpy as np


class Document(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>/<style>/<title>."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.texts: list[tuple[str, dict, str]] = []
        self._open: tuple[str, dict] | None = None
        self._buf: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag in ("script", "style", "title"):
            self._open, self._buf = (tag, a), []

    def handle_data(self, data):
        if self._open:
            self._buf.append(data)

    def handle_endtag(self, tag):
        if self._open and tag == self._open[0]:
            self.texts.append((tag, self._open[1], "".join(self._buf)))
            self._open = None


def parts(doc: str) -> dict:
    d = Document(doc)
    scripts = [(a, t) for tag, a, t in d.texts if tag == "script"]
    out = {"doc": d, "scripts": scripts}
    for a, t in scripts:
        out[a.get("id") or a.get("type") or "code"] = t
    out["style"] = next(t for tag, _, t in d.texts if tag == "style")
    out["title"] = next(t for tag, _, t in d.texts if tag == "title")
    return out


def _decode(meta: dict, blob: bytes, bits: int) -> np.ndarray:
    n, h, lq, lk = meta["shape"]
    q = (1 << bits) - 1
    dtype = np.uint8 if bits == 8 else np.dtype("<u2")
    out = np.empty((n, h, lq, lk))
    for idx, (off, length) in enumerate(meta["blocks"]):
        raw = zlib.decompress(blob[off : off + length])
        m = np.frombuffer(raw[: 4 * lq], "<f4").astype(np.float64)
        codes = np.frombuffer(raw[4 * lq :], dtype).reshape(lq, lk)
        out[idx // h, idx % h] = m[:, None] * codes / q
    return out


def decode_weights(doc: str) -> tuple[dict, np.ndarray]:
    """Read the stored weights back following the format documented in attnkit.viz.encoding."""
    p = parts(doc)
    meta = json.loads(p["attnkit-meta"])
    blob = base64.b64decode(p["attnkit-data"])
    return meta, _decode(meta, blob, meta["bits"])


def decode_sections(doc: str) -> tuple[dict, list[tuple[dict, np.ndarray]]]:
    """A page of several sections (``meta["sections"]``; a one-section page as one):
    (the page's metadata, [(each section's metadata, its weights)])."""
    p = parts(doc)
    meta = json.loads(p["attnkit-meta"])
    blob = base64.b64decode(p["attnkit-data"])
    sections = meta.get("sections", [meta])
    return meta, [(s, _decode(s, blob, meta["bits"])) for s in sections]
