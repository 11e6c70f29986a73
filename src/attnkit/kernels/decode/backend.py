"""``decode``: a few query rows against a long key/value cache (generation), K and V read once.

What it serves, and why not the rest (each a reason in :meth:`DecodeBackend.not_supported_reasons`):

- Lq <= DECODE_MAX_Q query rows (a generated token, or a short speculative block). Longer query
  blocks are prefill: ``blocksparse`` and ``dense`` are faster there.
- float32 on CPU, and bfloat16 where the CPU has native bf16 (:func:`attnkit.cpu.native_bf16`)
  and numba runs: the split-K kernel (:mod:`.split_k`) reads bf16 K and V and accumulates in
  float32 (P4). A bf16 step whose mask needs a tile is redone by ``dense``. float16, float64
  and bf16 elsewhere go to ``dense``, which follows P4/P5 for them.
- grouped k/v heads without repeating them (``supports_gqa``).
- masks without a score bias: causal and sliding windows (bottom-right aligned for a cache; any
  alignment works), key padding (lengths or a ``key_padding_mask``), their intersections, and any
  other mask without a bias (evaluated on the (Lq, keys) tile). A bias (ALiBi, float masks) goes
  to ``dense``; so do softcapping and attention sinks.
- no gradients: decoding is inference. A call whose inputs require grad goes to ``dense`` (the
  dispatcher's reason says so), as do ``return_weights`` and dropout.

``backend="auto"`` takes float32 steps from DECODE_MIN_KV cached keys holding DECODE_MIN_BYTES
of k and v: below that, SDPA's lower fixed cost per call wins. bfloat16 steps it takes at any
length (SDPA's bf16 path on CPU is several times slower per key). float32 steps run on the
split-K kernel or on torch ops per range of k and v bytes (``decode_split_k_ranges``). That
:class:`~attnkit.kernels.tuning.Tuning` field is measured by ``attnkit tune``; its default is
split-K at every size: on the 2-core AVX-512 EPYC, q (1, 8, 1, 64) float32, the kernel (keys
in groups of eight for widths 64 and 128, units on torch's OpenMP threads) took 67-74 us
against 87-98 us on torch ops at Lk = 2048, and 114 against 138 us on one thread.

The overflow policy is checked inside the step (:mod:`.kernel`; ``kernel_checks``: dispatch
hands the backend a decision without the input scan); a step whose scores or output break it
returns None and dispatch redoes it on ``dense`` (``fallback``) under the full policy (float64
when P5 asks, P6 for NaN and inf), so the result always follows
:mod:`attnkit.kernels.policy.numerics`.

On a GPU, decode steps run on ``dense``: SDPA with ``enable_gqa`` (no K/V repeat) and the
policy's device path (no host sync).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
from torch import Tensor

from attnkit.cpu import native_bf16
from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.decode.kernel import attend
from attnkit.kernels.decode.split_k import numba_missing
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.kernels.tuning import current

__all__ = [
    "DECODE_MAX_Q",
    "DECODE_MIN_BYTES",
    "DECODE_MIN_KV",
    "DecodeBackend",
]

DECODE_MAX_Q = 16
"""Most query rows a decode call has (a token, or a short block of draft tokens)."""

DECODE_MIN_KV = 512
"""Cached keys from which ``backend="auto"`` may prefer ``decode`` to SDPA (``dense``)."""

DECODE_MIN_BYTES = 2**21
"""Bytes of k and v (as the call holds them) from which ``backend="auto"`` prefers ``decode``:
below them SDPA's smaller fixed cost per call wins even with the policy's scan. The crossover
measured on a 2-core AVX-512 EPYC (q (1, 8, 1, 64): decode ahead from Lk = 512, 2 MiB; q
(1, 2, 4, 32): SDPA ahead up to Lk = 2048, 1 MiB). Named constants for the measured dispatch
tuning to replace."""


class DecodeBackend(Backend):
    name = "decode"
    kinds = ("dot",)
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    devices = ("cpu",)
    supports_grad = False
    supports_bias = False
    supports_gqa = True
    kernel_checks = True
    fallback = "dense"

    def fallback_notes(self, call: AttentionCall) -> list[str]:
        return [
            "the policy (overflow, NaN/inf) is checked inside the step; a step that breaks it "
            "is redone on dense under the full policy"
        ]

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        r = []
        if call.q_len > DECODE_MAX_Q:
            r.append(f"Lq = {call.q_len} query rows: decode serves at most {DECODE_MAX_Q}")
        if call.k.shape[-1] != call.q.shape[-1]:
            r.append("k and q have different widths")
        if call.dtype == torch.bfloat16:
            if not _native_bf16():
                r.append("bfloat16 decode runs only on CPUs with native bf16 (avx512_bf16/amx)")
            why = numba_missing()
            if why:
                r.append(f"bfloat16 decode needs numba: {why}")
        return r

    def speed_reasons(self, call: AttentionCall) -> list[str]:
        if call.dtype == torch.bfloat16:
            return []
        if call.kv_len < DECODE_MIN_KV:
            return [f"Lk = {call.kv_len} < {DECODE_MIN_KV} cached keys: SDPA is faster there"]
        size = _bytes(call)
        if size < DECODE_MIN_BYTES:
            return [
                f"k and v hold {size / 2**20:.2f} MiB < {DECODE_MIN_BYTES / 2**20:g} MiB: "
                "SDPA's smaller fixed cost per call is faster there"
            ]
        return []

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, None] | None:
        split_k = call.dtype == torch.bfloat16 or (
            current().decode_split_k_at(_bytes(call)) and numba_missing() is None
        )
        res = attend(call.q, call.k, call.v, call.mask, call.scale, split_k)
        if res is None:  # the scores or the output broke the policy: dispatch redoes it
            return None
        return res[0], None


@functools.cache
def _native_bf16() -> bool:
    """:func:`attnkit.cpu.native_bf16` of this CPU, read once."""
    return bool(native_bf16())


def _bytes(call: AttentionCall) -> int:
    """Bytes of k and v as the call holds them."""
    return (call.k.numel() + call.v.numel()) * call.k.element_size()
