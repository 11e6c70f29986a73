"""The ``attnkit`` command line (also ``python -m attnkit``).

Verbs: ``explain`` (seed 000's walkthrough, a seed's worked example, or what a real model
attends to) and ``bench`` (runs ``benchmarks/run.py`` from the source checkout).
Exit codes: 0 success, 2 bad usage or a missing file/package (message on stderr); ``bench``
returns the benchmark script's own exit code.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from attnkit import explain as ex

__all__ = ["main"]

PROG = "attnkit"

EPILOG = """\
verbs and examples:
  explain   seed 000's self-attention walkthrough, step by step with shapes
              attnkit explain
              attnkit explain "the cat sat on the mat" --word cat --d-model 16
              attnkit explain --json --full --d-model 8          (the same trace as JSON)
            a seed's worked example computed by the library, checked against the seed's numbers
              attnkit explain --example seed004
            what a real pretrained model attends to (needs: pip install "attnkit[model]")
              attnkit explain "The animal didn't cross the street because it was too tired" \\
                  --model default --word it
  bench     run benchmarks/run.py from the source checkout (arguments are passed through)
              attnkit bench --quick --only dense --json bench.json

run "attnkit explain --help" for every option.
"""

EXPLAIN_DESCRIPTION = """\
Without --example or --model: seed 000's walkthrough on SENTENCE (default "humpty dumpty sat
on"): seeded embeddings X and projections W^Q, W^K, W^V; Q, K, V; the score row of --word,
÷ sqrt(d_k), the softmax weights (they sum to 1), the weighted sum; then the matrix form for all
words and a check that its row equals the one-word computation, and a cross-check against
attnkit.functional.scaled_dot_product_attention in float64.

--json prints the same trace as one JSON object (schema "attnkit.explain/1", documented in the
attnkit.explain module): arrays are nested lists; unless --full, axes of width d_model, d_k or
d_v are cut to their first 8 entries ("shapes" gives the full shapes, "truncated" says whether
anything was cut).
"""

EXPLAIN_EPILOG = """\
examples:
  attnkit explain
  attnkit explain "the cat sat on the mat" --word cat --d-model 16 --seed 3
  attnkit explain --d-model 64 --d-k 8 --json --full
  attnkit explain --example seed004 [--seeds DIR]
  attnkit explain --example seed002
  attnkit explain "The animal didn't cross the street because it was too tired" \\
      --model default --word it [--top-k 3] [--json]
