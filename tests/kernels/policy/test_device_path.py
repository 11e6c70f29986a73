"""The numerics policy's device path (no host sync), exercised on the CPU.

``numerics.use_path("device")`` makes CPU calls take the path CUDA calls take: the decision is
made from the dtype alone (no input scan), P1 is kept by device-side selects, and rows that are
not finite become NaN by one select. A ``TorchFunctionMode`` spy (:mod:`tests.support.host_sync`)
fails on every read of a value back to the host; outputs and gradients are compared with the
float64 reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy import numerics
from tests.support.host_sync import HostSync, NoHostSync, cuda_sync_errors
from tests.support.masks import KINDS, make_case, ref_mask

NO_SYNC_KINDS = [k for k in KINDS if k not in ("additive_extreme",)]
"""Every mask kind; ``additive_extreme`` (a bias of -finfo.max) is the host path's P2 case: on
the device path float32 scores plus that bias may round to -inf (documented)."""


def _qkv(batch, lq, lk, d=8, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(batch + (n, d), generator=g, dtype=torch.float64) for n in (lq, lk, lk)]
    return [t.to(dtype).requires_grad_(grad) for t in ts]


def _ref(q, k, v, spec, batch, lq, lk):
    m = ref_mask(spec, batch, lq, lk)
    return R.scaled_dot_product(*(t.detach().double().numpy() for t in (q, k, v)), m).output


def test_device_path_is_decided_by_device_and_can_be_forced():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert not numerics.device_path(cpu) and numerics.device_path(meta)
    with numerics.use_path("device"):
        assert numerics.device_path(cpu)
    with numerics.use_path("host"):
        assert not numerics.device_path(meta)
    assert not numerics.device_path(cpu)
    with pytest.raises(ValueError, match="path"):
        with numerics.use_path("gpu"):
            pass


def test_device_decision_reads_no_value():
    q, k, v = _qkv((2,), 5, 7, dtype=torch.bfloat16)
    call = AttentionCall("dot", q, k, v, scale=0.5)
    with numerics.use_path("device"), NoHostSync():
        work, d = numerics.prepare(call)
    assert work is call and d.checked == "device" and d.compute == torch.float32


def test_the_spy_catches_each_read():
    x = torch.ones(3)
    for read in (lambda: x.tolist(), lambda: x.sum().item(), lambda: bool(x.all()), x.cpu):
        with pytest.raises(HostSync), NoHostSync():
            read()


@pytest.mark.parametrize("kind", NO_SYNC_KINDS)
def test_dense_on_the_device_path_never_syncs_and_matches_float64(kind):
    batch, lq, lk = (2, 3), 5, 9
    spec = make_case(kind, batch, lq, lk, seed=1)
    if spec is None:
        pytest.skip(f"{kind} needs more batch dims")
    q, k, v = _qkv(batch, lq, lk, seed=2, grad=True)
    with numerics.use_path("device"):
        F.scaled_dot_product_attention(q, k, v, spec.mask, backend="dense")  # checks: first call
        with NoHostSync():
            out = F.scaled_dot_product_attention(q, k, v, spec.mask, backend="dense")
            out.backward(torch.ones_like(out))
    ref = _ref(q, k, v, spec, batch, lq, lk)
    np.testing.assert_allclose(out.detach().double().numpy(), ref, atol=2e-6, rtol=1e-5)
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", [None, "top_left", "bottom_right"])
def test_grouped_causal_calls_never_sync(dtype, mask):
    q, k, v = _qkv((2, 8), 6, 11, dtype=dtype, seed=3)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    m = None if mask is None else M.causal(mask)
    with numerics.use_path("device"):
        F.grouped_query_attention(q, k, v, m)
        with NoHostSync():
            out = F.grouped_query_attention(q, k, v, m)
    spec_mask = None if m is None else m.materialize(6, 11).numpy()
    kr, vr = (t.double().repeat_interleave(4, 1).numpy() for t in (k, v))
    ref = R.scaled_dot_product(q.double().numpy(), kr, vr, spec_mask).output
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    np.testing.assert_allclose(out.double().numpy(), ref, atol=tol, rtol=tol)


def test_rows_without_keys_give_zero_not_nan_without_a_sync():
    q, k, v = _qkv((2,), 6, 4)
    mask = M.causal("bottom_right")  # Lq > Lk: the first two rows have no key
    with numerics.use_path("device"):
        F.scaled_dot_product_attention(q, k, v, mask, backend="dense")
        with NoHostSync():
            out = F.scaled_dot_product_attention(q, k, v, mask, backend="dense")
    assert torch.equal(out[:, :2], torch.zeros_like(out[:, :2]))
    m = mask.materialize(6, 4).numpy()
    ref = R.scaled_dot_product(*(t.double().numpy() for t in (q, k, v)), m).output
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_inputs_make_the_output_nan_on_the_device_path(where, bad):
    """The device path's P6 (conventions guide), without reading a value back: a NaN or inf in
    a q row makes that row NaN; one anywhere in k or v makes every row of its batch element and
    head NaN (even rows whose mask excludes the key); the other heads are untouched. The host
    path sets only the rows that read it."""
    q, k, v = _qkv((1, 2), 4, 6)
    t = {"q": q, "k": k, "v": v}[where]
    t[0, 0, 1, 0] = bad
    with numerics.use_path("device"), NoHostSync():
        out = F.scaled_dot_product_attention(q, k, v, M.causal(), backend="dense")
    want = torch.zeros(1, 2, 4, dtype=torch.bool)
    if where == "q":
        want[0, 0, 1] = True
    else:
        want[0, 0] = True
    assert torch.equal(torch.isnan(out).any(-1), want)
    assert torch.equal(torch.isnan(out).all(-1), want)
    causal = M.causal().materialize(4, 6).numpy()
    ref1 = R.scaled_dot_product(*(x[0, 1].double().numpy() for x in (q, k, v)), causal).output
    np.testing.assert_allclose(out[0, 1].numpy(), ref1, atol=2e-6, rtol=1e-5)
    host = F.scaled_dot_product_attention(q, k, v, M.causal(), backend="dense")
    assert torch.isnan(host).any() and not torch.isnan(host).all()


def test_non_finite_keys_spare_other_batch_elements_and_their_empty_rows():
    """Batch 1 holds a NaN key; batch 0 has no allowed key at all (key_padding 0): its rows
    stay 0 (P1), never NaN, and batch 1's rows are NaN; grouped heads map k/v head g to its
    group of query heads; float64 calls take the same path."""
    for dtype in (torch.float32, torch.float64):
        q, k, v = _qkv((2, 4), 3, 5, dtype=dtype)
        k, v = k[:, :2].clone(), v[:, :2].clone()  # 2 k/v heads for 4 query heads
        k[1, 1, 2, 0] = math.nan  # batch 1, k/v head 1: query heads 2 and 3
        mask = M.key_padding([0, 5])
        with numerics.use_path("device"), NoHostSync():
            out = F.grouped_query_attention(q, k, v, mask, backend="dense")
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert torch.isnan(out[1, 2:]).all() and not torch.isnan(out[1, :2]).any()
        for h in (0, 1):  # query heads 0 and 1 read k/v head 0
            x = (q[1, h], k[1, 0], v[1, 0])
            ref = R.scaled_dot_product(*(t.double().numpy() for t in x)).output
            np.testing.assert_allclose(out[1, h].double().numpy(), ref, atol=2e-6, rtol=1e-5)


def test_float64_and_additive_calls_on_the_device_path():
    """float64 inputs (no narrowing in the device-side checks) for dot-product and additive
    attention, against the float64 reference, without a host read."""
    q, k, v = _qkv((2,), 5, 7, dtype=torch.float64)
    with numerics.use_path("device"), NoHostSync():
        out = F.scaled_dot_product_attention(q, k, v, M.causal("bottom_right"), backend="dense")
    m = M.causal("bottom_right").materialize(5, 7).numpy()
    ref = R.scaled_dot_product(*(t.numpy() for t in (q, k, v)), m).output
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    g = torch.Generator().manual_seed(4)
    wq, wk, wv = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((6, 8), (6, 8), (6,)))
    with numerics.use_path("device"), NoHostSync():
        add = F.additive_attention(q, k, v, wq, wk, wv, backend="additive_chunked")
    ref = R.additive(*(t.numpy() for t in (q, k, v, wq, wk, wv))).output
    np.testing.assert_allclose(add.numpy(), ref, atol=1e-10)


def test_overflow_on_the_device_path_is_nan_not_a_silent_value():
    """Scores beyond float32 (bf16 inputs of 1e30): the host path computes in float64; the
    device path cannot branch on values, and gives NaN rows, never a finite wrong output."""
    q, k, v = _qkv((1,), 3, 5, dtype=torch.bfloat16)
    q = q * 1e30
    k = k * 1e30
    with numerics.use_path("device"):
        out = F.scaled_dot_product_attention(q, k, v, backend="dense")
    assert torch.isnan(out).all(-1).any()
    assert not (torch.isinf(out)).any()
    host = F.scaled_dot_product_attention(q, k, v, backend="dense")  # the scan: float64
    assert torch.isfinite(host).all()


def test_overflow_bound_flags_rows_even_when_the_kernel_returns_a_finite_value():
    """A kernel need not turn an overflow into NaN (torch 2.15's CPU kernel gives 0): the rows
    whose bound d * max|q_i| * max|k| reaches the score limit are bad whatever ``out`` holds;
    rows far below it are not, and grouped heads use their own k/v head's bound. No host read."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k = torch.randn(2, 2, 5, 8, generator=g)
    v = torch.randn(2, 2, 5, 8, generator=g)
    q[0, 1, 2] *= 1e20  # row 2 of query head 1, which reads k/v head 0 of element 0
    k[0, 0] *= 1e19  # every key of that head: only the huge q row reaches the limit
    k[1, 1, 4] *= 1e20  # k/v head 1 of element 1, read by query heads 2 and 3
    q[1, 3, 0] *= 1e19
    out = torch.zeros(2, 4, 3, 8)  # finite, as the silent kernel leaves it
    limit = torch.finfo(torch.float32).max / 4
    with NoHostSync():
        bad = numerics.device_bad_rows(q, k, v, out, limit)[..., 0]
    want = torch.zeros(2, 4, 3, dtype=torch.bool)
    want[0, 1, 2] = want[1, 3, 0] = True
    # the bound in float64 (no row is near the limit)
    qm = q.double().abs().amax(-1)
    km = k.double().abs().amax((-2, -1)).repeat_interleave(2, 1)
    assert torch.equal(8 * qm * km[..., None] >= limit, want)
    assert torch.equal(bad, want)
    assert not numerics.device_bad_rows(q, k, v, out)[..., 0].any()  # no limit: finite is fine


def test_overflow_on_the_device_path_is_nan_for_every_kernel():
    """fp32 scores beyond float32 on the device path: NaN rows from every backend that runs
    them, and the host path's float64 gives finite rows."""
    q, k, v = _qkv((1,), 3, 5)
    q, k = q * 1e20, k * 1e20
    for backend in ("dense", "math"):
        with numerics.use_path("device"), NoHostSync():
            out = F.scaled_dot_product_attention(q, k, v, backend=backend)
        assert torch.isnan(out).all(), backend
    assert torch.isfinite(F.scaled_dot_product_attention(q, k, v, backend="dense")).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
@pytest.mark.parametrize("mask", [None, "top_left", "bottom_right"])
def test_cuda_calls_raise_no_sync_error(mask):
    q, k, v = (t.cuda() for t in _qkv((2, 8), 64, 96, dtype=torch.bfloat16))
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    m = None if mask is None else M.causal(mask)
    F.grouped_query_attention(q, k, v, m)
    with cuda_sync_errors():
        out = F.grouped_query_attention(q, k, v, m)
    spec = None if m is None else m.materialize(64, 96).numpy()
    kr, vr = (t.double().cpu().repeat_interleave(4, 1).numpy() for t in (k, v))
    ref = R.scaled_dot_product(q.double().cpu().numpy(), kr, vr, spec).output
    np.testing.assert_allclose(out.double().cpu().numpy(), ref, atol=2e-2, rtol=2e-2)


CUDA_KINDS = ["none", "tensor_bool", "tensor_float", "raw_bool", "raw_float_heads", "all_masked"]
"""Kinds whose mask lives on the device (tensors): no host copy. Mask objects built from
parameters (windows, documents, ...) are Flex's (issue 29, section 3)."""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", CUDA_KINDS)
def test_cuda_tensor_masks_without_sync_forward_and_backward(kind, dtype):
    batch, lq, lk = (2, 3), 33, 70
    spec = make_case(kind, batch, lq, lk, seed=1)
    mask = spec.mask
    if isinstance(mask, torch.Tensor):
        mask = mask.cuda()
    q, k, v = (t.detach().cuda().requires_grad_() for t in _qkv(batch, lq, lk, 16, dtype))
    F.scaled_dot_product_attention(q, k, v, mask)
    with cuda_sync_errors():
        out = F.scaled_dot_product_attention(q, k, v, mask)
        out.backward(torch.ones_like(out))
    ref = _ref(q, k, v, spec, batch, lq, lk)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    np.testing.assert_allclose(out.detach().double().cpu().numpy(), ref, atol=tol, rtol=tol)
    assert torch.isfinite(q.grad).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_cuda_decode_step_with_a_kv_cache_never_syncs():
    from attnkit.nn import KVCache

    cache = KVCache()
    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(1, 2, 300, 32, generator=g).cuda() for _ in range(2))
    cache.update(k, v, 300)
    q = torch.randn(1, 8, 1, 32, generator=g).cuda()
    k1, v1 = (torch.randn(1, 2, 1, 32, generator=g).cuda() for _ in range(2))
    with cuda_sync_errors():
        ck, cv = cache.update(k1, v1, 1)
        out = F.grouped_query_attention(q, ck, cv, M.causal("bottom_right"))
    assert ck.device.type == "cuda" and cache._rows.k_max.device.type == "cuda"
    kr, vr = (t.double().cpu().repeat_interleave(4, 1) for t in (ck, cv))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double().cpu(), kr, vr)
    torch.testing.assert_close(out.double().cpu(), ref, atol=2e-5, rtol=2e-5)


