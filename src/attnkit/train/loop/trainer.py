"""The training loop: AdamW with the warm-up schedule, label smoothing, gradient clipping,
length-bucketed batches, periodic evaluation, a JSONL log, atomic checkpoints, bit-exact resume.
One step and one evaluation are in :mod:`attnkit.train.loop.steps`.

Determinism: the weights come from ``torch.manual_seed(seed)``; batches are a function of
(seed, epoch) (:mod:`attnkit.train.data.batches`) and the run stores its position (epoch, next
batch); dropout draws from torch's global generator, whose state a checkpoint stores and a
resumed run restores *after* building the model, optimiser and data order. So the losses after
``resume`` equal, bit for bit, those of an uninterrupted run (same machine, same threads).

Several processes (``torchrun``, :mod:`attnkit.train.loop.distributed`): every rank runs this
loop on its shard of the epoch's batches, the model in DistributedDataParallel; rank 0 alone writes
checkpoints and ``log.jsonl`` and shows the progress bar; every rank reads a checkpoint the same
way. Each rank's dropout generator is seeded from (seed, rank) and stored per rank in every
checkpoint, so a resumed run with the same number of processes is bit-identical too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnkit.checks import choice
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
from attnkit.train.loop.distributed import Dist, DistributedError, join, rank_seed, shard
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

__all__ = ["TrainingInterrupted", "train"]


class TrainingInterrupted(Exception):
    """A run stopped by SIGINT/SIGTERM after writing ``checkpoint``; the message says how to
    resume it."""

    def __init__(self, message: str, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


@dataclass
class _Start:
    """What a run starts from, checked on every rank before any process waits for another."""

    data: TaskData
    model: torch.nn.Module
    mcfg: dict
    opt: torch.optim.Optimizer
    digest: str | None
    lengths: np.ndarray
    plan: list[list[np.ndarray]]
    loaded: Loaded | None = None
    step: int = 0
    epoch: int = 0
    index: int = 0
    tokens: int = 0
    tensors: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)


def _plan(c: TrainConfig, d: Dist, data: TaskData, lengths: np.ndarray, epoch: int) -> list:
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


def _start(c: TrainConfig, out: Path, resume: str | Path | Checkpoint | None, d: Dist) -> _Start:
    """Load and check everything (no collective): the checkpoint to resume, the output
    directory (rank 0), the data, the model and the optimiser."""
    loaded = None
    if resume is not None:
        loaded = load(resume)
        diffs = loaded.train_config.resolved().identity_differences(c)
        if diffs:
            raise CheckpointError(
                f"{loaded.path / 'config.json'}: the checkpoint comes from another "
                f"configuration (checkpoint != requested: {'; '.join(diffs)})"
            )
    if d.is_main:
        save_resume.check_out(out, None if loaded is None else loaded.path)
    if c.bf16:
        require_bf16(current())
    if c.fp16:
        require_fp16(current())
    if c.threads is not None:
        torch.set_num_threads(c.threads)
    data = prepare(c, None if loaded is None else loaded.tokenizer)
    digest = None if c.data is None else hashlib.sha256(Path(c.data).read_bytes()).hexdigest()
    if data.stream is not None:
        longest, lengths = c.block_size + 1, np.zeros(0, dtype=np.int64)
    else:
        longest = max(len(x) for e in data.examples for x in e)
        lengths = np.array([sum(len(x) for x in e) for e in data.examples])
    if loaded is None:
        mcfg = model_config(c, data.kind, data.tokenizer.get_vocab_size(), max(256, longest + 2))
        torch.manual_seed(c.seed)
        model = build_model(data.kind, mcfg)
    else:
        mcfg, model = loaded.model_config, loaded.model
    model.train()
    opt = build_optimizer(model, c)
    s = _Start(data, model, mcfg, opt, digest, lengths, [], loaded)
    if loaded is not None:
        s.tensors, s.state = save_resume.resume_state(loaded)
        st = s.state
        try:
            load_optimizer_state(opt, s.tensors, st["optimizer"])
            s.step, (s.epoch, s.index), s.tokens = st["step"], st["position"], st["tokens"]
            stored_digest, saved_world = st["data_sha256"], int(st.get("world_size", 1))
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(
                f"{loaded.path / 'state.json'}: unusable training state ({e})"
            ) from None
        if stored_digest != digest:
            raise DataError(
                f"{c.data}: the file differs from the one {loaded.path} was trained on "
                "(SHA-256 differs); resume with the same data"
            )
        save_resume.check_world(loaded, saved_world, d.world_size, c.accumulate)
    s.plan = _plan(c, d, data, lengths, s.epoch)
    return s


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: str | Path | Checkpoint | None = None,
    progress: bool | str = False,
    echo: Callable[[str], None] = print,
    tensorboard: bool = False,
) -> Path:
    """Train as ``config`` says, writing checkpoints and ``log.jsonl`` into ``out``; returns the
    last checkpoint's path. ``resume``: a checkpoint (or run directory, or a
    :class:`~attnkit.train.checkpoint.Checkpoint` already resolved) to continue from; its
    identity options must equal ``config``'s. Nothing is written before the data, the model and
    the checkpoint to resume have been checked. ``progress``: "bar" (or True), "lines" (plain
    lines every ``log_every`` steps, for a log file) or "off" (or False); ``tensorboard``: also
    write TensorBoard event files (``out/tensorboard``). The best evaluation's checkpoint is
    kept in ``out/best`` (``config.best_metric``).

    SIGINT/SIGTERM (:mod:`attnkit.train.loop.interrupt`): the current step finishes, a checkpoint is
    written and :class:`TrainingInterrupted` says how to resume; a second signal stops at once.

    Under torchrun every process calls this with the same arguments (see the module docstring):
    rank 0 writes and prints, and all return when the last checkpoint is written.
    DistributedError when another process fails or stops responding.
    """
    c = config.resolved()
    d = join(c.dist_timeout, device=current())
    if not d.is_main:  # rank 0 alone prints
        echo, progress = (lambda _: None), False
    mode = {True: "bar", False: "off"}.get(progress, progress)
    choice("progress", mode, ("bar", "lines", "off"))
    return _train(c, Path(out), resume, mode, echo, d, tensorboard)


def _train(
    c: TrainConfig,
    out: Path,
    resume: str | Path | Checkpoint | None,
    progress: str,
    echo: Callable[[str], None],
    d: Dist,
    tensorboard: bool,
) -> Path:
    try:
        s = _start(c, out, resume, d)
    except BaseException:
        with contextlib.suppress(Exception):
            d.all_ok(False)  # the other ranks stop too, instead of waiting for this one
        raise
    with d.guard("starting"):
        if not d.all_ok(True):
            raise DistributedError(
                f"rank {d.rank}: another process of the run failed to start (its own message "
                "says why)"
            )
        model = d.wrap(training_module(s.model, s.data.kind, c))
        model = torch.compile(model) if c.compile else model  # compiled at step 1
    # the generators last: nothing draws between restoring them and training
    if s.loaded is None and d.enabled:
        torch.manual_seed(rank_seed(c.seed, d.rank))  # each rank its own dropout
    elif s.loaded is not None:
        note = save_resume.restore_rng(
            s.tensors, s.state, seed=c.seed, rank=d.rank, world_size=d.world_size
        )
        if note:
            echo(note)
    data, opt, per_step = s.data, s.opt, d.world_size * c.accumulate
    step, epoch, index, tokens, plan = s.step, s.epoch, s.index, s.tokens, s.plan
    lr_at = schedule_of(c)
    held = heldout_examples(data, c) if d.is_main else []
    best = Best.from_dict(s.state.get("best"), c.best_metric)
    scaler = grad_scaler(current(), c.fp16)
    if scaler is not None and "scaler" in s.state:
        scaler.load_state_dict(s.state["scaler"])

    def files(extra: dict[str, bytes]) -> dict[str, bytes]:
        opt_t, opt_meta = optimizer_state(opt)
        rng_t, rng_meta = rng_state(states, gpu_states)
        state = {
            "data_sha256": s.digest,
            "step": step,
            "position": [epoch, index],
            "tokens": tokens,
            "world_size": d.world_size,
            "accumulate": c.accumulate,
            "optimizer": opt_meta,
            "rng": rng_meta,
            "schedule": {"kind": c.schedule, "step": step, "lr": lr_at(max(step, 1))},
            "best": best.to_dict(),
        } | ({} if scaler is None else {"scaler": scaler.state_dict()})
        return (
            save_resume.checkpoint_files(
                model=s.model,
                kind=data.kind,
                model_config=s.mcfg,
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

    def save() -> Path:
        nonlocal states, gpu_states
        with d.guard(f"saving step {step}"):
            states = d.all_gather(torch.get_rng_state())
            gpu = gpu_rng(current())
            gpu_states = [] if gpu is None else d.all_gather(gpu)
        if not d.is_main:
            return out / f"step-{step:08d}"
        return write_checkpoint(out, step, files({}), c.keep)

    def evaluation() -> None:
        """Evaluate (rank 0), log, update best/ and the early-stop count."""
        nonlocal best, states, gpu_states, stop_reason
        t_eval = time.monotonic()
        row = evaluate(s.model, data, c, held, step, best.value)
        row["eval_s"] = round(time.monotonic() - t_eval, 3)  # shown in the progress line
        best, improved = best.update(row)
        report.evaluation(row, "  (best so far)" if improved else "")
        if improved:
            states = [torch.get_rng_state()]  # best/ holds rank 0's generator only
            gpu = gpu_rng(current())
            gpu_states = [] if gpu is None else [gpu]
            record = json.dumps(best.to_dict()).encode()
            write_best(out, files({BEST_RECORD: record}))
        if best.patience_out(c.early_stop) and stop_reason is None:
            stop_reason = (
                f"early stop: {best.stale} evaluations without improvement of the "
                f"{best.label} (best: {best.describe()})"
            )

    states: list = []
    gpu_states: list = []
    report = None
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        bar = Progress(
            progress, c.max_steps, None if c.max_minutes is None else c.max_minutes * 60, echo
        )
        report = Reporter(
            out,
            bar,
            keep_until=None if s.loaded is None else step,
            log_every=c.log_every,
            tensorboard=tensorboard,
        )
    n_params = sum(p.numel() for p in s.model.parameters())
    procs = "" if not d.enabled else f", {d.world_size} processes"
    packed = "" if data.pack is None else f"; packed rows of {data.pack.max_len} tokens"
    if data.stream is not None:
        packed = f"; one stream of {len(data.stream.ids):,} tokens, windows of {c.block_size}"
    held_out = f"{len(data.heldout)} held out"
    if data.stream is not None:
        held_out = f"the last {len(data.heldout[0]):,} characters held out"
    source = "" if s.loaded is None else f" from {s.loaded.describe()}"
    echo(
        f"{'resuming' if s.loaded else 'training'} {c.task}{source}: {len(data.examples):,} "
        f"training examples, {held_out}, vocabulary {data.tokenizer.get_vocab_size()}, "
        f"{n_params:,} parameters{procs}{packed}; step {step}; writing to {out}"
    )
    echo(recipe_summary(c))
    first, first_tokens, t0, saved = step, tokens, time.monotonic(), None
    cpu0 = time.process_time()  # CPU seconds beside wall seconds: a busy machine shows as a gap
    stepping = 0.0  # seconds inside optimiser steps (no evaluation, no saving)
    stop_reason: str | None = None

    def time_up() -> bool:  # every reason to stop after this step, combined over the ranks
        if c.max_minutes is not None and time.monotonic() - t0 >= c.max_minutes * 60:
            return True
        return stop_reason is not None or interrupt.requested is not None

    stop, loss_value = False, None
    try:
        with Interrupt() as interrupt:
            while not stop and (c.max_steps is None or step < c.max_steps):
                if index // per_step >= len(plan):
                    epoch, index = epoch + 1, 0
                    plan = _plan(c, d, data, s.lengths, epoch)
                micro = plan[index // per_step]
                index, step = index + per_step, step + 1
                lr = lr_at(step)
                for g in opt.param_groups:
                    g["lr"] = lr
                t_step = time.monotonic()
                with d.guard(f"step {step}"):
                    loss_sum, ntok, stop = optimizer_step(
                        model, opt, data, c, d, micro, time_up, scaler
                    )
                    if step % c.log_every == 0 or loss_value is None:  # read back at log steps
                        loss_value = mean_loss(loss_sum, ntok, d)
                tokens, stepping = tokens + ntok, stepping + time.monotonic() - t_step
                if c.compile and step == first + 1:
                    echo(f"step {step} took {time.monotonic() - t_step:.1f} s: compile included")
                elapsed = time.monotonic() - t0
                tok_s = (tokens - first_tokens) / max(elapsed, 1e-9)
                if report is not None:
                    row = {"step": step, "epoch": epoch, "loss": loss_value, "lr": lr}
                    row |= {"tokens": tokens, "tok_per_s": round(tok_s, 1)}
                    row |= {"elapsed_s": round(elapsed, 3)}
                    report.step(row | {"cpu_s": round(time.process_time() - cpu0, 3)}, first)
                if report is not None and step % c.eval_every == 0:
                    evaluation()
                    stop = stop or (stop_reason is not None and not d.enabled)  # else next step
                if step % c.save_every == 0 and not (stop and interrupt.requested):
                    saved = save()
            interrupted = interrupt.requested
            if report is not None and not interrupted and step % c.eval_every and step > first:
                evaluation()
            if saved is None or saved.name != f"step-{step:08d}":
                saved = save()
            with d.guard("finishing"):
                d.barrier()  # every rank returns once rank 0 has written the checkpoint
    except DistributedError as e:
        last = "none written" if saved is None else f"{saved} (--resume it to continue)"
        raise DistributedError(f"{e}; the last checkpoint: {last}") from None
    finally:
        if report is not None:
            report.close()
    speed = (tokens - first_tokens) / max(stepping, 1e-9)
    if interrupted:
        raise TrainingInterrupted(
            f"interrupted ({interrupted}) after step {step}: checkpoint {saved} written; "
            f"continue with: attnkit train --resume {out}",
            saved,
        )
    if stop_reason is not None:
        echo(stop_reason)
    echo(
        f"stopped at step {step} after {time.monotonic() - t0:.0f} s (training: {speed:,.0f} "
        f"target tokens/s{procs}); checkpoint {saved}"
    )
    return saved
