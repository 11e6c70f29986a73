"""``attnkit generate``: continue a prompt with a trained language-model checkpoint."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli.common import UsageError, add_device, on_device, one_line, option_names

NAME = "generate"
EXAMPLES = """\
  generate  continue a prompt with a trained language model (task lm)
              attnkit generate --ckpt runs/lm --prompt "humpty dumpty sat on"
"""

EPILOG = """\
examples:
  attnkit generate --ckpt runs/lm --prompt "humpty dumpty sat on"
  attnkit generate --ckpt runs/lm --prompt "humpty dumpty sat on" --max-new-tokens 30 \\
      --temperature 0.8 --top-k 5 --seed 1
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="continue a prompt with a trained language model",
        description="Continue PROMPT with a checkpoint of 'attnkit train --task lm': greedy by "
        "default, sampled with --temperature > 0 (among the --top-k most likely tokens). "
        "Prints the prompt followed by the continuation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ckpt", required=True, metavar="DIR", help="checkpoint or run directory")
    add_device(p)
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=20, help="tokens to add (20)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K likeliest")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler (0)")


def run(ns: argparse.Namespace) -> int:
    """Check --device, then run the verb there; 0 on success."""
    with on_device(ns.device):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    """Generate; 0 on success."""
    from attnkit.train import metrics, session

    loaded = session.load(ns.ckpt, best=True)  # a run directory: best/ when it exists
    if loaded.kind != "lm":
        raise UsageError(
            f"generate: {loaded.path} is an encoder-decoder (task "
            f'{loaded.train_config.task}); use attnkit translate --ckpt {ns.ckpt} "..."'
        )
    print(f"checkpoint {one_line(loaded.describe())}", file=sys.stderr)
    names = {
        "max_new_tokens": "--max-new-tokens",
        "temperature": "--temperature",
        "top_k": "--top-k",
        "prompt": "--prompt",
    }
    with option_names(names):
        text = metrics.continue_text(
            loaded.model,
            loaded.tokenizer,
            ns.prompt,
            ns.max_new_tokens,
            ns.temperature,
            ns.top_k,
            ns.seed,
        )
    print(one_line(f"{ns.prompt} {text}"))
    return 0
