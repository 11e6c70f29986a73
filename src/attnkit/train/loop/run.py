"""One training run on one process, as an object (torchtune's recipe classes are the model):
what the run holds between steps is its fields; :meth:`Run.setup` loads and checks everything,
:meth:`Run.start` joins the other processes and restores the generators, :meth:`Run.step` is
one optimiser step, :meth:`Run.evaluate` one evaluation (and ``best/``), :meth:`Run.save` one
checkpoint, and :meth:`Run.loop` the loop that calls them. :func:`attnkit.train.loop.trainer.train`
builds one and runs it.

The order of the work is the order that makes resuming bit-identical (see
:mod:`attnkit.train.loop.trainer`): the model is built from ``torch.manual_seed(seed)``, the
optimiser and data order come from the checkpoint, and the generators are restored last, so that
nothing draws between their restoring and the first step.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from attnkit.devices import current
from attnkit.train.best import Best
from attnkit.train.checkpoint import (
    BEST_RECORD,
    Checkpoint,
    CheckpointError,
    write_best,
    write_checkpoint,
)
from attnkit.train.config import TrainConfig, recipe_summary
from attnkit.train.data.batches import epoch_batches
from attnkit.train.data.sources import DataError
from attnkit.train.data.stream import EPOCH_BATCHES, stream_batches
from attnkit.train.data.tasks import TaskData, build_model, model_config, prepare
from attnkit.train.inference.session import Loaded, load
from attnkit.train.loop import save_resume
from attnkit.train.loop.distributed import Dist, DistributedError, rank_seed, shard
from attnkit.train.loop.interrupt import Interrupt
from attnkit.train.loop.optim import build_optimizer, schedule_of
from attnkit.train.loop.precision import grad_scaler, require_bf16, require_fp16
from attnkit.train.loop.progress import Progress, Reporter
from attnkit.train.loop.state import gpu_rng, load_optimizer_state, optimizer_state, rng_state
from attnkit.train.loop.steps import (
    evaluate,
    heldout_examples,
    mean_loss,
    optimizer_step,
    training_module,
)

__all__ = ["Position", "Run", "epoch_plan"]


@dataclass(frozen=True)
class Position:
    """Where a run is: ``step`` (optimiser steps done), ``epoch``, ``index`` (micro-batches of
    the epoch used, over all ranks: the next step's start in the epoch's plan) and ``tokens``
    (target tokens trained on). A checkpoint stores it (``step``, ``position``, ``tokens``)."""

    step: int = 0
    epoch: int = 0
    index: int = 0
    tokens: int = 0


def epoch_plan(c: TrainConfig, d: Dist, data: TaskData, lengths: np.ndarray, epoch: int) -> list:
    """This rank's micro-batches of ``epoch``, ``c.accumulate`` per step (a pure function)."""
    if data.stream is not None:  # random windows of the stream (attnkit.train.data.stream)
        per_step = d.world_size * c.accumulate
        batches = stream_batches(
            len(data.stream), c.batch_size, c.seed, epoch, EPOCH_BATCHES * per_step
        )
    else:
        batches = epoch_batches(lengths, c.batch_size, c.seed, epoch, data.pack)
    plan = shard(batches, d.world_size, d.rank, c.accumulate)
    if not plan:
        raise ValueError(
            f"accumulate: epoch {epoch} has {len(batches)} batches, fewer than one step needs "
            f"({d.world_size} process(es) x --accumulate {c.accumulate}); use fewer processes, "
            "a smaller --accumulate or --batch-size, or more data"
        )
    return plan


