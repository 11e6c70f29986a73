"""Checkpoints: directories written atomically, verified when read.

A run directory (``--out``) holds ``log.jsonl`` and checkpoints ``step-00000200/`` ... Each
checkpoint holds:

- ``model.safetensors``   the weights (safetensors; tied matrices stored once)
- ``config.json``         format, model kind and config, training config, step
- ``tokenizer.json``      the tokenizer (``tokenizers`` library)
- ``state.safetensors``   optimiser tensors and the torch RNG state
- ``state.json``          optimiser hyper-parameters, schedule step, data position, NumPy and
                          Python RNG states
- ``heldout.jsonl``, ``train_sample.jsonl``  the held-out split and a sample of training data
- ``manifest.json``       SHA-256 of every file above, written last

``best/`` beside them is the checkpoint of the best evaluation so far (lowest held-out loss, or
highest BLEU with ``--best-metric bleu``), with ``best.json`` saying which metric, value and
step; commands that read a run directory load it when it exists (:func:`find_checkpoint`).

Writing: every file goes into a temporary directory beside the target (``.tmp-...``), is
fsynced, then the directory is renamed to ``step-NNNNNNNN`` and the parent fsynced; only then
are older checkpoints (beyond ``keep``) removed. A process killed at any moment therefore leaves
the previous checkpoints complete; leftovers of an interrupted save are ignored and cleaned up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from attnkit.train.config import TrainConfig

__all__ = [
    "BEST",
    "BEST_RECORD",
    "FORMAT",
    "KINDS",
    "Checkpoint",
    "CheckpointError",
    "find_checkpoint",
    "list_checkpoints",
    "read_json",
    "resolve",
    "verify",
    "write_best",
    "write_checkpoint",
]

FORMAT = "attnkit-checkpoint/1"
STEP_DIR = re.compile(r"^step-(\d{8})$")
BEST = "best"
"""The run's best checkpoint so far (by held-out loss, or BLEU): a checkpoint like the others."""
BEST_RECORD = "best.json"
"""In ``best/``: the :class:`~attnkit.train.best.Best` record (metric, value, step)."""
KINDS = ("seq2seq", "lm")
SECTIONS = {"model": "model's sizes", "train": "training options"}


