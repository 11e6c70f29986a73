"""The ``blocksparse`` backend: outputs against the float64 NumPy reference, gradients against
the math backend in float64, every mask kind and combination, odd lengths and Lq != Lk, fully
masked rows and strided inputs. Plans and dispatch: test_blocksparse_plans.py; memory:
test_blocksparse_memory.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def ref_mask(mask: M.Mask, batch_ndim: int, lq: int, lk: int) -> np.ndarray:
    """The mask as the reference's NumPy mask: batch dims lifted to line up with the leading
    batch dims of q; a biased mask becomes one float array (bias, -inf where disallowed)."""
    nb = len(mask.batch_shape)

    def lift(a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[:nb] + (1,) * (batch_ndim - nb) + a.shape[-2:])

    allowed = lift(mask.materialize(lq, lk).numpy())
    bias = mask.materialize_bias(lq, lk)
    if bias is None:
        return allowed
    return np.where(allowed, lift(bias.double().numpy()), -np.inf)


def inputs(batch, lq, lk, dk, dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch + (lq, dk), generator=g, dtype=torch.float64)
    k = torch.randn(batch + (lk, dk), generator=g, dtype=torch.float64)
    v = torch.randn(batch + (lk, dv), generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def run_blocksparse(q, k, v, mask, block_q, block_kv, scale=None):
    """The backend itself (any sparsity accepted), bypassing the dispatch thresholds."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    backend = bs.BlocksparseBackend(block_q, block_kv, min_empty=0.0)
    call = AttentionCall("dot", q, k, v, mask=mask, scale=scale)
    out, weights = dispatch.run(call, backend)
    assert weights is None
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float(a.norm())


def check(q, k, v, mask, block_q, block_kv, *, grads=True):
    """Output vs the float64 reference; gradients vs the math backend in float64."""
    dtype = q.dtype
    out = run_blocksparse(q, k, v, mask, block_q, block_kv)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + v.shape[-1:]
    assert torch.isfinite(out).all()
    lq, lk = q.shape[-2], k.shape[-2]
    want = reference.scaled_dot_product(
        q.detach().double().numpy(),
        k.detach().double().numpy(),
        v.detach().double().numpy(),
        mask=ref_mask(mask, q.dim() - 2, lq, lk),
    ).output.copy()
    err = rel(out, torch.from_numpy(want))
    assert err <= TOL[dtype], f"{mask!r} {tuple(q.shape)} {tuple(k.shape)} output rel err {err:.2e}"
    if not grads:
        return
    g = torch.Generator().manual_seed(1)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), go.to(dtype))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = F.scaled_dot_product_attention(q64, k64, v64, mask, backend="math")
    want_g = torch.autograd.grad(ref_out, (q64, k64, v64), go)
    for name, a, b in zip("qkv", got, want_g, strict=True):
        assert torch.isfinite(a).all()
        diff = float((a.double() - b).norm())
        assert diff <= TOL[dtype] * float(b.norm()) + 1e-12, (
            f"{mask!r} grad {name}: rel err {diff / max(float(b.norm()), 1e-300):.2e}"
        )


def _sorted_ids(n, ndoc, g):
    return torch.sort(torch.randint(0, ndoc, (n,), generator=g)).values


def _float_mask(shape, g):
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return t.masked_fill(torch.rand(shape, generator=g) < 0.3, -math.inf)


