"""``attnkit export``: a trained checkpoint as a HuggingFace transformers directory (loadable
with ``AutoModelForSeq2SeqLM`` or ``AutoModelForCausalLM``, and ``AutoTokenizer``), only when a
transformers class computes exactly the same function (:mod:`attnkit.integrations.hf_export`,
:mod:`attnkit.integrations.hf_export_lm`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.support import options as o
from attnkit.cli.support.common import UsageError, one_line
from attnkit.files import check_writable

NAME = "export"
EXAMPLES = """\
  export    a trained model as a transformers directory (Pegasus, GPT-2)
              attnkit export --ckpt runs/fra --to hf hf-fra
"""

EPILOG = """\
examples:
  attnkit export --ckpt runs/fra --to hf hf-fra
      then, in Python: AutoModelForSeq2SeqLM.from_pretrained("hf-fra"),
      AutoTokenizer.from_pretrained("hf-fra"), model.generate(**tokenizer(["I am cold."],
      return_tensors="pt"))
  attnkit train --task lm --data book.txt --positions learned --no-bias --out runs/book
  attnkit export --ckpt runs/book --to hf hf-book
      then: AutoModelForCausalLM.from_pretrained("hf-book") (a GPT2LMHeadModel)

Encoder-decoders are written as PegasusForConditionalGeneration (pre-LN layers, sinusoidal
positions, a bias on the logits: the only transformers class that computes what attnkit's
model computes; MarianMTModel and BART are post-LN). Language models: with learned positions
(--positions learned) as GPT2LMHeadModel, with sinusoidal positions as PegasusForCausalLM;
neither has a bias on its output layer, so the LM must be trained with --no-bias. The
tokenizer is written as tokenizer.json. A model that no transformers class represents
faithfully (post-LN layers for an LM, --window, an output bias) is refused with the feature
named. Given a run directory, its best checkpoint (best/) is exported when it exists. Needs
the optional extra: pip install 'attnkit[hf]'.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="write a checkpoint as a transformers directory (save_pretrained layout)",
        description="Write the checkpoint as a directory that HuggingFace transformers loads "
        "with its Auto classes: the model (safetensors) and its tokenizer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    o.add(p, o.CKPT)
    p.add_argument("--to", required=True, choices=("hf",), help="format: hf (transformers)")
    p.add_argument("out", metavar="OUT", help="new directory to write")


def run(ns: argparse.Namespace) -> int:
    """Export; 0 on success."""
    from attnkit.integrations.hf_export import available, export_seq2seq, quiet
    from attnkit.integrations.hf_export_lm import export_lm, lm_class

    if not available():
        raise UsageError("--to hf: needs HuggingFace transformers (pip install 'attnkit[hf]')")
    from attnkit.train.inference import session

    out = Path(ns.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"OUT: {ns.out} exists and is not an empty directory; choose a new one")
    if not out.absolute().parent.is_dir():  # as -o / --output of the other verbs
        raise UsageError(f"OUT: the directory '{out.absolute().parent}' does not exist")
    check_writable("OUT", out.absolute().parent)
    with o.checkpoint_of("--ckpt"):
        loaded = session.load(ns.ckpt, best=True)
    print(f"checkpoint {one_line(loaded.describe())}", file=sys.stderr)
    if loaded.kind == "lm":
        lm_class(loaded.model.config)  # refuses naming the feature, before transformers loads
        with quiet():
            out, cls = export_lm(loaded.model, loaded.tokenizer, ns.out)
        auto = "AutoModelForCausalLM"
    else:
        with quiet():
            out = export_seq2seq(loaded.model, loaded.tokenizer, ns.out)
        cls, auto = "PegasusForConditionalGeneration", "AutoModelForSeq2SeqLM"
    print(
        f"wrote {one_line(out)}: {cls} + tokenizer.json; load with "
        f'{auto}.from_pretrained("{one_line(out)}")'
    )
    if loaded.kind == "lm":
        n = loaded.model.config.max_len
        rows = (  # GPT-2's learned table is the training window; Pegasus's sinusoids are not
            "its training window, --block-size"
            if cls == "GPT2LMHeadModel"
            else "the rows of its sinusoidal position table"
        )
        print(
            f"the model holds {n} positions ({rows}): "
            f"generation_config.json stops generate() at max_length={n} tokens, prompt "
            f"included; keep prompt + max_new_tokens <= {n} (transformers lets max_new_tokens "
            "override max_length and fails past the last position)"
        )
    return 0
