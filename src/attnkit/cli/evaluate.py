"""``attnkit evaluate``: score a checkpoint on its held-out split (or a file): exact match for
the synthetic tasks, BLEU, chrF and TER (sacrebleu, all references of a source) for translate,
perplexity for lm."""

from __future__ import annotations

import argparse

from attnkit import checks
from attnkit.cli.support import options as o
from attnkit.cli.support.common import UsageError, one_line

NAME = "evaluate"
EXAMPLES = """\
  evaluate  score a checkpoint: exact match, BLEU/chrF/TER (sacrebleu) or perplexity
              attnkit evaluate --ckpt runs/copy
              attnkit evaluate --ckpt runs/fra --split train --n 200 --beam 4
"""

EPILOG = """\
examples:
  attnkit evaluate --ckpt runs/copy                  exact match on the held-out split
  attnkit evaluate --ckpt runs/fra --beam 4          BLEU, chrF, TER on the held-out split
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
        "BLEU, chrF and TER come from sacrebleu on detokenized text (default 13a tokenizer), "
        "each distinct source decoded once and scored against all its references; the "
        "signatures are printed (nrefs:var when the number of references varies). With --data, "
        "a warning says how many examples the run was trained on.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    o.add(p, o.CKPT, o.DEVICE)
    p.add_argument("--data", metavar="FILE", help="evaluate on this file instead")
    p.add_argument("--split", choices=("heldout", "train"), default="heldout")
    o.add(p, *OPTIONS)


OPTIONS = (
    o.Option("--n", "n", checks.positive_int, o.positive("first N examples only")),
    o.BEAM,
    o.LENGTH_PENALTY,
    o.Option("--stride", "stride", checks.positive_int, o.positive(
        "lm: sliding windows every S tokens (default: the block size, no overlap)", metavar="S")),
)  # fmt: skip
"""The options checked before the checkpoint is read (option -> library field and check)."""


def _examples(loaded, ns):
    from attnkit.train.data.sources import read_pairs, read_text_lines

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
    """Check --device, then run the verb there; 0 on success."""
    o.check(ns, *OPTIONS)  # before the checkpoint is read
    with o.on_device(ns.device):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    """Evaluate; 0 on success."""
    from attnkit.train.inference import metrics, session

    with o.renamed(*OPTIONS):
        with o.checkpoint_of("--ckpt"):
            loaded = session.load(ns.ckpt, best=True)
        if loaded.kind == "lm":  # nats/token, bits/char, perplexity (cli.support.evaluate_lm)
            from attnkit.cli.support import evaluate_lm

            with o.data_of("--data", ns.data is not None):
                return evaluate_lm.run(loaded, ns)
        with o.data_of("--data", ns.data is not None):
            items, source = _examples(loaded, ns)
        if ns.data is not None:
            _warn_overlap(loaded, items, ns.data)
        task = loaded.train_config.task
        print(f"checkpoint {loaded.describe()}, task {task}; {len(items)} examples from {source}")
        if task == "lm":
            c = loaded.train_config
            ppl = metrics.perplexity(
                loaded.model, loaded.tokenizer, items, c.block_size, packed=c.pack is True
            )
            print(f"perplexity={ppl:.4f}")
            return 0
        return _seq2seq(loaded, items, ns)


def _warn_overlap(loaded, items: list, name: str) -> None:
    """Warn (stderr) when ``items`` share examples with the run's training data."""
    import sys

    from attnkit.train.inference.overlap import training_overlap

    held, sample = loaded.jsonl("heldout.jsonl"), loaded.jsonl("train_sample.jsonl")
    warning = training_overlap(loaded.train_config, held, sample, items).warning(name)
    if warning:
        print(one_line(warning), file=sys.stderr)


def _seq2seq(loaded, items: list, ns: argparse.Namespace) -> int:
    """Exact match or BLEU/chrF/TER: each distinct source decoded once and scored against all
    its references (:mod:`attnkit.train.inference.scoring`)."""
    from attnkit.train.inference import metrics
    from attnkit.train.inference.scoring import corpus_scores, group_references

    groups = group_references(items)
    hyps = metrics.translate(
        loaded.model, loaded.tokenizer, list(groups.sources), ns.beam, ns.length_penalty
    )
    how = "greedy" if ns.beam == 1 else f"beam {ns.beam}, length penalty {ns.length_penalty}"
    print(f"{len(groups.sources)} distinct sources, each decoded once ({how})")
    for s, refs, h in list(zip(groups.sources, groups.references, hyps))[:3]:
        print(f"  {one_line(s)!s} -> {one_line(h)!s}   (reference: {one_line(refs[0])!s})")
    if loaded.train_config.task == "translate":
        scores = corpus_scores(hyps, groups.streams())
        for sc in scores.all():
            print(sc.line())
        for sc in (scores.chrf, scores.ter, scores.bleu):
            print(f"{sc.name.lower()}={sc.score:.2f}")
        return 0
    em = metrics.exact_match(hyps, list(groups.references))
    print(f"exact match ({how}): {round(em * len(hyps))}/{len(hyps)}")
    print(f"exact_match={em:.4f}")
    return 0
