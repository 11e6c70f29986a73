"""``attnkit view``: a pretrained model's attention on a text as one offline HTML file (head
view, matrix view, layers × heads overview; see :mod:`attnkit.viz.html`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.common import UsageError

NAME = "view"
EXAMPLES = """\
  view      a model's attention as one offline, interactive HTML file
              attnkit view "The animal didn't cross the street because it was too tired" \\
                  --model default -o view.html
              attnkit view --file text.txt --layers 0,5 --heads 0-3 -o long.html
"""

DESCRIPTION = """\
Run a pretrained BERT-style model on SENTENCE (or the text of --file) and write its attention
weights, every layer and head (or the --layers/--heads chosen), as one self-contained HTML file:
a head view (lines from query to key tokens, opacity = weight), a matrix view (zoom, pan, the
weight under the cursor) and a layers x heads overview. The file loads nothing from the network
and works from file://. Weights are stored with 8 bits per entry (--bits 16 for more precision):
each shown weight is within 1/510 of its row's largest weight. Texts longer than the model's
limit are cut (a note says so).
"""

EPILOG = """\
examples:
  attnkit view "The animal didn't cross the street because it was too tired" -o view.html
  attnkit view --file notes.txt --model path/to/bert-dir -o notes.html
  attnkit view "the cat sat on the mat" --layers 4-5 --heads 0,3,7 -o subset.html
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="a model's attention as one offline, interactive HTML file",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sentence", nargs="*", metavar="SENTENCE", help="the text (or use --file)")
    p.add_argument("--file", type=Path, metavar="PATH", help="read the text from a UTF-8 file")
    p.add_argument(
        "--model",
        metavar="PATH|default",
        default="default",
        help="a pretrained BERT-style directory, or 'default' for all-MiniLM-L6-v2 (default)",
    )
    p.add_argument(
        "-o", "--output", type=Path, metavar="FILE.html", required=True, help="the HTML file"
    )
    p.add_argument("--layers", metavar="LIST", help='layers to include, e.g. "0,2-3" (default all)')
    p.add_argument("--heads", metavar="LIST", help='heads to include, e.g. "0-5" (default all)')
    p.add_argument("--title", help="the page's title (default: the model and the text)")
    p.add_argument(
        "--bits", type=int, choices=(8, 16), default=8, help="bits per stored weight (default 8)"
    )


def index_list(option: str, text: str | None, n: int) -> list[int]:
    """Parse "0,2-4" into sorted distinct indices in [0, n); None = all."""
    if text is None:
        return list(range(n))
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise UsageError(
                f'view: {option}: expected indices like "0,2-4", got {text!r}'
            ) from None
        if a > b or a < 0 or b >= n:
            raise UsageError(f"view: {option}: expected indices in [0, {n - 1}], got {part!r}")
        out.update(range(a, b + 1))
    return sorted(out)


def _read_text(ns: argparse.Namespace) -> str:
    sentence = " ".join(ns.sentence).strip()
    if ns.file is not None:
        if sentence:
            raise UsageError("view: give either SENTENCE or --file, not both")
        try:
            text = ns.file.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"view: --file {str(ns.file)!r} is not UTF-8 text ({e.reason})") from e
        except OSError as e:
            raise UsageError(f"view: --file {str(ns.file)!r}: {e.strerror or e}") from e
        if not text.strip():
            raise UsageError(f"view: --file {str(ns.file)!r} is empty")
        return text
    if not sentence:
        raise UsageError("view: give the SENTENCE to run through the model (or --file PATH)")
    return sentence


def run(ns: argparse.Namespace) -> int:
    """Run the verb on parsed arguments; the exit code."""
    from attnkit.viz.weights import check_output_path

    text = _read_text(ns)
    try:
        out = check_output_path("-o", ns.output, (".html", ".htm"))
    except (ValueError, OSError) as e:
        raise UsageError(f"view: {e}") from e
    from attnkit.models import resolve_model_path
    from attnkit.models.bert import BertConfig, BertModel
    from attnkit.viz import html
    from attnkit.viz.weights import model_attentions

    path = resolve_model_path(ns.model)
    config = BertConfig.from_json(path / "config.json")  # sizes, before loading any weights
    layers = index_list("--layers", ns.layers, config.num_hidden_layers)
    heads = index_list("--heads", ns.heads, config.num_attention_heads)
    model = BertModel.from_pretrained(path)
    tokens, weights = model_attentions(model, text)
    limit = model.pooling.max_seq_length
    if len(tokens) >= limit:
        print(
            f"note: the model reads at most {limit} tokens; the text was cut to its first "
            f"{limit} tokens",
            file=sys.stderr,
        )
    weights = weights[layers][:, heads]
    name = "default model" if ns.model == "default" else Path(ns.model).name
    short = " ".join(text.split())
    title = ns.title or f"{name}: {short[:80]}{'…' if len(short) > 80 else ''}"
    page = html.render(
        weights, tokens, title=title, layer_labels=layers, head_labels=heads, bits=ns.bits
    )
    html.save(page, out)
    size = out.stat().st_size
    print(
        f"wrote {out} ({len(layers)} layers x {len(heads)} heads, {len(tokens)} tokens, "
        f"{size / 1e6:.1f} MB); open it in a browser"
    )
    return 0
