"""What goes into a checkpoint and how it comes back: weights (safetensors), the configs
(JSON), the tokenizer, the optimiser/RNG state, the data position and the held-out data.

:func:`checkpoint_files` builds the files; :func:`load` reads a checkpoint (verifying it)
into a :class:`Loaded` with the model ready for evaluation and decoding.
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
from attnkit.train.tasks import build_model

__all__ = [
    "Loaded",
    "checkpoint_files",
    "load",
    "load_weights",
    "read_train_config",
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
