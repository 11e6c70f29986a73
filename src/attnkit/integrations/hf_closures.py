"""Recognising transformers' mask closures (used by :mod:`attnkit.integrations.hf_masks`;
imports transformers, so only the transformers integration imports it).

transformers builds every mask from small closures of ``transformers.masking_utils``
(``causal_mask_function``, ``sliding_window_overlay(w)``, ``padding_mask_function(mask)``,
``and_masks(...)``, ...). :func:`classify` names a closure by its code object and reads the
values it captured (the window size, the padding mask, the child functions), so the mask can be
rebuilt from attnkit's structured masks without evaluating it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import masking_utils as mu

__all__ = ["classify"]


def _kinds() -> dict:
    """Code object -> (kind, names of the captured values we read)."""
    t = torch.zeros(1, 1, dtype=torch.long, device="cpu")
    f = mu.causal_mask_function
    return {
        mu.causal_mask_function.__code__: ("causal", ()),
        mu.bidirectional_mask_function.__code__: ("all", ()),
        mu.sliding_window_overlay(1).__code__: ("window", ("sliding_window",)),
        mu.sliding_window_bidirectional_overlay(1).__code__: ("window_bi", ("sliding_window",)),
        mu.padding_mask_function(t).__code__: ("padding", ("padding_mask",)),
        mu.packed_sequence_mask_function(t).__code__: ("packed", ("packed_sequence_mask",)),
        mu.remap_positions_for_packed_sequence(f, t).__code__: (
            "remap",
            ("mask_function", "position_ids"),
        ),
        mu.and_masks(f).__code__: ("and", ("mask_functions",)),
        mu.or_masks(f).__code__: ("or", ("mask_functions",)),
        mu.add_offsets_to_mask_function(f, 0, 0).__code__: (
            "offsets",
            ("mask_function", "q_offset", "kv_offset"),
        ),
    }


_KINDS: dict | None = None


def classify(fn: Callable) -> tuple[str, dict]:
    """("kind", captured values) for a known closure, ("unknown", {}) otherwise."""
    global _KINDS
    if _KINDS is None:
        _KINDS = _kinds()
    code = getattr(fn, "__code__", None)
    kind = _KINDS.get(code)
    if kind is None:
        return "unknown", {}
    name, want = kind
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    try:
        values = {n: cells[n].cell_contents for n in want}
    except (KeyError, ValueError):  # a transformers version with other captured names
        return "unknown", {}
    return name, values
