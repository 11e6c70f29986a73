"""``attnkit train``: train a Transformer on a task (copy, reverse, sort, lm, translate) and
write checkpoints; ``--resume`` continues a run bit-identically."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from attnkit.cli.support.common import UsageError, option_names
from attnkit.cli.support.options import DEVICE, add, on_device

SCHEDULES = ("noam", "cosine", "constant")  # attnkit.train.schedule.SCHEDULES (no torch import)


def _betas(text: str) -> tuple[float, float]:
    """``"0.9,0.99"`` -> (0.9, 0.99); argparse reports the ValueError as a usage error."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two numbers B1,B2, got {text!r}")
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers B1,B2, got {text!r}") from None


NAME = "train"
EXAMPLES = """\
  train     train a Transformer (copy/reverse/sort/lm/translate) with checkpoints and resume
              attnkit train                        (the built-in copy task, no files needed)
              attnkit train --task translate --data eng-fra.tsv \\
                  --out runs/fra --max-minutes 10
              attnkit train --resume runs/fra --max-minutes 20
"""

EPILOG = """\
examples:
  attnkit train
      the built-in default: the copy task (vocabulary 10, length 10), 600 steps at most
  attnkit train --task reverse --vocab 20 --length 12 --out runs/rev --max-steps 2000
  attnkit train --task translate --data eng-fra.tsv --out runs/fra \\
      --max-minutes 10
  attnkit train --task lm --data rhymes.txt --out runs/lm --max-minutes 5 --tokenizer word
  attnkit train --task lm --data tinyshakespeare.txt --tokenizer char \\
      --schedule cosine --lr 2e-3 --max-steps 2000 --betas 0.9,0.99 --weight-decay 0.1 \\
      --no-bias --dropout 0 --out runs/shakespeare
      the file is one token stream (newlines included), batches are random windows of
      --block-size + 1 tokens, the last 10% is held out; --lines: each line an example
  attnkit train --task translate --data eng-fra.tsv --pack --out runs/fra-pack
      packs several sentence pairs into each row (document masks); the row length is
      twice the longest training pair rounded up to a multiple of 32 unless --max-len is given
  attnkit train --task lm --data book.txt --max-len 16384 --window 256 --batch-size 1 \\
      --checkpoint --out runs/long     (local attention: each token sees the 256 tokens
      before it; --checkpoint recomputes layers in the backward pass to save memory)
  attnkit train --resume runs/fra --max-minutes 20      (continues in runs/fra)
  torchrun --nproc_per_node=2 -m attnkit train --task copy --out runs/ddp --max-steps 600
      two processes (DistributedDataParallel, gloo on CPU); each step sees 2 x --batch-size
      sequences; --accumulate K steps the optimiser every K micro-batches per process

--data for translate: a UTF-8 text file, one sentence pair per line, source TAB target (e.g.
eng-fra.tsv: "I'm cold.<TAB>J'ai froid."); for lm: plain UTF-8 text.

On a terminal a progress bar shows step/total, loss and the last held-out loss; elsewhere (a
pipe, nohup, CI) one plain line every --log-every steps and one per evaluation. Ctrl-C (or
SIGTERM) finishes the current step, writes a checkpoint and prints the command that resumes
it; a second Ctrl-C stops at once. --max-steps is a total; --max-minutes is the budget of this
invocation (on --resume: extra time).

The run directory (--out) receives log.jsonl (one JSON line per logging step and evaluation),
metrics.csv (the same numbers as columns; plot them with attnkit plot RUN), best/ (the
checkpoint of the best evaluation: lowest held-out loss, or BLEU with --best-metric bleu;
evaluate, translate and generate load it) and checkpoints step-NNNNNNNN/ (model.safetensors,
config.json, tokenizer.json, optimiser and RNG state, the held-out split); the last --keep are
kept. An existing non-empty --out is never
overwritten (except by --resume of a checkpoint inside it).
"""

