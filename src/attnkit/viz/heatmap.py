"""Attention weights as a heatmap image (matplotlib, Agg: no display needed).

    fig = heatmap(weights, tokens, path="attention.png")          # one head (Lq, Lk)
    fig = heatmap(model_weights, tokens, path="grid.pdf")         # layers × heads (N, H, L, L)

One head gives one panel with the query tokens down the left and the key tokens along the
bottom; (H, Lq, Lk) or (N, H, Lq, Lk) gives a grid, one panel per layer (row) and head
(column), token labels on the left column and the bottom row only. All panels share one colour
scale, from 0 to the largest weight shown, on a square-root scale (so the many small weights of a
long input stay visible; the colour bar is labelled in real weights). Token labels are thinned
to every n-th token when there are more than fit at a readable size. Tokens are drawn as plain
text (``$`` is not maths; control characters are shown escaped).

Shape legend: ``N`` layers, ``H`` heads, ``Lq`` query tokens, ``Lk`` key tokens.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from attnkit.viz.weights import AttentionGrid, attention_grid, check_output_path, write_atomic

__all__ = ["FORMATS", "heatmap", "label_step"]

FORMATS = (".png", ".svg", ".pdf")
"""File types :func:`heatmap` writes, chosen by the path's extension."""

_DPI = 100
_LABEL_PT = {True: 8.0, False: 6.0}  # font size of token labels: one panel / grid
_MAX_TOKEN_CHARS = 16
_ANNOTATE = 144  # one panel with at most this many cells shows each weight as a number


def label_step(n: int, length_inches: float, fontsize: float) -> int:
    """Show every ``step``-th of ``n`` labels along an axis ``length_inches`` long: labels of
    ``fontsize`` points need about 1.4 × their size each (1 = every label)."""
    fit = max(1, int(length_inches * 72 / (1.4 * fontsize)))
    return max(1, math.ceil(n / fit))


