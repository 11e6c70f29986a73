"""Where a call's q, k and v entries lie in memory, as the policy's input scan reads them:
:class:`Span` (runs of contiguous entries at a fixed stride) and :class:`ScanPlan` (the spans of
q, k and v, fixed by a call signature). Plain values of the call record; the scan that computes
and reads them is :mod:`attnkit.kernels.policy.scan`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ScanPlan", "Span"]


@dataclass(frozen=True)
class Span:
    """Where a tensor's distinct entries lie, from ``t.data_ptr()``, in elements: ``rows`` runs
    of ``width`` contiguous entries, run ``r`` starting at ``r * stride`` (``rows == 1``: one
    dense block of ``width`` entries)."""

    width: int
    rows: int
    stride: int


@dataclass(frozen=True)
class ScanPlan:
    """What the bit scan reads of a call signature's q, k and v: their runs
    (:func:`~attnkit.kernels.policy.scan.row_span`), each read from the tensor's ``data_ptr()``.

    It depends only on what a call signature of :mod:`attnkit.kernels.dispatch` fixes (tensor
    type, dtype, device, shape, strides): dispatch remembers it with the choice
    (:func:`~attnkit.kernels.policy.scan.plan3`, once per signature) and hands it to every call
    of the signature (``call.memo.scan_plan``), so :func:`~attnkit.kernels.policy.scan.absmax3`
    skips these checks on repeated signatures.
    """

    q: Span
    k: Span
    v: Span
