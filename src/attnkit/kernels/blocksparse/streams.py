"""Streams of small SDPA calls: a plan's calls shared out between torch's threads, each call run
on one thread, instead of each call opening a parallel region of all of them.

A blocksparse plan is many small fused calls (one per query block, or per batch element and
query block). Run one after the other, every call opens an OpenMP parallel region over its few
heads and rows and ends at a barrier; when another process holds one of the cores, each barrier
waits for a descheduled thread, and the calls lose to dense SDPA's single region by 2-5x
(measured on a 2-core EPYC at load 7: 32 per-element calls of a BERT batch, 152-640 ms against
72-195 ms for the whole batch at once). In streams, each of ``torch.get_num_threads()`` worker
threads takes a share of the calls (longest first, to the least loaded stream) and runs them
with an OpenMP team of one, so no call waits for another thread: the same batch took 46 ms
against the whole batch's 110 ms in the same run.

The workers are this module's own threads, each set to one thread with ``torch.set_num_threads``:
with torch on OpenMP that is a per-thread setting (the team size of the OpenMP runtime, and the
BLAS's), so the caller's threads keep theirs; torch's default for threads not yet started, which
it also sets, is put back. On torch's other thread pools the setting is process-wide, so streams
need OpenMP. The caller's grad mode and inference mode are carried into the worker (both are
thread-local in torch). A call on one thread may round differently from the same call on
several (the fused kernel's blocking follows the thread count), never more than that.

:func:`streams_for` says how many streams a run of calls gets (1: run them in the caller).
"""

from __future__ import annotations

import functools
import heapq
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

__all__ = ["available", "run_streams", "share_out", "streams_for"]

T = TypeVar("T")

MIN_CALLS_PER_STREAM = 2
"""Fewest calls per stream: with fewer, one long call would leave the other streams idle."""

_STATE = threading.local()
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_LOCK = threading.Lock()


def _after_fork() -> None:
    global _POOL, _POOL_SIZE
    _POOL, _POOL_SIZE = None, 0  # the child has none of the parent's worker threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@functools.cache
def available() -> bool:
    """True when calls can run in streams: torch's parallel backend is OpenMP (module
    docstring). Setting ``ATTNKIT_NO_STREAMS`` (any value) before the first call makes it
    False."""
    if os.environ.get("ATTNKIT_NO_STREAMS"):
        return False
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def _init_worker(ready: threading.Barrier) -> None:
    # One thread for torch's parallel loops and for the BLAS inside them: with the OpenMP team
    # alone (omp_set_num_threads) the BLAS kept two threads and opened a region per product,
    # 10x slower. torch's own per-thread set-up first (get_num_threads), or it would undo this
    # at the first parallel loop; set_num_threads also sets the default of threads not yet
    # started, which the pool puts back (:func:`_pool`).
    torch.get_num_threads()
    torch.set_num_threads(1)
    _STATE.worker = True
    ready.wait()


def streams_for(n_calls: int) -> int:
    """How many streams ``n_calls`` calls get: ``torch.get_num_threads()`` when streams are
    available, the caller is not itself a stream, and every stream gets at least
    :data:`MIN_CALLS_PER_STREAM` calls; else 1 (run them in the caller)."""
    if n_calls < 2 * MIN_CALLS_PER_STREAM or getattr(_STATE, "worker", False):
        return 1
    threads = torch.get_num_threads()
    if threads < 2 or not available():
        return 1
    return max(1, min(threads, n_calls // MIN_CALLS_PER_STREAM))


def _pool(size: int) -> ThreadPoolExecutor:
    """The workers, at least ``size``, each set up before the first stream: every one passes
    the barrier of its set-up, then the caller's thread count is the default again."""
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE < size:
            old, threads = _POOL, torch.get_num_threads()
            ready = threading.Barrier(size + 1)
            _POOL = ThreadPoolExecutor(
                size, "attnkit-stream", initializer=_init_worker, initargs=(ready,)
            )
            _POOL_SIZE = size
            for _ in range(size):  # start every worker: each blocks in its set-up until all do
                _POOL.submit(int)
            ready.wait()
            torch.set_num_threads(threads)  # the default of new threads, as the caller had it
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def share_out(costs: Sequence[float], streams: int) -> list[list[int]]:
    """Indices of the calls per stream: longest first, each to the least loaded stream; each
    stream keeps its calls in their original order."""
    heap = [(0.0, s) for s in range(streams)]
    shares: list[list[int]] = [[] for _ in range(streams)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        load, s = heapq.heappop(heap)
        shares[s].append(i)
        heapq.heappush(heap, (load + float(costs[i]), s))
    return [sorted(s) for s in shares if s]


def run_streams(jobs: Sequence[Callable[[], T]], costs: Sequence[float], streams: int) -> list[T]:
    """Run ``jobs`` (each a call without arguments) in ``streams`` streams, shared out by
    ``costs`` (any unit); their results in the order of ``jobs``. Jobs must not write to the
    same memory. With ``streams`` <= 1 they run in the caller, in order. The first exception
    of a job is raised once every stream has ended."""
    if len(costs) != len(jobs):
        raise ValueError(f"costs: expected one per job ({len(jobs)}), got {len(costs)}")
    if streams <= 1:
        return [j() for j in jobs]
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def stream(indices: list[int]) -> list[tuple[int, T]]:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return [(i, jobs[i]()) for i in indices]

    pool = _pool(streams)
    futures: list[Future] = [pool.submit(stream, s) for s in share_out(costs, streams)]
    results: list = [None] * len(jobs)
    error: BaseException | None = None
    for f in futures:
        try:
            for i, r in f.result():
                results[i] = r
        except BaseException as e:  # noqa: BLE001 - re-raised after every stream ended
            error = error or e
    if error is not None:
        raise error
    return results
