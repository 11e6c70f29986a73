"""A checkpoint read back for use: its weights (safetensors, tied matrices stored once), its
tokenizer and configs, and the model built from them, ready for evaluation and decoding.

:func:`load` takes a path or a :class:`~attnkit.train.checkpoint.Checkpoint` already resolved
(found, verified, config.json read) and returns a :class:`Loaded`. Resuming a run (optimiser
and RNG state) is :mod:`attnkit.train.loop.save_resume`'s.
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

from attnkit.models.hf_loading import first, read_header
from attnkit.nn.projection import pack_legacy
from attnkit.train.best import Best
from attnkit.train.checkpoint import BEST_RECORD, Checkpoint, CheckpointError, read_json, resolve
from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.tasks import build_model

__all__ = ["CheckpointError", "Loaded", "load", "load_weights", "weights_bytes"]


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
    best: Best | None = None
    separate_qkv: bool = False
    """Written before the packed in-projection: its optimiser state is packed when read."""

    def describe(self) -> str:
        """Which checkpoint this is, for the user: ``runs/fra/best (the best checkpoint so far:
        held-out loss 1.2345 at step 400)`` or ``runs/fra/step-00000600 (step 600)``."""
        if self.best is not None and self.best.value is not None:
            return f"{self.path} (the best checkpoint of the run: {self.best.describe()})"
        return f"{self.path} (step {self.step})"

    def jsonl(self, name: str) -> list:
        """The items of ``heldout.jsonl`` / ``train_sample.jsonl``."""
        f = self.path / name
        try:
            return [json.loads(s) for s in f.read_text(encoding="utf-8").splitlines() if s]
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{f}: corrupted checkpoint file ({e})") from None

    def characters(self) -> str | None:
        """The tokenizer's training characters (:data:`~attnkit.train.data.tokenizer.CHARACTERS`);
        None for a checkpoint written before they were recorded."""
        f = self.path / tk.CHARACTERS
        return f.read_text(encoding="utf-8") if f.is_file() else None


def _check_weights_fit(kind: str, model_cfg: dict, weights: Path, cfg_path: Path) -> None:
    """Compare the model that ``model_cfg`` describes (built on the meta device: shapes only,
    no memory) with the safetensors header of ``weights`` (nothing loaded), so that a
    config.json whose sizes disagree with the weights is refused before any allocation."""
    try:
        with torch.device("meta"):
            expected = {
                k: tuple(v.shape) for k, v in build_model(kind, model_cfg).state_dict().items()
            }
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: invalid model section ({e})") from None
    try:
        header = read_header(weights)
        with safe_open(str(weights), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    except (ValueError, OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from None
    if not isinstance(aliases, dict):
        raise CheckpointError(f"{weights}: corrupted metadata (aliases is not an object)")
    shapes = {k: shape for k, (shape, _) in header.items()}
    shapes.update({k: shapes[v] for k, v in aliases.items() if v in shapes})
    shapes = _packed_shapes(shapes)
    bad = [
        f"{k} {shapes[k]} (expected {v})"
        for k, v in expected.items()
        if k in shapes and shapes[k] != v
    ]
    missing = [k for k in expected if k not in shapes]
    unknown = [k for k in shapes if k not in expected]
    problems = [f"shape mismatch: {first(bad)}"] if bad else []
    problems += [f"missing weights: {first(missing)}"] if missing else []
    problems += [f"unexpected weights: {first(unknown)}"] if unknown else []
    if problems:
        raise CheckpointError(
            f"{weights}: weights do not match config.json: " + "; ".join(problems)
        )


def _packed_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shapes of a checkpoint's weights under today's names: checkpoints written before
    the packed in-projection hold q/k/v apart (``MultiHeadAttention`` packs them when loading,
    :func:`attnkit.nn.projection.pack_legacy`)."""
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    pack_legacy(meta)
    return {k: tuple(t.shape) for k, t in meta.items()}


def load(path: str | Path | Checkpoint, *, best: bool = False) -> Loaded:
    """Read the checkpoint at ``path`` (a checkpoint or run directory; of a run directory, its
    ``best/`` when ``best`` and it exists, else its last checkpoint; or a
    :class:`~attnkit.train.checkpoint.Checkpoint` already resolved, which is not verified
    again), check config.json against the weights' header (before building anything) and
    build its model (eval mode). CheckpointError naming the file when anything is wrong."""
    ckpt = path if isinstance(path, Checkpoint) else resolve(path, best=best)
    where = ckpt.path
    cfg_path = where / "config.json"
    _check_weights_fit(ckpt.kind, ckpt.model_config, where / "model.safetensors", cfg_path)
    model = build_model(ckpt.kind, ckpt.model_config)
    load_weights(model, where / "model.safetensors")
    model.eval()
    tok = tk.load(where / "tokenizer.json")
    vocab = model.config.vocab_size if ckpt.kind == "lm" else model.config.src_vocab_size
    if tok.get_vocab_size() > vocab:
        raise CheckpointError(
            f"{where / 'tokenizer.json'}: {tok.get_vocab_size()} tokens, more than the model's "
            f"vocabulary of {vocab} in config.json"
        )
    record = None
    if (where / BEST_RECORD).is_file():
        saved = read_json(where / BEST_RECORD)
        record = Best.from_dict(saved, str(saved.get("metric")))
    old = any(k.endswith("q_proj.weight") for k in read_header(where / "model.safetensors"))
    return Loaded(
        where,
        ckpt.kind,
        ckpt.step,
        model,
        tok,
        ckpt.model_config,
        ckpt.train_config,
        record,
        old,
    )
