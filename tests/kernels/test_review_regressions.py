"""Regressions found in review of the input scan (kernels/policy/scan.py), the grouped-query fold
and the blocksparse attention dropout (kernels/blocksparse/keep.py). Each test compares attnkit with
an independent float64 computation (torch autograd or the NumPy keep mask of
``attnkit.reference.dropout``), tolerance stated in the test.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels import dispatch
from attnkit.kernels.blocksparse.keep import draw_seed
from attnkit.kernels.policy import scan
from attnkit.reference.dropout import keep_mask


def _window_reference(q, k, v, left: int, keep=None, p: float = 0.0):
    """float64 softmax(q k^T / sqrt(d) + window mask) (* keep / (1 - p)) v, q/k/v (B, H, L, d)."""
    lq, lk = q.shape[-2], k.shape[-2]
    i = torch.arange(lq)[:, None]
    j = torch.arange(lk)[None, :]
    allowed = (j <= i) & (j >= i - left)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    w = torch.softmax(s.masked_fill(~allowed, -math.inf), -1)
    if keep is not None:
        w = w * keep / (1.0 - p)
    return w @ v


@pytest.mark.parametrize("p", [1 - 2**-17, 0.9999999, 1 - 1e-16])
def test_dropout_p_rounding_to_one_drops_everything(p):
    """p in [1 - 2**-17, 1): the reference keep mask keeps nothing, so the output is 0."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(1)
    seed = draw_seed()
    torch.manual_seed(1)
    out = F.scaled_dot_product_attention(
        q, k, v, M.sliding_window(8) & M.causal(), dropout_p=p, backend="blocksparse"
    )
    keep = torch.from_numpy(keep_mask(seed, (1, 2), 64, 64, p))
    assert not keep.any()  # the reference drops every weight
    ref = _window_reference(q, k, v, 8, keep, p)
    assert torch.equal(ref, torch.zeros_like(ref))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # and every gradient is exactly 0 (the output does not depend on q, k or v)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(1)
    out = F.scaled_dot_product_attention(
        *xs, M.sliding_window(8) & M.causal(), dropout_p=p, backend="blocksparse"
    )
    for g in torch.autograd.grad(out.sum(), xs):
        assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("h,g", [(4, 2), (4, 1)])
@pytest.mark.parametrize("kind", ["band", "key_padding", "document&causal"])
def test_dropout_p_rounding_to_one_grouped(h, g, kind):
    """Grouped heads folded into the plans (band tiles shift their keys: drop_tile's shift):
    p = 1 - 1e-16 keeps nothing, so output and gradients are exactly 0."""
    torch.manual_seed(0)
    lq = 97
    masks = {
        "band": M.sliding_window(8) & M.causal(),
        "key_padding": M.key_padding(torch.tensor([lq, 5])),
        "document&causal": M.document(torch.tensor([[0] * 50 + [1] * 47] * 2)) & M.causal(),
    }
    q = torch.randn(2, h, lq, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, g, lq, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, g, lq, 8, dtype=torch.float64, requires_grad=True)
    out = F.grouped_query_attention(
        q, k, v, masks[kind], dropout_p=1 - 1e-16, backend="blocksparse"
    )
    assert torch.equal(out, torch.zeros_like(out))
    for grad in torch.autograd.grad(out.sum(), [q, k, v]):
        assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("p", [0.5, 0.99999])
def test_dropout_near_one_matches_reference(p):
    """Thresholds below 2**16 (p = 0.99999 rounds to 65535): exact against the keep mask,
    float64 within 1e-10 relative (scaled by 1/(1-p))."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(2)
    seed = draw_seed()
    torch.manual_seed(2)
    out = F.scaled_dot_product_attention(
        q, k, v, M.sliding_window(8) & M.causal(), dropout_p=p, backend="blocksparse"
    )
    keep = torch.from_numpy(keep_mask(seed, (1, 2), 64, 64, p))
    ref = _window_reference(q, k, v, 8, keep, p)
    assert (out - ref).abs().max() <= 1e-10 * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("backend", ["auto", "math", "dense"])
def test_torch_func_grad_through_attention(backend):
    """torch.func.grad of sum(attention) with the bit scan loaded (it cannot read
    functorch-wrapped tensors) equals float64 autograd, 1e-5 relative (float32)."""
    scan.absmax(torch.zeros(1))  # loads the bit scan, as a process's first call does
    dispatch.clear_cache()
    torch.manual_seed(0)
    q = torch.randn(2, 4, 7, 8)
    k = torch.randn(2, 4, 9, 8)
    v = torch.randn(2, 4, 9, 8)
    F.scaled_dot_product_attention(q, k, v, backend=backend)  # remembers the plain tensors' plan
    for _ in range(2):  # wrapped tensors of the same signature take the remembered plan
        g = torch.func.grad(
            lambda a: F.scaled_dot_product_attention(a, k, v, backend=backend).sum()
        )(q)
    q64 = q.double().requires_grad_()
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k.double(), v.double())
    (rg,) = torch.autograd.grad(ref.sum(), q64)
    assert (g.double() - rg).abs().max() <= 1e-5 * max(1.0, float(rg.abs().max()))


def test_from_tensor_mask_modified_in_place_blocksparse():
    """Same mask object, tensor changed in place: the second call follows the new values
    (float64, 1e-10 absolute against a dense float64 softmax)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 8, dtype=torch.float64) for _ in range(3))
    t = torch.rand(2, 1, 40, 40) > 0.5
    t[..., :5] = True
    t[..., 20:, :] = False
    m = M.from_tensor(t)
    F.scaled_dot_product_attention(q, k, v, m, backend="blocksparse")
    t[..., 20:, :] = True
    t[..., :20, :] = False
    t[..., 20:, :5] = True
    out = F.scaled_dot_product_attention(q, k, v, m, backend="blocksparse")
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    w = torch.softmax(s.masked_fill(~t, -math.inf), -1).nan_to_num(0.0)
    w = torch.where(t.any(-1, keepdim=True), w, 0.0)
    ref = w @ v
    assert (out - ref).abs().max() <= 1e-10
