"""``attnkit generate``: continue a prompt with a trained language-model checkpoint."""

from __future__ import annotations

import argparse
import shlex
import sys

from attnkit import checks
from attnkit.cli.support import options as o
from attnkit.cli.support.common import UsageError, one_line, utf8_text

NAME = "generate"
EXAMPLES = """\
  generate  continue a prompt with a trained language model (task lm)
              attnkit generate --ckpt runs/lm --prompt "ROMEO:"
"""

EPILOG = """\
examples:
  attnkit generate --ckpt runs/lm --prompt "ROMEO:"
      sampled as nanoGPT's sample.py: temperature 0.8 among the 200 likeliest tokens
  attnkit generate --ckpt runs/lm --prompt "ROMEO:" --max-new-tokens 30 --temperature 0
      greedy: the likeliest token each time
  attnkit generate --ckpt runs/lm --prompt "ROMEO:" --view gen.html
      also writes the self-attention on the prompt and the generated text as HTML
  attnkit generate --ckpt runs/shakespeare --prompt "ROMEO:" --max-new-tokens 300 \\
      --temperature 0.8 --top-p 0.95
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="continue a prompt with a trained language model",
        description="Continue PROMPT with a checkpoint of 'attnkit train --task lm': "
        "sampled as nanoGPT's sample.py samples by default (temperature 0.8 among the 200 "
        "likeliest tokens; --top-p: the nucleus), greedy with --temperature 0; [UNK] is never "
        "written. Prints the prompt, then the continuation as it is generated (detokenised: no "
        "space before punctuation; newlines kept). The context is cropped to the model's "
        "training window (--block-size).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    o.add(p, o.CKPT, o.DEVICE)
    p.add_argument("--prompt", required=True, help="text to continue")
    o.add(p, *OPTIONS)
    p.add_argument(
        "--view",
        metavar="FILE.html",
        help="also write the model's self-attention on the prompt and the generated text "
        "(every layer and head; the last --block-size tokens) as one offline HTML file",
    )


def _temperature(name: str, value: float) -> float:
    """A finite number >= 0 (0 = greedy)."""
    if checks.finite_float(name, value, "a number >= 0 (0 = greedy)") < 0:
        raise ValueError(f"{name}: expected a number >= 0 (0 = greedy), got {value}")
    return value


def _top_p(name: str, value: float) -> float:
    """A number in (0, 1]: the probability mass sampled from."""
    if not 0.0 < checks.finite_float(name, value, "a number in (0, 1]") <= 1.0:
        raise ValueError(f"{name}: expected a number in (0, 1], got {value}")
    return value


def _seed(name: str, value: int) -> int:
    """A seed of torch.Generator: an int in [0, 2**63 - 1]."""
    return checks.nonnegative_int(name, value, maximum=2**63 - 1)


OPTIONS = (
    o.Option("--max-new-tokens", "max_new_tokens", checks.positive_int,
             o.positive("tokens to add (20)", 20)),
    o.Option("--temperature", "temperature", _temperature, dict(type=o.float_arg, default=0.8,
             metavar="T", help="sampling temperature; 0 = greedy (0.8, as nanoGPT's sample.py)")),
    o.Option("--top-k", "top_k", checks.positive_int, o.positive(
        "sample among the K likeliest (200, as nanoGPT's sample.py)", 200, metavar="K")),
    o.Option("--top-p", "top_p", _top_p, dict(type=o.float_arg, metavar="P", help="sample among "
             "the likeliest tokens whose probabilities add up to P (nucleus sampling)")),
    o.Option("--seed", "seed", _seed, dict(type=o.int_arg, default=0, metavar="N",
             help="seed of the sampler (0)")),
)  # fmt: skip
"""The options checked before the checkpoint is read, even those greedy decoding (--temperature
0) does not use (option -> library field of ``generate_ids`` and check)."""


def run(ns: argparse.Namespace) -> int:
    """Check the options and --device, then run the verb there; 0 on success."""
    utf8_text("--prompt", ns.prompt)
    o.check(ns, *OPTIONS)
    if ns.view is not None:  # before any work, as translate --view
        from attnkit.viz.weights import check_output_path

        check_output_path("--view", ns.view, (".html", ".htm"))
    with o.on_device(ns.device):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    """Generate; 0 on success."""
    import torch

    from attnkit.train.data import tokenizer as tk
    from attnkit.train.inference import session
    from attnkit.train.inference.lm_generate import generate_ids

    with o.checkpoint_of("--ckpt"):  # a run directory: best/ when it exists
        loaded = session.load(ns.ckpt, best=True)
    if loaded.kind != "lm":
        raise UsageError(
            f"generate: {loaded.path} is an encoder-decoder (task "
            f"{loaded.train_config.task}); use attnkit translate --ckpt "
            f'{shlex.quote(ns.ckpt)} "..."'
        )
    print(f"checkpoint {one_line(loaded.describe())}", file=sys.stderr)
    tok = loaded.tokenizer
    with o.renamed(*OPTIONS, prompt="--prompt"):
        enc = tok.encode(ns.prompt, add_special_tokens=False)
        if not enc.ids:
            raise UsageError(f"--prompt: {one_line(ns.prompt)!r} has no tokens")
        unknown = tk.unknown_words(tok, ns.prompt)
        if unknown:
            print(
                "warning: --prompt: not in the model's vocabulary, read as an unknown token: "
                + ", ".join(repr(one_line(w)) for w in unknown),
                file=sys.stderr,
            )
        lm = loaded.model
        c = loaded.train_config.resolved()
        gen = torch.Generator().manual_seed(ns.seed)
        stop = tk.EOS if c.lines else None  # a stream model never saw [EOS]
        ids = generate_ids(
            lm,
            enc.ids,
            ns.max_new_tokens,
            c.block_size,
            temperature=ns.temperature,
            top_k=ns.top_k,
            top_p=ns.top_p,
            banned=lm.banned_ids() + tk.never_generated(tok) + ((tk.EOS,) if stop is None else ()),
            stop=stop,
            generator=gen,
        )
        head = tk.decode(tok, enc.ids)
        shown = ""
        out = sys.stdout
        out.write(_safe(ns.prompt))
        new: list[int] = []
        for i in ids:
            new.append(i)
            text = tk.decode(tok, enc.ids + new)[len(head) :]
            if text.startswith(shown) and not text.endswith("\ufffd"):
                out.write(_safe(text[len(shown) :]))
                out.flush()
                shown = text
        out.write(_safe(tk.decode(tok, enc.ids + new)[len(head) :][len(shown) :]) + "\n")
    if ns.view is not None:
        _write_view(loaded, enc.ids + new, c.block_size, ns.view)
    return 0


def _write_view(loaded, ids: list[int], block: int, path: str) -> None:
    """The model's self-attention on the last ``block`` tokens of ``ids`` (prompt and
    generated text) as one HTML file, as ``attnkit translate --view`` writes its page."""
    from attnkit.cli.support.own_attentions import lm_sections
    from attnkit.viz import html

    section, tokens = lm_sections(loaded, ids[-block:])
    cut = "" if len(ids) <= block else f" (its last {block} tokens, the training window)"
    page = html.render(
        section.weights,
        tokens,
        tokens,
        title=f"self-attention: {loaded.path}{cut}",
        note=section.note,
    )
    html.save(page, path)
    print(f"wrote {one_line(path)} (self-attention, {len(tokens)} tokens{cut})", file=sys.stderr)


def _safe(text: str) -> str:
    """Generated text for a terminal: newlines kept, other control characters escaped."""
    from attnkit.terminal import printable

    return "\n".join(printable(line) for line in text.split("\n"))
