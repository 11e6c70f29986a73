"""``additive_fused``: placeholder until the fused additive kernel lands (see issue 5)."""

from __future__ import annotations

from attnkit.kernels.base import Backend


class AdditiveFusedBackend(Backend):
    name = "additive_fused"
    description = "fused additive attention, online softmax, O(L*h) memory"
    kinds = ("additive",)

    def available(self) -> str | None:
        return "not implemented yet"
