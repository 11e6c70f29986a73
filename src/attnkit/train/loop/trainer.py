"""The training loop: AdamW with the warm-up schedule, label smoothing, gradient clipping,
length-bucketed batches, periodic evaluation, a JSONL log, atomic checkpoints, bit-exact resume.
The run itself is :class:`attnkit.train.loop.run.Run`; one step and one evaluation are in
:mod:`attnkit.train.loop.steps`.

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
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from attnkit.checks import choice
from attnkit.devices import current
from attnkit.train.checkpoint import Checkpoint
from attnkit.train.config import TrainConfig
from attnkit.train.loop.distributed import DistributedError, join
from attnkit.train.loop.run import Run

__all__ = ["TrainingInterrupted", "train"]


class TrainingInterrupted(Exception):
    """A run stopped by SIGINT/SIGTERM after writing ``checkpoint``; the message says how to
    resume it."""

    def __init__(self, message: str, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


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

    SIGINT/SIGTERM (:mod:`attnkit.train.loop.interrupt`): the current step finishes, a
    checkpoint is written and :class:`TrainingInterrupted` says how to resume; a second signal
    stops at once.

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
    run = Run(c, Path(out), d, progress=mode, echo=echo, tensorboard=tensorboard)
    try:
        run.setup(resume)
    except BaseException:
        with contextlib.suppress(Exception):
            d.all_ok(False)  # the other ranks stop too, instead of waiting for this one
        raise
    return _finish(run)


def _finish(run: Run) -> Path:
    """Start ``run``, loop, and say how it ended; the last checkpoint's path."""
    run.start()
    try:
        interrupted = run.loop()
    except DistributedError as e:
        last = "none written" if run.saved is None else f"{run.saved} (--resume it to continue)"
        raise DistributedError(f"{e}; the last checkpoint: {last}") from None
    finally:
        if run.report is not None:
            run.report.close()
    speed = (run.at.tokens - run.first_tokens) / max(run.stepping, 1e-9)
    if interrupted:
        raise TrainingInterrupted(
            f"interrupted ({interrupted}) after step {run.at.step}: checkpoint {run.saved} "
            f"written; continue with: attnkit train --resume {shlex.quote(str(run.out))}",
            run.saved,
        )
    if run.stop_reason is not None:
        run.echo(run.stop_reason)
    procs = "" if not run.d.enabled else f", {run.d.world_size} processes"
    run.echo(
        f"stopped at step {run.at.step} after {time.monotonic() - run.t0:.0f} s (training: "
        f"{speed:,.0f} target tokens/s{procs}); checkpoint {run.saved}"
    )
    return run.saved
