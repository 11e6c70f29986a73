"""Run a numba C callback on torch's own OpenMP threads (a parallel region, as ``at::parallel_for``
opens one).

A decode step is tens of microseconds of work per thread. Handing it to a Python thread pool
costs as much again (a round trip to an idle ``ThreadPoolExecutor`` worker measured 75 us on a
2-core VM, where SDPA's whole step at Lk = 2048 takes 88 us), and a second set of busy threads
would compete for the cores with torch's, which spin for a while after each of torch's parallel
ops. So the decode kernels run on torch's threads themselves: :func:`parallel` calls the OpenMP
runtime torch is linked to (``GOMP_parallel``, the entry point of the GNU OpenMP ABI, which
LLVM's OpenMP runtime also provides), with a C callback compiled by numba (``numba.cfunc``).
The caller is one of the region's threads, and the call returns when every thread has.

Where torch is not built with OpenMP, or its runtime's entry point is not found, :func:`available`
is False and the kernels fall back to :func:`attnkit.kernels.numba.runtime.launch`. It is also
False in a process forked from one that ran (GNU) OpenMP threads: the child inherits the runtime's
thread pool without its threads, and a parallel region there never returns (torch's own threaded
ops hang there too); the thread pool, built per process, serves the child instead.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

__all__ = ["available", "parallel"]

_FORKED = False
"""True in a process forked from the one that imported this module."""


def _forked() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_forked)


@functools.cache
def _entry():
    """torch's ``GOMP_parallel(fn, data, num_threads, flags)``, or None."""
    if os.environ.get("ATTNKIT_NO_OPENMP"):
        return None
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        fn = ctypes.CDLL(None).GOMP_parallel  # loaded with torch, into the global namespace
    except (AttributeError, OSError, TypeError):  # not exported, or no dlopen(NULL) (Windows)
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    fn.restype = None
    return fn


def available() -> bool:
    """True when :func:`parallel` can run: torch uses OpenMP, its runtime was found, and this is
    not a forked child (module docstring). Setting ``ATTNKIT_NO_OPENMP`` (any value) before the
    first call makes it False."""
    return not _FORKED and _entry() is not None


def parallel(body: int, data: int, threads: int) -> None:
    """Run the C function at address ``body`` (``void body(intptr_t data)``) with ``data`` on
    ``threads`` of torch's OpenMP threads (the caller among them); returns when all have
    returned. The GIL is released meanwhile. Requires :func:`available`."""
    _entry()(body, data, threads, 0)
