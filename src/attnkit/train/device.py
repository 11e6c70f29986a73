"""Where a command runs: ``--device cpu|cuda|mps`` checked against this torch build and machine,
and a context in which the model, its inputs and every tensor a command creates live there.

``with use_device(resolve("cuda")): ...`` makes ``cuda`` torch's default device inside the
block (``torch.device`` as a context manager), so models built and batches padded inside it are
created on the GPU without every function taking a device argument; weights read from a
checkpoint are copied there by ``load_state_dict``. Checkpoints are always written from CPU
copies, so a run trained on one device is read on any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["DEVICES", "resolve", "use_device"]

DEVICES = ("cpu", "cuda", "mps")


def resolve(name: str) -> torch.device:
    """``name`` ("cpu", "cuda", "cuda:N" or "mps") as a torch.device, or ValueError naming
    ``device`` and saying what this machine has."""
    if not isinstance(name, str):
        raise TypeError(f"device: expected one of {DEVICES}, got {type(name).__name__}")
    kind, _, index = name.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"device: expected cpu, cuda, cuda:N or mps, got {name!r}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no visible GPU"
            raise ValueError(
                f"device: cuda is not available (torch {torch.__version__}: {build}); install "
                "a CUDA build of torch on a machine with an NVIDIA GPU, or use --device cpu"
            )
        if index and int(index) >= torch.cuda.device_count():
            raise ValueError(
                f"device: {name} does not exist ({torch.cuda.device_count()} GPU(s) visible)"
            )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            "device: mps is not available (it needs Apple silicon and a torch build with MPS); "
            "use --device cpu"
        )
    return torch.device(name)


@contextlib.contextmanager
def use_device(device: torch.device) -> Iterator[None]:
    """Inside the block, tensors and modules are created on ``device`` by default."""
    if device.type == "cpu":
        yield
        return
    with device:
        yield
