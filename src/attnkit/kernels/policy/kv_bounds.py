"""What the overflow policy needs from cached keys and values, known without scanning them.

The policy (:mod:`attnkit.kernels.policy.numerics`) reads max|k| and the finiteness of k and v at
every call. A key/value cache that appends a few rows per step can keep those statistics itself,
updated from the appended rows only (:class:`RowBounds`), and hand them to the policy as a typed
value (:class:`KVBounds`) through :func:`remember`; :func:`known` gives them back for the very
tensors they describe, as long as no in-place change happened since (version counters; inference
tensors keep none, see :func:`remember`). The policy then scans only q.

Shape legend: ``B`` batch rows of the cache, ``G`` key/value heads, ``L`` cached positions.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.kernels.policy import scan
from attnkit.tensor_version import version

__all__ = ["KNOWN_LIMIT", "KVBounds", "RowBounds", "known", "remember"]

FEW_ROWS = 8
"""Batch rows up to which the bounds are computed row by row with the bit scan and Python
(a few microseconds) rather than with torch reductions (a few microseconds each)."""

KNOWN_LIMIT = 256
"""Most (k, v) pairs remembered at once (one per cache layer; the oldest are forgotten)."""


@dataclass(frozen=True)
class KVBounds:
    """max|k| over every entry of the cached keys (``nan`` when one is NaN, else ``inf`` when one
    is +-inf, as :func:`attnkit.kernels.policy.scan.absmax` reports it) and whether k and v are
    finite."""

    max_abs_k: float
    finite: bool


@dataclass(frozen=True)
class RowBounds:
    """Per batch row of a cache: ``k_max`` (B,) float64 max|k| (NaN/inf propagate) and
    ``finite`` (B,) bool, k and v both finite. Exact after :meth:`extend` and :meth:`select`."""

    k_max: Tensor
    finite: Tensor

    @classmethod
    def of(cls, k: Tensor, v: Tensor, host: bool = True) -> RowBounds:
        """The bounds of k (B, G, L, dk) and v (B, G, L, dv), one pass over each, kept on the
        tensors' device; ``host`` False (the policy's device path) never reads a value back to
        the host."""
        k, v = k.detach(), v.detach()
        if k.numel() == 0:  # no rows yet (an empty cache, or a window cropped to nothing)
            zeros = torch.zeros(k.shape[0], dtype=torch.float64, device=k.device)
            return cls(zeros, torch.ones(k.shape[0], dtype=torch.bool, device=k.device))
        if host and k.shape[0] <= FEW_ROWS:  # a few batch rows: one bit scan of each
            km = [scan.absmax(k[b]) for b in range(k.shape[0])]
            ok = [math.isfinite(m) and math.isfinite(scan.absmax(v[b])) for b, m in enumerate(km)]
            return cls(
                torch.tensor(km, dtype=torch.float64, device=k.device),
                torch.tensor(ok, dtype=torch.bool, device=k.device),
            )
        k_max = k.abs().amax(dim=(1, 2, 3)).double()  # amax propagates NaN
        finite = torch.isfinite(k_max) & torch.isfinite(v).flatten(1).all(1)
        return cls(k_max, finite)

    def extend(self, k: Tensor, v: Tensor, host: bool = True) -> RowBounds:
        """The bounds after appending rows k (B, G, Ln, dk), v (B, G, Ln, dv): reads only them
        (``host`` as in :meth:`of`)."""
        new = RowBounds.of(k, v, host)
        return RowBounds(torch.maximum(self.k_max, new.k_max), self.finite & new.finite)

    def select(self, index: Tensor) -> RowBounds:
        """The bounds of batch rows ``index`` (B',) (beam search)."""
        return RowBounds(self.k_max.index_select(0, index), self.finite.index_select(0, index))

    def bounds(self) -> KVBounds:
        """max|k| over all rows (NaN when one row's is) and whether every row is finite."""
        if self.k_max.numel() <= FEW_ROWS:  # Python on a few values beats torch's reductions
            km = self.k_max.tolist()
            m = math.nan if any(math.isnan(x) for x in km) else max(km, default=0.0)
            return KVBounds(m, all(self.finite.tolist()) and math.isfinite(m))
        m, ok = torch.stack([self.k_max.max(), self.finite.all().double()]).tolist()
        return KVBounds(m, bool(ok) and math.isfinite(m))


@dataclass(frozen=True)
class _Entry:
    k: weakref.ref
    v: weakref.ref
    version: tuple[int | None, int | None]
    bounds: KVBounds


_KNOWN: dict[int, _Entry] = {}


def remember(k: Tensor, v: Tensor, bounds: KVBounds) -> None:
    """Record that ``k`` and ``v`` (these tensor objects, as they are now) have ``bounds``.

    An in-place change of either (a new version) makes :func:`known` forget them. Inference
    tensors have no version counter: changing a remembered one in place inside
    ``torch.inference_mode`` is not seen (a cache's tensors are not changed in place)."""
    _KNOWN.pop(id(k), None)
    _KNOWN[id(k)] = _Entry(weakref.ref(k), weakref.ref(v), (version(k), version(v)), bounds)
    while len(_KNOWN) > KNOWN_LIMIT:
        try:
            del _KNOWN[next(iter(_KNOWN))]
        except (KeyError, StopIteration, RuntimeError):  # another thread removed it
            break


def known(k: Tensor, v: Tensor) -> KVBounds | None:
    """The bounds remembered for exactly these ``k`` and ``v``, unchanged since; else None."""
    e = _KNOWN.get(id(k))
    if e is None or e.k() is not k or e.v() is not v:
        return None
    if e.version != (version(k), version(v)):
        return None
    return e.bounds
