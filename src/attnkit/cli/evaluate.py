"""``attnkit evaluate``: score a checkpoint on its held-out split (or a file): exact match for
the synthetic tasks, BLEU and chrF (sacrebleu) for translate, perplexity for lm."""

from __future__ import annotations

import argparse

from attnkit.cli.common import UsageError, one_line, option_names

NAME = "evaluate"
EXAMPLES = """\
  evaluate  score a checkpoint: exact match, BLEU/chrF (sacrebleu) or perplexity
              attnkit evaluate --ckpt runs/copy
              attnkit evaluate --ckpt runs/fra --split train --n 200 --beam 4
"""

EPILOG = """\
examples:
  attnkit evaluate --ckpt runs/copy                  exact match on the held-out split
  attnkit evaluate --ckpt runs/fra --beam 4          BLEU and chrF on the held-out split
  attnkit evaluate --ckpt runs/fra --split train     ... on 200 training pairs
  attnkit evaluate --ckpt runs/lm                    nats/token, bits/char (char tokenizer),
                                                     perplexity of the held-out stream
  attnkit evaluate --ckpt runs/lm --stride 32 --data other.txt
                                                     sliding windows over another file
  attnkit evaluate --ckpt runs/fra --data other.tsv --n 500

The last line of the output is metric=value (exact_match, bleu or perplexity).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="score a checkpoint (exact match, BLEU/chrF, perplexity)",
        description="Score a checkpoint on the held-out split saved with it (default), on the "
        "sample of training data saved with it (--split train), or on a data file (--data). "
        "BLEU and chrF come from sacrebleu on detokenized text (default 13a tokenizer); its "
        "signatures are printed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ckpt", required=True, metavar="DIR", help="checkpoint or run directory")
    p.add_argument("--data", metavar="FILE", help="evaluate on this file instead")
    p.add_argument("--split", choices=("heldout", "train"), default="heldout")
    p.add_argument("--n", type=int, default=None, help="first N examples only")
    p.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=0.0, help="beam length penalty")
    p.add_argument(
        "--stride",
        type=int,
        metavar="S",
        help="lm: sliding windows every S tokens (default: the block size, no overlap)",
    )


def _examples(loaded, ns):
    from attnkit.train.data import read_pairs, read_text_lines

    task = loaded.train_config.task
    if ns.data is not None:
        items = read_text_lines(ns.data) if task == "lm" else read_pairs(ns.data)
        source = ns.data
    else:
        name = "heldout.jsonl" if ns.split == "heldout" else "train_sample.jsonl"
        items = loaded.jsonl(name)
        source = f"the {ns.split} split of {loaded.path}"
    if task != "lm":
        items = [tuple(x) for x in items]
    if ns.n is not None:
        items = items[: ns.n]
    if not items:
        raise UsageError(f"evaluate: {source} has no examples")
    return items, source


def run(ns: argparse.Namespace) -> int:
    """Evaluate; 0 on success."""
    from attnkit.train import metrics, session

    if ns.n is not None and ns.n < 1:
        raise UsageError(f"--n: expected a positive int, got {ns.n}")
    if ns.beam < 1:  # checked before the checkpoint is loaded
        raise UsageError(f"--beam: expected a positive int, got {ns.beam}")
    with option_names({"beam_size": "--beam", "length_penalty": "--length-penalty"}):
        loaded = session.load(ns.ckpt)
        if loaded.kind == "lm":  # nats/token, bits/char, perplexity (attnkit.cli.evaluate_lm)
            from attnkit.cli import evaluate_lm

            return evaluate_lm.run(loaded, ns)
        items, source = _examples(loaded, ns)
        task = loaded.train_config.task
        print(
            f"checkpoint {loaded.path} (task {task}, step {loaded.step}); {len(items)} "
            f"examples from {source}"
        )
        if task == "lm":
            c = loaded.train_config
            ppl = metrics.perplexity(
                loaded.model, loaded.tokenizer, items, c.block_size, packed=c.pack is True
            )
            print(f"perplexity={ppl:.4f}")
            return 0
        hyps = metrics.translate(
            loaded.model, loaded.tokenizer, [s for s, _ in items], ns.beam, ns.length_penalty
        )
        refs = [t for _, t in items]
        how = "greedy" if ns.beam == 1 else f"beam {ns.beam}, length penalty {ns.length_penalty}"
        for (s, t), h in list(zip(items, hyps))[:3]:
            print(f"  {one_line(s)!s} -> {one_line(h)!s}   (reference: {one_line(t)!s})")
        if task == "translate":
            sc = metrics.bleu_chrf(hyps, refs)
            print(f"BLEU {sc.bleu:.2f}  ({sc.bleu_signature})")
            print(f"chrF {sc.chrf:.2f}  ({sc.chrf_signature})")
            print(f"decoding: {how}")
            print(f"chrf={sc.chrf:.2f}")
            print(f"bleu={sc.bleu:.2f}")
            return 0
        em = metrics.exact_match(hyps, refs)
        print(f"exact match ({how}): {round(em * len(refs))}/{len(refs)}")
        print(f"exact_match={em:.4f}")
    return 0
