"""``attnkit translate``: decode sentences with a trained encoder-decoder checkpoint (greedy
or beam search with the KV cache): from arguments, a file or stdin, in batches, to stdout or a
file, optionally as an n-best list."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from attnkit import checks
from attnkit.cli.support import options as o
from attnkit.cli.support.common import UsageError, one_line, utf8_text
from attnkit.files import check_writable

NAME = "translate"
EXAMPLES = """\
  translate decode with a trained encoder-decoder checkpoint (greedy or beam search)
              attnkit translate --ckpt runs/fra "How are you?" --beam 4 --length-penalty 0.6
"""

EPILOG = """\
examples:
  attnkit translate --ckpt runs/fra "I am tired."
  attnkit translate --ckpt runs/fra "How are you?" "Go away." --beam 4 --length-penalty 0.6
  attnkit translate --ckpt runs/fra --input test.en --output test.hyp.fr --batch-size 32
  echo "I am cold." | attnkit translate --ckpt runs/fra          (no SENTENCE, or -: stdin)
  attnkit translate --ckpt runs/fra --input test.en --beam 5 --n-best 3 --output nbest.tsv
  attnkit translate --ckpt runs/copy "3 1 4 1 5 9 2 6 5 3"
  attnkit translate --ckpt runs/fra "I am tired." --view fra.html   (cross-attention as HTML)

Output: one hypothesis per input line, in input order (an empty input line gives an empty
line). With --n-best K, K lines per input (fewer when the beam finished fewer hypotheses), as
tab-separated values: LINE (1-based input line) TAB RANK (1 = best) TAB SCORE (sum of token
log-probabilities / length ** --length-penalty) TAB HYPOTHESIS.
Given a run directory, the run's best checkpoint (best/) is used when it exists, else its last;
stderr says which. Input words outside the vocabulary are decoded as [UNK]; for byte-level BPE,
which reads any text, unknown means characters never seen in training: a warning counts them
(--strict makes that an error).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="decode sentences with a trained encoder-decoder checkpoint",
        description="Translate (or copy/reverse/sort) each SENTENCE, each line of --input FILE, "
        "or each line of standard input (no SENTENCE, or -) with a checkpoint of 'attnkit "
        "train'; one output line per input line, on stdout or in --output FILE.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences (- = stdin)")
    o.add(p, o.CKPT, o.DEVICE)
    p.add_argument("--input", metavar="FILE", help="one sentence per line (UTF-8)")
    p.add_argument("--output", metavar="FILE", help="write the outputs here (default: stdout)")
    o.add(p, *OPTIONS)
    p.add_argument(
        "--strict",
        action="store_true",
        help="unknown input is an error: words "
        "outside the vocabulary (word, char), characters never seen in training (bpe)",
    )
    p.add_argument(
        "--view",
        metavar="FILE.html",
        help="also write the decoder's cross-attention (generated tokens x source tokens, "
        "every layer and head) as one offline HTML file (one SENTENCE)",
    )


OPTIONS = (
    o.BATCH_SIZE,
    o.BEAM,
    o.Option("--n-best", "n_best", checks.positive_int,
             o.positive("K best (with --beam)", metavar="K")),
    o.LENGTH_PENALTY,
    o.MAX_LEN,
)  # fmt: skip
"""The options checked before the checkpoint is read (option -> library field and check)."""


def _check(ns: argparse.Namespace) -> None:
    """Every option checked before the checkpoint is read."""
    o.check(ns, *OPTIONS)
    if ns.n_best is not None and ns.n_best > ns.beam:
        raise UsageError(
            f"--n-best: expected at most --beam ({ns.beam}) hypotheses, got {ns.n_best}; use "
            f"--beam {ns.n_best} or more"
        )
    if ns.input is not None and ns.sentences:
        raise UsageError("--input: give either SENTENCE arguments or --input FILE, not both")
    if ns.sentences.count("-") and len(ns.sentences) > 1:
        raise UsageError("translate: '-' (standard input) must be the only SENTENCE")
    for s in ns.sentences:
        if not utf8_text("SENTENCE", s).strip():
            raise UsageError("translate: a SENTENCE is empty")
    if ns.view is not None:
        from attnkit.viz.weights import check_output_path

        if ns.n_best is not None:
            raise UsageError("--view: shows one translation; leave out --n-best")
        if len(ns.sentences) != 1 or ns.sentences == ["-"]:
            raise UsageError(f"--view: expected one SENTENCE, got {len(ns.sentences)}")
        check_output_path("--view", ns.view, (".html", ".htm"))
    if ns.output is not None:
        out = Path(ns.output)
        if out.is_dir() or not out.parent.is_dir():
            raise UsageError(f"--output: {ns.output} is a directory or in a missing directory")
        check_writable("--output", out.parent)


def _inputs(ns: argparse.Namespace) -> list[str]:
    from attnkit.train.data.sources import DataError, read_lines

    if ns.input is not None:
        try:
            return [s.strip() for s in read_lines(ns.input)]
        except DataError as e:
            raise UsageError(f"--input: {e}") from None
    if ns.sentences and ns.sentences != ["-"]:
        return ns.sentences
    if sys.stdin.isatty():
        print("reading sentences from standard input, one per line (Ctrl-D ends)", file=sys.stderr)
    lines = sys.stdin.read().splitlines()
    return [utf8_text("standard input", s, f" line {n}").strip() for n, s in enumerate(lines, 1)]


