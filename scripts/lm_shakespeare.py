"""``make lm-shakespeare``: attnkit's best recipe for the character-level tiny Shakespeare
(``../shared/data/tinyshakespeare.txt``, first 90% trained on, last 10% held out), through the
command line: ``attnkit train``, ``attnkit evaluate`` (validation nats/char, bits/char, the
unigram baseline beside them) and a 300-character sample from ``attnkit generate``; writes the
loss curve to ``docs/lm_shakespeare_curve.png``.

    python scripts/lm_shakespeare.py [--runs DIR] [--steps N] [--no-bf16]

The recipe (see the README's "A character-level Shakespeare"): nanoGPT's CPU model (4 layers,
4 heads, d 128, pre-LN, GELU, no biases, tied embeddings, AdamW (0.9, 0.99), weight decay 0.1 on
matrices, clip 1.0, dropout 0, cosine to lr/10 after 100 warm-up steps) trained on windows of
256 characters, batch 4, peak lr 2e-3, bf16 autocast where the CPU has native bf16.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from accept import attnkit, curve  # the command runner and loss-curve plot of scripts/accept.py

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
PNG = ROOT / "docs" / "lm_shakespeare_curve.png"

RECIPE = ["--tokenizer", "char", "--block-size", "256", "--batch-size", "4", "--d-model", "128",
          "--nhead", "4", "--layers", "4", "--dim-feedforward", "512", "--dropout", "0",
          "--schedule", "cosine", "--lr", "2e-3", "--min-lr", "2e-4", "--warmup", "100",
          "--betas", "0.9,0.99", "--weight-decay", "0.1", "--clip", "1.0", "--no-bias",
          "--tie-embeddings", "--norm-first", "--activation", "gelu", "--seed", "1337"]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=None, help="run directory parent (a temp dir)")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--no-bf16", action="store_true", help="float32 even on a native-bf16 CPU")
    p.add_argument("--png", type=Path, default=PNG)
    ns = p.parse_args()
    if not DATA.is_file():
        print(f"lm_shakespeare: {DATA} not found (the shared data directory)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "src"))
    from attnkit.train.loop.precision import native_bf16

    bf16 = ["--bf16"] if native_bf16() and not ns.no_bf16 else []
    out = (ns.runs or Path(tempfile.mkdtemp(prefix="attnkit-shakespeare-"))) / "shakespeare"
    attnkit("train", "--task", "lm", "--data", DATA, "--out", out, *RECIPE, *bf16,
            "--max-steps", ns.steps, "--eval-every", max(ns.steps // 10, 1), "--log-every", 20,
            "--threads", 1, "--no-progress")  # fmt: skip
    attnkit("evaluate", "--ckpt", out)
    attnkit("generate", "--ckpt", out, "--prompt", "\n", "--max-new-tokens", 300,
            "--temperature", 0.8, "--top-p", 0.95, "--seed", 1)  # fmt: skip
    curve(out / "log.jsonl", ns.png, "attnkit, character-level tiny Shakespeare "
          "(make lm-shakespeare)", "training loss (batch mean)",
          (1.88, "nanoGPT CPU recipe, published (1.88)"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
