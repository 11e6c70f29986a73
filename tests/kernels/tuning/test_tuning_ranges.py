"""Size ranges as a tuned value (:mod:`attnkit.kernels.tuning.ranges`): validation naming the
field, merging, the route of a size at the bounds, the old single threshold mapped to ranges,
and the decode backend's choice following the ranges in use."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.decode import backend as decode_backend
from attnkit.kernels.tuning import DEFAULT, current, use
from attnkit.kernels.tuning import ranges as R

MIB = 2**20


@pytest.mark.parametrize(
    "value, error, words",
    [
        ((), TypeError, "non-empty sequence"),
        (((MIB, "gpu"), (R.TOP, "torch")), ValueError, "expected a route in"),
        (((2 * MIB, "torch"), (MIB, "split-k")), ValueError, "expected increasing bounds"),
        (((MIB, "torch"),), ValueError, "last bound to be 2**40"),
        (((True, "torch"), (R.TOP, "split-k")), ValueError, "bounds as integers"),
        ((MIB,), TypeError, "(bound in bytes, route) pairs"),
    ],
)
def test_bad_ranges_are_refused_naming_the_field(value, error, words):
    with pytest.raises(error) as e:
        dataclasses.replace(DEFAULT, decode_split_k_ranges=value)
    assert "decode_split_k_ranges" in str(e.value) and words in str(e.value)


def test_ranges_merge_and_route_sizes_at_their_bounds():
    ranges = R.checked("x", [[MIB, "torch"], [4 * MIB, "torch"], [R.TOP, "split-k"]])
    assert ranges == ((4 * MIB, R.TORCH), (R.TOP, R.SPLIT_K))
    assert R.route_at(ranges, 4 * MIB - 1) == R.TORCH
    assert R.route_at(ranges, 4 * MIB) == R.SPLIT_K
    assert R.route_at(ranges, R.TOP + 1) == R.SPLIT_K


def test_the_old_threshold_maps_to_the_ranges_it_meant():
    assert R.from_min_bytes(0) == ((R.TOP, R.SPLIT_K),)
    assert R.from_min_bytes(2**40) == ((R.TOP, R.TORCH),)
    assert R.from_min_bytes(MIB) == ((MIB, R.TORCH), (R.TOP, R.SPLIT_K))


def test_the_default_keeps_split_k_at_every_size():
    assert DEFAULT.decode_split_k_ranges == ((R.TOP, R.SPLIT_K),)
    assert all(DEFAULT.decode_split_k_at(n) for n in (0, MIB, 2**39))


@pytest.mark.parametrize("lk, want", [(1024, True), (4096, False)])
def test_the_decode_backend_follows_the_ranges_in_use(monkeypatch, lk, want):
    seen = []

    def spy(q, k, v, mask, scale, split_k):
        seen.append(split_k)
        return None  # as if the policy asked for the exact redo

    monkeypatch.setattr(decode_backend, "attend", spy)
    monkeypatch.setattr(decode_backend, "numba_missing", lambda: None)
    q = torch.randn(1, 8, 1, 64)
    k, v = torch.randn(1, 8, lk, 64), torch.randn(1, 8, lk, 64)
    bound = 2 * 8 * 2048 * 64 * 4  # the k and v bytes of Lk = 2048
    ranges = ((bound, R.SPLIT_K), (R.TOP, R.TORCH))
    call = AttentionCall(
        "dot", q, k, v, mask=None, scale=0.125, dropout_p=0.0, return_weights=False
    )
    with use(dataclasses.replace(current(), decode_split_k_ranges=ranges)):
        out, _ = dispatch.run(call, decode_backend.DecodeBackend())  # the redo: on dense
    assert seen == [want]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