def _check_vocabulary(tok, lines: list[str], strict: bool, seen: str | None) -> None:
    from attnkit.train.data.tokenizer import unknown_words

    unknown = [w for s in lines for w in unknown_words(tok, s, seen)]
    if not unknown:
        return
    shown = ", ".join(repr(w) for w in list(dict.fromkeys(unknown))[:5])
    if type(tok.model).__name__ == "BPE":  # byte-level: reads any text, unseen characters too
        msg = (
            f"{len(unknown)} input piece(s) have characters never seen in training (first: {shown})"
        )
        after = "the model reads their bytes, which it was never trained on"
    else:
        msg = f"{len(unknown)} input word(s) are not in the model's vocabulary (first: {shown})"
        after = "they are decoded as [UNK]"
    if strict:
        raise UsageError(f"--strict: {msg}")
    print(one_line(f"warning: {msg}; {after}"), file=sys.stderr)


def run(ns: argparse.Namespace) -> int:
    """Check --device, then run the verb there; 0 on success."""
    with o.on_device(ns.device):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    """Decode; 0 on success."""
    from attnkit.terminal import printable  # only line breaks and control characters escaped
    from attnkit.train.inference import metrics, session

    _check(ns)
    lines = _inputs(ns)  # a missing --input is reported before the checkpoint is read
    with o.checkpoint_of("--ckpt"):
        loaded = session.load(ns.ckpt, best=True)
    if loaded.kind != "seq2seq":
        raise UsageError(
            f"translate: {loaded.path} is a language model (task lm); use "
            f'attnkit generate --ckpt {shlex.quote(ns.ckpt)} --prompt "..."'
        )
    print(f"checkpoint {one_line(loaded.describe())}", file=sys.stderr)
    _check_vocabulary(loaded.tokenizer, lines, ns.strict, loaded.characters())
    todo = [s for s in lines if s]
    with o.renamed(*OPTIONS):
        if ns.n_best is None:
            outs = iter(
                metrics.translate(
                    loaded.model,
                    loaded.tokenizer,
                    todo,
                    ns.beam,
                    ns.length_penalty,
                    ns.max_len,
                    ns.batch_size,
                )
            )
            text = [printable(next(outs)) if s else "" for s in lines]  # as produced
        else:
            best = iter(
                metrics.translate_nbest(
                    loaded.model,
                    loaded.tokenizer,
                    todo,
                    ns.beam,
                    ns.n_best,
                    ns.length_penalty,
                    ns.max_len,
                    ns.batch_size,
                )
            )
            text = [
                f"{n}\t{rank}\t{score:.4f}\t{printable(h)}"
                for n, s in enumerate(lines, start=1)
                if s
                for rank, (h, score) in enumerate(next(best), start=1)
            ]
    _emit(text, ns.output)
    if ns.view is not None:
        _write_view(loaded, lines[0], text[0], ns.view)
    return 0


def _emit(text: list[str], output: str | None) -> None:
    """The output lines on stdout, or written atomically to ``output``."""
    if output is None:
        for line in text:
            print(line)
        return
    from attnkit.viz.weights import write_atomic

    data = "".join(line + "\n" for line in text).encode("utf-8")
    write_atomic(Path(output), lambda f: f.write(data))
    print(f"wrote {len(text)} line(s) to {one_line(output)}", file=sys.stderr)


def _write_view(loaded, source: str, output: str, path: str) -> None:
    """The cross-attention of the model translating ``source`` into ``output`` (teacher-forced
    on the decoded tokens) as one HTML file; row t is the decoder step that produced output
    token t, and is labelled with it."""
    import torch

    from attnkit.train.data.tasks import seq2seq_example
    from attnkit.viz import html
    from attnkit.viz.weights import seq2seq_attentions

    src_ids, tgt_ids = seq2seq_example(loaded.tokenizer, source, output)
    tok = loaded.tokenizer

    def show(i: int) -> str:  # a token as text (byte-level BPE pieces decoded one by one)
        return tok.decode([i], skip_special_tokens=False).strip() or tok.id_to_token(i) or f"<{i}>"

    # tgt_ids = [BOS] + output + [EOS]: the decoder reads tgt_ids[:-1], step t produces tgt_ids[t+1]
    src_tokens, produced = [show(i) for i in src_ids], [show(i) for i in tgt_ids[1:]]
    att = seq2seq_attentions(loaded.model, torch.tensor([src_ids]), torch.tensor([tgt_ids[:-1]]))
    page = html.render(
        att.cross,
        produced,
        src_tokens,
        title=f"cross-attention: {source} -> {output}",
        note="row t: the decoder step that produced output token t (shown on the left); "
        "columns: the source tokens; layers: the decoder's layers",
    )
    html.save(page, path)
    print(f"wrote {one_line(path)} (cross-attention, {len(produced)} x {len(src_tokens)} tokens)")