class Run:
    """One run of config ``c`` (resolved) into ``out`` on this rank of ``d``; ``progress``
    ("bar", "lines", "off"), ``echo`` (rank 0's lines), ``tensorboard``.

    Fields, set by :meth:`setup` and :meth:`start` and advanced by :meth:`step`: the position
    ``at`` (a :class:`Position`; ``plan``: this rank's micro-batches of its epoch), the
    ``model`` (its training form, possibly wrapped and compiled, is ``module``), ``opt``,
    ``scaler``, ``best``, the evaluation's held-out examples ``held``, the generators' states
    gathered at the last save (``rng_states``, ``gpu_states``), the ``report`` (rank 0) and why
    the run stops early (``stop_reason``)."""

    def __init__(
        self,
        c: TrainConfig,
        out: Path,
        d: Dist,
        *,
        progress: str,
        echo: Callable[[str], None],
        tensorboard: bool,
    ) -> None:
        self.c, self.out, self.d = c, out, d
        self.progress, self.echo, self.tensorboard = progress, echo, tensorboard
        self.loaded: Loaded | None = None
        self.at = Position()
        self.tensors: dict = {}
        self.state: dict = {}
        self.rng_states: list = []
        self.gpu_states: list = []
        self.report: Reporter | None = None
        self.stop_reason: str | None = None
        self.saved: Path | None = None
        self.interrupt: Interrupt | None = None

    # -- setup: everything loaded and checked, no collective ----------------------------------

    def setup(self, resume: str | Path | Checkpoint | None) -> None:
        """Load and check everything (no collective): the checkpoint to resume, the output
        directory (rank 0), the data, the model and the optimiser."""
        c, d = self.c, self.d
        if resume is not None:
            self.loaded = load(resume)
            diffs = self.loaded.train_config.resolved().identity_differences(c)
            if diffs:
                raise CheckpointError(
                    f"{self.loaded.path / 'config.json'}: the checkpoint comes from another "
                    f"configuration (checkpoint != requested: {'; '.join(diffs)})"
                )
        loaded = self.loaded
        if d.is_main:
            save_resume.check_out(self.out, None if loaded is None else loaded.path)
        if c.bf16:
            require_bf16(current())
        if c.fp16:
            require_fp16(current())
        if c.threads is not None:
            torch.set_num_threads(c.threads)
        self.data = data = prepare(c, None if loaded is None else loaded.tokenizer)
        self.digest = (
            None if c.data is None else hashlib.sha256(Path(c.data).read_bytes()).hexdigest()
        )
        if data.stream is not None:
            longest, self.lengths = c.block_size + 1, np.zeros(0, dtype=np.int64)
        else:
            longest = max(len(x) for e in data.examples for x in e)
            self.lengths = np.array([sum(len(x) for x in e) for e in data.examples])
        if loaded is None:
            vocab = data.tokenizer.get_vocab_size()
            self.mcfg = model_config(c, data.kind, vocab, max(256, longest + 2))
            torch.manual_seed(c.seed)
            self.model = build_model(data.kind, self.mcfg)
        else:
            self.mcfg, self.model = loaded.model_config, loaded.model
        self.model.train()
        self.opt = build_optimizer(self.model, c)
        if loaded is not None:
            self._resume_position(loaded)
        self.plan = epoch_plan(c, d, data, self.lengths, self.at.epoch)

    def _resume_position(self, loaded: Loaded) -> None:
        """The optimiser state, the position and the checks of a resumed run."""
        self.tensors, self.state = save_resume.resume_state(loaded)
        st = self.state
        try:
            load_optimizer_state(self.opt, self.tensors, st["optimizer"])
            step, (epoch, index), tokens = st["step"], st["position"], st["tokens"]
            self.at = Position(step, epoch, index, tokens)
            stored_digest, saved_world = st["data_sha256"], int(st.get("world_size", 1))
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(
                f"{loaded.path / 'state.json'}: unusable training state ({e})"
            ) from None
        if stored_digest != self.digest:
            raise DataError(
                f"{self.c.data}: the file differs from the one {loaded.path} was trained on "
                "(SHA-256 differs); resume with the same data"
            )
        save_resume.check_world(loaded, saved_world, self.d.world_size, self.c.accumulate)

    # -- start: every rank set up, the generators restored, reporting opened ------------------

    def start(self) -> None:
        """Join the other ranks (DistributedError when one failed to start), wrap the model,
        restore or seed the generators (last: nothing draws between them and the first step),
        and open the report (rank 0)."""
        c, d = self.c, self.d
        with d.guard("starting"):
            if not d.all_ok(True):
                raise DistributedError(
                    f"rank {d.rank}: another process of the run failed to start (its own "
                    "message says why)"
                )
            module = d.wrap(training_module(self.model, self.data.kind, c))
            self.module = torch.compile(module) if c.compile else module  # compiled at step 1
        if self.loaded is None and d.enabled:
            torch.manual_seed(rank_seed(c.seed, d.rank))  # each rank its own dropout
        elif self.loaded is not None:
            note = save_resume.restore_rng(
                self.tensors, self.state, seed=c.seed, rank=d.rank, world_size=d.world_size
            )
            if note:
                self.echo(note)
        self.per_step = d.world_size * c.accumulate
        self.lr_at = schedule_of(c)
        self.held = heldout_examples(self.data, c) if d.is_main else []
        self.best = Best.from_dict(self.state.get("best"), c.best_metric)
        self.scaler = grad_scaler(current(), c.fp16)
        if self.scaler is not None and "scaler" in self.state:
            self.scaler.load_state_dict(self.state["scaler"])
        if d.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            minutes = None if c.max_minutes is None else c.max_minutes * 60
            bar = Progress(self.progress, c.max_steps, minutes, self.echo)
            self.report = Reporter(
                self.out,
                bar,
                keep_until=None if self.loaded is None else self.at.step,
                log_every=c.log_every,
                tensorboard=self.tensorboard,
            )
        self.echo(self.describe())
        self.echo(recipe_summary(c))
        self.first, self.first_tokens = self.at.step, self.at.tokens
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()  # CPU seconds beside wall seconds: a busy machine
        self.stepping = 0.0  # seconds inside optimiser steps (no evaluation, no saving)
        self.loss_value: float | None = None

    def describe(self) -> str:
        """The run's first line: what it trains, on what data, with how many parameters."""
        c, d, data = self.c, self.d, self.data
        n_params = sum(p.numel() for p in self.model.parameters())
        procs = "" if not d.enabled else f", {d.world_size} processes"
        packed = "" if data.pack is None else f"; packed rows of {data.pack.max_len} tokens"
        if data.stream is not None:
            packed = f"; one stream of {len(data.stream.ids):,} tokens, windows of {c.block_size}"
        held_out = f"{len(data.heldout)} held out"
        if data.stream is not None:
            held_out = f"the last {len(data.heldout[0]):,} characters held out"
        source = "" if self.loaded is None else f" from {self.loaded.describe()}"
        return (
            f"{'resuming' if self.loaded else 'training'} {c.task}{source}: "
            f"{len(data.examples):,} training examples, {held_out}, vocabulary "
            f"{data.tokenizer.get_vocab_size()}, {n_params:,} parameters{procs}{packed}; "
            f"step {self.at.step}; writing to {self.out}"
        )

    # -- the loop -----------------------------------------------------------------------------

    def time_up(self) -> bool:
        """Every reason to stop after this step (combined over the ranks by the step)."""
        c = self.c
        if c.max_minutes is not None and time.monotonic() - self.t0 >= c.max_minutes * 60:
            return True
        return self.stop_reason is not None or self.interrupt.requested is not None

    def step(self) -> bool:
        """One optimiser step (the next micro-batches of the plan, a new epoch's when this one
        is used up), its log row and, on its schedule, an evaluation and a checkpoint. True
        when the run stops after it."""
        c, d = self.c, self.d
        at = self.at
        if at.index // self.per_step >= len(self.plan):
            at = replace(at, epoch=at.epoch + 1, index=0)
            self.plan = epoch_plan(c, d, self.data, self.lengths, at.epoch)
        micro = self.plan[at.index // self.per_step]
        self.at = at = replace(at, step=at.step + 1, index=at.index + self.per_step)
        step, lr = at.step, self.lr_at(at.step)
        for g in self.opt.param_groups:
            g["lr"] = lr
        t_step = time.monotonic()
        with d.guard(f"step {step}"):
            loss_sum, ntok, stop = optimizer_step(
                self.module, self.opt, self.data, c, d, micro, self.time_up, self.scaler
            )
            if step % c.log_every == 0 or self.loss_value is None:  # read back at log steps
                self.loss_value = mean_loss(loss_sum, ntok, d)
        self.at = at = replace(at, tokens=at.tokens + ntok)
        self.stepping += time.monotonic() - t_step
        if c.compile and step == self.first + 1:
            self.echo(f"step {step} took {time.monotonic() - t_step:.1f} s: compile included")
        elapsed = time.monotonic() - self.t0
        tok_s = (at.tokens - self.first_tokens) / max(elapsed, 1e-9)
        if self.report is not None:
            row = {"step": step, "epoch": at.epoch, "loss": self.loss_value, "lr": lr}
            row |= {"tokens": at.tokens, "tok_per_s": round(tok_s, 1)}
            row |= {"elapsed_s": round(elapsed, 3)}
            self.report.step(row | {"cpu_s": round(time.process_time() - self.cpu0, 3)}, self.first)
        if self.report is not None and step % c.eval_every == 0:
            self.evaluate()
            stop = stop or (self.stop_reason is not None and not d.enabled)  # else next step
        if step % c.save_every == 0 and not (stop and self.interrupt.requested):
            self.saved = self.save()
        return stop

    def loop(self) -> str | None:
        """Steps until ``max_steps``, the time budget, early stopping or a signal; then the last
        evaluation and checkpoint. The signal that interrupted the run, if one did."""
        c, d = self.c, self.d
        stop = False
        with Interrupt() as self.interrupt:
            while not stop and (c.max_steps is None or self.at.step < c.max_steps):
                stop = self.step()
            interrupted = self.interrupt.requested
            if (
                self.report is not None
                and not interrupted
                and self.at.step % c.eval_every
                and self.at.step > self.first
            ):
                self.evaluate()
            if self.saved is None or self.saved.name != f"step-{self.at.step:08d}":
                self.saved = self.save()
            with d.guard("finishing"):
                d.barrier()  # every rank returns once rank 0 has written the checkpoint
        return interrupted

    # -- evaluate and save --------------------------------------------------------------------

    def evaluate(self) -> None:
        """Evaluate (rank 0), log, update best/ and the early-stop count."""
        c = self.c
        t_eval = time.monotonic()
        row = evaluate(self.model, self.data, c, self.held, self.at.step, self.best.value)
        row["eval_s"] = round(time.monotonic() - t_eval, 3)  # shown in the progress line
        self.best, improved = self.best.update(row)
        self.report.evaluation(row, "  (best so far)" if improved else "")
        if improved:
            self.rng_states = [torch.get_rng_state()]  # best/ holds rank 0's generator only
            gpu = gpu_rng(current())
            self.gpu_states = [] if gpu is None else [gpu]
            record = json.dumps(self.best.to_dict()).encode()
            write_best(self.out, self.files({BEST_RECORD: record}))
        if self.best.patience_out(c.early_stop) and self.stop_reason is None:
            self.stop_reason = (
                f"early stop: {self.best.stale} evaluations without improvement of the "
                f"{self.best.label} (best: {self.best.describe()})"
            )

    def save(self) -> Path:
        """Gather every rank's generators and write checkpoint ``step-N`` (rank 0)."""
        d = self.d
        with d.guard(f"saving step {self.at.step}"):
            self.rng_states = d.all_gather(torch.get_rng_state())
            gpu = gpu_rng(current())
            self.gpu_states = [] if gpu is None else d.all_gather(gpu)
        if not d.is_main:
            return self.out / f"step-{self.at.step:08d}"
        return write_checkpoint(self.out, self.at.step, self.files({}), self.c.keep)

    def files(self, extra: dict[str, bytes]) -> dict[str, bytes]:
        """The checkpoint of the run as it stands (name -> bytes), with ``extra`` files."""
        c, d, data, at = self.c, self.d, self.data, self.at
        step = at.step
        opt_t, opt_meta = optimizer_state(self.opt)
        rng_t, rng_meta = rng_state(self.rng_states, self.gpu_states)
        state = {
            "data_sha256": self.digest,
            "step": step,
            "position": [at.epoch, at.index],
            "tokens": at.tokens,
            "world_size": d.world_size,
            "accumulate": c.accumulate,
            "optimizer": opt_meta,
            "rng": rng_meta,
            "schedule": {"kind": c.schedule, "step": step, "lr": self.lr_at(max(step, 1))},
            "best": self.best.to_dict(),
        } | ({} if self.scaler is None else {"scaler": self.scaler.state_dict()})
        return (
            save_resume.checkpoint_files(
                model=self.model,
                kind=data.kind,
                model_config=self.mcfg,
                train_config=c,
                tokenizer=data.tokenizer,
                step=step,
                tensors={**opt_t, **rng_t},
                state=state,
                heldout=[list(x) if isinstance(x, tuple) else x for x in data.heldout],
                train_sample=[list(x) if isinstance(x, tuple) else x for x in data.train_sample],
                characters=data.characters,
            )
            | extra
        )
