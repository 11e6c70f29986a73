"""The configuration of a training run: one dataclass, saved as JSON with every checkpoint.

Fields left at None take the task's default (:mod:`attnkit.train.recipes`) in
:meth:`TrainConfig.resolved`.
*Identity* fields (the task, data, tokenizer, model and optimiser) must match when a run resumes;
*run* fields (:data:`RUN_FIELDS`: how long, how often to log, evaluate and save) may change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from attnkit.checks import (
    choice,
    finite_float,
    flag,
    nonnegative_int,
    positive_float,
    positive_int,
    probability,
)
from attnkit.train.recipes import LM_LR, LM_RECIPE, LM_STEPS, SEQ2SEQ_RECIPE, TASK_DEFAULTS

__all__ = ["CHOICES", "RUN_FIELDS", "TASKS", "TrainConfig", "recipe_summary"]

TASKS = ("copy", "reverse", "sort", "lm", "translate")
CHOICES: dict[str, tuple[str, ...]] = {
    "task": TASKS,
    "tokenizer": ("word", "char", "bpe"),
    "best_metric": ("loss", "bleu", "exact"),
    "schedule": ("noam", "cosine", "constant"),
    "activation": ("gelu", "relu"),
    "positions": ("sinusoidal", "learned"),
}
"""The values a field of text takes (checked by :meth:`TrainConfig.validate`; the CLI's choices)."""

RUN_FIELDS = frozenset(
    {"max_steps", "max_minutes", "log_every", "eval_every", "save_every", "keep", "threads"}
) | {"accumulate", "dist_timeout"}  # accumulate: the trainer checks processes x accumulate
RUN_FIELDS |= {"best_metric", "early_stop"}  # issue 21: best/ and early stopping
RUN_FIELDS |= {"eval_batches"}  # issue 31: nanoGPT's estimate of the held-out loss
RUN_FIELDS |= {"compile"}  # issue 30: how the same model runs, not what it is


@dataclass
class TrainConfig:
    """Everything that defines a training run (see the module docstring).

    Data: ``task``; ``data`` (file, needed by lm and translate); ``seed`` (data, split, weights,
    dropout); synthetic ``vocab`` symbols and lengths ``min_length..length`` (min_length None =
    length // 2), ``train_size`` examples; held-out ``valid_size`` examples (synthetic) or
    ``valid_fraction`` of the lines (files); ``block_size`` tokens per lm example.
    Tokeniser: ``tokenizer`` (word, char, bpe), ``vocab_size`` (bpe).
    Model: ``d_model``, ``nhead``, ``layers`` (per stack), ``dim_feedforward``, ``dropout``.
    Optimiser: AdamW (betas 0.9/0.98, eps 1e-9, ``weight_decay``); lr =
    ``lr_factor`` · d_model^-0.5 · min(step^-0.5, step · ``warmup``^-1.5);
    ``label_smoothing`` (default 0.1, lm 0.0); gradient norm clipped to ``clip`` (0 = off);
    ``batch_size`` sequences.
    Packing and long context: ``pack`` several sequences into each row of ``max_len`` tokens
    (document masks keep them apart, positions restart; default row: lm ``block_size``, the
    encoder-decoder tasks :func:`attnkit.train.data.packing.default_row_length` of the training
    pairs, twice the longest rounded up to a multiple of 32, chosen when the data is read);
    ``max_len`` for lm is also its training window (it replaces ``block_size``); ``window``: the
    lm attends locally, each token to itself and the ``window`` tokens before it;
    ``checkpoint`` (lm): recompute each layer's sub-blocks in the backward pass instead of
    keeping their activations, and compute the loss a chunk of positions at a time (same
    losses, less memory).
    Run: ``max_steps`` (a total: a resumed run stops at that step), ``max_minutes`` (this
    invocation's budget: on resume, extra time) (None = no limit; at least one must be set),
    logging, evaluation and checkpoint intervals in steps, ``keep`` last checkpoints, torch
    ``threads`` (None = torch's default).
    Several processes (torchrun, :mod:`attnkit.train.loop.distributed`): each optimiser step
    accumulates gradients over ``accumulate`` micro-batches of ``batch_size`` per process, so a
    step sees processes x accumulate x batch_size sequences; ``dist_timeout`` seconds bound
    every wait for another process.
    Best checkpoint: ``best_metric`` ("loss": lowest held-out loss, the estimate with
    ``eval_batches``; "exact": lowest loss over the whole held-out split, scored when the
    estimate is below the best whole-split loss so far; "bleu": highest held-out
    BLEU, encoder-decoder tasks) decides ``best/``; ``early_stop`` N stops after N evaluations
    in a row without improvement (None = never).
    Language models (issue 20): ``lines`` False (the default for lm, unless ``pack``) reads the
    file as one token stream (:mod:`attnkit.train.data.stream`: random windows, the contiguous tail
    held out, ``valid_fraction`` 0.1; lines mode 0.05); ``schedule`` noam, cosine or constant
    (:mod:`attnkit.train.loop.schedule`: ``lr`` peak, default 1e-3, ``min_lr`` floor, default lr/10;
    cosine decays over ``max_steps``); AdamW ``betas``; ``weight_decay`` on matrices only
    (:mod:`attnkit.train.loop.optim`); model ``tie_embeddings`` (default True), ``norm_first``,
    ``bias``, ``activation`` (lm gelu, seq2seq relu); ``bf16`` autocast (CPUs with native bf16).
    ``positions`` (lm, issue 21): "sinusoidal" or "learned" (GPT-2 / nanoGPT: a learned table of
    ``block_size`` rows, embeddings not scaled; :mod:`attnkit.models.lm_positions`).
    Recipe defaults (issue 31, :mod:`attnkit.train.recipes`): the lm task takes ``LM_RECIPE``
    (cosine, lr 4e-3, betas 0.9/0.99, weight decay 0.1, no biases, learned positions, windows
    of 128: exportable as GPT-2), every other task ``SEQ2SEQ_RECIPE`` (seed 003's).
    ``eval_batches`` N (lm stream): each evaluation is nanoGPT's estimate from N random batches
    of held-out windows instead of the whole held-out split (``attnkit evaluate`` always scores
    it all).
    """

    task: str = "copy"
    data: str | None = None
    seed: int = 0
    vocab: int = 10
    length: int = 10
    min_length: int | None = None
    train_size: int = 20000
    valid_size: int = 200
    valid_fraction: float | None = None
    block_size: int | None = None
    tokenizer: str | None = None
    vocab_size: int = 2000
    d_model: int | None = None
    nhead: int | None = None
    layers: int | None = None
    dim_feedforward: int | None = None
    dropout: float | None = None
    batch_size: int | None = None
    warmup: int | None = None
    lr_factor: float | None = None
    weight_decay: float | None = None
    label_smoothing: float | None = None
    clip: float = 1.0
    max_steps: int | None = None
    max_minutes: float | None = None
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 200
    keep: int = 3
    threads: int | None = 1
    pack: bool = False
    max_len: int | None = None
    window: int | None = None
    accumulate: int = 1
    dist_timeout: float = 300.0
    checkpoint: bool = False
    # issue 21: which evaluation is best (best/), early stopping
    best_metric: str = "loss"
    early_stop: int | None = None
    # language-model recipe (issue 20; see the class docstring's last paragraph)
    lines: bool | None = None
    lr: float | None = None
    schedule: str | None = None
    min_lr: float | None = None
    betas: tuple[float, float] | None = None
    tie_embeddings: bool | None = None
    norm_first: bool = True
    bias: bool | None = None
    activation: str | None = None
    bf16: bool = False
    positions: str | None = None  # issue 21: lm positions, sinusoidal or learned
    eval_batches: int | None = None  # issue 31: None = the whole held-out split
    compile: bool = False  # torch.compile of the model (issue 30)
    fp16: bool = False  # float16 autocast + gradient scaling, GPUs without bf16 (issue 30)

    def resolved(self) -> TrainConfig:
        """A validated copy with the task's defaults filled in."""
        c = dataclasses.replace(self)
        choice("task", c.task, CHOICES["task"])
        for k, v in TASK_DEFAULTS[c.task].items():
            if getattr(c, k) is None:
                setattr(c, k, v)
        for k, v in (LM_RECIPE if c.task == "lm" else SEQ2SEQ_RECIPE).items():
            if getattr(c, k) is None:  # issue 31: the lm recipe, or seed 003's
                setattr(c, k, v)
        if c.schedule == "cosine" and c.task == "lm" and c.max_steps is c.max_minutes is None:
            c.max_steps = LM_STEPS  # the cosine schedule's length
        if c.min_length is None:  # variable lengths: decoding shorter inputs stays in range
            c.min_length = max(1, c.length // 2)
        if c.max_len is not None and positive_int("max_len", c.max_len) and c.task == "lm":
            c.block_size = c.max_len  # one length for lm windows and packed rows
        if c.pack is True and c.max_len is None and c.task == "lm":
            c.max_len = c.block_size  # seq2seq: from the data (attnkit.train.data.tasks.prepare)
        _resolve_lm_recipe(c)
        if c.data is not None:  # one spelling per file, whatever the working directory
            c.data = str(Path(c.data).expanduser().resolve())
        c.validate()
        return c

    def validate(self) -> None:
        """Raise TypeError/ValueError naming the first bad field."""
        choice("tokenizer", self.tokenizer, CHOICES["tokenizer"])
        nonnegative_int("seed", self.seed)
        for name in ("vocab", "length", "min_length", "train_size", "valid_size"):
            positive_int(name, getattr(self, name))
        if self.min_length > self.length:
            raise ValueError(
                f"min_length: expected at most length={self.length}, got {self.min_length}"
            )
        for name in ("block_size", "vocab_size", "d_model", "nhead", "layers"):
            positive_int(name, getattr(self, name))
        for name in ("dim_feedforward", "batch_size", "log_every", "eval_every"):
            positive_int(name, getattr(self, name))
        # noam divides by its warm-up; cosine and constant may start at their peak (as nanoGPT)
        (positive_int if self.schedule == "noam" else nonnegative_int)("warmup", self.warmup)
        positive_int("save_every", self.save_every)
        positive_int("keep", self.keep)
        if self.d_model % self.nhead:
            raise ValueError(
                f"d_model: expected a multiple of nhead={self.nhead}, got {self.d_model}"
            )
        if not 0.0 < self.valid_fraction < 1.0:
            raise ValueError(
                f"valid_fraction: expected a number in (0, 1), got {self.valid_fraction}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a number in [0, 1), got {self.dropout}")
        probability("label_smoothing", self.label_smoothing)
        positive_float("lr_factor", self.lr_factor)
        for name in ("weight_decay", "clip"):  # 0 = off; a negative value is a typo
            x = getattr(self, name)
            if finite_float(name, x, "a non-negative number") < 0:
                raise ValueError(f"{name}: expected a non-negative number, got {x}")
        if self.max_steps is not None:
            positive_int("max_steps", self.max_steps)
        if self.max_minutes is not None:
            positive_float("max_minutes", self.max_minutes)
        if self.threads is not None:
            positive_int("threads", self.threads)
        flag("pack", self.pack)
        if self.max_len is not None:
            positive_int("max_len", self.max_len)
        if self.window is not None:
            nonnegative_int("window", self.window)
            if self.task != "lm":
                raise ValueError(
                    f"window: local attention is for the lm task (decoder-only), got task "
                    f"{self.task!r}"
                )
        positive_int("accumulate", self.accumulate)
        flag("checkpoint", self.checkpoint)
        if self.checkpoint and self.task != "lm":
            raise ValueError(
                f"checkpoint: activation checkpointing is for the lm task, got task {self.task!r}"
            )
        positive_float("dist_timeout", self.dist_timeout)
        choice("best_metric", self.best_metric, CHOICES["best_metric"])
        if self.best_metric == "bleu" and self.task == "lm":
            raise ValueError("best_metric: BLEU needs an encoder-decoder task, got task 'lm'")
        if self.early_stop is not None:
            positive_int("early_stop", self.early_stop)
        if self.eval_batches is not None:
            positive_int("eval_batches", self.eval_batches)
            if self.task != "lm" or self.lines:
                raise ValueError(
                    "eval_batches: the estimate from random held-out windows is for the lm "
                    f"task's stream (not --lines/--pack), got task {self.task!r}"
                )
        _validate_lm_recipe(self)
        if self.task in ("lm", "translate") and self.data is None:
            raise ValueError(f"data: the {self.task} task needs a data file (--data FILE)")

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> TrainConfig:
        """From :meth:`to_dict`'s output; ValueError naming ``source`` for unknown fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{source}: unknown training options {unknown}")
        if d.get("task") == "lm" and "lines" not in d:  # saved before stream training existed
            d = {**d, "lines": True}
        d = {**SEQ2SEQ_RECIPE, **d}  # saved before issue 31: the defaults of the time
        return cls(**d)

    def identity_differences(self, other: TrainConfig) -> list[str]:
        """``"name: a != b"`` for each identity field (not in RUN_FIELDS) that differs."""
        out = []
        for f in dataclasses.fields(self):
            if f.name in RUN_FIELDS:
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                out.append(f"{f.name}: {a!r} != {b!r}")
        return out


def recipe_summary(c: TrainConfig) -> str:
    """One line naming a resolved config's optimiser, schedule and model options (printed by
    ``attnkit train`` and ``attnkit evaluate``; the checkpoint's config.json holds them all)."""
    if c.schedule == "noam":
        lr = f"noam schedule (factor {c.lr_factor:g}, warm-up {c.warmup})"
    else:
        lr = f"{c.schedule} schedule, lr {c.lr:g}"
        lr += f" -> {c.min_lr:g}" if c.schedule == "cosine" else ""
        lr += f", warm-up {c.warmup}"
    parts = [
        lr,
        f"AdamW betas {c.betas[0]:g},{c.betas[1]:g}",
        f"weight decay {c.weight_decay:g} (matrices)",
        f"clip {c.clip:g}",
        f"dropout {c.dropout:g}",
        f"label smoothing {c.label_smoothing:g}",
        "pre-LN" if c.norm_first else "post-LN",
        c.activation,
        "biases" if c.bias else "no biases",
        "tied embeddings" if c.tie_embeddings else "untied embeddings",
        f"{c.positions} positions",
        "bf16 autocast" if c.bf16 else "fp16 autocast, scaled gradients" if c.fp16 else "float32",
    ]
    return "recipe: " + ", ".join(parts)


def _resolve_lm_recipe(c: TrainConfig) -> None:
    """Fill the language-model recipe's defaults in place (see :class:`TrainConfig`)."""
    if c.lines is None:
        c.lines = c.task != "lm" or c.pack is True  # packing keeps lines as documents
    if c.valid_fraction is None:
        c.valid_fraction = 0.05 if c.lines else 0.1
    if c.lr is None and c.schedule != "noam":
        c.lr = LM_LR if c.task == "lm" else 1e-3
    if c.min_lr is None and c.lr is not None:
        c.min_lr = c.lr / 10
    if c.label_smoothing is None:  # a language model is scored in nats: no smoothing
        c.label_smoothing = 0.0 if c.task == "lm" else 0.1
    if c.tie_embeddings is None:
        c.tie_embeddings = True
    if c.activation is None:
        c.activation = "gelu" if c.task == "lm" else "relu"
    c.betas = tuple(c.betas)


def _validate_lm_recipe(c: TrainConfig) -> None:
    for name in ("lines", "tie_embeddings", "norm_first", "bias", "bf16", "compile", "fp16"):
        flag(name, getattr(c, name))
    if c.bf16 and c.fp16:
        raise ValueError("fp16: choose --bf16 or --fp16, not both")
    choice("schedule", c.schedule, CHOICES["schedule"])
    choice("activation", c.activation, CHOICES["activation"])
    if c.schedule == "noam" and c.lr is not None:
        raise ValueError(
            f"lr: the noam schedule sets its own peak (--lr-factor); got lr={c.lr}; use "
            "--schedule cosine or constant with --lr"
        )
    if c.lr is not None:
        positive_float("lr", c.lr)
        finite_float("min_lr", c.min_lr)
        if not 0.0 <= c.min_lr <= c.lr:
            raise ValueError(f"min_lr: expected a number in [0, lr={c.lr}], got {c.min_lr}")
    if c.schedule == "cosine" and c.max_steps is None:
        raise ValueError("schedule: cosine decays over --max-steps; give --max-steps")
    if len(c.betas) != 2 or not all(0.0 <= finite_float("betas", b) < 1.0 for b in c.betas):
        raise ValueError(f"betas: expected two numbers in [0, 1), got {c.betas!r}")
    if not c.lines and c.task != "lm":
        raise ValueError(f"lines: stream training is for the lm task, got task {c.task!r}")
    choice("positions", c.positions, CHOICES["positions"])
    if c.positions != "sinusoidal" and c.task != "lm":
        raise ValueError(f"positions: learned positions are for the lm task, got task {c.task!r}")
    if not c.bias and c.task != "lm":
        raise ValueError(f"bias: --no-bias is for the lm task, got task {c.task!r}")
