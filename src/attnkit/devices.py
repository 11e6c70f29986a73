"""Where a command runs: ``--device cpu|cuda|mps`` checked against this torch build and machine,
and a context in which the model, its inputs and every tensor a command creates live there.

``with use_device(resolve("cuda")): ...`` makes ``cuda`` torch's default device inside the
block (``torch.device`` as a context manager), so models built inside it and the tensors they
create (positions, caches, decoding state) are on the GPU without every function taking a
device argument; weights read from a checkpoint (always on the CPU, written from CPU copies)
are copied there by ``load_state_dict``, so a run trained on one device is read on any other.

What stays on the host: mask objects (:mod:`attnkit.masks` computes on the CPU and the kernels
copy what they need), and batches, which are padded on the host and then copied with
:func:`to_run_device` (pinned memory and ``non_blocking`` on CUDA, so the copy overlaps the
GPU's work instead of a copy per row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["DEVICES", "current", "resolve", "to_run_device", "use_device"]

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


def current() -> torch.device:
    """The run's device: the one :func:`use_device` made the default (``cpu`` outside it)."""
    return torch.get_default_device()


def to_run_device(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Host tensors (a batch) on the run's device (:func:`current`): the tensors themselves on
    the CPU; on CUDA pinned and copied with ``non_blocking=True`` (the copy is queued on the
    stream, ahead of the kernels that read it, and the host goes on preparing the next batch)."""
    device = current()
    if device.type == "cpu":
        return tensors
    if device.type == "cuda":
        tensors = tuple(t.pin_memory() for t in tensors)
    return tuple(t.to(device, non_blocking=True) for t in tensors)
