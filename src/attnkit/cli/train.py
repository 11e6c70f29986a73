"""``attnkit train``: train a Transformer on a task (copy, reverse, sort, lm, translate) and
write checkpoints; ``--resume`` continues a run bit-identically."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.cli.support.common import UsageError, option_names
from attnkit.cli.support.options import DEVICE, add, checkpoint_of, data_of, on_device
from attnkit.cli.support.train_scope import shown
from attnkit.files import check_writable

if TYPE_CHECKING:  # pragma: no cover
    from attnkit.train.checkpoint import Checkpoint
    from attnkit.train.config import TrainConfig


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

# option -> (TrainConfig field, help, argparse kwargs beyond those the field's type gives). The
# defaults and choices shown come from TrainConfig (its fields, their resolution per task and
# train.config.CHOICES), never written here.
OPTIONS: dict[str, tuple[str, str, dict]] = {
    "--data": ("data", "TSV (translate) or text (lm) file", dict(metavar="FILE")),
    "--seed": ("seed", "seed of data, split, weights, dropout", {}),
    "--vocab": ("vocab", "synthetic tasks: symbols", {}),
    "--length": ("length", "synthetic tasks: longest sequence", {}),
    "--min-length": ("min_length", "synthetic: shortest (default: --length // 2)", {}),
    "--train-size": ("train_size", "synthetic: training examples", {}),
    "--valid-size": ("valid_size", "synthetic: held-out examples", {}),
    "--valid-fraction": ("valid_fraction", "files: the fraction held out (an lm stream: its "
                         "tail; lm --lines: as the other tasks)", {}),
    "--block-size": ("block_size", "lm: tokens per example", {}),
    "--tokenizer": ("tokenizer", "tokenizer kind", {}),
    "--vocab-size": ("vocab_size", "bpe vocabulary size", {}),
    "--d-model": ("d_model", "model width", {}),
    "--nhead": ("nhead", "attention heads", {}),
    "--layers": ("layers", "layers per stack", {}),
    "--dim-feedforward": ("dim_feedforward", "feed-forward width", {}),
    "--dropout": ("dropout", "dropout", {}),
    "--batch-size": ("batch_size", "sequences per batch", {}),
    "--warmup": ("warmup", "warm-up steps of the schedule (cosine, constant: 0 = none)", {}),
    "--lr-factor": ("lr_factor", "factor of the schedule", {}),
    "--weight-decay": ("weight_decay", "AdamW weight decay on matrices only (Linear weights, "
                       "embeddings; not biases or LayerNorm weights, as nanoGPT)", {}),
    "--label-smoothing": ("label_smoothing", "label smoothing of the loss", {}),
    "--clip": ("clip", "gradient-norm clipping, 0 = off", {}),
    "--max-steps": ("max_steps", "stop at step N (a total, also on --resume)", {}),
    "--max-minutes": ("max_minutes", "stop after M minutes of this invocation (on --resume: "
                      "extra time)", {}),
    "--log-every": ("log_every", "steps between log lines", {}),
    "--eval-every": ("eval_every", "steps between evaluations", {}),
    "--save-every": ("save_every", "steps between checkpoints", {}),
    "--keep": ("keep", "checkpoints kept", {}),
    "--threads": ("threads", "torch threads (more help only on an idle machine)", {}),
    "--pack": ("pack", "pack several sequences into each row (lm, translate)", {}),
    "--max-len": ("max_len", "tokens per row: packed rows (default: twice the longest training "
                  "pair, rounded up to a multiple of 32; lm: --block-size), lm windows "
                  "(= --block-size)", {}),
    "--window": ("window", "lm: local attention to the W tokens before", dict(metavar="W")),
    "--checkpoint": ("checkpoint", "lm: recompute layers in the backward pass and compute the "
                     "loss in chunks (same losses, less memory, about one more forward)", {}),
    "--accumulate": ("accumulate", "micro-batches per optimiser step, per process",
                     dict(metavar="K")),
    "--dist-timeout": ("dist_timeout", "torchrun: seconds to wait for another process",
                       dict(metavar="S")),
    # issue 21: best/ and early stopping
    "--best-metric": ("best_metric", "what makes RUN/best: held-out loss (with --eval-batches "
                      "its estimate), BLEU, or exact: the loss over the whole held-out split, "
                      "scored when the estimate beats the best so far", {}),
    "--early-stop": ("early_stop", "stop after N evaluations without improvement of "
                     "--best-metric", {}),
    # the language-model recipe (issue 20)
    "--lines": ("lines", "lm: each line its own example, joined by [EOS] (default: the file is "
                "one token stream)", {}),
    "--lr": ("lr", "peak learning rate of cosine/constant", {}),
    "--schedule": ("schedule", "learning-rate schedule", {}),
    "--min-lr": ("min_lr", "cosine: final learning rate (default: --lr / 10)", {}),
    "--betas": ("betas", "AdamW betas", dict(type=_betas, metavar="B1,B2")),
    "--tie-embeddings": ("tie_embeddings", "output layer shares the embedding matrix",
                         dict(action=argparse.BooleanOptionalAction)),
    "--norm-first": ("norm_first", "pre-LayerNorm layers",
                     dict(action=argparse.BooleanOptionalAction)),
    "--bias": ("bias", "lm: biases in Linear and LayerNorm",
               dict(action=argparse.BooleanOptionalAction)),
    "--activation": ("activation", "feed-forward activation", {}),
    "--positions": ("positions", "lm: sinusoidal (x sqrt(d_model)) or learned (GPT-2, "
                    "--block-size rows)", {}),
    "--eval-batches": ("eval_batches", "lm: estimate the held-out loss from N random batches "
                       "of held-out windows (nanoGPT's estimate_loss) instead of scoring the "
                       "whole held-out split at each evaluation", {}),
    "--bf16": ("bf16", "bfloat16 autocast (CPUs with native bf16: AVX512-BF16, AMX or Arm bf16; "
               "GPUs with bf16: Ampere or newer)", {}),
    "--fp16": ("fp16", "float16 autocast with gradient scaling (CUDA; for GPUs without bf16)", {}),
    "--compile": ("compile", "torch.compile the model (the first step includes the compile "
                  "time, which is reported)", {}),
}  # fmt: skip
NAMES = {field: opt for opt, (field, _, _) in OPTIONS.items()} | {"task": "--task", "out": "--out"}
RULES = frozenset({"data", "min_length", "min_lr", "max_len", "max_steps", "max_minutes", "lines"})
"""Fields whose default is a rule the help states in words, or the verb's own (--max-steps)."""
SHOWN_UNDER = {"lr": dict(schedule="constant")}
"""The settings under which a field's default is shown (lr: under noam, the schedule sets it)."""

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
    from attnkit.train.config import CHOICES, TrainConfig  # torch-free: a fast --help

    p.add_argument("--task", choices=CHOICES["task"])
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
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for opt, (name, text, extra) in OPTIONS.items():
        kw = _from_type(str(fields[name].type)) | extra
        if name in CHOICES:
            kw["choices"] = CHOICES[name]
        shown = _default_help(name) if kw.get("action") != "store_true" else None
        kw["help"] = text if shown is None else f"{text} (default: {shown})"
        p.add_argument(opt, default=None, **kw)