# option -> (TrainConfig field, argparse kwargs)
OPTIONS: dict[str, tuple[str, dict]] = {
    "--data": ("data", dict(metavar="FILE", help="TSV (translate) or text (lm) file")),
    "--seed": ("seed", dict(type=int, help="seed of data, split, weights, dropout (0)")),
    "--vocab": ("vocab", dict(type=int, help="synthetic tasks: symbols (10)")),
    "--length": ("length", dict(type=int, help="synthetic tasks: longest sequence (10)")),
    "--min-length": ("min_length", dict(type=int, help="synthetic: shortest (--length // 2)")),
    "--train-size": ("train_size", dict(type=int, help="synthetic: training examples (20000)")),
    "--valid-size": ("valid_size", dict(type=int, help="synthetic: held-out examples (200)")),
    "--valid-fraction": (
        "valid_fraction",
        dict(type=float, help="files: held out (0.05; an lm stream: its last 0.1)"),
    ),
    "--block-size": ("block_size", dict(type=int, help="lm: tokens per example")),
    "--tokenizer": ("tokenizer", dict(choices=("word", "char", "bpe"), help="tokenizer kind")),
    "--vocab-size": ("vocab_size", dict(type=int, help="bpe vocabulary size (2000)")),
    "--d-model": ("d_model", dict(type=int, help="model width")),
    "--nhead": ("nhead", dict(type=int, help="attention heads")),
    "--layers": ("layers", dict(type=int, help="layers per stack")),
    "--dim-feedforward": ("dim_feedforward", dict(type=int, help="feed-forward width")),
    "--dropout": ("dropout", dict(type=float, help="dropout")),
    "--batch-size": ("batch_size", dict(type=int, help="sequences per batch")),
    "--warmup": ("warmup", dict(type=int, help="warm-up steps of the schedule")),
    "--lr-factor": ("lr_factor", dict(type=float, help="factor of the schedule")),
    "--weight-decay": (
        "weight_decay",
        dict(type=float, help="AdamW weight decay on matrices only (Linear weights, embeddings; "
             "not biases or LayerNorm weights, as nanoGPT)"),
    ),
    "--label-smoothing": ("label_smoothing", dict(type=float, help="(0.1; lm 0)")),
    "--clip": ("clip", dict(type=float, help="gradient-norm clipping, 0 = off (1.0)")),
    "--max-steps": ("max_steps", dict(type=int, help="stop at step N (a total, also on --resume)")),
    "--max-minutes": (
        "max_minutes",
        dict(type=float, help="stop after M minutes of this invocation (on --resume: extra time)"),
    ),
    "--log-every": ("log_every", dict(type=int, help="steps between log lines (10)")),
    "--eval-every": ("eval_every", dict(type=int, help="steps between evaluations (200)")),
    "--save-every": ("save_every", dict(type=int, help="steps between checkpoints (200)")),
    "--keep": ("keep", dict(type=int, help="checkpoints kept (3)")),
    "--threads": (
        "threads",
        dict(type=int, help="torch threads (1; more help only on an idle machine)"),
    ),
    "--pack": (
        "pack",
        dict(action="store_true", help="pack several sequences into each row (lm, translate)"),
    ),
    "--max-len": (
        "max_len",
        dict(
            type=int,
            help="tokens per row: packed rows (default: twice the longest training pair, "
            "rounded up to a multiple of 32; lm: --block-size), lm windows (= --block-size)",
        ),
    ),
    "--window": (
        "window",
        dict(type=int, metavar="W", help="lm: local attention to the W tokens before"),
    ),
    "--checkpoint": (
        "checkpoint",
        dict(
            action="store_true",
            help="lm: recompute layers in the backward pass and compute the loss in chunks "
            "(same losses, less memory, about one more forward)",
        ),
    ),
    "--accumulate": (
        "accumulate",
        dict(type=int, metavar="K", help="micro-batches per optimiser step, per process (1)"),
    ),
    "--dist-timeout": (
        "dist_timeout",
        dict(type=float, metavar="S", help="torchrun: seconds to wait for another process (300)"),
    ),
    # issue 21: best/ and early stopping
    "--best-metric": (
        "best_metric",
        dict(choices=("loss", "bleu", "exact"), help="what makes RUN/best: held-out loss "
             "(default; with --eval-batches its estimate), BLEU, or exact: the loss over the "
             "whole held-out split, scored when the estimate beats the best so far"),
    ),
    "--early-stop": (
        "early_stop",
        dict(type=int, help="stop after N evaluations without improvement of --best-metric"),
    ),
    # the language-model recipe (issue 20)
    "--lines": ("lines", dict(action="store_true", help="lm: each line its own "
                "example, joined by [EOS] (default: the file is one token stream)")),
    "--lr": ("lr", dict(type=float, help="peak learning rate of cosine/constant (lm 4e-3, "
             "others 1e-3)")),
    "--schedule": ("schedule", dict(choices=SCHEDULES, help="learning-rate schedule")),
    "--min-lr": ("min_lr", dict(type=float, help="cosine: final learning rate (--lr / 10)")),
    "--betas": ("betas", dict(type=_betas, metavar="B1,B2", help="AdamW betas")),
    "--tie-embeddings": ("tie_embeddings", dict(action=argparse.BooleanOptionalAction,
                         help="output layer shares the embedding matrix (default: tied)")),
    "--norm-first": ("norm_first", dict(action=argparse.BooleanOptionalAction,
                     help="pre-LayerNorm layers (default: on)")),
    "--bias": ("bias", dict(action=argparse.BooleanOptionalAction,
               help="lm: biases in Linear and LayerNorm")),
    "--activation": ("activation", dict(choices=("gelu", "relu"),
                     help="feed-forward activation (lm gelu, others relu)")),
    "--positions": ("positions", dict(choices=("sinusoidal", "learned"), help="lm: "
                    "sinusoidal (x sqrt(d_model)) or learned (GPT-2, --block-size rows)")),
    "--eval-batches": ("eval_batches", dict(type=int, help="lm: estimate the held-out loss "
                       "from N random batches of held-out windows (nanoGPT's estimate_loss) "
                       "instead of scoring the whole held-out split at each evaluation")),
    "--bf16": ("bf16", dict(action="store_true", help="bfloat16 autocast (CPUs with native "
               "bf16: AVX512-BF16, AMX or Arm bf16; GPUs with bf16: Ampere or newer)")),
    "--fp16": ("fp16", dict(action="store_true", help="float16 autocast with gradient scaling "
               "(CUDA; for GPUs without bf16)")),
    "--compile": ("compile", dict(action="store_true", help="torch.compile the model (the "
                  "first step includes the compile time, which is reported)")),
}  # fmt: skip
NAMES = {field: opt for opt, (field, _) in OPTIONS.items()} | {"task": "--task", "out": "--out"}

