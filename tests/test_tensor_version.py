"""attnkit.tensor_version: the one reader of torch's in-place version counter. If torch removes
or renames ``Tensor._version``, these tests fail and say so (every cache keyed by a tensor
object would stop noticing in-place writes)."""

from __future__ import annotations

import torch

from attnkit.tensor_version import version


def test_torch_still_has_the_counter():
    t = torch.zeros(3)
    assert hasattr(t, "_version"), (
        "torch.Tensor._version is gone: attnkit.tensor_version.version must read the in-place "
        "version counter some other way"
    )


def test_counts_in_place_writes_of_the_tensor_and_its_views():
    t = torch.zeros(4, 3)
    v0 = version(t)
    assert isinstance(v0, int)
    t[0, 0] = 1.0
    v1 = version(t)
    assert v1 is not None and v1 > v0
    t[1].add_(2.0)  # a write through a view shares the counter
    v2 = version(t)
    assert v2 is not None and v2 > v1
    _ = t + 1  # reading, and out-of-place arithmetic, count nothing
    assert version(t) == v2


def test_inference_tensors_have_none():
    with torch.inference_mode():
        t = torch.zeros(2)
    assert version(t) is None
