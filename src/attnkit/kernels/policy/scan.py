"""The input scan of the NaN/inf/overflow policy: max|x| over a tensor's entries, exactly, with
NaN and +-inf reported (``math.nan`` when any entry is NaN, else ``math.inf`` when any is +-inf).

Two implementations that return the same float for every tensor:

- :func:`absmax_torch`: ``torch.aminmax`` on the storage-order view (any layout, any device).
  The reference.
- :func:`absmax_bits`: one integer max over the entries' bit patterns with the sign bit cleared
  (:mod:`attnkit.kernels.policy.absmax_kernels`, numba, one call, single pass, no temporaries; the
  module docstring there says why this is exact). Only for CPU tensors whose distinct entries
  form one dense block in memory (:func:`dense_span`: contiguous, any permutation of dims,
  expanded dims, storage offsets), or equal runs at a fixed stride (:func:`row_span`: the q, k
  or v slice of a packed in-projection's output, one run per token); None otherwise.

:func:`absmax` takes the second when it applies. At attention's per-call sizes the torch
reduction costs a dispatch, a temporary and, above 32k entries, a wake-up of torch's thread
pool per tensor; the bit scan reads the block once (about 5 us for q, k and v of
(1, 8, 64, 64) float32 on an AVX-512 core, against 25-35 us for the torch reductions).

Numba's one-time cost (importing numba, loading the compiled kernels from numba's on-disk cache,
or compiling them when the cache is cold) is paid by the first scan of a CPU tensor in the
process, for all six kernels at once (:func:`kernels_status` says whether it was paid), so no
later call stalls. A background thread was measured as well: its import and loading hold the
GIL, so calls made meanwhile stalled for up to 1-2 s each instead of the first call alone.

One thread reads the tensors. Reading is bound by memory bandwidth: on the 2-core machine of
the benchmarks, k and v of a decode step (2 x 4 MiB) took 350-380 us with the numba scan, with
torch's two-thread reductions and with the numba scan split over two threads alike, and the
split scan lost 150-300 us per call (thread hand-off) whenever the other core was busy.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from attnkit.kernels.call.layout import ScanPlan, Span
from attnkit.kernels.tuning import DEFAULT, current

__all__ = [
    "absmax",
    "absmax3",
    "absmax_bits",
    "absmax_torch",
    "dense_span",
    "float32_maxima",
    "kernels_status",
    "plan3",
    "planned_kernel32",
    "row_span",
]

THREADED_MIN = DEFAULT.scan_threaded_min
"""Built-in default (in use: ``tuning.current().scan_threaded_min``, measured by ``attnkit
tune``) of the entries of q, k and v together from which, when torch has more than one thread,
the scan uses torch's threaded reduction instead of the serial bit scan: both read memory at their
bandwidth, and well above 2.4M entries two threads read it faster (measured on a 2-core AVX-512
Xeon: 2.4M entries 0.44 ms either way, 4.7M 0.91 against 1.10 ms, 9.4M 2.5 against 3.4 ms).
Decode steps (2.1M entries for a 2048-key, 8-head cache) stay below it."""

_I16, _I32, _I64 = struct.Struct("=h"), struct.Struct("=i"), struct.Struct("=q")
_F16, _F32, _F64 = struct.Struct("=e"), struct.Struct("=f"), struct.Struct("=d")
_I32x3, _F32x3 = struct.Struct("=3i"), struct.Struct("=3f")
_X3 = {
    torch.float16: (struct.Struct("=3h"), struct.Struct("=3e")),
    torch.float32: (_I32x3, _F32x3),
    torch.float64: (struct.Struct("=3q"), struct.Struct("=3d")),
}
_INF_BITS = {
    torch.float16: 0x7C00,
    torch.bfloat16: 0x7F80,
    torch.float32: 0x7F800000,
    torch.float64: 0x7FF0000000000000,
}
_PLAIN = (Tensor, torch.nn.Parameter)
"""Tensor types whose memory the bit scan reads; subclasses (fake, functorch or user tensors)
get the torch scan, which dispatches through them."""
_FLOAT32 = torch.float32
_NUMBA = Path(__file__).resolve().parent.parent / "numba"  # the shared numba helpers
_state: dict[str, object] = {}
"""``kernels``: the numba module (None: numba is not usable; absent: not loaded yet);
``ready``: the numba module once loaded and every kernel warmed (absent otherwise)."""


def absmax_torch(t: Tensor) -> float:
    """max|t| (``nan`` / ``inf`` when ``t`` holds NaN / +-inf) with ``torch.aminmax``; any
    non-empty floating tensor (any layout or device)."""
    t = t.detach()
    view = t.permute(sorted(range(t.dim()), key=lambda i: -t.stride(i)))  # reads in place
    lo, hi = torch.stack(torch.aminmax(view)).tolist()
    if math.isnan(lo) or math.isnan(hi):
        return math.nan
    return max(-lo, hi)


def dense_span(t: Tensor) -> int | None:
    """The number of elements of the dense memory block, starting at ``t.data_ptr()``, that
    holds exactly ``t``'s distinct entries; None when there is none (gaps between entries):
    :func:`row_span` when it is a single run."""
    span = row_span(t)
    return span.width if span is not None and span.rows == 1 else None


def row_span(t: Tensor) -> Span | None:
    """The :class:`Span` that holds exactly ``t``'s distinct entries; None when there is none.

    Dims of size 1 or stride 0 (expanded) repeat entries and are left out; the others, sorted
    by stride, must tile one dense run (the smallest stride 1, each next one the product of the
    sizes below it), then the remaining ones one regular lattice of runs (the first stride past
    the run's width, each next one the product of the sizes since). The q slice of a packed
    ``(B, L, 3E)`` projection seen as ``(B, H, L, d)``: ``B * L`` runs of ``E`` at stride ``3E``.
    """
    if t.is_contiguous():
        return Span(t.numel(), 1, t.numel())
    dims = sorted((st, n) for st, n in zip(t.stride(), t.shape, strict=True) if n > 1 and st > 0)
    width, i = 1, 0
    while i < len(dims) and dims[i][0] == width:
        width *= dims[i][1]
        i += 1
    if i == len(dims):
        return Span(width, 1, width)
    stride, rows = dims[i]
    if stride < width:
        return None  # runs would overlap: entries that repeat, not a lattice
    for st, n in dims[i + 1 :]:
        if st != stride * rows:
            return None
        rows *= n
    return Span(width, rows, stride)


def kernels_status() -> str:
    """Whether this process has paid the bit scan's one-time cost: ``"ready"`` (numba's kernels
    are loaded and compiled), ``"unavailable"`` (numba is not usable: the torch scan serves every
    call) or ``"not loaded"`` (no scan of a CPU tensor yet)."""
    if "kernels" not in _state:
        return "not loaded"
    return "unavailable" if _state["kernels"] is None else "ready"


def _kernels() -> ModuleType | None:
    """The numba kernel module, or None when numba is not usable (loaded and every kernel
    compiled once, at the first call: no later call pays for a kernel of another width)."""
    if "kernels" not in _state:
        from attnkit.kernels.numba.runtime import load_kernels, numba_missing

        kern = (
            None
            if numba_missing()
            else load_kernels(
                "attnkit.kernels.policy.absmax_kernels",
                [Path(__file__).with_name("absmax_kernels.py"), _NUMBA / "memory.py"],
            )
        )
        if kern is not None:
            buf = torch.zeros(1, dtype=torch.float64)  # 8 bytes: one entry of every width
            one_entry = (buf.data_ptr(), 1, 1, 1)
            for one in (kern.absmax_bits16, kern.absmax_bits32, kern.absmax_bits64):
                one(*one_entry)
            for three in (kern.absmax3_bits16, kern.absmax3_bits32, kern.absmax3_bits64):
                three(*one_entry, *one_entry, *one_entry)
            _state["ready"] = kern
        _state["kernels"] = kern
    return _state["kernels"]  # type: ignore[return-value]


def _from_bits(m: int, dtype: torch.dtype) -> float:
    """The float whose bit pattern (sign cleared) is ``m``; inf / nan at or above inf's."""
    inf = _INF_BITS[dtype]
    if m >= inf:
        return math.inf if m == inf else math.nan
    if dtype == torch.float32:
        return _F32.unpack(_I32.pack(m))[0]
    if dtype == torch.float64:
        return _F64.unpack(_I64.pack(m))[0]
    if dtype == torch.float16:
        return _F16.unpack(_I16.pack(m))[0]
    return _F32.unpack(_I32.pack(m << 16))[0]  # bfloat16: the top half of a float32