class CheckpointError(ValueError):
    """A path that is not a usable checkpoint; the message names the file."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _remove(path: Path, parent: Path) -> None:
    """Rename ``path`` out of the way (atomic), then delete it."""
    trash = parent / f".trash-{path.name}-{os.getpid()}"
    os.rename(path, trash)
    _fsync_dir(parent)
    shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (``step-*`` with a manifest) in ``run_dir``, oldest first."""
    if not run_dir.is_dir():
        return []
    found = [
        p for p in run_dir.iterdir() if STEP_DIR.match(p.name) and (p / "manifest.json").is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def _write_dir(run_dir: Path, name: str, files: dict[str, bytes]) -> Path:
    """Write ``files`` (name -> content) as the directory ``run_dir/name`` atomically (a
    temporary directory renamed into place; an existing one is moved away first)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in run_dir.glob(".trash-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = run_dir / name
    tmp = run_dir / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    manifest = {"format": FORMAT, "files": {}}
    for fname, data in files.items():
        _write_bytes(tmp / fname, data)
        manifest["files"][fname] = hashlib.sha256(data).hexdigest()
    _write_bytes(tmp / "manifest.json", json.dumps(manifest, indent=1).encode())
    _fsync_dir(tmp)
    if final.exists():
        _remove(final, run_dir)
    os.rename(tmp, final)
    _fsync_dir(run_dir)
    return final


def write_checkpoint(run_dir: Path, step: int, files: dict[str, bytes], keep: int) -> Path:
    """Write ``files`` (name -> content) as checkpoint ``run_dir/step-<step>`` atomically and
    keep the last ``keep`` checkpoints. Returns the checkpoint's path."""
    final = _write_dir(run_dir, f"step-{step:08d}", files)
    for old in list_checkpoints(run_dir)[:-keep]:
        _remove(old, run_dir)
    return final


def write_best(run_dir: Path, files: dict[str, bytes]) -> Path:
    """Write ``files`` as ``run_dir/best`` (replacing the previous best atomically: a process
    killed in between leaves either the old or the new one, or none, never a partial one)."""
    return _write_dir(run_dir, BEST, files)


def find_checkpoint(path: str | Path, *, best: bool = False) -> Path:
    """The checkpoint at ``path``: the directory itself when it is one; for a run directory,
    its ``best/`` checkpoint when ``best`` and it exists, else its latest complete step-*
    checkpoint. CheckpointError naming the path otherwise.

    The rule of every command that reads a run: ``generate``, ``evaluate``, ``translate`` and
    ``export`` pass ``best=True``; ``train --resume`` continues from the last checkpoint."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run directory")
    if not path.is_dir():
        raise CheckpointError(
            f"{path}: not a checkpoint (expected a directory with manifest.json, config.json, "
            "model.safetensors and tokenizer.json, or a run directory holding step-* checkpoints)"
        )
    if (path / "manifest.json").exists():
        return path
    if best and (path / BEST / "manifest.json").is_file():
        return path / BEST
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"{path}: not an attnkit checkpoint (no manifest.json) and no complete step-* "
            "checkpoint inside"
        )
    return found[-1]


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; CheckpointError naming the file otherwise."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupted checkpoint file ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: corrupted checkpoint file (expected a JSON object)")
    return obj


def verify(ckpt: Path) -> dict:
    """Check every file of checkpoint ``ckpt`` against its manifest; the manifest."""
    manifest = read_json(ckpt / "manifest.json")
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(
            f"{ckpt / 'manifest.json'}: not an attnkit checkpoint manifest (format "
            f"{manifest.get('format')!r}, expected {FORMAT!r})"
        )
    for name, digest in manifest["files"].items():
        f = ckpt / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing from the checkpoint")
        if _sha256(f) != digest:
            raise CheckpointError(f"{f}: corrupted checkpoint (SHA-256 differs from manifest.json)")
    return manifest


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found, verified against its manifest and its config.json read, once:
    ``path`` (the checkpoint directory), ``run_dir`` (the run directory that holds it: where a
    resumed run writes), ``kind`` (:data:`KINDS`), ``step``, ``model_config`` (the model's
    sizes) and ``train_config``. What ``attnkit train --resume``, the training run and
    :func:`attnkit.train.inference.session.load` share, so that nothing is hashed twice."""

    path: Path
    run_dir: Path
    kind: str
    step: int
    model_config: dict
    train_config: TrainConfig


def resolve(path: str | Path, *, best: bool = False) -> Checkpoint:
    """The checkpoint at ``path`` (a checkpoint or run directory, :func:`find_checkpoint`'s
    rule) as a :class:`Checkpoint`: every file checked against the manifest (one SHA-256 pass)
    and config.json read and checked. CheckpointError naming the file when anything is wrong."""
    ckpt = find_checkpoint(path, best=best)
    verify(ckpt)
    cfg_path = ckpt / "config.json"
    cfg = read_json(cfg_path)
    if cfg.get("format") != FORMAT or cfg.get("kind") not in KINDS:
        raise CheckpointError(f"{cfg_path}: not an attnkit checkpoint config")
    for section in ("model", "train"):
        if not isinstance(cfg.get(section), dict):
            raise CheckpointError(
                f"{cfg_path}: the config has no {section!r} section (the {SECTIONS[section]}), "
                "so no model can be built from it"
            )
    try:
        train_config = TrainConfig.from_dict(cfg["train"], str(cfg_path))
        step = int(cfg["step"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: invalid checkpoint config ({e})") from None
    return Checkpoint(ckpt, ckpt.parent, cfg["kind"], step, cfg["model"], train_config)
