"""Assert that a call which raises did no work first: no backend ran, no projection, no
attention, no normalisation (the "validate everything first" rule of the project brief).

    with no_work() as seen:
        with pytest.raises(ValueError):
            multi_head_attention(..., w_o=bad)
    assert not seen, seen

``seen`` lists every backend ``run`` and every compute op (from ``WORK``) called inside the
block; metadata reads (shape, dtype, ``dim()``) and the small index tensors a mask builds to
check its lengths are not work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from attnkit.kernels import BACKENDS

WORK = {
    F.linear,
    F.scaled_dot_product_attention,
    F.layer_norm,
    F.dropout,
    F.relu,
    F.gelu,
    F.softmax,
    torch.matmul,
    torch.bmm,
    torch.baddbmm,
    torch.einsum,
    torch.softmax,
    torch.tanh,
    torch.Tensor.__matmul__,
    torch.Tensor.matmul,
    torch.Tensor.softmax,
    torch.Tensor.tanh,
    torch.Tensor.repeat_interleave,
}


class _Watch(TorchFunctionMode):
    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in WORK:
            self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@contextmanager
def no_work() -> Iterator[list[str]]:
    """Record backend runs and compute ops inside the block (see the module docstring)."""
    seen: list[str] = []
    saved = {name: b.__dict__.get("run") for name, b in BACKENDS.items()}

    def recorder(name):
        def run(call):
            seen.append(f"backend {name}")
            raise AssertionError(f"backend {name} ran")

        return run

    for name, b in BACKENDS.items():
        b.run = recorder(name)
    try:
        with _Watch(seen):
            yield seen
    finally:
        for name, b in BACKENDS.items():
            if saved[name] is None:
                del b.run
            else:
                b.run = saved[name]
