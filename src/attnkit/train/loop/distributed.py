"""Training on several processes: PyTorch's DistributedDataParallel (DDP), started by torchrun.

``torchrun --nproc_per_node=N -m attnkit train ...`` starts N processes and gives each the
environment variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; :func:`join` reads them, forms the process group (``gloo`` on CPU,
``nccl`` for a CUDA device) and gives the trainer a :class:`Dist`. Without those variables (or
with ``WORLD_SIZE=1``) everything here is a no-op and training runs in one process.

Data: every process computes the same epoch order (a function of (seed, epoch)); :func:`shard`
gives each rank a disjoint part of it. Global step ``s`` of an epoch uses the ``W * K``
micro-batches ``s*W*K ... s*W*K + W*K - 1`` of the order (``W`` processes, ``K`` accumulation
micro-batches): rank ``r`` takes the micro-batches ``s*W*K + k*W + r`` for ``k = 0 .. K-1``. So a
step's data depend on ``W * K`` only, never on how it is split between processes and
accumulation, and the run's position is still (epoch, index of the next micro-batch).

Failures: every collective has the process group's timeout. A process that exits closes its
connections, and the others fail at their next collective at once; a process that stops
responding makes them fail after the timeout. Either way :meth:`Dist.guard` turns the backend's
error into a one-line :class:`DistributedError` (a ``ConnectionError``, so the CLI prints it
without a traceback and exits with code 2).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from attnkit.checks import positive_float, positive_int

__all__ = [
    "DEFAULT_TIMEOUT",
    "Dist",
    "DistributedError",
    "environment",
    "is_main_process",
    "join",
    "rank_seed",
    "shard",
]

T = TypeVar("T")

DEFAULT_TIMEOUT = 300.0
"""Seconds a collective waits for the other processes. It bounds how long a process that
stopped responding can hold the others, and must exceed the longest pause of rank 0 (an
evaluation plus a checkpoint save), during which the other ranks wait."""


class DistributedError(ConnectionError):
    """Another process of the run failed, stopped responding, or the group could not form."""


def shard(batches: Sequence[T], world_size: int, rank: int, accumulate: int = 1) -> list[list[T]]:
    """This rank's micro-batches of one epoch, one list of ``accumulate`` per global step.

    ``out[s][k] = batches[s*W*K + k*W + rank]`` (``W`` = world_size, ``K`` = accumulate) for
    ``s < len(batches) // (W*K)``: the ranks' shards are disjoint, together they cover the
    epoch except a ragged tail of fewer than ``W*K`` batches (dropped, so every rank runs the
    same number of steps), and the result is a pure function of the arguments.
    """
    world_size = positive_int("world_size", world_size)
    accumulate = positive_int("accumulate", accumulate)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank!r}")
    per_step = world_size * accumulate
    steps = len(batches) // per_step
    return [
        [batches[s * per_step + k * world_size + rank] for k in range(accumulate)]
        for s in range(steps)
    ]


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """A 63-bit torch seed for ``rank``'s dropout, different per rank (and per ``step``, used
    when a checkpoint's per-rank generators cannot be restored)."""
    state = np.random.SeedSequence([seed, rank, step, 0xDD9]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer environment variable, got {raw!r}") from None


def environment() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) from torchrun's environment variables, or None when the
    process was not started as one of several (no ``WORLD_SIZE``, or ``WORLD_SIZE=1``)."""
    world = _env_int("WORLD_SIZE")
    if world is None or world == 1:
        return None
    if world < 1:
        raise ValueError(f"WORLD_SIZE: expected a positive integer, got {world}")
    rank, local = _env_int("RANK"), _env_int("LOCAL_RANK")
    if rank is None or not 0 <= rank < world:
        raise ValueError(
            f"RANK: expected 0 <= RANK < WORLD_SIZE={world} (set by torchrun), got "
            f"{os.environ.get('RANK')!r}"
        )
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise ValueError(f"{name}: not set; start the processes with torchrun")
    return rank, world, rank if local is None else local


def is_main_process() -> bool:
    """True in the process that writes files and prints (rank 0, or the only process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    env = environment()
    return env is None or env[0] == 0


def _reason(e: BaseException) -> str:
    """The backend's message on one line, without its source location and advice."""
    msg = " ".join(str(e).split())
    msg = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", msg)
    msg = msg.split(" This is typically")[0]
    return msg[:200] or type(e).__name__


def _is_comm_error(e: BaseException) -> bool:
    if isinstance(e, getattr(torch.distributed, "DistError", ())):
        return True
    text = str(e)
    markers = ("gloo", "NCCL", "Connection closed", "Connection reset", "Timed out", "Socket")
    return isinstance(e, RuntimeError) and any(m in text for m in markers)


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world_size`` (``local_rank`` on its
    machine) and the collectives' ``timeout`` in seconds; ``device``: where the collectives'
    tensors live ("cpu" for gloo; "cuda" for NCCL, which reduces GPU tensors only: the small
    host values and generator states are copied there and back). ``Dist()`` is a single
    process, for which every method below is a no-op or the identity."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout: float = DEFAULT_TIMEOUT
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints, the log and the progress bar."""
        return self.rank == 0

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Turn a failed collective inside the block into a one-line DistributedError that says
        ``what`` was being done (e.g. "step 12")."""
        try:
            yield
        except (RuntimeError, TimeoutError) as e:
            if not self.enabled or not _is_comm_error(e):
                raise
            raise DistributedError(
                f"rank {self.rank}: lost contact with another process of the run ({what}; "
                f"world size {self.world_size}): one exited or did not respond within "
                f"{self.timeout:g} s ({_reason(e)})"
            ) from None

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """The sum over all ranks of each value (float64; exact for integers below 2**53)."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape and dtype on every rank), in rank order."""
        if not self.enabled:
            return [t]
        src = t.to(self.device).contiguous()
        out = [torch.empty_like(src) for _ in range(self.world_size)]
        torch.distributed.all_gather(out, src)
        return [o.to(t.device) for o in out]

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.enabled:
            torch.distributed.barrier()

    def all_ok(self, ok: bool) -> bool:
        """True when every rank passes ``ok=True`` (so all stop together when one failed)."""
        return self.all_sum([0.0 if ok else 1.0])[0] == 0.0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` in DistributedDataParallel (parameters and buffers broadcast from rank 0
        once; buffers, which training never changes, are not re-sent before every forward)."""
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, forward_sync_buffers=False)

    def sync(self, model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's backward: DDP's ``no_sync()`` unless ``last`` (only
        the last micro-batch of a step all-reduces the accumulated gradients)."""
        if self.enabled and not last:
            return model.no_sync()
        return contextlib.nullcontext()


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _collective_device(backend: str, local_rank: int) -> str:
    """Where a ``backend`` group's collectives read their tensors: this process's GPU for NCCL
    (``cuda:LOCAL_RANK``, the device :func:`join` selected), the host otherwise."""
    return f"cuda:{local_rank}" if backend == "nccl" else "cpu"


_formed: dict[str, float] = {}  # the timeout of the group join() formed, once per process


def join(timeout: float = DEFAULT_TIMEOUT, device: str | torch.device = "cpu") -> Dist:
    """The :class:`Dist` of this process.

    Under torchrun (``WORLD_SIZE`` > 1) the first call forms the default process group
    (``gloo`` for a CPU ``device``, ``nccl`` for CUDA; every collective bounded by ``timeout``
    seconds), which later calls reuse (with its first timeout) and which is destroyed when the
    process exits: re-forming a group on the same ``MASTER_PORT`` within one process races with
    the other ranks. A group the caller formed is used as it is; without torchrun's variables,
    ``Dist()`` (one process). DistributedError when the group cannot form in time.
    """
    timeout = positive_float("dist_timeout", timeout)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        timeout = _formed.get("timeout", timeout)
        local = _env_int("LOCAL_RANK") or 0
        where = _collective_device(dist.get_backend(), local)
        return Dist(dist.get_rank(), dist.get_world_size(), local, timeout, where)
    env = environment()
    if env is None:
        return Dist(timeout=timeout)
    if not dist.is_available():
        raise ValueError("WORLD_SIZE: this PyTorch build has no torch.distributed")
    rank, world, local = env
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(local)
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        dist.init_process_group(
            _backend(device),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except (RuntimeError, TimeoutError) as e:
        raise DistributedError(
            f"rank {rank}: the {world} processes did not all join at {where} within "
            f"{timeout:g} s ({_reason(e)})"
        ) from None
    _formed["timeout"] = timeout
    atexit.register(_leave)
    return Dist(rank, world, local, timeout, _collective_device(_backend(device), local))


def _leave() -> None:
    with contextlib.suppress(Exception):
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
