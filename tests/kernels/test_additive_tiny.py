"""additive_fused with tiny projections (|W_q q|, |W_k k| ~ 1e-30): tanh must keep its relative
accuracy there (the exp form of tanh cancels to 0), checked against float64 autograd of the
plain formula: outputs and the gradients of v and w_v, with small and huge w_v."""

from __future__ import annotations

import pytest
import torch

from attnkit import functional as F


def reference(q, k, v, w_q, w_k, w_v):
    s = torch.tanh((q @ w_q.T)[:, None, :] + (k @ w_k.T)[None, :, :]) @ w_v
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("backend", ["additive_fused", "math"])
@pytest.mark.parametrize("wv_scale", [1.0, 1e30])
@pytest.mark.parametrize("lq, lk, h", [(1, 2, 1), (7, 5, 3)])
def test_tiny_projections_keep_relative_accuracy(lq, lk, h, wv_scale, backend):
    g = torch.Generator().manual_seed(lq * 31 + lk)
    shapes = [(lq, 4), (lk, 4), (lk, 3), (h, 4), (h, 4), (h,)]
    scales = [1e-30, 1e-30, 1.0, 1.0, 1.0, wv_scale / h]
    xs = [torch.randn(s, generator=g, dtype=torch.float64) * c for s, c in zip(shapes, scales)]
    x64 = [x.clone().requires_grad_() for x in xs]
    x32 = [x.float().requires_grad_() for x in xs]
    want = reference(*x64)
    got = F.additive_attention(*x32, backend=backend)
    scale = want.detach().abs().max()
    assert (got.double() - want).abs().max() <= 1e-5 * scale
    go = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want.backward(go)
    got.backward(go.float())
    # the gradients of q, k, W_q and W_k cancel (softmax gradients sum to 0 and tanh' ~ 1):
    # float32 cannot give them to relative accuracy, so only v's and w_v's are checked
    for name, a, b in zip(["v", "w_v"], [x32[2], x32[5]], [x64[2], x64[5]]):
        err = (a.grad.double() - b.grad).norm() / max(b.grad.norm(), 1e-300)
        assert err <= 1e-5, f"gradient of {name}: rel err {err:.3g}"
