"""``attnkit score``: BLEU, chrF and TER (sacrebleu) of a file of hypotheses against one or
more files of references, one segment per line, as the ``sacrebleu`` command scores them."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli.support.common import UsageError, utf8_text

NAME = "score"
EXAMPLES = """\
  score     BLEU, chrF and TER (sacrebleu, with signatures) of hypotheses against references
              attnkit score --hyp out.fr --ref ref1.fr --ref ref2.fr
"""

EPILOG = """\
examples:
  attnkit score --hyp out.fr --ref ref.fr
  attnkit score --hyp out.fr --ref ref1.fr --ref ref2.fr      (two references per line)
  attnkit translate --ckpt runs/fra --input test.en | attnkit score --hyp - --ref test.fr

Line i of every file is segment i; the numbers and signatures are those of the sacrebleu
command (sacrebleu REF... -i HYP -m bleu chrf ter) with its defaults. The last lines of the
output are metric=value (bleu, chrf, ter).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="BLEU, chrF and TER of hypotheses against references (sacrebleu)",
        description="Score detokenized hypotheses (one per line) against one or more reference "
        "files with sacrebleu's corpus BLEU (13a tokenizer), chrF and TER; prints each score "
        "with its sacrebleu signature.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hyp", required=True, metavar="FILE", help="hypotheses ('-' = stdin)")
    p.add_argument(
        "--ref", required=True, action="append", metavar="FILE", help="references (repeatable)"
    )


def _lines(option: str, path: str) -> list[str]:
    from attnkit.train.data.sources import DataError, read_lines

    if path == "-":
        lines = sys.stdin.read().splitlines()
        return [utf8_text(option, s, f": standard input line {n}") for n, s in enumerate(lines, 1)]
    try:
        return read_lines(path)
    except DataError as e:
        raise UsageError(f"{option}: {e}") from None


def run(ns: argparse.Namespace) -> int:
    """Score; 0 on success."""
    from attnkit.train.inference.scoring import corpus_scores

    if ns.ref.count("-") + (ns.hyp == "-") > 1:
        raise UsageError("--ref: at most one of --hyp and --ref may read stdin ('-')")
    hyps = _lines("--hyp", ns.hyp)
    refs = []
    for path in ns.ref:
        stream = _lines("--ref", path)
        if len(stream) != len(hyps):
            raise UsageError(
                f"--ref: {path} has {len(stream)} lines, expected one per hypothesis in "
                f"{ns.hyp} ({len(hyps)})"
            )
        refs.append(stream)
    scores = corpus_scores(hyps, refs)
    print(f"{len(hyps)} segments, {len(refs)} reference file(s)")
    for s in scores.all():
        print(s.line())
    for s in scores.all():
        print(f"{s.name.lower()}={s.score:.2f}")
    return 0
