"""What a run saves and how a resumed run takes it back: the files of a checkpoint (weights,
configs, tokenizer, optimiser/RNG state, data position, held-out data), the output directory's
check, the optimiser/RNG state of a checkpoint read back (:func:`resume_state`), the split of
each step into micro-batches (:func:`check_world`) and the generators (:func:`restore_rng`).
Reading a checkpoint's model is :mod:`attnkit.train.inference.session`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch as st
import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.train.checkpoint import FORMAT, CheckpointError, read_json
from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.inference.session import Loaded, weights_bytes
from attnkit.train.loop.distributed import rank_seed
from attnkit.train.loop.legacy_state import pack_optimizer_state
from attnkit.train.loop.state import set_rng_state, torch_rng_key

__all__ = ["check_out", "check_world", "checkpoint_files", "restore_rng", "resume_state"]


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
    :func:`~attnkit.train.checkpoint.write_checkpoint`; ``characters``: the tokenizer's
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


def resume_state(loaded: Loaded) -> tuple[dict[str, Tensor], dict]:
    """(state tensors, state JSON) of checkpoint ``loaded`` for resuming; the optimiser state of
    a checkpoint written before the packed in-projection packed like its weights."""
    f = loaded.path / "state.safetensors"
    try:
        tensors = st.load_file(str(f))
    except Exception as e:  # safetensors raises its own error type
        raise CheckpointError(f"{f}: corrupted checkpoint file ({e})") from None
    state = read_json(loaded.path / "state.json")
    if loaded.separate_qkv and isinstance(state.get("optimizer"), dict):
        try:
            tensors, state["optimizer"] = pack_optimizer_state(
                loaded.model, tensors, state["optimizer"]
            )
        except (KeyError, ValueError, RuntimeError, IndexError) as e:
            raise CheckpointError(f"{f}: unusable optimiser state ({e})") from None
    return tensors, state


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