def _block(t: Tensor) -> tuple[int, int, int, int] | None:
    """(address, width, rows, stride) of ``t``'s runs (:func:`row_span`) when the bit scan can
    read ``t``, else None."""
    if type(t) not in _PLAIN or t.dtype not in _INF_BITS or not t.is_cpu:
        return None
    if t.layout != torch.strided:
        return None
    span = row_span(t)
    if span is None:
        return None
    try:
        return t.data_ptr(), span.width, span.rows, span.stride
    except RuntimeError:  # no storage: a functorch-wrapped tensor (torch.func.grad, vmap)
        return None


def absmax_bits(t: Tensor) -> float | None:
    """max|t| as :func:`absmax_torch` gives it, from one integer max over the bit patterns of
    its entries; None when ``t`` is not a strided CPU tensor of a float dtype whose entries form
    one dense block or equal runs at a fixed stride (:func:`row_span`), or numba is not
    usable."""
    block = _block(t)
    kern = None if block is None else _kernels()
    if kern is None:
        return None
    width = t.element_size()
    fn = {2: kern.absmax_bits16, 4: kern.absmax_bits32, 8: kern.absmax_bits64}[width]
    return _from_bits(fn(*block), t.dtype)


def plan3(q: Tensor, k: Tensor, v: Tensor) -> ScanPlan | None:
    """The :class:`ScanPlan` of q, k and v when the bit scan can read all three (one float
    dtype, CPU, plain strided tensors), else None."""
    if not (q.dtype == k.dtype == v.dtype):
        return None
    bq, bk, bv = _block(q), _block(k), _block(v)
    if bq is None or bk is None or bv is None:
        return None
    return ScanPlan(Span(*bq[1:]), Span(*bk[1:]), Span(*bv[1:]))


