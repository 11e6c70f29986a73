"""``attnkit explain ... --png FILE``: the walkthrough's weights, or with ``--model``
every layer's and head's weights for the chosen word (without ``--word``: each layer's
head-averaged weights), as a heatmap image (PNG, SVG or PDF). The file written is announced."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from attnkit.cli.support.common import UsageError, one_line

__all__ = ["add_option", "announce", "write", "write_model"]


def add_option(p: argparse.ArgumentParser) -> None:
    """Add ``--png FILE`` to the explain parser."""
    p.add_argument(
        "--png",
        type=Path,
        metavar="FILE",
        help="also draw the weights as a heatmap: the walkthrough's (words x words), or with "
        "--model the chosen word's weights in every layer (rows: heads; without --word, each "
        "layer's head-averaged weights); .png, .svg or .pdf",
    )


def write(ns: argparse.Namespace, sentence: str | None) -> None:
    """Draw the heatmap ``ns.png`` asks for (path checked before any work)."""
    from attnkit import explain as ex
    from attnkit.viz.heatmap import FORMATS
    from attnkit.viz.weights import check_output_path

    if ns.example is not None:
        raise UsageError("--png draws the walkthrough or --model's weights, not an --example")
    try:
        path = check_output_path("--png", ns.png, FORMATS)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from e
    ns.png = path
    if ns.model is not None:
        return  # drawn by write_model once the model has run
    w = ex.walkthrough(
        sentence or ex.DEFAULT_SENTENCE, ns.word, ns.d_model, ns.d_k, ns.d_v, ns.seed
    )
    _heatmap()(
        w.trace.weights,
        list(w.words),
        path=path,
        title=f"self-attention weights softmax(QK\u1d40/\u221ad_k), d_model={w.d_model}, "
        f"d_k={w.d_k}, seed={w.seed}",
    )
    announce(ns, path)


def announce(ns: argparse.Namespace, path: Path) -> None:
    """Say which file was written (on stderr with --json, which keeps stdout one JSON object)."""
    print(f"wrote {one_line(path)}", file=sys.stderr if ns.json else sys.stdout)


def _heatmap():
    # the module (attnkit.viz.heatmap names the function), looked up at call time
    return importlib.import_module("attnkit.viz.heatmap").heatmap


def write_model(ns: argparse.Namespace, name: str, section: Any, position: Any) -> None:
    """``--model ... --png``: with ``--word`` (``position``), that word's row in every layer
    (a panel per layer, a row per head); without it, each layer's head-averaged weights (a
    panel per layer, tokens x tokens). ``section``: the model's self-attention (N, H, L, L)."""
    path = Path(ns.png)
    weights, tokens = section.weights, section.q_tokens
    n, h = weights.shape[:2]
    layers = [f"layer {i}" for i in range(n)]
    if position is None:
        _heatmap()(
            weights.mean(dim=1, keepdim=True),  # (N, 1, L, L)
            tokens,
            path=path,
            title=f"{name}: each layer's attention, averaged over its {h} heads",
            layer_labels=layers,
            head_labels=["mean of heads"],
        )
    else:
        q = position.query_index
        _heatmap()(
            weights[:, :, q, :][:, None],  # (N, 1, H, L): one panel per layer, a row per head
            [f"head {i}" for i in range(h)],
            tokens,
            path=path,
            title=f"{name}: what {ns.word!r} (token {q}) attends to, every layer and head",
            layer_labels=layers,
        )
    announce(ns, path)
