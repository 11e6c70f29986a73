"""The ``blocksparse`` backend: outputs against the float64 NumPy reference, gradients against
the math backend in float64, every mask kind and combination, odd lengths and Lq != Lk, fully
masked rows and strided inputs. Plans and dispatch: test_blocksparse_plans.py; memory:
test_blocksparse_memory.py.
"""

from __future__ import annotations

import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference
from attnkit.kernels import dispatch
from attnkit.kernels.blocksparse import plans
from attnkit.kernels.call.base import AttentionCall
from tests.support import masks as S
from tests.support.numerics import rel_err

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def inputs(batch, lq, lk, dk, dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch + (lq, dk), generator=g, dtype=torch.float64)
    k = torch.randn(batch + (lk, dk), generator=g, dtype=torch.float64)
    v = torch.randn(batch + (lk, dv), generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def run_blocksparse(q, k, v, mask, block_q, block_kv, scale=None):
    """The backend itself (any sparsity accepted), bypassing the dispatch thresholds; ``mask``
    as a user passes it (a mask object, a tensor or None)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    backend = bs.BlocksparseBackend(block_q, block_kv, min_empty=0.0)
    mask = M.normalize(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2])
    call = AttentionCall("dot", q, k, v, mask=mask, scale=scale)
    out, weights = dispatch.run(call, backend)
    assert weights is None
    return out


def check(q, k, v, spec: S.Spec, block_q, block_kv, *, grads=True):
    """Output vs the float64 reference (the catalogue's mask, tests/support/masks.py);
    gradients vs the math backend in float64."""
    dtype, mask = q.dtype, spec.mask
    out = run_blocksparse(q, k, v, mask, block_q, block_kv)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + v.shape[-1:]
    assert torch.isfinite(out).all()
    lq, lk = q.shape[-2], k.shape[-2]
    want = reference.scaled_dot_product(
        q.detach().double().numpy(),
        k.detach().double().numpy(),
        v.detach().double().numpy(),
        mask=S.ref_mask(spec, tuple(q.shape[:-2]), lq, lk),
    ).output.copy()
    err = rel_err(out, torch.from_numpy(want))
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


KINDS = tuple(k for k in S.KINDS if k != "none")
"""Every mask kind of the catalogue (tests/support/masks.py); ``none`` has no block to skip."""
SMALL_SHAPES = [(1, 1), (7, 7), (97, 97), (97, 61), (61, 97), (150, 150)]


def mask_cases(shapes, kinds=KINDS):
    """(lq, lk, kind) for every catalogue kind at every shape."""
    return [
        pytest.param(lq, lk, name, id=f"{name}-{lq}x{lk}") for lq, lk in shapes for name in kinds
    ]


def make(name, batch, lq, lk, seed=0) -> S.Spec:
    spec = S.make_case(name, batch, lq, lk, seed)
    assert spec is not None, f"{name} needs more batch dims than {batch}"
    return spec


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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "lq,lk,name",
    mask_cases([(1025, 1025), (1025, 700)], S.EMPTY_BLOCKS),
)
def test_long_sequences_default_blocks(name, lq, lk, dtype):
    batch = (2, 2)
    mask = make(name, batch, lq, lk, seed=5)
    q, k, v = inputs(batch, lq, lk, 16, 16, dtype, seed=7)
    check(q, k, v, mask, bs.BLOCK_Q, bs.BLOCK_KV, grads=(dtype == torch.float64))


@pytest.mark.parametrize("name", ["window", "document_1d", "key_padding&window", "alibi&causal"])
def test_bfloat16(name):
    batch = (2, 2)
    mask = make(name, batch, 150, 150, seed=2)
    q, k, v = inputs(batch, 150, 150, 16, 16, torch.bfloat16, seed=2)
    check(q, k, v, mask, 32, 16, grads=False)


@pytest.mark.parametrize("name", ["window", "document", "key_padding&window", "prefix"])
def test_value_width_differs_from_key_width(name):
    mask = make(name, (2, 3), 61, 70, seed=1) if name != "prefix" else S.prefix_lm(9)
    q, k, v = inputs((2, 3), 61, 70, 8, 5, torch.float64, seed=4)
    check(q, k, v, mask, 16, 8)


@pytest.mark.parametrize("batch", [(), (2,), (2, 3, 2)])
def test_other_batch_ranks(batch):
    for mask in (S.sliding_window(4), S.prefix_lm(5)):
        q, k, v = inputs(batch, 37, 41, 8, 8, torch.float64, seed=len(batch))
        check(q, k, v, mask, 16, 8)
    if batch:
        mask = S.key_padding([30, 3][: batch[0]]) & S.sliding_window(4)
        q, k, v = inputs(batch, 37, 41, 8, 8, torch.float64, seed=9)
        check(q, k, v, mask, 16, 8)


def test_strided_inputs_like_split_heads():
    """q/k/v as (B, H, L, d) views of (B, L, H, d) tensors, as multi-head attention makes them."""
    g = torch.Generator().manual_seed(0)
    for mask in (S.sliding_window(6), S.key_padding([40, 7]), S.document(_sorted_ids(40, 3, g))):
        q, k, v = (
            torch.randn(2, 40, 3, 8, generator=g, dtype=torch.float64)
            .transpose(1, 2)
            .requires_grad_()
            for _ in range(3)
        )
        check(q, k, v, mask, 16, 8)


def test_fully_masked_rows_give_zero_output_and_zero_gradient():
    lq, lk = 50, 30
    specs = [
        S.causal("bottom_right"),  # the first 20 rows see no key
        S.key_padding([0, 30]),  # batch element 0 sees nothing
        S.sliding_window(2, alignment="bottom_right") & S.causal("bottom_right"),
        S.tensor(torch.arange(lq)[:, None].expand(lq, lk) % 3 != 0),  # rows 0, 3, ... empty
    ]
    for mask in specs:
        q, k, v = inputs((2, 2), lq, lk, 8, 8, torch.float64, seed=0)
        out = run_blocksparse(q, k, v, mask.mask, 16, 8)
        allowed = torch.from_numpy(S.ref_mask(mask, (2, 2), lq, lk)).expand(2, 2, lq, lk)
        empty = ~allowed.any(-1)
        assert empty.any()
        assert torch.equal(out[empty], torch.zeros_like(out[empty])), repr(mask.mask)
        gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
        assert all(torch.isfinite(t).all() for t in (gq, gk, gv))
        assert torch.equal(gq[empty], torch.zeros_like(gq[empty]))
        check(q, k, v, mask, 16, 8)


def test_functional_entry_point_with_forced_backend():
    """Through attnkit.functional, with a tensor mask and with a mask object."""
    batch, lq = (2, 4), 1025
    q, k, v = inputs(batch, lq, lq, 16, 16, torch.float32, seed=0)
    spec = S.sliding_window(32) & S.causal()
    mask = spec.mask
    out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    want = reference.scaled_dot_product(
        *(t.detach().double().numpy() for t in (q, k, v)), mask=S.ref_mask(spec, batch, lq, lq)
    ).output.copy()
    assert rel_err(out, torch.from_numpy(want)) <= 1e-5
    dense = mask.materialize(lq, lq)  # the same mask as a bool tensor (True = may attend)
    out_t = F.scaled_dot_product_attention(q, k, v, dense, backend="blocksparse")
    assert rel_err(out_t, torch.from_numpy(want)) <= 1e-5
    out_u = F.dot_product_attention(q, k, v, mask, backend="blocksparse")
    want_u = reference.dot_product(
        *(t.detach().double().numpy() for t in (q, k, v)), mask=S.ref_mask(spec, batch, lq, lq)
    ).output.copy()
    assert rel_err(out_u, torch.from_numpy(want_u)) <= 1e-5


@pytest.mark.parametrize("chunk_bytes", [1, 2**15])
def test_band_backward_in_chunks_of_blocks(monkeypatch, chunk_bytes):
    """The band's interior backward run in chunks of one or a few blocks (their key-window
    gradients folded into dk, dv chunk by chunk): gradients against float64, odd lengths,
    Lq != Lk, both alignments, causal and symmetric bands."""
    monkeypatch.setattr(plans, "BACKWARD_CHUNK_BYTES", chunk_bytes)
    specs = [
        S.sliding_window(5),
        S.sliding_window(6, 0) & S.causal(),
        S.sliding_window(4, alignment="bottom_right") & S.causal("bottom_right"),
    ]
    for i, spec in enumerate(specs):
        q, k, v = inputs((2, 3), 71, 77 if i == 2 else 71, 8, 6, torch.float64, seed=i)
        check(q, k, v, spec, 8, 8)
