"""``attnkit explain ... --png FILE``: the walkthrough's weights, or with ``--model``
every layer's and head's weights for the chosen word, as a heatmap image (PNG, SVG or PDF)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from attnkit.cli.common import UsageError

__all__ = ["add_option", "write"]


def add_option(p: argparse.ArgumentParser) -> None:
    """Add ``--png FILE`` to the explain parser."""
    p.add_argument(
        "--png",
        type=Path,
        metavar="FILE",
        help="also draw the weights as a heatmap: the walkthrough's (words x words), or with "
        "--model the chosen word's weights in every layer (rows: heads); .png, .svg or .pdf",
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
    if ns.model is not None:
        if sentence is not None and ns.word is not None:  # else explain says what is missing
            _model_png(ns, sentence, path)
        return
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


def _heatmap():
    # the module (attnkit.viz.heatmap names the function), looked up at call time
    return importlib.import_module("attnkit.viz.heatmap").heatmap


def _model_png(ns: argparse.Namespace, sentence: str, path: Path) -> None:
    from attnkit.explain.model_attention import model_attention_report
    from attnkit.models.bert import BertModel
    from attnkit.models.hub import resolve_model_path
    from attnkit.viz.weights import model_attentions

    model = BertModel.from_pretrained(resolve_model_path(ns.model))
    report = model_attention_report(model, sentence, ns.word, top_k=1)
    tokens, weights = model_attentions(model, sentence)
    rows = weights[:, :, report.query_index, :]  # (N, H, L): the word's row, every layer/head
    n, h = rows.shape[:2]
    _heatmap()(
        rows[:, None],  # (N, 1, H, L): one panel per layer, a row per head
        [f"head {i}" for i in range(h)],
        tokens,
        path=path,
        title=f"what {ns.word!r} (token {report.query_index}) attends to, every layer and head",
        layer_labels=[f"layer {i}" for i in range(n)],
    )
