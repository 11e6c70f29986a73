"""``blocksparse``: placeholder until the block-sparse kernel lands (see issue 5)."""

from __future__ import annotations

from attnkit.kernels.base import Backend


class BlocksparseBackend(Backend):
    name = "blocksparse"
    description = "skips the blocks a structured mask leaves empty"

    def available(self) -> str | None:
        return "not implemented yet"
