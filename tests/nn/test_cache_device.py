"""KVCache on an accelerator: its growth buffer and per-row bounds stay on the device of its
tensors, and an update reads nothing back to the host. Checked on the CPU with ``meta``
tensors (every tensor the cache makes must be ``meta`` too: a CPU tensor would show a default-
device allocation) and with the policy's device path forced under a host-read spy."""

from __future__ import annotations

import torch

from attnkit import functional as F
from attnkit.kernels.policy import kv_bounds, numerics
from attnkit.nn import KVCache
from tests.support.host_sync import NoHostSync


def _step(n: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(2, 2, n, 8, generator=g) for _ in range(2))
    return k.to(device), v.to(device)


def test_meta_cache_keeps_buffers_and_bounds_on_meta():
    cache = KVCache()
    for i, n in enumerate((5, 1, 1, 40, 1)):  # grows its buffer more than once
        k, v = _step(n, "meta", i)
        ck, cv = cache.update(k, v, n)
    assert ck.device.type == cv.device.type == "meta" and ck.shape[-2] == 48
    assert all(b.device.type == "meta" for b in cache._buffers)
    assert cache._rows.k_max.device.type == "meta" and cache._rows.finite.device.type == "meta"
    cache.reorder(torch.tensor([1, 0]))
    assert cache.k.device.type == "meta" and cache._rows.k_max.device.type == "meta"


def test_cpu_cache_on_the_device_path_reads_nothing_back_and_attends_right():
    cache = KVCache()
    with numerics.use_path("device"):
        k, v = _step(20, "cpu")
        cache.update(k, v, 20)
        q = torch.randn(2, 4, 1, 8)
        steps = []
        for i in range(3):
            k1, v1 = _step(1, "cpu", i + 1)
            with NoHostSync():
                ck, cv = cache.update(k1, v1, 1)
                out = F.grouped_query_attention(q, ck, cv, backend="dense")
            steps.append((ck.clone(), cv.clone(), out))
    assert kv_bounds.known(ck, cv) is None  # no bounds handed to the host-side policy
    for ck, cv, out in steps:
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), ck.double().repeat_interleave(2, 1), cv.double().repeat_interleave(2, 1)
        )
        torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    # the bounds are still exact when asked for (one read then)
    b = cache.bounds()
    assert b.finite and b.max_abs_k == float(cache.k.abs().max())
