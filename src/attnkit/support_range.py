"""The torch releases attnkit was tested with: the one place that records the range.

``pyproject.toml`` requires ``torch>=TORCH_OLDEST,<TORCH_BELOW`` (a range, so ``pip install
attnkit`` keeps the torch a machine already has, CUDA build or not); the README's install
section, ``attnkit info`` and ``make compat`` (``scripts/compat.py``) read the range from here,
and ``tests/test_support_range.py`` keeps them in step.

attnkit detects features, not version numbers (fused SDPA with ``enable_gqa``, FlexAttention,
native bf16 of the CPU, ``torch.cuda.is_bf16_supported()``); the range says which releases the
kernel and functional tests passed with. The committed locks (requirements/) pin one release
inside it, :data:`TORCH_LOCKED`, for CI and ``make demo``.

Importing this module imports nothing (``attnkit --help`` stays fast).
"""

from __future__ import annotations

__all__ = [
    "TORCH_BELOW",
    "TORCH_LOCKED",
    "TORCH_NEWEST",
    "TORCH_OLDEST",
    "torch_requirement",
    "torch_support",
]

TORCH_OLDEST = "2.11.0"
"""The oldest torch the kernel, functional and nn tests passed with (``make compat``: 3,585
tests on 2.11.0, 3,600 on 2.15.0). Older releases tried: 2.9.1 and 2.5.1 fail
``torch.func.grad`` through attention (the input scan's ``aminmax`` on a functorch tensor:
"Cannot access data pointer of Tensor that doesn't have storage"; 3 tests on 2.9.1, everything
else passes); before 2.5 SDPA has no ``enable_gqa``."""
TORCH_NEWEST = "2.15.0"
"""The newest torch release the kernel and functional tests passed with (``make compat``)."""
TORCH_BELOW = "2.16"
"""pyproject's upper bound: the next minor release, not yet tested."""
TORCH_LOCKED = "2.13.0"
"""The release the committed locks install (CPU build from the wheel directory, else PyPI's)."""


def torch_requirement() -> str:
    """The requirement string pyproject.toml carries, e.g. ``torch>=2.11.0,<2.16``."""
    return f"torch>={TORCH_OLDEST},<{TORCH_BELOW}"


def torch_support() -> str:
    """One line for people: which torch releases were tested, and which one the locks pin."""
    return (
        f"tested with torch {TORCH_OLDEST} to {TORCH_NEWEST} (the locks pin {TORCH_LOCKED}); "
        "any build: CPU or CUDA"
    )
