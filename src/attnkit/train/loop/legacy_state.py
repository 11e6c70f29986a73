"""The optimiser state of checkpoints written before the packed in-projection.

Those checkpoints hold each attention's q, k and v projections apart (``q_proj``, ``k_proj``,
``v_proj``, weight and bias each), and their optimiser state has one entry per such parameter.
Today's ``MultiHeadAttention`` packs them (:mod:`attnkit.nn.projection`); the weights are packed
when loaded, and :func:`pack_optimizer_state` packs the optimiser state the same way, so that a
run started before the change resumes where it stopped (AdamW's moments of the three blocks
stacked as the weights are; the step count is shared).

The optimiser's parameter order is :func:`attnkit.train.loop.optim.decay_groups`'s: matrices,
then the rest, each in ``model.parameters()`` order; the old order is the same with every packed
parameter replaced by its q, k, v parts.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.nn.projection import LEGACY
from attnkit.train.loop.optim import decay_groups

__all__ = ["pack_optimizer_state"]

_PARTS = {"in_proj.weight": "weight", "in_proj.bias": "bias"}
_SEPARATE = {f"in_proj.{n[0]}_weight": n for n in LEGACY}


def _old_names(name: str) -> list[str]:
    """The old parameter names a parameter of today's model stands for."""
    prefix, sep, last = name.rpartition("in_proj.")
    if not sep or (prefix and not prefix.endswith(".")):
        return [name]
    key = "in_proj." + last
    if key in _PARTS:
        return [f"{prefix}{n}.{_PARTS[key]}" for n in LEGACY]
    if key in _SEPARATE:
        return [f"{prefix}{_SEPARATE[key]}.weight"]
    return [name]


def pack_optimizer_state(
    model: nn.Module, tensors: dict[str, Tensor], meta: dict
) -> tuple[dict[str, Tensor], dict]:
    """(tensors, meta) of :func:`attnkit.train.loop.state.optimizer_state` saved with the old
    separate q/k/v parameters -> the same for ``model`` (today's packed parameters). Tensors
    other than the optimiser's (``optim.<index>.<key>``) pass unchanged."""
    names = {id(p): n for n, p in model.named_parameters()}
    new_groups = [[names[id(p)] for p in g["params"]] for g in decay_groups(model, 0.0)]
    old_index: dict[str, int] = {}
    for group in new_groups:
        for name in group:
            for old in _old_names(name):
                old_index[old] = len(old_index)
    out = {k: v for k, v in tensors.items() if not k.startswith("optim.")}
    scalars_in, scalars = meta.get("scalars", {}), {}
    new = 0
    for group in new_groups:
        for name in group:
            olds = [old_index[o] for o in _old_names(name)]
            keys = {k.split(".", 2)[2] for k in tensors if k.split(".", 2)[1] == str(olds[0])}
            for key in keys:
                parts = [tensors[f"optim.{o}.{key}"] for o in olds]
                packed = parts[0] if parts[0].dim() == 0 else torch.cat(parts)
                out[f"optim.{new}.{key}"] = packed
            if str(olds[0]) in scalars_in:
                scalars[str(new)] = scalars_in[str(olds[0])]
            new += 1
    starts = [0, len(new_groups[0])]
    groups = [
        dict(g, params=list(range(s, s + len(ng))))
        for g, s, ng in zip(meta["param_groups"], starts, new_groups, strict=True)
    ]
    return out, dict(meta, param_groups=groups, scalars=scalars)
