"""A tensor's in-place version counter: the one place attnkit reads torch's ``Tensor._version``.

Why a private attribute of torch: caches keyed by a tensor object (a mask tensor's checks and
dispatch choice, a mask's block maps, a KV cache's bounds) must notice ``t[...] = x`` on that
object. Autograd counts such writes in ``t._version``, and torch offers no public name for it
(``torch.Tensor._version`` is what ``torch.autograd`` itself checks). If torch renames it,
:func:`version` fails loudly here, and ``tests/test_tensor_version.py`` says so.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["version"]


def version(t: Tensor) -> int | None:
    """How many in-place writes ``t`` (or a view sharing its storage) has seen; None for an
    inference tensor (made under ``torch.inference_mode``), which keeps no counter."""
    if t.is_inference():
        return None
    return t._version  # torch's counter (module docstring)