@functools.cache
def _resolved(task: str, under: tuple[tuple[str, object], ...]) -> TrainConfig:
    """TrainConfig's defaults for ``task`` (with the settings ``under``), resolved."""
    from attnkit.train.config import TrainConfig

    return TrainConfig(task=task, data="FILE", **dict(under)).resolved()


def _from_type(annotation: str) -> dict:
    """argparse's type and metavar for a TrainConfig field annotated ``annotation``."""
    base = annotation.replace(" | None", "")
    if base == "int":
        return dict(type=int, metavar="N")
    if base == "float":
        return dict(type=float, metavar="X")
    if base == "bool":
        return dict(action="store_true")
    return {}


def _default_help(name: str) -> str | None:
    """The default of TrainConfig field ``name`` as ``resolved()`` sets it for each task, in
    words: ``3``, ``lm 128, others 64`` or ``copy 64, translate 128, lm 128``; None for the
    fields of :data:`RULES` and those no task sets."""
    if name in RULES:
        return None
    under = tuple(SHOWN_UNDER.get(name, {}).items())
    per = {task: getattr(_resolved(task, under), name) for task in ("copy", "translate", "lm")}
    if all(v is None for v in per.values()):
        return None
    if per["copy"] == per["translate"] == per["lm"]:
        return shown(per["lm"])
    if per["copy"] == per["translate"]:
        return f"lm {shown(per['lm'])}, others {shown(per['copy'])}"
    return ", ".join(f"{task} {shown(v)}" for task, v in per.items())


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
    from attnkit.cli.support.train_scope import refuse_changed, refuse_ignored
    from attnkit.train.checkpoint import resolve
    from attnkit.train.config import TrainConfig
    from attnkit.train.loop.trainer import TrainingInterrupted, train
    from attnkit.train.recipes import LM_STEPS

    given = {f: getattr(ns, o[2:].replace("-", "_")) for o, (f, _, _) in OPTIONS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if ns.task is not None:
        given["task"] = ns.task
    resumed = None
    with option_names(NAMES):
        if ns.resume is not None:
            with checkpoint_of("--resume"):  # found and verified once, for the verb and the run
                resumed = resolve(ns.resume)
            base = resumed.train_config
            out = Path(ns.out) if ns.out else resumed.run_dir
        else:
            base = TrainConfig()
            if "task" not in given:
                steps = given.setdefault("max_steps", DEFAULT_STEPS)
                copy = dataclasses.replace(base, **given).resolved()  # the values it will use
                print(
                    f"no --task given: training the built-in copy task (vocabulary {copy.vocab}, "
                    f"length {copy.length}, shortest {copy.min_length}, {copy.train_size} "
                    f"generated training sequences, {copy.valid_size} held out) for at most "
                    f"{steps} steps"
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
        refuse_ignored(given, config.resolved(), NAMES)
        if resumed is not None:
            refuse_changed(given, config.resolved(), resumed, NAMES)
            _check_steps_left(resumed, config.max_steps, given_steps="max_steps" in given)
        # before the data is read; the run directory is --out, or the resumed one
        check_writable("--resume" if ns.resume and not ns.out else "--out", out)
        mode = "off" if ns.no_progress else "bar" if sys.stderr.isatty() else "lines"
        try:
            with on_device(ns.device), data_of("--data", config.data is not None):
                train(config, out, resume=resumed, progress=mode, tensorboard=ns.tensorboard)
        except TrainingInterrupted as e:
            print(e, file=sys.stderr)
            return 130
    from attnkit.train.loop.distributed import is_main_process

    if not is_main_process():  # under torchrun only rank 0 writes and reports
        return 0
    _summary(out / "log.jsonl")
    ckpt = shlex.quote(str(out))  # commands to paste into a shell
    print(f"evaluate: attnkit evaluate --ckpt {ckpt}")
    if config.task == "lm":
        print(f"generate: attnkit generate --ckpt {ckpt} --prompt {_lm_prompt(out)}")
    else:
        print(f"decode:   attnkit translate --ckpt {ckpt} {_trained_example(out)}")
    return 0


def _check_steps_left(resumed: Checkpoint, max_steps: int | None, given_steps: bool) -> None:
    """Refuse to resume a run that has no step left before ``max_steps`` (a total): it would
    train nothing, evaluate again and write its last checkpoint over itself."""
    if max_steps is None or max_steps > resumed.step:
        return
    at = f"{resumed.path} is at step {resumed.step}"
    if given_steps:
        raise UsageError(
            f"--max-steps: expected more than {resumed.step} (a total: {at}), got {max_steps}"
        )
    raise UsageError(
        f"--resume: {at}, the run's --max-steps; give a larger --max-steps (a total) to continue it"
    )


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


def _trained_example(out: Path) -> str:
    """A source sentence the model of run ``out`` was trained on, quoted for a shell."""
    from attnkit.train.checkpoint import find_checkpoint

    sample = find_checkpoint(out, best=True) / "train_sample.jsonl"
    first_line = sample.read_text(encoding="utf-8").splitlines()[0]
    return shlex.quote(json.loads(first_line)[0])


def _lm_prompt(out: Path) -> str:
    """A prompt from the run's own training text, quoted for a shell: the start of its first
    line that has a word (e.g. "ROMEO:" for tiny Shakespeare), at most 4 words."""
    from attnkit.train.checkpoint import find_checkpoint
    from attnkit.train.inference.lm_generate import suggested_prompt

    sample = find_checkpoint(out, best=True) / "train_sample.jsonl"
    lines = sample.read_text(encoding="utf-8").splitlines() if sample.is_file() else []
    items = (json.loads(s) for s in lines[:SAMPLE_ITEMS])
    return shlex.quote(suggested_prompt(x if isinstance(x, str) else x[0] for x in items))
