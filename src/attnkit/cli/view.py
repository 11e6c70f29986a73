"""``attnkit view``: a pretrained model's attention on a text as one offline HTML file (head
view, matrix view, layers × heads overview; see :mod:`attnkit.viz.html`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.support import options as o
from attnkit.cli.support.common import UsageError, one_line, utf8_text
from attnkit.cli.support.model_attentions import add_download_option

NAME = "view"
EXAMPLES = """\
  view      a model's attention as one offline, interactive HTML file
              attnkit view "The animal didn't cross the street because it was too tired" \\
                  --model default -o view.html
              attnkit view --file text.txt --layers 0,5 --heads 0-3 -o long.html
"""

DESCRIPTION = """\
Run a pretrained model on SENTENCE (or the text of --file) and write its attention
weights, every layer and head (or the --layers/--heads chosen), as one self-contained HTML file:
a head view (lines from query to key tokens, opacity = weight), a matrix view (zoom, pan, the
weight under the cursor) and a layers x heads overview. The file loads nothing from the network
and works from file://. Weights are stored with 8 bits per entry (--bits 16 for more precision):
each shown weight is within 1/510 of its row's largest weight. Texts longer than the model's
limit are cut (a note says so).

--model takes 'default' (all-MiniLM-L6-v2), a directory saved by transformers' save_pretrained
(encoder-only such as BERT or RoBERTa, decoder-only such as GPT-2 or Llama, encoder-decoder
such as BART, T5 or Marian), or a model name already in the local Hugging Face cache; nothing is
downloaded unless you add --download. An encoder-decoder gets three tabs: the encoder's
self-attention on the text, the decoder's self-attention on the output it generates (greedy),
and the cross-attention, whose row t is the step that produced output token t.

--device cuda (or cuda:N, mps) runs the model there, attnkit's own runs included; the weights
come back to the CPU once the model has run, to be written into the page.
"""

EPILOG = """\
examples:
  attnkit view "The animal didn't cross the street because it was too tired" -o view.html
  attnkit view --file notes.txt --model path/to/bert-dir -o notes.html
  attnkit view "The cat sat on the mat" --model path/to/gpt2-dir -o gpt2.html
  attnkit view "translate English to French: I am cold." --model google-t5/t5-small -o t5.html
  attnkit view "the cat sat on the mat" --layers 4-5 --heads 0,3,7 -o subset.html
  attnkit view "The cat sat on the mat" --model path/to/run --device cuda -o run.html
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
        metavar="PATH|NAME|default",
        default="default",
        help="a model directory (saved by transformers), a model name in the local Hugging Face "
        "cache, or 'default' for all-MiniLM-L6-v2 (default)",
    )
    add_download_option(p)
    o.add(p, o.DEVICE)
    p.add_argument(
        "-o", "--output", type=Path, metavar="FILE.html", required=True, help="the HTML file"
    )
    p.add_argument("--layers", metavar="LIST", help='layers to include, e.g. "0,2-3" (default all)')
    p.add_argument("--heads", metavar="LIST", help='heads to include, e.g. "0-5" (default all)')
    p.add_argument("--title", help="the page's title (default: the model and the text)")
    p.add_argument(
        "--bits", type=int, choices=(8, 16), default=8, help="bits per stored weight (default 8)"
    )


_ANY = 1 << 30  # an upper bound for checking the syntax of --layers / --heads


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
        if a > b:
            raise UsageError(
                f"view: {option}: expected a range LO-HI with LO <= HI, got {part.strip()!r}"
            )
        if a < 0 or b >= n:
            bound = "indices in [0, 2**30)" if n == _ANY else f"indices in [0, {n - 1}]"
            raise UsageError(f"view: {option}: expected {bound}, got {part!r}")
        out.update(range(a, b + 1))
    return sorted(out)


def _read_text(ns: argparse.Namespace) -> str:
    sentence = utf8_text("SENTENCE", " ".join(ns.sentence)).strip()
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
    from attnkit.viz import html
    from attnkit.viz.weights import check_output_path

    text = _read_text(ns)
    try:
        out = check_output_path("-o", ns.output, (".html", ".htm"))
    except (ValueError, OSError) as e:
        raise UsageError(f"view: {e}") from e
    for option, value in (("--layers", ns.layers), ("--heads", ns.heads)):
        if value is not None:  # the syntax, before any work (the range: below)
            index_list(option, value, _ANY)
    from attnkit.cli.support import model_attentions as ma

    with o.on_device(ns.device):  # --device checked before the model is loaded
        from attnkit.devices import current

        chosen = ma.choose(ns.model, ns.download, current())
        result = ma.attentions(chosen, text)  # the weights: host tensors, for the page
    if result.truncated_to is not None:
        print(
            f"note: the model reads at most {result.truncated_to} tokens; the text was cut to "
            f"its first {result.truncated_to} tokens",
            file=sys.stderr,
        )
    short = " ".join(text.split())
    title = ns.title or f"{result.name}: {short[:80]}{'…' if len(short) > 80 else ''}"
    sections = [_section(s, ns) for s in result.sections]
    if len(sections) == 1:
        s = sections[0]
        page = html.render(
            s.attentions,
            s.q_tokens,
            s.k_tokens,
            title=title,
            layer_labels=s.layer_labels,
            head_labels=s.head_labels,
            bits=ns.bits,
            note=s.note,
        )
    else:
        page = html.render_sections(sections, title=title, bits=ns.bits)
    html.save(page, out)
    size = out.stat().st_size
    shapes = "; ".join(
        f"{s.name + ': ' if len(sections) > 1 else ''}{len(s.layer_labels)} layers x "
        f"{len(s.head_labels)} heads, {len(s.q_tokens)} x {len(s.k_tokens or s.q_tokens)} tokens"
        for s in sections
    )
    print(f"wrote {one_line(out)} ({shapes}; {size / 1e6:.1f} MB); open it in a browser")
    return 0


def _section(s, ns: argparse.Namespace):
    """A model's attention section as a page section, cut to --layers / --heads."""
    from attnkit.viz.html import Section

    n, h = s.weights.shape[:2]
    layers = index_list("--layers", ns.layers, n)
    heads = index_list("--heads", ns.heads, h)
    weights = s.weights[layers][:, heads]
    k_tokens = None if s.k_tokens == s.q_tokens else s.k_tokens
    return Section(s.title, weights, s.q_tokens, k_tokens, s.note, layers, heads)