DEFAULT_STEPS = 600
SAMPLE_ITEMS = 50  # lines of train_sample.jsonl read for a prompt
DEFAULT_MINUTES = 10.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="train a Transformer on a task, with checkpoints and bit-exact resume",
        description="Train an encoder-decoder (copy, reverse, sort, translate) or a decoder-only "
        "language model (lm) with AdamW, the warm-up schedule of Vaswani et al., label smoothing "
        "and gradient clipping. Without --task: the copy task on built-in data.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", choices=("copy", "reverse", "sort", "lm", "translate"))
    p.add_argument("--out", metavar="DIR", help="run directory (default: runs/TASK[-N])")
    p.add_argument("--resume", metavar="DIR", help="checkpoint or run directory to continue")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (on a terminal) and no plain progress lines (elsewhere)",
    )
    add(p, DEVICE)
    p.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files to RUN/tensorboard (pip install "
        "'attnkit[tensorboard]')",
    )
    from attnkit.train.config import LM_RECIPE, SEQ2SEQ_RECIPE, TASK_DEFAULTS

    for opt, (field, kw) in OPTIONS.items():
        kw = dict(kw)
        if field in TASK_DEFAULTS["copy"]:  # defaults that depend on the task
            per = ", ".join(f"{t} {TASK_DEFAULTS[t][field]}" for t in ("copy", "translate", "lm"))
            kw["help"] = f"{kw['help']} (default: {per})"
        elif field in LM_RECIPE:  # issue 31: the lm recipe and seed 003's
            lm, other = _shown(LM_RECIPE[field]), _shown(SEQ2SEQ_RECIPE[field])
            kw["help"] = f"{kw['help']} (default: lm {lm}, others {other})"
        if kw.get("type") in (int, float):
            kw.setdefault("metavar", "N" if kw["type"] is int else "X")
        p.add_argument(opt, default=None, **kw)


def _fresh_out(task: str) -> Path:
    base = Path("runs") / task
    n = 1
    out = base
    while out.exists():
        n += 1
        out = base.with_name(f"{task}-{n}")
    return out


