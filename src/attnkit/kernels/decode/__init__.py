"""The ``decode`` backend: Lq <= 16 query rows against a long key/value cache, K and V read once.

- :mod:`.backend` — what it serves (and the reasons for what it does not), DECODE_MAX_Q and the
  dispatch crossovers DECODE_MIN_KV and DECODE_MIN_BYTES.
- :mod:`.kernel` — the step: grouped heads folded into rows, the policy's checks on the scores and
  the output, the exact redo when they fail.
- :mod:`.keys` — the key range and the allowed tile of a mask for a decode step.
- :mod:`.split_k` / :mod:`.nb_kernels` — the numba split-K step (float32 or bf16 K and V) and its
  kernels.
"""

from attnkit.kernels.decode.backend import (
    DECODE_MAX_Q,
    DECODE_MIN_BYTES,
    DECODE_MIN_KV,
    DecodeBackend,
)
from attnkit.kernels.decode.kernel import attend

__all__ = ["DECODE_MAX_Q", "DECODE_MIN_BYTES", "DECODE_MIN_KV", "DecodeBackend", "attend"]
