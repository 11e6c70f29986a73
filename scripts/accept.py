"""Acceptance runs of the training issue, through the command line (``python -m attnkit``).

    python scripts/accept.py copy        copy task (vocabulary 10, length 10): exact match of
                                         greedy decoding on 200 held-out sequences, < 3 minutes
    python scripts/accept.py translate   eng-fra-5k (95/5 split), 10 minutes: BLEU and chrF on
                                         the held-out split and on 200 training pairs, with the
                                         sacrebleu signatures; docs/translate_learning_curve.png
    python scripts/accept.py lm          character-level tiny Shakespeare (../shared/data),
                                         1,000 steps: validation nats/char and bits/char beside
                                         the unigram baseline, and a sampled continuation
    python scripts/accept.py all

Options: --runs DIR (default: a new temporary directory), --threads N (torch threads, 1),
--minutes M (override the task's time budget), --data FILE (translate: eng-fra-5k.tsv).
Prints each command, its output, wall times and the CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENG_FRA = ROOT.parent / "shared" / "data" / "eng-fra-5k.tsv"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def attnkit(*args: object) -> tuple[str, float]:
    """Run ``python -m attnkit ARGS``; (stdout, seconds). Exits when it fails."""
    cmd = [sys.executable, "-m", "attnkit", *map(str, args)]
    print("$ attnkit " + " ".join(map(str, args)), flush=True)
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - t
    print(proc.stdout.rstrip())
    if proc.returncode:
        print(proc.stderr.rstrip())
        sys.exit(f"failed with exit code {proc.returncode}")
    print(f"  ({seconds:.1f} s)\n", flush=True)
    return proc.stdout, seconds


def last_value(out: str) -> float:
    return float(out.strip().splitlines()[-1].split("=")[1])


def first_step(log: Path, key: str, value: float) -> dict | None:
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if row.get(key, -1) >= value:
            return row
    return None


def copy(runs: Path, ns) -> None:
    out = runs / "copy"
    minutes = ns.minutes or 2
    _, t_train = attnkit(
        "train",
        "--task",
        "copy",
        "--vocab",
        10,
        "--length",
        10,
        "--out",
        out,
        "--max-minutes",
        minutes,
        "--eval-every",
        50,
        "--threads",
        ns.threads,
        "--no-progress",
    )
    res, t_eval = attnkit("evaluate", "--ckpt", out, "--n", 200)
    hit = first_step(out / "log.jsonl", "val_exact", 1.0)
    when = "never" if hit is None else f"step {hit['step']}"
    print(
        f"copy: exact match {last_value(res):.4f} on 200 held-out sequences; train + evaluate "
        f"{t_train + t_eval:.0f} s wall (budget 180 s); first 100% held-out evaluation: {when}\n"
    )


def curve(
    log: Path,
    png: Path,
    title: str = "attnkit train --task translate, eng-fra-5k (95/5 split)",
    train_label: str = "training loss (label smoothing 0.1)",
    reference: tuple[float, str] | None = None,
) -> None:
    """Training and held-out loss against the step as a PNG; ``reference``: (loss, label) of a
    horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(s) for s in log.read_text().splitlines()]
    tr = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    va = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(*zip(*tr), lw=0.8, label=train_label)
    ax.plot(*zip(*va), "o-", label="held-out loss (NLL per token)")
    if reference is not None:
        ax.axhline(reference[0], color="grey", ls="--", lw=0.8, label=reference[1])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(png.name + ".tmp.png")
    fig.savefig(tmp)
    tmp.replace(png)  # atomic
    print(f"learning curve: {png}\n")


def translate(runs: Path, ns) -> None:
    data = Path(ns.data or ENG_FRA)
    if not data.is_file():
        print(f"translate: skipped, {data} is absent")
        return
    out = runs / "fra"
    minutes = ns.minutes or 10
    attnkit(
        "train",
        "--task",
        "translate",
        "--data",
        data,
        "--out",
        out,
        "--max-minutes",
        minutes,
        "--eval-every",
        100,
        "--threads",
        ns.threads,
        "--no-progress",
    )
    for split in ("heldout", "train"):
        for beam in (1, 4):
            extra = [] if beam == 1 else ["--beam", 4, "--length-penalty", 0.6]
            attnkit("evaluate", "--ckpt", out, "--split", split, *extra)
    attnkit(
        "translate",
        "--ckpt",
        out,
        "I am tired.",
        "How are you?",
        "We lost.",
        "--beam",
        4,
        "--length-penalty",
        0.6,
    )
    curve(out / "log.jsonl", ROOT / "docs" / "translate_learning_curve.png")


def lm(runs: Path, ns) -> None:
    out = runs / "lm"
    attnkit("train", "--task", "lm", "--data", SHAKESPEARE, "--tokenizer", "char",
            "--block-size", 256, "--batch-size", 4, "--schedule", "cosine", "--lr", 2e-3,
            "--warmup", 100, "--max-steps", 1000, "--betas", "0.9,0.99", "--weight-decay", 0.1,
            "--no-bias", "--dropout", 0, "--eval-every", 250, "--out", out,
            "--threads", ns.threads, "--no-progress")  # fmt: skip
    attnkit("evaluate", "--ckpt", out)  # prints the unigram baseline beside the model
    attnkit("generate", "--ckpt", out, "--prompt", "ROMEO:", "--max-new-tokens", 200,
            "--temperature", 0.8, "--top-p", 0.95, "--seed", 1)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("task", choices=("copy", "translate", "lm", "all"))
    p.add_argument("--runs", type=Path, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--data", default=None)
    ns = p.parse_args()
    import torch

    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch threads {ns.threads}, "
        f"torch {torch.__version__}\n"
    )
    runs = ns.runs or Path(tempfile.mkdtemp(prefix="attnkit-accept-"))
    for name in ("copy", "translate", "lm") if ns.task == "all" else (ns.task,):
        globals()[name](runs, ns)


if __name__ == "__main__":
    main()
