"""The training loop: AdamW with the warm-up schedule, label smoothing, gradient clipping,
length-bucketed batches, periodic evaluation, a JSONL log, atomic checkpoints, bit-exact resume.

Determinism: the weights come from ``torch.manual_seed(seed)``; batches are a function of
(seed, epoch) (:mod:`attnkit.train.batches`) and the run stores its position (epoch, next
batch); dropout draws from torch's global generator, whose state a checkpoint stores and a
resumed run restores *after* building the model, optimiser and data order. So the losses after
``resume`` equal, bit for bit, those of an uninterrupted run (same machine, same threads).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnkit.train import session
from attnkit.train.batches import batch_logits, epoch_batches
from attnkit.train.checkpoint import CheckpointError, write_checkpoint
from attnkit.train.config import TrainConfig
from attnkit.train.data import DataError
from attnkit.train.metrics import exact_match, heldout_loss, translate
from attnkit.train.progress import Progress
from attnkit.train.schedule import noam_lr
from attnkit.train.state import load_optimizer_state, optimizer_state, rng_state, set_rng_state
from attnkit.train.tasks import (
    TaskData,
    build_model,
    lm_stream,
    lm_windows,
    model_config,
    prepare,
    seq2seq_example,
)
from attnkit.train.tokenizer import PAD

__all__ = ["train"]

LOG = "log.jsonl"


def _check_out(out: Path, resumed: Path | None) -> None:
    """Refuse to start over anything on disk: ``out`` must be new or empty, or the run
    directory of the resumed checkpoint."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if resumed is None or resumed.parent.resolve() != out.resolve():
            raise ValueError(
                f"out: {out} already exists and is not empty; choose a new --out, or "
                f"--resume {out} to continue that run"
            )


def _loss(model, kind: str, batch: list, smoothing: float) -> tuple[torch.Tensor, int]:
    logits, y = batch_logits(model, kind, batch)
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        y.reshape(-1),
        ignore_index=PAD,
        label_smoothing=smoothing,
    )
    return loss, int((y != PAD).sum())


def _heldout_examples(data: TaskData, c: TrainConfig) -> list:
    if data.kind == "lm":
        return [
            (w,)
            for w in lm_windows(lm_stream(data.tokenizer, data.heldout), c.block_size, c.block_size)
        ]
    return [seq2seq_example(data.tokenizer, s, t) for s, t in data.heldout]


def _evaluate(model, data: TaskData, c: TrainConfig, held: list, step: int) -> dict:
    model.eval()
    row: dict = {"step": step, "val_loss": heldout_loss(model, data.kind, held)}
    if data.kind == "lm":
        row["val_ppl"] = float(np.exp(row["val_loss"]))
    elif c.task != "translate":
        hyps = translate(model, data.tokenizer, [s for s, _ in data.heldout])
        row["val_exact"] = exact_match(hyps, [t for _, t in data.heldout])
    model.train()
    return row


