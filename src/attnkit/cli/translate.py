"""``attnkit translate``: decode sentences with a trained encoder-decoder checkpoint (greedy
or beam search with the KV cache)."""

from __future__ import annotations

import argparse

from attnkit.cli.common import UsageError, one_line, option_names

NAME = "translate"
EXAMPLES = """\
  translate decode with a trained encoder-decoder checkpoint (greedy or beam search)
              attnkit translate --ckpt runs/fra "How are you?" --beam 4 --length-penalty 0.6
"""

EPILOG = """\
examples:
  attnkit translate --ckpt runs/fra "I am tired."
  attnkit translate --ckpt runs/fra "How are you?" "Go away." --beam 4 --length-penalty 0.6
  attnkit translate --ckpt runs/copy "3 1 4 1 5 9 2 6 5 3"
  attnkit translate --ckpt runs/fra "I am tired." --view fra.html   (cross-attention as HTML)
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="decode sentences with a trained encoder-decoder checkpoint",
        description="Translate (or copy/reverse/sort) each SENTENCE with a checkpoint of "
        "'attnkit train'; one output line per sentence.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sentences", nargs="+", metavar="SENTENCE")
    p.add_argument("--ckpt", required=True, metavar="DIR", help="checkpoint or run directory")
    p.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    p.add_argument(
        "--length-penalty",
        type=float,
        default=0.0,
        help="score = log p / length ** PENALTY (beam search)",
    )
    p.add_argument("--max-len", type=int, default=None, help="longest output in tokens")
    p.add_argument(
        "--view",
        metavar="FILE.html",
        help="also write the decoder's cross-attention (generated tokens x source tokens, "
        "every layer and head) as one offline HTML file (one SENTENCE)",
    )


def run(ns: argparse.Namespace) -> int:
    """Decode; 0 on success."""
    from attnkit.train import metrics, session

    if ns.beam < 1:
        raise UsageError(f"--beam: expected a positive int, got {ns.beam}")
    if ns.max_len is not None and ns.max_len < 1:
        raise UsageError(f"--max-len: expected a positive int, got {ns.max_len}")
    loaded = session.load(ns.ckpt)
    if loaded.kind != "seq2seq":
        raise UsageError(
            f"translate: {loaded.path} is a language model (task lm); use "
            f'attnkit generate --ckpt {ns.ckpt} --prompt "..."'
        )
    for s in ns.sentences:
        if not s.strip():
            raise UsageError("translate: a SENTENCE is empty")
    if ns.view is not None:
        from attnkit.viz.weights import check_output_path

        if len(ns.sentences) != 1:
            raise UsageError(f"--view: expected one SENTENCE, got {len(ns.sentences)}")
        check_output_path("--view", ns.view, (".html", ".htm"))
    with option_names({"length_penalty": "--length-penalty", "max_len": "--max-len"}):
        outs = metrics.translate(
            loaded.model, loaded.tokenizer, ns.sentences, ns.beam, ns.length_penalty, ns.max_len
        )
    for o in outs:
        print(one_line(o))
    if ns.view is not None:
        _write_view(loaded, ns.sentences[0], outs[0], ns.view)
    return 0


def _write_view(loaded, source: str, output: str, path: str) -> None:
    """The cross-attention of the model translating ``source`` into ``output`` (teacher-forced
    on the decoded tokens) as one HTML file; row t is the decoder step that produced output
    token t, and is labelled with it."""
    import torch

    from attnkit.train.tasks import seq2seq_example
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
