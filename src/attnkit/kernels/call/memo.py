"""What the stages of one attention call hand each other, as typed values.

A call's path (drawn in ``docs/architecture.md``)::

    functional ── calls.parse ──▶ AttentionCall ── dispatch.select ──▶ Backend
      (user args)  (validation,      (q, k, v, mask, options; memo: CallMemo)
                    or a remembered
                    Choice + ScanPlan)
    dispatch.run ── numerics.prepare ──▶ (call, NumericsDecision) ── Backend.run(call, decision)
                    (input scan with the call's ScanPlan,          block map ──▶ backend plan
                     or no scan: the device path)
                 ── numerics.finish ──▶ (output, weights)

Each stage returns a value the next one reads by name: validation the frozen
:class:`~attnkit.kernels.call.base.AttentionCall`; the policy's input scan reads the
:class:`~attnkit.kernels.call.layout.ScanPlan` dispatch remembered for the signature; the policy
(one stage of dispatch, run once per call) decides a
:class:`~attnkit.kernels.policy.decision.NumericsDecision` and hands it to the backend; the
mask's block map (``call.block_map(bq, bkv)``) and a backend's plan (blocksparse's ``Plan``,
additive's ``MaskTiles``) follow.

What a stage computed once and a later stage of the *same call* reads again lives in the
call's :class:`CallMemo` (``call.memo``): a named slot for the scan plan, and entries under
typed keys (:class:`MemoKey` subclasses whose type parameter is the entry's type:
:class:`DenseMaskKey`, :class:`BlockMapKey`, the policy's ``DECISION`` and each backend's own
plan key). Every call object has its own memo; ``dataclasses.replace(call, ...)`` makes a new
one. The memo names no stage's types but the call's own: the policy and the backends, which
sit above the call record, define their keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch
from torch import Tensor

from attnkit.kernels.call.layout import ScanPlan

__all__ = ["BlockMapKey", "CallMemo", "DenseMaskKey", "MemoKey", "PlainCheck"]

E = TypeVar("E")


class PlainCheck(Protocol):
    """The policy's check of its common case for a remembered signature (the policy defines
    it: :class:`attnkit.kernels.policy.steady.Steady`): the decision it reaches for q, k and v,
    or None when the call must be decided in full."""

    def decide(self, q: Tensor, k: Tensor, v: Tensor) -> object | None: ...


class MemoKey(Generic[E]):
    """Base class of the keys of a :class:`CallMemo`: each subclass is a frozen dataclass whose
    fields say what the entry depends on (or, for an entry that depends on nothing, a single
    instance), and whose type parameter ``E`` is the entry's type."""

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
    steady: the policy's check of the common case for the signature (set likewise; None:
        the policy decides in full).
    :meth:`get`: entries under typed keys (:class:`MemoKey`), built on first use (the policy's
        decision among them).

    (Class-level defaults and no ``__init__``: ``CallMemo()`` costs no Python-level call on
    the per-call fast path.)
    """

    scan_plan: ScanPlan | None = None
    steady: PlainCheck | None = None
    entries: dict[MemoKey, object] | None = None  # made on first use

    def get(self, key: MemoKey[E], build: Callable[..., E], *args: object) -> E:
        """The entry under ``key``, built by ``build(*args)`` and kept on first use."""
        entries = self.entries
        if entries is None:
            entries = self.entries = {}
        if key in entries:
            return entries[key]  # type: ignore[return-value]
        value = entries[key] = build(*args)
        return value

    def __repr__(self) -> str:
        keys = [type(k).__name__ for k in self.entries or ()]
        return f"CallMemo(scan_plan={self.scan_plan!r}, entries={keys})"
