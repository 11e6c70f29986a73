"""Driving Debian's ``chromium`` with Playwright for the viewer tests (never a downloaded
browser): the browser's flags, attention-like test weights, a page handle that records console
errors, dialogs and requests, and the matrix view's hover readout. The fixtures that open pages
(``browser``, ``open_page``) are in ``tests/viz/conftest.py``."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


def softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    return s.astype(np.float32)


def structured(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Attention-like weights: a local band, a sink on key 0, noise; a different pattern per
    head (the band's width and offset change with the head index); every third head is
    diffuse (near-uniform rows), which compresses worst, as in real models."""
    *lead, lq, lk = shape
    rng = np.random.default_rng(seed)
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    heads = int(np.prod(lead)) if lead else 1
    out = np.empty((heads, lq, lk), np.float32)
    for h in range(heads):
        width = 2.0 + 3 * (h % 5)
        noise = rng.standard_normal((lq, lk)).astype(np.float32)
        if h % 3 == 2:
            s = 0.5 * noise
        else:
            s = -np.abs(i - j + (h % 3)) / width + noise
            s[:, 0] += 2.0 * (h % 2)
        out[h] = softmax(s.astype(np.float32))
    return out.reshape(shape)


@dataclass
class Page:
    page: object
    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.dialogs == [], self.dialogs
        assert self.requests == [self.url], self.requests  # the file itself, nothing else

    def js(self, code: str, arg=None):
        return self.page.evaluate(code, arg)

    def wait_drawn(self, state: str, timeout: float = 15_000) -> None:
        self.page.wait_for_function(
            "s => document.body.dataset.drawn === s", arg=state, timeout=timeout
        )

    def pixels(self, canvas: str) -> str:
        return self.js(f"document.getElementById('{canvas}').toDataURL()")


def hover_cell(p: Page, i: int, j: int, slack: int = 0) -> dict:
    """Move the mouse over matrix cell (i, j); the readout once it shows a cell within
    ``slack`` rows/columns of it (0 = exactly it; when a cell is narrower than a pixel the
    pointer cannot always land on it)."""
    p.js(
        "() => { const d = document.getElementById('m-readout').dataset; delete d.q; delete d.k; }"
    )
    pt = p.js("([i, j]) => attnkitView.cellPoint(i, j)", [i, j])
    p.page.mouse.move(pt["x"], pt["y"])
    p.page.wait_for_function(
        "([i, j, s]) => { const d = document.getElementById('m-readout').dataset;"
        " return d.q !== undefined && Math.abs(Number(d.q) - i) <= s"
        " && Math.abs(Number(d.k) - j) <= s; }",
        arg=[i, j, slack],
        timeout=5_000,
    )
    return p.js(
        "() => { const r = document.getElementById('m-readout');"
        " return {text: r.textContent, weight: Number(r.dataset.weight),"
        " error: Number(r.dataset.error), q: Number(r.dataset.q), k: Number(r.dataset.k)}; }"
    )


def assert_weight(shown: dict, w: np.ndarray, i: int, j: int, bits: int = 8) -> None:
    bound = float(w[i].max()) / (2 * ((1 << bits) - 1))
    assert abs(shown["weight"] - float(w[i, j])) <= bound * (1 + 1e-6) + 1e-9
    assert shown["error"] == pytest.approx(bound, rel=1e-6)