def _display(token: str) -> str:
    """A token as a plain, one-line label: control characters escaped, long tokens cut."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in token)
    if len(text) > _MAX_TOKEN_CHARS:
        text = text[: _MAX_TOKEN_CHARS - 1] + "…"
    return text


def _figure_size(g: AttentionGrid) -> tuple[float, float, float, float]:
    """(width, height, panel width, panel height) in inches."""
    n, h, lq, lk = g.shape
    if n * h == 1:
        pw = min(max(2.0 + 0.16 * lk, 4.0), 11.0)
        ph = min(max(1.5 + 0.16 * lq, 3.0), 11.0)
        return pw + 2.2, ph + 1.8, pw, ph
    side = 2.2 if n * h <= 16 else 1.6
    pw = min(max(side, 0.3 * lk), 22.0 / h, 12.0)
    ph = min(pw * min(max(lq / lk, 0.25), 4.0), 14.0 / n, 12.0)
    return h * pw + 2.0, n * ph + 1.6, pw, ph


def _ticks(ax: Any, axis: str, tokens: Sequence[str], inches: float, fontsize: float) -> None:
    step = label_step(len(tokens), inches, fontsize)
    pos = list(range(0, len(tokens), step))
    labels = [_display(tokens[i]) for i in pos]
    if axis == "x":
        ax.set_xticks(pos)
        ax.set_xticklabels(labels, rotation=90, fontsize=fontsize, parse_math=False)
    else:
        ax.set_yticks(pos)
        ax.set_yticklabels(labels, fontsize=fontsize, parse_math=False)


def _panel_title(g: AttentionGrid, layer: int, head: int, custom: tuple[bool, bool]) -> str:
    n, h, _, _ = g.shape
    parts = []
    if n > 1 or custom[0]:
        parts.append(g.layer_labels[layer] if custom[0] else f"layer {g.layer_labels[layer]}")
    if h > 1 or custom[1]:
        parts.append(g.head_labels[head] if custom[1] else f"head {g.head_labels[head]}")
    return " · ".join(parts)


def heatmap(
    weights: Any,
    q_tokens: Sequence[str],
    k_tokens: Sequence[str] | None = None,
    *,
    path: str | os.PathLike | None = None,
    title: str | None = None,
    layer_labels: Sequence[str | int] | None = None,
    head_labels: Sequence[str | int] | None = None,
) -> Any:
    """Draw attention weights as a heatmap; write it to ``path`` if given.

    Args:
        weights: (Lq, Lk) one head, (H, Lq, Lk) one layer, (N, H, Lq, Lk) layers × heads, or a
            sequence of per-layer (H, Lq, Lk) / (1, H, Lq, Lk) (NumPy or torch); finite, in
            [0, 1].
        q_tokens: Lq query tokens (rows). k_tokens: Lk key tokens (columns; default q_tokens).
        path: file to write, type by extension: .png, .svg or .pdf. Written atomically (a
            temporary file beside it, renamed), so a failure leaves an existing file unchanged.
        title: the figure's title (plain text).
        layer_labels / head_labels: N / H labels for the panel titles (default the indices,
            shown as "layer i · head j"; labels given here are shown as they are).

    Returns:
        the ``matplotlib.figure.Figure`` (one axes per panel, plus one for the colour bar).

    Raises:
        TypeError / ValueError: bad weights, tokens, labels or path — before any drawing.
    """
    if path is not None:
        path = check_output_path("path", path, FORMATS)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title: expected a str or None, got {type(title).__name__}")
    g = attention_grid(
        weights, q_tokens, k_tokens, layer_labels=layer_labels, head_labels=head_labels
    )
    fig = _draw(g, title, (layer_labels is not None, head_labels is not None))
    if path is not None:
        fmt = path.suffix.lower()[1:]
        write_atomic(path, lambda f: fig.savefig(f, format=fmt, dpi=_DPI))
    return fig


def _draw(g: AttentionGrid, title: str | None, custom: tuple[bool, bool]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    n, h, lq, lk = g.shape
    width, height, pw, ph = _figure_size(g)
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    single = n * h == 1
    fontsize = _LABEL_PT[single]
    top = float(g.weights.max())
    norm = PowerNorm(0.5, vmin=0.0, vmax=top if top > 0 else 1.0)
    axes = fig.subplots(n, h, squeeze=False, sharex=True, sharey=True)
    image = None
    for layer in range(n):
        for head in range(h):
            ax = axes[layer][head]
            image = ax.imshow(
                g.weights[layer, head],
                cmap="viridis",
                norm=norm,
                aspect="auto",
                interpolation="nearest" if max(lq, lk) <= 256 else "antialiased",
            )
            ax.tick_params(length=2, pad=1)
            if not single:
                ax.set_title(_panel_title(g, layer, head, custom), fontsize=7, parse_math=False)
    for layer in range(n):
        _ticks(axes[layer][0], "y", g.q_tokens, ph, fontsize)
    for head in range(h):
        _ticks(axes[n - 1][head], "x", g.k_tokens, pw, fontsize)
    if single and lq * lk <= _ANNOTATE:
        _annotate(axes[0][0], g.weights[0, 0], norm)
    if single:
        axes[0][0].set_ylabel("query", fontsize=9)
        axes[0][0].set_xlabel("key", fontsize=9)
    bar = fig.colorbar(image, ax=axes, shrink=0.8 if single else 0.6, pad=0.02)
    bar.set_label("weight (square-root colour scale)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(_display_title(title), fontsize=11 if single else 12, parse_math=False)
    return fig


def _annotate(ax: Any, w: Any, norm: Any) -> None:
    """Write each weight in its cell (dark text on light cells, light text on dark ones)."""
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            light = float(norm(w[i, j])) > 0.6
            ax.text(
                j,
                i,
                f"{w[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=8,
                color="black" if light else "white",
                parse_math=False,
            )


def _display_title(title: str) -> str:
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in title)