def test_sinks_and_softcap_on_the_device_path_read_nothing_back():
    """Sinks are checked for NaN on the host path (a ValueError); on the device path the check
    would be a sync, so a NaN sink makes its head's rows NaN; finite ones equal the host path."""
    q, k, v = _qkv((1, 2), 4, 6)
    sinks = torch.tensor([0.5, -1.0])
    kw = dict(sinks=sinks, softcap=5.0, backend="math")  # blocksparse is CPU-only
    host = F.scaled_dot_product_attention(q, k, v, M.causal(), **kw)
    with numerics.use_path("device"):
        F.scaled_dot_product_attention(q, k, v, M.causal(), **kw)
        with NoHostSync():
            dev = F.scaled_dot_product_attention(q, k, v, M.causal(), **kw)
        nan_sink = torch.tensor([math.nan, 0.0])
        bad = F.scaled_dot_product_attention(q, k, v, sinks=nan_sink, backend="math")
    torch.testing.assert_close(dev, host, atol=2e-6, rtol=1e-5)
    assert torch.isnan(bad[:, 0]).all() and not torch.isnan(bad[:, 1]).any()  # its head's rows
    with pytest.raises(ValueError, match="sinks"):
        F.scaled_dot_product_attention(q, k, v, sinks=torch.tensor([math.nan, 0.0]))