def run(ns: argparse.Namespace) -> int:
    """Train; 0 on success."""
    from attnkit.train.config import LM_STEPS, TrainConfig
    from attnkit.train.session import read_train_config
    from attnkit.train.trainer import TrainingInterrupted, train

    given = {f: getattr(ns, o[2:].replace("-", "_")) for o, (f, _) in OPTIONS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if ns.task is not None:
        given["task"] = ns.task
    with option_names(NAMES):
        if ns.resume is not None:
            base = read_train_config(ns.resume)
            out = Path(ns.out) if ns.out else _run_dir_of(ns.resume)
        else:
            base = TrainConfig()
            if "task" not in given:
                steps = given.setdefault("max_steps", DEFAULT_STEPS)
                print(
                    "no --task given: training the built-in copy task (vocabulary "
                    f"{given.get('vocab', 10)}, length {given.get('length', 10)}, shortest "
                    f"{given.get('min_length', max(1, given.get('length', 10) // 2))}, "
                    f"{given.get('train_size', 20000)} generated training sequences, "
                    f"{given.get('valid_size', 200)} held out) for at most {steps} steps"
                )
            elif given["task"] == "lm" and "max_steps" not in given:
                given["max_steps"] = LM_STEPS  # the cosine schedule decays over it
                print(f"no --max-steps: training for {LM_STEPS} steps (the length of the "
                      "learning-rate schedule; --max-minutes stops earlier)")  # fmt: skip
            elif "max_steps" not in given and "max_minutes" not in given:
                given["max_minutes"] = DEFAULT_MINUTES
                print(f"no --max-steps or --max-minutes: training for {DEFAULT_MINUTES:g} minutes")
            out = Path(ns.out) if ns.out else _fresh_out(given.get("task", "copy"))
        try:
            config = dataclasses.replace(base, **given)
        except TypeError as e:  # pragma: no cover - OPTIONS mirror the dataclass
            raise UsageError(str(e)) from None
        mode = "off" if ns.no_progress else "bar" if sys.stderr.isatty() else "lines"
        try:
            with on_device(ns.device):
                train(config, out, resume=ns.resume, progress=mode, tensorboard=ns.tensorboard)
        except TrainingInterrupted as e:
            print(e, file=sys.stderr)
            return 130
    from attnkit.train.distributed import is_main_process

    if not is_main_process():  # under torchrun only rank 0 writes and reports
        return 0
    _summary(out / "log.jsonl")
    print(f"evaluate: attnkit evaluate --ckpt {out}")
    if config.task == "lm":
        print(f"generate: attnkit generate --ckpt {out} --prompt {_lm_prompt(out)}")
    else:
        print(f"decode:   attnkit translate --ckpt {out} {_trained_example(out)}")
    return 0


def _summary(log: Path) -> None:
    """Print the last evaluation of the run (held-out loss and exact match / perplexity)."""
    rows = [json.loads(s) for s in log.read_text().splitlines() if '"val_loss"' in s]
    if rows:
        r = rows[-1]
        how = f" (estimate, {r['val_batches']} batches)" if "val_batches" in r else ""
        parts = [f"held-out loss{how} {r['val_loss']:.4f}"]
        if "val_exact" in r:
            parts.append(f"exact match (greedy) {r['val_exact']:.4f}")
        if "val_ppl" in r:
            parts.append(f"perplexity {r['val_ppl']:.2f}")
        print(f"step {r['step']}: " + ", ".join(parts))


def _run_dir_of(resume: str) -> Path:
    from attnkit.train.checkpoint import find_checkpoint

    return find_checkpoint(resume).parent


def _trained_example(out: Path) -> str:
    """A source sentence the model of run ``out`` was trained on, quoted for a shell."""
    import shlex

    from attnkit.train.checkpoint import find_checkpoint

    sample = find_checkpoint(out, best=True) / "train_sample.jsonl"
    first_line = sample.read_text(encoding="utf-8").splitlines()[0]
    return shlex.quote(json.loads(first_line)[0])


def _shown(value: object) -> str:
    """A default as the user types it: (0.9, 0.99) -> 0.9,0.99; True -> on."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _lm_prompt(out: Path) -> str:
    """A prompt from the run's own training text, quoted for a shell: the start of its first
    line that has a word (e.g. "ROMEO:" for tiny Shakespeare), at most 4 words."""
    import shlex

    from attnkit.train.checkpoint import find_checkpoint
    from attnkit.train.lm_generate import suggested_prompt

    sample = find_checkpoint(out, best=True) / "train_sample.jsonl"
    lines = sample.read_text(encoding="utf-8").splitlines() if sample.is_file() else []
    items = (json.loads(s) for s in lines[:SAMPLE_ITEMS])
    return shlex.quote(suggested_prompt(x if isinstance(x, str) else x[0] for x in items))