class _Log:
    def __init__(self, path: Path, keep_until: int | None) -> None:
        self.path = path
        if keep_until is not None and path.exists():  # resuming: drop what came after
            kept = [
                s
                for s in path.read_text().splitlines()
                if s and json.loads(s)["step"] <= keep_until
            ]
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(s + "\n" for s in kept))
            os.replace(tmp, path)
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: dict) -> None:
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: str | Path | None = None,
    progress: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """Train as ``config`` says, writing checkpoints and ``log.jsonl`` into ``out``; returns the
    last checkpoint's path. ``resume``: a checkpoint (or run directory) to continue from; its
    identity options must equal ``config``'s. Nothing is written before the data, the model and
    the checkpoint to resume have been checked."""
    c = config.resolved()
    out = Path(out)
    loaded = None
    if resume is not None:
        loaded = session.load(resume)
        diffs = loaded.train_config.resolved().identity_differences(c)
        if diffs:
            raise CheckpointError(
                f"{loaded.path / 'config.json'}: the checkpoint comes from another "
                f"configuration (checkpoint != requested: {'; '.join(diffs)})"
            )
    _check_out(out, None if loaded is None else loaded.path)
    if c.threads is not None:
        torch.set_num_threads(c.threads)
    data = prepare(c, None if loaded is None else loaded.tokenizer)
    digest = None if c.data is None else hashlib.sha256(Path(c.data).read_bytes()).hexdigest()
    longest = max(len(x) for e in data.examples for x in e)
    if loaded is None:
        mcfg = model_config(c, data.kind, data.tokenizer.get_vocab_size(), max(256, longest + 2))
        torch.manual_seed(c.seed)
        model = build_model(data.kind, mcfg)
    else:
        mcfg, model = loaded.model_config, loaded.model
    model.train()
    opt = torch.optim.AdamW(
        model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=c.weight_decay
    )
    step, epoch, index, tokens = 0, 0, 0, 0
    if loaded is not None:
        tensors, st = loaded.state()
        try:
            load_optimizer_state(opt, tensors, st["optimizer"])
            step, (epoch, index), tokens = st["step"], st["position"], st["tokens"]
            stored_digest = st["data_sha256"]
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(
                f"{loaded.path / 'state.json'}: unusable training state ({e})"
            ) from None
        if stored_digest != digest:
            raise DataError(
                f"{c.data}: the file differs from the one {loaded.path} was trained on "
                "(SHA-256 differs); resume with the same data"
            )
    lengths = np.array([sum(len(x) for x in e) for e in data.examples])
    batches = epoch_batches(lengths, c.batch_size, c.seed, epoch)
    if loaded is not None:  # after the data order is built, so nothing draws after restoring
        set_rng_state(tensors, st["rng"])
    held = _heldout_examples(data, c)

    def save() -> Path:
        opt_t, opt_meta = optimizer_state(opt)
        rng_t, rng_meta = rng_state()
        state = {
            "data_sha256": digest,
            "step": step,
            "position": [epoch, index],
            "tokens": tokens,
            "optimizer": opt_meta,
            "rng": rng_meta,
            "schedule": {
                "kind": "noam",
                "step": step,
                "lr": noam_lr(max(step, 1), c.d_model, c.warmup, c.lr_factor),
            },
        }
        files = session.checkpoint_files(
            model=model,
            kind=data.kind,
            model_config=mcfg,
            train_config=c,
            tokenizer=data.tokenizer,
            step=step,
            tensors={**opt_t, **rng_t},
            state=state,
            heldout=[list(x) if isinstance(x, tuple) else x for x in data.heldout],
            train_sample=[list(x) if isinstance(x, tuple) else x for x in data.train_sample],
        )
        return write_checkpoint(out, step, files, c.keep)

    out.mkdir(parents=True, exist_ok=True)
    log = _Log(out / LOG, None if loaded is None else step)
    n_params = sum(p.numel() for p in model.parameters())
    echo(
        f"{'resuming' if loaded else 'training'} {c.task}: {len(data.examples)} training "
        f"examples, {len(data.heldout)} held out, vocabulary {data.tokenizer.get_vocab_size()}, "
        f"{n_params:,} parameters; step {step}; writing to {out}"
    )
    first, t0, saved = step, time.monotonic(), None
    bar = Progress(progress, c.max_steps, None if c.max_minutes is None else c.max_minutes * 60)
    try:
        while c.max_steps is None or step < c.max_steps:
            if c.max_minutes is not None and time.monotonic() - t0 >= c.max_minutes * 60:
                break
            if index >= len(batches):
                epoch, index = epoch + 1, 0
                batches = epoch_batches(lengths, c.batch_size, c.seed, epoch)
            batch = [data.examples[i] for i in batches[index]]
            index, step = index + 1, step + 1
            lr = noam_lr(step, c.d_model, c.warmup, c.lr_factor)
            for g in opt.param_groups:
                g["lr"] = lr
            loss, ntok = _loss(model, data.kind, batch, c.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if c.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
            opt.step()
            tokens += ntok
            elapsed = time.monotonic() - t0
            tok_s = (tokens - (0 if loaded is None else st["tokens"])) / max(elapsed, 1e-9)
            loss_value = loss.item()
            bar.update(step, first, loss_value, tok_s, lr)
            if step % c.log_every == 0:
                log.write(
                    {
                        "step": step,
                        "epoch": epoch,
                        "loss": loss_value,
                        "lr": lr,
                        "tokens": tokens,
                        "tok_per_s": round(tok_s, 1),
                        "elapsed_s": round(elapsed, 3),
                    }
                )
            if step % c.eval_every == 0:
                log.write(_evaluate(model, data, c, held, step))
            if step % c.save_every == 0:
                saved = save()
        if step % c.eval_every != 0 and step > first:
            row = _evaluate(model, data, c, held, step)
            log.write(row)
        if saved is None or saved.name != f"step-{step:08d}":
            saved = save()
    finally:
        bar.close()
        log.close()
    echo(f"stopped at step {step} after {time.monotonic() - t0:.0f} s; checkpoint {saved}")
    return saved