def absmax3(q: Tensor, k: Tensor, v: Tensor, plan: ScanPlan | None = None) -> tuple:
    """(max|q|, max|k|, max|v|) as :func:`absmax` gives them (one numba call when the bit scan
    reads all three). ``plan``: :func:`plan3` of these tensors' signature (type, dtype, device,
    shape, strides), which dispatch remembered (the caller vouches for the signature: a call's
    memo holds the plan of the call's own tensors); float32 calls then take the shortest path."""
    if "kernels" not in _state and q.is_cpu:
        _kernels()  # the one-time cost, at the first call (module docstring)
    n = q.numel() + k.numel() + v.numel()
    if n >= current().scan_threaded_min and torch.get_num_threads() > 1:
        return absmax_torch(q), absmax_torch(k), absmax_torch(v)
    kern = _state.get("ready")
    if kern is not None and plan is not None and q.dtype is _FLOAT32:
        sq, sk, sv = plan.q, plan.k, plan.v
        try:
            ptrs = q.data_ptr(), k.data_ptr(), v.data_ptr()
        except RuntimeError:  # no storage (functorch-wrapped tensors of the same signature)
            return _absmax3(q, k, v)
        m = kern.absmax3_bits32(
            ptrs[0], sq.width, sq.rows, sq.stride,
            ptrs[1], sk.width, sk.rows, sk.stride,
            ptrs[2], sv.width, sv.rows, sv.stride,
        )  # fmt: skip
        return _F32x3.unpack(_I32x3.pack(*m))  # inf / nan patterns included
    return _absmax3(q, k, v)


def planned_kernel32() -> Callable[..., tuple[int, int, int]] | None:
    """The bit kernel :func:`absmax3` runs for float32 calls with a scan plan
    (``absmax3_bits32(address, width, rows, stride, ...)`` of q, k and v: the max bit patterns
    of |x|; numba's kernels loaded now if they are not yet, as a first call does), or None
    when numba is not usable."""
    kern = _kernels()
    return None if kern is None else kern.absmax3_bits32  # type: ignore[attr-defined]


def float32_maxima(bits: tuple[int, int, int]) -> tuple[float, float, float]:
    """The float32 values of three max bit patterns (:func:`planned_kernel32`'s result);
    NaN and inf patterns included."""
    return _F32x3.unpack(_I32x3.pack(*bits))


def _absmax3(q: Tensor, k: Tensor, v: Tensor) -> tuple[float, float, float]:
    """:func:`absmax3` for any tensors (other dtypes, layouts, devices)."""
    dtype = q.dtype
    if k.dtype == dtype and v.dtype == dtype:
        bq, bk, bv = _block(q), _block(k), _block(v)
        if bq is not None and bk is not None and bv is not None:
            kern = _kernels()
            if kern is not None:
                width = q.element_size()
                if width == 4:
                    mq, mk, mv = kern.absmax3_bits32(*bq, *bk, *bv)
                else:
                    fn = kern.absmax3_bits64 if width == 8 else kern.absmax3_bits16
                    mq, mk, mv = fn(*bq, *bk, *bv)
                if dtype == torch.bfloat16:  # the top half of a float32
                    return _F32x3.unpack(_I32x3.pack(mq << 16, mk << 16, mv << 16))
                ints, floats = _X3[dtype]
                return floats.unpack(ints.pack(mq, mk, mv))  # inf / nan patterns included
    return absmax(q), absmax(k), absmax(v)


def absmax(t: Tensor) -> float:
    """max|t| (``nan`` / ``inf`` when ``t`` holds NaN / +-inf): :func:`absmax_bits` when it
    applies, else :func:`absmax_torch`."""
    m = absmax_bits(t)
    return absmax_torch(t) if m is None else m