# name -> factory(B, Lq, Lk, generator) -> mask (None: does not apply to these lengths)
MASKS = {
    "causal": lambda b, lq, lk, g: M.causal(),
    "causal_br": lambda b, lq, lk, g: M.causal("bottom_right"),
    "window": lambda b, lq, lk, g: M.sliding_window(5),
    "window_asym_br": lambda b, lq, lk, g: M.sliding_window(3, 11, alignment="bottom_right"),
    "local_causal": lambda b, lq, lk, g: M.sliding_window(9) & M.causal(),
    "key_padding": lambda b, lq, lk, g: M.key_padding([lk, max(1, lk // 3)][:b]),
    "key_padding_zero": lambda b, lq, lk, g: M.key_padding([0, lk // 2][:b]),
    "document": lambda b, lq, lk, g: M.document(_sorted_ids(lq, 4, g)) if lq == lk else None,
    "document_unsorted": lambda b, lq, lk, g: (
        M.document(torch.randint(0, 3, (lq,), generator=g)) if lq == lk else None
    ),
    "document_batched_kv": lambda b, lq, lk, g: M.document(
        torch.stack([_sorted_ids(lq, 3, g) for _ in range(b)]),
        torch.stack([_sorted_ids(lk, 4, g) for _ in range(b)]),
    ),
    "document_causal": lambda b, lq, lk, g: (
        M.document(_sorted_ids(lq, 5, g)) & M.causal() if lq == lk else None
    ),
    "document_causal_batched": lambda b, lq, lk, g: (
        M.causal() & M.document(torch.stack([_sorted_ids(lq, 3, g) for _ in range(b)]))
        if lq == lk
        else None
    ),
    "prefix": lambda b, lq, lk, g: M.prefix_lm(min(lk, 6)),
    "prefix_batched": lambda b, lq, lk, g: M.prefix_lm([0, lk // 2][:b]),
    "predicate_bh": lambda b, lq, lk, g: M.from_predicate(
        lambda bi, h, qi, kj: (qi + 2 * kj + bi + h) % 5 < 2, batch_size=b, num_heads=3
    ),
    "tensor_bool": lambda b, lq, lk, g: M.from_tensor(
        torch.rand((b, 1, lq, lk), generator=g) > 0.6
    ),
    "tensor_float": lambda b, lq, lk, g: M.from_tensor(_float_mask((1, 3, lq, lk), g)),
    "key_padding_mask": lambda b, lq, lk, g: M.from_key_padding_mask(
        torch.rand((b, lk), generator=g) < 0.4
    ),
    "additive": lambda b, lq, lk, g: M.from_additive(_float_mask((lq, lk), g)),
    "alibi_causal": lambda b, lq, lk, g: M.alibi(0.3) & M.causal(),
    "alibi_window": lambda b, lq, lk, g: M.alibi(0.1) & M.sliding_window(4),
    "key_padding_window": lambda b, lq, lk, g: (
        M.key_padding([lk, lk // 2][:b]) & M.sliding_window(6)
    ),
    "document_or_padding": lambda b, lq, lk, g: (
        M.document(
            torch.stack([_sorted_ids(lq, 3, g) for _ in range(b)]),
            torch.stack([_sorted_ids(lk, 3, g) for _ in range(b)]),
        )
        | M.key_padding([2, 1][:b])
    ),
    "prefix_causal_or_window": lambda b, lq, lk, g: (
        (M.prefix_lm([3, 0][:b]) & M.causal()) | M.sliding_window(2)
    ),
    "all_masked": lambda b, lq, lk, g: M.from_tensor(torch.zeros((lq, lk), dtype=torch.bool)),
}

SMALL_SHAPES = [(1, 1), (7, 7), (97, 97), (97, 61), (61, 97), (150, 150)]
SQUARE_ONLY = {"document", "document_unsorted", "document_causal", "document_causal_batched"}


def mask_cases(shapes):
    """(lq, lk, name) for every mask that is defined at that shape (some need Lq == Lk)."""
    return [
        pytest.param(lq, lk, name, id=f"{name}-{lq}x{lk}")
        for lq, lk in shapes
        for name in MASKS
        if lq == lk or name not in SQUARE_ONLY
    ]


def make(name, batch, lq, lk, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = MASKS[name](batch[0], lq, lk, g)
    if mask is None:
        raise AssertionError(f"{name} needs Lq == Lk: add it to SQUARE_ONLY")
    return mask


# ---------------------------------------------------------------------------------------------
# correctness
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lq,lk,name", mask_cases(SMALL_SHAPES))
def test_every_mask_float64_small_blocks(name, lq, lk):
    """Blocks (16, 8) so that short sequences span many blocks, none dividing the lengths."""
    batch = (2, 3)
    mask = make(name, batch, lq, lk, seed=lq + lk)
    q, k, v = inputs(batch, lq, lk, 8, 8, torch.float64, seed=lq * lk)
    check(q, k, v, mask, 16, 8)


@pytest.mark.parametrize("lq,lk,name", mask_cases([(97, 61), (150, 150)]))
def test_every_mask_float32(name, lq, lk):
    batch = (2, 3)
    mask = make(name, batch, lq, lk, seed=3)
    q, k, v = inputs(batch, lq, lk, 16, 16, torch.float32, seed=lq)
    check(q, k, v, mask, 32, 16)


LONG_MASKS = [
    "window",
    "window_asym_br",
    "local_causal",
    "key_padding_window",
    "document",
    "document_causal",
    "document_causal_batched",
    "document_batched_kv",
    "prefix_batched",
    "alibi_window",
    "causal_br",
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "lq,lk,name",
    [c for c in mask_cases([(1025, 1025), (1025, 700)]) if c.values[2] in LONG_MASKS],
)
def test_long_sequences_default_blocks(name, lq, lk, dtype):
    batch = (2, 2)
    mask = make(name, batch, lq, lk, seed=5)
    q, k, v = inputs(batch, lq, lk, 16, 16, dtype, seed=7)
    check(q, k, v, mask, bs.BLOCK_Q, bs.BLOCK_KV, grads=(dtype == torch.float64))


@pytest.mark.parametrize("name", ["window", "document", "key_padding_window", "alibi_causal"])
def test_bfloat16(name):
    batch = (2, 2)
    mask = make(name, batch, 150, 150, seed=2)
    q, k, v = inputs(batch, 150, 150, 16, 16, torch.bfloat16, seed=2)
    check(q, k, v, mask, 32, 16, grads=False)


@pytest.mark.parametrize("name", ["window", "document_batched_kv", "key_padding_window", "prefix"])
def test_value_width_differs_from_key_width(name):
    mask = make(name, (2, 3), 61, 70, seed=1) if name != "prefix" else M.prefix_lm(9)
    q, k, v = inputs((2, 3), 61, 70, 8, 5, torch.float64, seed=4)
    check(q, k, v, mask, 16, 8)


@pytest.mark.parametrize("batch", [(), (2,), (2, 3, 2)])
def test_other_batch_ranks(batch):
    for mask in (M.sliding_window(4), M.prefix_lm(5)):
        q, k, v = inputs(batch, 37, 41, 8, 8, torch.float64, seed=len(batch))
        check(q, k, v, mask, 16, 8)
    if batch:
        mask = M.key_padding([30, 3][: batch[0]]) & M.sliding_window(4)
        q, k, v = inputs(batch, 37, 41, 8, 8, torch.float64, seed=9)
        check(q, k, v, mask, 16, 8)


def test_strided_inputs_like_split_heads():
    """q/k/v as (B, H, L, d) views of (B, L, H, d) tensors, as multi-head attention makes them."""
    g = torch.Generator().manual_seed(0)
    for mask in (M.sliding_window(6), M.key_padding([40, 7]), M.document(_sorted_ids(40, 3, g))):
        q, k, v = (
            torch.randn(2, 40, 3, 8, generator=g, dtype=torch.float64)
            .transpose(1, 2)
            .requires_grad_()
            for _ in range(3)
        )
        check(q, k, v, mask, 16, 8)


def test_fully_masked_rows_give_zero_output_and_zero_gradient():
    lq, lk = 50, 30
    masks = [
        M.causal("bottom_right"),  # the first 20 rows see no key
        M.key_padding([0, 30]),  # batch element 0 sees nothing
        M.sliding_window(2, alignment="bottom_right") & M.causal("bottom_right"),
        M.from_tensor(torch.arange(lq)[:, None].expand(lq, lk) % 3 != 0),  # rows 0, 3, ... empty
    ]
    for mask in masks:
        q, k, v = inputs((2, 2), lq, lk, 8, 8, torch.float64, seed=0)
        out = run_blocksparse(q, k, v, mask, 16, 8)
        allowed = torch.from_numpy(ref_mask(mask, 2, lq, lk)).expand(2, 2, lq, lk)
        empty = ~allowed.any(-1)
        assert empty.any()
        assert torch.equal(out[empty], torch.zeros_like(out[empty])), repr(mask)
        gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
        assert all(torch.isfinite(t).all() for t in (gq, gk, gv))
        assert torch.equal(gq[empty], torch.zeros_like(gq[empty]))
        check(q, k, v, mask, 16, 8)


def test_functional_entry_point_with_forced_backend():
    """Through attnkit.functional, with a tensor mask and with a mask object."""
    batch, lq = (2, 4), 1025
    q, k, v = inputs(batch, lq, lq, 16, 16, torch.float32, seed=0)
    mask = M.sliding_window(32) & M.causal()
    out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    want = reference.scaled_dot_product(
        *(t.detach().double().numpy() for t in (q, k, v)), mask=ref_mask(mask, 2, lq, lq)
    ).output.copy()
    assert rel(out, torch.from_numpy(want)) <= 1e-5
    dense = mask.materialize(lq, lq)  # the same mask as a bool tensor (True = may attend)
    out_t = F.scaled_dot_product_attention(q, k, v, dense, backend="blocksparse")
    assert rel(out_t, torch.from_numpy(want)) <= 1e-5
    out_u = F.dot_product_attention(q, k, v, mask, backend="blocksparse")
    want_u = reference.dot_product(
        *(t.detach().double().numpy() for t in (q, k, v)), mask=ref_mask(mask, 2, lq, lq)
    ).output.copy()
    assert rel(out_u, torch.from_numpy(want_u)) <= 1e-5
