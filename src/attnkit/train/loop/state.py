"""Training state as tensors + JSON (no pickle): the optimiser's state dict and the random
number generators of torch, NumPy and Python.

``optimizer_state(opt)`` returns ``(tensors, meta)``: every tensor of ``opt.state_dict()`` under
a flat name (``optim.<param index>.<key>``) and everything else as JSON-ready values;
``load_optimizer_state`` puts them back. ``rng_state()`` / ``set_rng_state`` do the same for the
generators; with several processes the torch generator of every rank is stored (rank 0's under
``rng.torch``, rank r's under ``rng.torch.rank<r>``), since each rank draws its own dropout.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "load_optimizer_state",
    "optimizer_state",
    "rng_state",
    "set_rng_state",
    "torch_rng_key",
]


def optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """(tensors, meta) of ``opt.state_dict()``."""
    sd = opt.state_dict()
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{idx}.{key}"] = value.detach().cpu().clone()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer_state(
    opt: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict
) -> None:
    """Restore what :func:`optimizer_state` returned (ValueError when it does not fit ``opt``)."""
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if not name.startswith("optim."):
            continue
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, st in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(st)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    opt.load_state_dict({"state": state, "param_groups": groups})


def torch_rng_key(rank: int) -> str:
    """The name of rank ``rank``'s torch generator state in the state tensors."""
    return "rng.torch" if rank == 0 else f"rng.torch.rank{rank}"


def gpu_rng_key(rank: int) -> str:
    """The name of rank ``rank``'s CUDA generator state in the state tensors."""
    return "rng.cuda" if rank == 0 else f"rng.cuda.rank{rank}"


def gpu_rng(device: torch.device) -> Tensor | None:
    """The state of ``device``'s CUDA generator (which dropout on the GPU draws from), or None
    for a CPU run."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def rng_state(
    torch_states: Sequence[Tensor] | None = None, gpu_states: Sequence[Tensor] = ()
) -> tuple[dict[str, Tensor], dict]:
    """(tensors, meta) of the torch, NumPy (legacy global) and Python generators;
    ``torch_states``: every rank's torch generator state, in rank order (default: this
    process's only); ``gpu_states``: every rank's CUDA generator state on a GPU run."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    meta = {
        "numpy": [np_state[0], np_state[1].tolist(), *map(_plain, np_state[2:])],
        "python": [py_version, list(py_internal), py_gauss],
    }
    states = [torch.get_rng_state()] if torch_states is None else list(torch_states)
    tensors = {torch_rng_key(r): s for r, s in enumerate(states)}
    return tensors | {gpu_rng_key(r): s.cpu() for r, s in enumerate(gpu_states)}, meta


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def set_rng_state(
    tensors: dict[str, Tensor], meta: dict, rank: int = 0, *, torch_state: bool = True
) -> None:
    """Restore what :func:`rng_state` returned: rank ``rank``'s torch generator (unless
    ``torch_state`` is False; with it, the rank's CUDA generator when the checkpoint holds it
    and this process has a GPU) and the NumPy and Python generators."""
    if torch_state:
        torch.set_rng_state(tensors[torch_rng_key(rank)])
        if gpu_rng_key(rank) in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors[gpu_rng_key(rank)].cpu())
    name, key, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
