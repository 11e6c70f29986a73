"""What goes into a checkpoint and how it comes back: weights (safetensors), the configs
(JSON), the tokenizer, the optimiser/RNG state, the data position and the held-out data.

:func:`checkpoint_files` builds the files; :func:`load` reads a checkpoint (verifying it)
into a :class:`Loaded` with the model ready for evaluation and decoding. A resumed run checks
that it splits each step the same way (:func:`check_world`) and restores its generators
(:func:`restore_rng`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch as st
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.train import tokenizer as tk
from attnkit.train.checkpoint import FORMAT, CheckpointError, find_checkpoint, read_json, verify
from attnkit.train.config import TrainConfig
from attnkit.train.distributed import rank_seed
from attnkit.train.state import set_rng_state
from attnkit.train.tasks import build_model

__all__ = [
    "Loaded",
    "check_world",
    "checkpoint_files",
    "load",
    "load_weights",
    "read_train_config",
    "restore_rng",
    "weights_bytes",
]


def weights_bytes(model: torch.nn.Module) -> bytes:
    """The model's state dict as safetensors bytes; a tensor shared by several names (tied
    embeddings) is stored once and the other names recorded as aliases in the metadata."""
    seen: dict[tuple, str] = {}
    out: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        out[name] = t.detach().cpu().contiguous()
    return st.save(out, metadata={"aliases": json.dumps(aliases)})


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load ``model.safetensors`` written by :func:`weights_bytes` (strict: every name and
    shape must match); CheckpointError naming the file otherwise."""
    try:
        with safe_open(str(path), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error type for a bad file
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    try:
        for name, target in aliases.items():
            tensors[name] = tensors[target]
        model.load_state_dict(tensors, strict=True)
    except (ValueError, RuntimeError, KeyError) as e:
        msg = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{path}: weights do not fit this model ({msg})") from None


def _jsonl(items: list) -> bytes:
    return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items).encode()


def checkpoint_files(
    *,
    model: torch.nn.Module,
    kind: str,
    model_config: dict,
    train_config: TrainConfig,
    tokenizer: Tokenizer,
    step: int,
    tensors: dict[str, Tensor],
    state: dict,
    heldout: list,
    train_sample: list,
) -> dict[str, bytes]:
    """The files of a checkpoint (name -> bytes), for
    :func:`~attnkit.train.checkpoint.write_checkpoint`."""
    config = {
        "format": FORMAT,
        "kind": kind,
        "step": step,
        "model": model_config,
        "train": train_config.to_dict(),
    }
    return {
        "model.safetensors": weights_bytes(model),
        "config.json": json.dumps(config, indent=1).encode(),
        "tokenizer.json": tokenizer.to_str().encode(),
        "state.safetensors": st.save(tensors),
        "state.json": json.dumps(state).encode(),
        "heldout.jsonl": _jsonl(heldout),
        "train_sample.jsonl": _jsonl(train_sample),
    }


@dataclass
class Loaded:
    """A checkpoint read back: ``model`` (in eval mode), ``tokenizer``, ``kind`` ("seq2seq" or
    "lm"), configs, ``step``, and the paths of its files."""

    path: Path
    kind: str
    step: int
    model: torch.nn.Module
    tokenizer: Tokenizer
    model_config: dict
    train_config: TrainConfig

    def jsonl(self, name: str) -> list:
        """The items of ``heldout.jsonl`` / ``train_sample.jsonl``."""
        f = self.path / name
        try:
            return [json.loads(s) for s in f.read_text(encoding="utf-8").splitlines() if s]
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{f}: corrupted checkpoint file ({e})") from None

    def state(self) -> tuple[dict[str, Tensor], dict]:
        """(state tensors, state JSON) for resuming."""
        f = self.path / "state.safetensors"
        try:
            tensors = st.load_file(str(f))
        except Exception as e:  # safetensors raises its own error type
            raise CheckpointError(f"{f}: corrupted checkpoint file ({e})") from None
        return tensors, read_json(self.path / "state.json")


def load(path: str | Path) -> Loaded:
    """Read the checkpoint at ``path`` (a checkpoint or run directory), verify every file and
    build its model (eval mode). CheckpointError naming the file when anything is wrong."""
    ckpt = find_checkpoint(path)
    verify(ckpt)
    cfg_path = ckpt / "config.json"
    cfg = read_json(cfg_path)
    if cfg.get("format") != FORMAT or cfg.get("kind") not in ("seq2seq", "lm"):
        raise CheckpointError(f"{cfg_path}: not an attnkit checkpoint config")
    try:
        train_config = TrainConfig.from_dict(cfg["train"], str(cfg_path))
        model = build_model(cfg["kind"], cfg["model"])
        step = int(cfg["step"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: invalid checkpoint config ({e})") from None
    load_weights(model, ckpt / "model.safetensors")
    model.eval()
    tok = tk.load(ckpt / "tokenizer.json")
    return Loaded(ckpt, cfg["kind"], step, model, tok, cfg["model"], train_config)


def read_train_config(path: str | Path) -> TrainConfig:
    """The training config stored in the checkpoint at ``path`` (verified first)."""
    ckpt = find_checkpoint(path)
    verify(ckpt)
    cfg_path = ckpt / "config.json"
    cfg = read_json(cfg_path)
    if cfg.get("format") != FORMAT or not isinstance(cfg.get("train"), dict):
        raise CheckpointError(f"{cfg_path}: not an attnkit checkpoint config")
    try:
        return TrainConfig.from_dict(cfg["train"], str(cfg_path))
    except TypeError as e:
        raise CheckpointError(f"{cfg_path}: invalid checkpoint config ({e})") from None


def check_world(loaded: Loaded, saved_world: int, world_size: int, accumulate: int) -> None:
    """Resuming ``loaded`` (written by ``saved_world`` processes) with ``world_size`` processes
    and ``accumulate``: processes x accumulate must be the checkpoint's, so that every step sees
    the same micro-batches (:func:`attnkit.train.distributed.shard`); the world size alone may
    change (2 processes, or 1 with --accumulate 2). ValueError saying what would fit."""
    old_k = loaded.train_config.accumulate
    before, now = saved_world * old_k, world_size * accumulate
    if before == now:
        return
    hint = (
        f"--accumulate {before // world_size} with {world_size} process(es)"
        if before % world_size == 0
        else f"{before} processes"
    )
    raise ValueError(
        f"accumulate: {loaded.path} was trained with {saved_world} process(es) x --accumulate "
        f"{old_k} = {before} micro-batches per step, this run has {world_size} x {accumulate} = "
        f"{now}; resume with {hint}, so that each step sees the same data"
    )


def restore_rng(
    tensors: dict[str, Tensor], state: dict, *, seed: int, rank: int, world_size: int
) -> str | None:
    """Restore the generators of a resumed run on rank ``rank`` of ``world_size``: the rank's
    own stored torch generator when the checkpoint was written by as many processes (resuming
    is then bit-identical); otherwise the torch generator is seeded from (seed, rank, step) and
    the returned note says that dropout draws differ from an uninterrupted run."""
    saved_world = int(state.get("world_size", 1))
    same = saved_world == world_size
    set_rng_state(tensors, state["rng"], rank, torch_state=same)
    if same:
        return None
    torch.manual_seed(rank_seed(seed, rank, int(state["step"])))
    return (
        f"note: the checkpoint was written by {saved_world} process(es), this run has "
        f"{world_size}: every step sees the same data, but dropout draws differ from those of "
        "an uninterrupted run"
    )
