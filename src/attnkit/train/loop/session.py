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

from attnkit.models.hf_loading import first, read_header
from attnkit.nn.projection import pack_legacy
from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.tasks import build_model
from attnkit.train.loop.best import Best
from attnkit.train.loop.checkpoint import (
    FORMAT,
    CheckpointError,
    find_checkpoint,
    read_json,
    verify,
)
from attnkit.train.loop.distributed import rank_seed
from attnkit.train.loop.legacy_state import pack_optimizer_state
from attnkit.train.loop.state import set_rng_state, torch_rng_key

BEST_RECORD = "best.json"
"""In ``best/``: the :class:`~attnkit.train.loop.best.Best` record (metric, value, step)."""
SECTIONS = {"model": "model's sizes", "train": "training options"}

__all__ = [
    "BEST_RECORD",
    "Loaded",
    "check_out",
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
    characters: str = "",
) -> dict[str, bytes]:
    """The files of a checkpoint (name -> bytes), for
    :func:`~attnkit.train.loop.checkpoint.write_checkpoint`; ``characters``: the tokenizer's
    training characters (:data:`~attnkit.train.data.tokenizer.CHARACTERS`, written when given)."""
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
    } | ({tk.CHARACTERS: characters.encode("utf-8")} if characters else {})


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

    def state(self) -> tuple[dict[str, Tensor], dict]:
        """(state tensors, state JSON) for resuming."""
        f = self.path / "state.safetensors"
        try:
            tensors = st.load_file(str(f))
        except Exception as e:  # safetensors raises its own error type
            raise CheckpointError(f"{f}: corrupted checkpoint file ({e})") from None
        state = read_json(self.path / "state.json")
        if self.separate_qkv and isinstance(state.get("optimizer"), dict):
            try:
                tensors, state["optimizer"] = pack_optimizer_state(
                    self.model, tensors, state["optimizer"]
                )
            except (KeyError, ValueError, RuntimeError, IndexError) as e:
                raise CheckpointError(f"{f}: unusable optimiser state ({e})") from None
        return tensors, state


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


def load(path: str | Path, *, best: bool = False) -> Loaded:
    """Read the checkpoint at ``path`` (a checkpoint or run directory; of a run directory, its
    ``best/`` when ``best`` and it exists, else its last checkpoint), verify every file, check
    config.json against the weights' header (before building anything) and build its model
    (eval mode). CheckpointError naming the file when anything is wrong."""
    ckpt = find_checkpoint(path, best=best)
    verify(ckpt)
    cfg_path = ckpt / "config.json"
    cfg = read_json(cfg_path)
    if cfg.get("format") != FORMAT or cfg.get("kind") not in ("seq2seq", "lm"):
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
    _check_weights_fit(cfg["kind"], cfg["model"], ckpt / "model.safetensors", cfg_path)
    model = build_model(cfg["kind"], cfg["model"])
    load_weights(model, ckpt / "model.safetensors")
    model.eval()
    tok = tk.load(ckpt / "tokenizer.json")
    vocab = model.config.vocab_size if cfg["kind"] == "lm" else model.config.src_vocab_size
    if tok.get_vocab_size() > vocab:
        raise CheckpointError(
            f"{ckpt / 'tokenizer.json'}: {tok.get_vocab_size()} tokens, more than the model's "
            f"vocabulary of {vocab} in config.json"
        )
    record = None
    if (ckpt / BEST_RECORD).is_file():
        saved = read_json(ckpt / BEST_RECORD)
        record = Best.from_dict(saved, str(saved.get("metric")))
    old = any(k.endswith("q_proj.weight") for k in read_header(ckpt / "model.safetensors"))
    return Loaded(ckpt, cfg["kind"], step, model, tok, cfg["model"], train_config, record, old)


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


def check_out(out: Path, resumed: Path | None) -> None:
    """Refuse to start over anything on disk: ``out`` must be new or empty, or the run
    directory of the resumed checkpoint (``resumed``); ValueError naming ``out`` otherwise."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if resumed is None or resumed.parent.resolve() != out.resolve():
            raise ValueError(
                f"out: {out} already exists and is not empty; choose a new --out, or "
                f"--resume {out} to continue that run"
            )


def check_world(loaded: Loaded, saved_world: int, world_size: int, accumulate: int) -> None:
    """Resuming ``loaded`` (written by ``saved_world`` processes) with ``world_size`` processes
    and ``accumulate``: processes x accumulate must be the checkpoint's, so that every step sees
    the same micro-batches (:func:`attnkit.train.loop.distributed.shard`); the world size alone may
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
    # best/ of a run of several processes holds rank 0's generator only
    same = saved_world == world_size and torch_rng_key(rank) in tensors
    set_rng_state(tensors, state["rng"], rank, torch_state=same)
    if same:
        return None
    torch.manual_seed(rank_seed(seed, rank, int(state["step"])))
    return (
        f"note: the checkpoint was written by {saved_world} process(es), this run has "
        f"{world_size}: every step sees the same data, but dropout draws differ from those of "
        "an uninterrupted run"
    )
