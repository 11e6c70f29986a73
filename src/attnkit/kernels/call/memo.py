"""What the stages of one attention call hand each other, as typed values.

A call's path (drawn in ``docs/architecture.md``)::

    functional ── calls.dot_call ──▶ AttentionCall ── dispatch.select ──▶ Backend
      (user args)   (validation,        (q, k, v, mask, options; memo: CallMemo)
                     or a remembered
                     Choice + ScanPlan)
    dispatch.run ── numerics.prepare ──▶ (call, NumericsDecision) ── Backend.run(call, decision)
                    (input scan with the call's ScanPlan,          block map ──▶ backend plan
                     or no scan: the device path)
                 ── numerics.finish ──▶ (output, weights)

Each stage returns a value the next one reads by name: validation the frozen
:class:`~attnkit.kernels.call.base.AttentionCall`; the policy's input scan reads the
:class:`~attnkit.kernels.policy.scan.ScanPlan` dispatch remembered for the signature; the policy
(one stage of dispatch, run once per call) decides a :class:`NumericsDecision` and hands it to
the backend; the mask's block map (``call.block_map(bq, bkv)``) and a
backend's plan (blocksparse's ``Plan``, additive's ``MaskTiles``) follow.

What a stage computed once and a later stage of the *same call* reads again lives in the
call's :class:`CallMemo` (``call.memo``): named slots for the scan plan and the decision, and
entries under typed keys (:class:`MemoKey` subclasses, frozen dataclasses whose type parameter
is the entry's type: :class:`DenseMaskKey`, :class:`BlockMapKey`, and each backend's own plan
key). Every call object has its own memo; ``dataclasses.replace(call, ...)`` makes a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import torch
from torch import Tensor

from attnkit.kernels.policy.precision import Float64Reason
from attnkit.kernels.policy.scan import ScanPlan

__all__ = ["BlockMapKey", "CallMemo", "DenseMaskKey", "MemoKey", "NumericsDecision"]

E = TypeVar("E")

Checked = Literal["scan", "device", "kernel"]
"""How a :class:`NumericsDecision` was reached (see its ``checked`` field)."""


@dataclass(frozen=True)
class NumericsDecision:
    """How the NaN/inf/overflow policy (:mod:`attnkit.kernels.policy.numerics`, or the additive
    one of :mod:`attnkit.kernels.policy.additive`) runs one call: decided once per call by
    dispatch's policy stage and handed to ``Backend.run(call, decision)``.

    compute: the dtype scores, softmax and accumulation use (P4; float64 when P5 says so).
    finite: q, k and v hold no NaN or +-inf (False: P6 replaced them by 0 in the call the
        backend receives, and sets the rows that read them to NaN afterwards). True when the
        values were not read (``checked`` "device" or "kernel").
    fused_backward_ok: a fused backward (which recomputes exp(s - logsumexp)) is exact for the
        call's scores in ``compute``; False: backends differentiate an explicit softmax.
    float64_reason: why ``compute`` is float64 for a call of a lower precision (what the
        :class:`~attnkit.kernels.policy.precision.PrecisionWarning` says), else None.
    checked: how the decision was reached.
        "scan": from an exact host-side scan of the inputs (CPU; every promise P1-P6 as the
        conventions guide states it).
        "device": from the dtype and device alone, without reading a value back to the host
        (CUDA and other accelerators): the backend keeps P1 with device-side selects, and the
        policy's last step sets every output row that is not finite to NaN
        (:func:`attnkit.kernels.policy.numerics.finish`).
        "kernel": the backend checks P5/P6 itself while it computes (``decode``) and returns
        None when they fail; dispatch then redoes the call under a "scan" decision.
    """

    compute: torch.dtype
    finite: bool
    fused_backward_ok: bool = True
    float64_reason: Float64Reason | None = None
    checked: Checked = "scan"


class MemoKey(Generic[E]):
    """Base class of the keys of a :class:`CallMemo`: each subclass is a frozen dataclass whose
    fields say what the entry depends on, and whose type parameter ``E`` is the entry's type."""

    __slots__ = ()


@dataclass(frozen=True)
class DenseMaskKey(MemoKey[tuple[Tensor | None, Tensor | None]]):
    """The call's mask as dense (allowed, bias) tensors, the bias in ``dtype``
    (:meth:`~attnkit.kernels.call.base.AttentionCall.dense_mask`)."""

    dtype: torch.dtype


@dataclass(frozen=True)
class BlockMapKey(MemoKey[Tensor]):
    """The call's block map (int8 mask batch_shape + (nq, nk)) for (block_q x block_kv) blocks
    (:meth:`~attnkit.kernels.call.base.AttentionCall.block_map`)."""

    block_q: int
    block_kv: int


class CallMemo:
    """What the stages of one call computed, for later stages of the same call.

    scan_plan: what the input scan may read of q, k and v (set by validation from the
        signature's remembered choice; None: the scan checks the tensors itself).
    numerics: the policy's decision (:func:`attnkit.kernels.policy.numerics.decision`), None until
        made.
    :meth:`get`: entries under typed keys (:class:`MemoKey`), built on first use.

    (Class-level defaults and no ``__init__``: ``CallMemo()`` costs no Python-level call on
    the per-call fast path.)
    """

    scan_plan: ScanPlan | None = None
    numerics: NumericsDecision | None = None
    entries: dict[MemoKey, object] | None = None  # made on first use

    def get(self, key: MemoKey[E], build: Callable[[], E]) -> E:
        """The entry under ``key``, built by ``build()`` and kept on first use."""
        entries = self.entries
        if entries is None:
            entries = self.entries = {}
        if key in entries:
            return entries[key]  # type: ignore[return-value]
        value = entries[key] = build()
        return value

    def __repr__(self) -> str:
        keys = [type(k).__name__ for k in self.entries or ()]
        return f"CallMemo(numerics={self.numerics!r}, entries={keys})"
