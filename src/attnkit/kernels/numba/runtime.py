"""The numba runtime of attnkit's kernels: availability, the on-disk cache, loading a kernel
module, and running a kernel over work units on torch's threads.

Any numba kernel module can use it. A kernel module is plain Python: module-level functions
decorated with ``numba.njit(cache=True, ...)``; it imports numba when it is imported, so the rest
of attnkit imports it only through :func:`load_kernels` (when a kernel first runs), which points
numba's cache at a directory chosen by :func:`cache_dir` while the module's decorators run.

Threads: the kernels release the GIL (``nogil=True``) and :func:`launch` runs them on
``torch.get_num_threads()`` Python threads that share the work units; numba's own thread pool is
never started, so it cannot compete with torch's.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import torch

from attnkit.kernels.tuning import DEFAULT, current

PARTS_PER_THREAD = DEFAULT.numba_parts_per_thread
"""Built-in default: work is cut into about this many parts per thread, handed out as threads
become free (in use: :func:`parts_per_thread`)."""

_LOCK = threading.Lock()
"""Held while a kernel module is imported (its decorators run with numba's cache directory
set). A process forked while another of its threads held it gets a new one: the child has no
such thread, and its first kernel load would otherwise wait forever."""


def _new_lock_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_new_lock_in_child)


@functools.cache
def numba_missing() -> str | None:
    """None when numba (and attnkit's numba helpers) import, else why not."""
    try:
        import numba

        from attnkit.kernels.numba import nbmath  # noqa: F401
    except Exception as e:  # any import failure (missing, ABI mismatch) means: not available
        return f"numba is not usable: {type(e).__name__}: {e}"
    if numba.config.DISABLE_JIT:
        return "numba's JIT is disabled (NUMBA_DISABLE_JIT is set)"
    return None


def cache_dir(name: str, files: Sequence[Path]) -> str:
    """A writable directory for numba's on-disk cache of the kernels built from ``files``.

    Its name carries a hash of ``files``: numba only notices changes to the file that defines a
    kernel, not to the helpers it inlines from other files or the constants it reads from them.
    It also carries the CPU target ($NUMBA_CPU_NAME/$NUMBA_CPU_FEATURES, "host" when unset), so
    kernels compiled for a generic CPU (``make test-portable``) never share a directory with the
    native build (numba keys its entries by CPU as well; this keeps the two apart on disk).
    Candidates: $NUMBA_CACHE_DIR/attnkit-<name>-<hash>, attnkit's kernels/__pycache__, then
    $XDG_CACHE_HOME (or ~/.cache)/attnkit/; the first writable one wins, else a new temporary
    directory (the kernels then compile again in every process).
    """
    digest = hashlib.sha1()
    for f in files:
        digest.update(Path(f).read_bytes())
    cpu = os.environ.get("NUMBA_CPU_NAME") or "host"
    if os.environ.get("NUMBA_CPU_FEATURES"):
        cpu += "-" + hashlib.sha1(os.environ["NUMBA_CPU_FEATURES"].encode()).hexdigest()[:8]
    tag = f"{name}-{cpu}-{digest.hexdigest()[:12]}"
    candidates = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(Path(os.environ["NUMBA_CACHE_DIR"]) / f"attnkit-{tag}")
    candidates.append(Path(__file__).resolve().parent / "__pycache__" / f"numba-{tag}")
    user = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates.append(Path(user) / "attnkit" / f"numba-{tag}")
    return first_writable(candidates) or tempfile.mkdtemp(prefix=f"attnkit-numba-{tag}-")


def first_writable(dirs: Sequence[Path]) -> str | None:
    """The first of ``dirs`` that exists or can be created and accepts a file, else None."""
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=d).close()
            return str(d)
        except OSError:
            continue
    return None


def load_kernels(module: str, files: Sequence[Path]) -> ModuleType:
    """Import the kernel module ``module`` (once per process) with numba's cache directory set
    to :func:`cache_dir` of ``files`` while its ``@njit(cache=True)`` decorators run. Compiling
    (or loading from the cache) happens on each kernel's first call."""
    with _LOCK:
        if module in sys.modules:
            return sys.modules[module]
        import numba

        old = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = cache_dir(module.rsplit(".", 2)[-2], files)
        try:
            return importlib.import_module(module)
        finally:
            numba.config.CACHE_DIR = old


def launch(kernel: Callable, args: tuple, units: int) -> None:
    """Run ``kernel(*args, first, step)`` over ``units`` work units on torch's number of threads:
    one part per call (units first, first + step, ...), about :func:`parts_per_thread` parts
    per thread."""
    threads = max(1, min(torch.get_num_threads(), units))
    if threads == 1:
        kernel(*args, 0, 1)
        return
    parts = min(units, parts_per_thread() * threads)
    pool = _pool(threads, os.getpid())
    for f in [pool.submit(kernel, *args, i, parts) for i in range(parts)]:
        f.result()


def parts_per_thread() -> int:
    """Work parts per thread of a launch: ``numba_parts_per_thread`` of the tuning in use."""
    return current().numba_parts_per_thread


@functools.cache
def _pool(threads: int, pid: int) -> ThreadPoolExecutor:
    """A pool per thread count and process (a forked child must not reuse its parent's pool,
    whose threads it does not have)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="attnkit-numba")
