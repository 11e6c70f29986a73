"""A spy for host read-backs (``.item()``, ``.tolist()``, ``bool(tensor)``, ``.cpu()``, ...):
on a CUDA tensor each one stalls the CPU until the GPU's queue drains, so the flex backend's
path must make none. Recorded on CPU tensors too, so the CPU tests check the GPU's path."""

from __future__ import annotations

from torch.overrides import TorchFunctionMode


class ReadBackSpy(TorchFunctionMode):
    """Records every call that reads a tensor's value back to the host."""

    READS = {"item", "tolist", "__bool__", "cpu", "numpy", "__int__", "__float__", "__index__"}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))