"""


def _int_in(name: str, low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            want = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"expected an integer {want}, got {value}")
        return value

    parse.__name__ = name
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (verbs as sub-commands)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="attnkit: attention, exact and fast.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from attnkit import __version__

    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="{explain,bench}")

    p = sub.add_parser(
        "explain",
        help="explain attention step by step (seed walkthroughs, seed examples, real models)",
        description=EXPLAIN_DESCRIPTION,
        epilog=EXPLAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sentence",
        nargs="*",
        metavar="SENTENCE",
        help=f'the words, split on whitespace (default: "{ex.DEFAULT_SENTENCE}")',
    )
    p.add_argument(
        "--word",
        help="the word whose attention is computed step by step (its first occurrence); "
        'default: the last word ("on", as in seed 000); required with --model',
    )
    p.add_argument(
        "--d-model",
        metavar="N",
        type=_int_in("d_model", 1, ex.MAX_D_MODEL),
        default=ex.DEFAULT_D_MODEL,
        help=f"embedding width (default {ex.DEFAULT_D_MODEL}, as in seed 000)",
    )
    p.add_argument(
        "--d-k",
        metavar="N",
        type=_int_in("d_k", 1, ex.MAX_D_MODEL),
        help="query/key width (default: d_model, seed 000's 512 × 512 projections)",
    )
    p.add_argument(
        "--d-v",
        metavar="N",
        type=_int_in("d_v", 1, ex.MAX_D_MODEL),
        help="value width (default: d_k)",
    )
    p.add_argument(
        "--seed",
        metavar="N",
        type=_int_in("seed", 0),
        default=ex.DEFAULT_SEED,
        help=f"seed of numpy.random.default_rng for X and the W's (default {ex.DEFAULT_SEED})",
    )
    p.add_argument(
        "--example",
        choices=sorted(ex.EXAMPLES),
        help="a seed's worked example instead of the walkthrough",
    )
    p.add_argument(
        "--seeds",
        type=Path,
        metavar="DIR",
        help="directory with the seed files (default: <repo>/../shared/seeds, else "
        "./../shared/seeds)",
    )
    p.add_argument(
        "--model",
        metavar="PATH|default",
        help="a pretrained BERT-style directory, or 'default' for all-MiniLM-L6-v2",
    )
    p.add_argument(
        "--top-k",
        metavar="N",
        type=_int_in("top_k", 1),
        default=3,
        help="with --model: how many most-attended tokens per head (default 3)",
    )
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

    sub.add_parser(
        "bench",
        help="run the benchmarks (benchmarks/run.py in the source checkout)",
        description="Runs benchmarks/run.py from the source checkout with this Python; every "
        "argument after 'bench' is passed through (e.g. --quick, --only PATTERN, --json FILE).",
        add_help=False,
    )
    return parser


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
class _UsageError(Exception):
    """A message for stderr and exit code 2."""


def _console():
    from rich.console import Console

    return Console(file=sys.stdout, highlight=False)


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, allow_nan=False, ensure_ascii=False) + "\n")


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def find_bench_script() -> Path | None:
    """``benchmarks/run.py`` of the source checkout (next to ``src/``), else of the working
    directory; None when neither exists (e.g. attnkit installed without a checkout)."""
    for root in (_repo_root(), Path.cwd()):
        script = root / "benchmarks" / "run.py"
        if script.is_file():
            return script
    return None


# ---------------------------------------------------------------------------------------------
# verbs
# ---------------------------------------------------------------------------------------------
def _bench(args: Sequence[str]) -> int:
    script = find_bench_script()
    if script is None:
        raise _UsageError(
            "bench: benchmarks/run.py not found; the benchmarks live in the source checkout "
            f"(looked in {_repo_root() / 'benchmarks'} and {Path.cwd() / 'benchmarks'}); run "
            "'attnkit bench' from a git checkout of attnkit"
        )
    sys.stdout.flush()
    return subprocess.call([sys.executable, str(script), *args])


def _explain(ns: argparse.Namespace) -> int:
    sentence = " ".join(ns.sentence).strip()
    if ns.model is not None:
        if ns.example is not None:
            raise _UsageError("explain: --model and --example cannot be combined")
        return _explain_model(ns, sentence)
    if ns.example is not None:
        given = [
            name
            for name, value in (
                ("SENTENCE", sentence),
                ("--word", ns.word),
                ("--d-k", ns.d_k),
                ("--d-v", ns.d_v),
            )
            if value
        ]
        if given:
            raise _UsageError(f"explain --example: {', '.join(given)} cannot be used with it")
        result = ex.seed_example(ns.example, ns.seeds)
        if ns.json:
            _print_json(ex.example_to_dict(result))
        else:
            ex.render_example(result, _console())
        return 0
    sentence = sentence or ex.DEFAULT_SENTENCE
    words = sentence.split()
    if len(words) > ex.MAX_WORDS:
        raise _UsageError(
            f"explain: SENTENCE: expected at most {ex.MAX_WORDS} words, got {len(words)}"
        )
    if ns.word is not None and ns.word not in words:
        raise _UsageError(
            f"explain: --word {ns.word!r} is not a word of the sentence; the words are: "
            f"{', '.join(words)}"
        )
    w = ex.walkthrough(sentence, ns.word, ns.d_model, ns.d_k, ns.d_v, ns.seed)
    if ns.json:
        _print_json(ex.walkthrough_to_dict(w, full=ns.full))
    else:
        ex.render_walkthrough(w, _console())
    return 0


def _explain_model(ns: argparse.Namespace, sentence: str) -> int:
    if not sentence:
        raise _UsageError("explain --model: give the SENTENCE to run through the model")
    if ns.word is None:
        raise _UsageError("explain --model: --word is required (the token whose attention to show)")
    try:
        from attnkit.models import default_model_path
        from attnkit.models.bert import BertModel
        from attnkit.viz.model_attention import model_attention_report, render_model_attention
    except ImportError as e:
        raise _UsageError(
            f"explain --model: the model support is not available in this installation ({e})"
        ) from e
    try:
        path = default_model_path() if ns.model == "default" else Path(ns.model).expanduser()
        model = BertModel.from_pretrained(path)
        report = model_attention_report(
            model, sentence, ns.word, top_k=ns.top_k, skip_special=ns.skip_special
        )
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise _UsageError(f"explain --model: {e}") from e
    if ns.json:
        _print_json(report.to_dict())
    else:
        render_model_attention(report, _console())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (``python -m attnkit`` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if argv and argv[0] == "bench":
            return _bench(argv[1:])
        ns = parser.parse_args(argv)
        if ns.verb is None:
            parser.print_help()
            return 2
        return _explain(ns)
    except SystemExit as e:  # argparse: --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except _UsageError as e:
        print(f"{PROG} {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
