"""The numba split-K decode kernel (kernels/decode/split_k.py, nb_kernels.py), float32 and bf16.

- The kernel itself, called directly (so its numerics are tested on any CPU, native bf16 or
  not): against the float64 reference of the same (bf16-rounded) inputs, odd Lk (1, 7, 97,
  2049), grouped rows, generic and fixed widths (64, 128), splits of the keys (down to one key
  per split), 1 and 2 threads on torch's OpenMP threads and on the thread pool, strided and
  transposed caches; its policy checks (a score outside the bound, NaN/inf in K or
  V: None, i.e. redo exactly).
- The backend on bf16 where the CPU has native bf16 (skipped with the reason elsewhere), and
  its refusal with a reason where the CPU has none.
- The whole float32 decode test module again with every float32 step forced onto the kernel.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.cpu import native_bf16
from attnkit.kernels.decode import backend as decode_backend
from attnkit.kernels.decode import kernel as decode_kernel
from attnkit.kernels.decode import split_k as SK
from attnkit.kernels.decode.kernel import SCORE_LIMIT
from attnkit.kernels.tuning import current, use
from tests.kernels import test_decode as T
from tests.support.numerics import to_np

pytestmark = pytest.mark.skipif(SK.numba_missing() is not None, reason="numba is not usable")

F32_ABS = 2e-6  # float32 accumulation of exactly representable inputs, |out| <= max|v| ~ 4
BF16_ABS = 2.0**-7 * 4  # the output rounded to bf16 (8 significant bits) at |out| <= 4


def _inputs(blocks, rows, n, dk=32, dv=24, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(blocks, rows, dk, generator=g)
    k = torch.randn(blocks, n, dk, generator=g).to(dtype)
    v = torch.randn(blocks, n, dv, generator=g).to(dtype)
    return q, k, v


def _ref(q, k, v, scale):
    """float64 reference of the kernel's inputs as stored (bf16 values widened exactly)."""
    return R.scaled_dot_product(to_np(q), to_np(k.double()), to_np(v.double()), None, scale=scale)


RUNS = ["1 thread", "2 threads, openmp", "2 threads, thread pool"]
"""How a step's units are run: in the caller, on torch's OpenMP threads, or (where torch has
no OpenMP) on attnkit's thread pool."""


def _run(run: str, monkeypatch, fn):
    """fn() with the thread count and route of ``run``."""
    if run.endswith("thread pool"):
        monkeypatch.setattr(SK.openmp, "available", lambda: False)
    elif run.endswith("openmp") and not SK.openmp.available():
        pytest.skip("torch here has no OpenMP runtime attnkit can find")
    old = torch.get_num_threads()
    torch.set_num_threads(1 if run == "1 thread" else 2)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 97, 2049])
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("widths", [(32, 24), (64, 64), (128, 128)])
@pytest.mark.parametrize("run", RUNS)
def test_kernel_matches_the_float64_reference(dtype, n, rows, widths, run, monkeypatch):
    """Every key split size (MIN_SPLIT 1 forces many splits), widths compiled as the call's
    and the two compiled as constants (64, 128), keys in groups of 8 with tails of 1..7, every
    route."""
    monkeypatch.setattr(SK, "MIN_SPLIT", 1 if n < 100 else 256)
    monkeypatch.setattr(SK, "ONE_THREAD_BYTES", 0)  # small calls on every thread too
    dk, dv = widths
    q, k, v = _inputs(3 if rows == 1 else 1, rows, n, dk=dk, dv=dv, dtype=dtype, seed=n + rows)
    scale = dk**-0.5
    out = _run(run, monkeypatch, lambda: SK.attend_split_k(q, k, v, scale, SCORE_LIMIT))
    assert out is not None and out.dtype == torch.float32 and out.shape == (q.shape[0], rows, dv)
    np.testing.assert_allclose(to_np(out), _ref(q, k, v, scale).output, atol=F32_ABS, rtol=0)


@pytest.mark.parametrize("splits", [1, 2, 5, 64])
def test_partial_softmaxes_combine_exactly(splits, monkeypatch):
    """The combine of split partial softmaxes against one pass: scores spread so that the
    splits have very different maxima (keys scaled up along the sequence)."""
    monkeypatch.setattr(SK, "splits_for", lambda blocks, n, threads: splits)
    q, k, v = _inputs(2, 4, 320, seed=3)
    k = k * torch.linspace(0.1, 3.0, 320)[None, :, None]
    out = SK.attend_split_k(q, k, v, 0.5, SCORE_LIMIT)
    # scores up to ~40: float32's exp and sums carry ~|s| eps of relative error
    np.testing.assert_allclose(to_np(out), _ref(q, k, v, 0.5).output, atol=1e-5, rtol=1e-5)


def test_splits_give_every_thread_work_and_respect_the_least_split():
    assert SK.splits_for(8, 2048, 2) == 1  # 8 blocks already feed 2 threads
    assert SK.splits_for(1, 2048, 2) == 4  # one block: 4 splits of 512 keys
    assert SK.splits_for(1, 300, 2) == 1  # too short to split (MIN_SPLIT 256)
    assert SK.splits_for(3, 10**6, 1) == 1  # one thread: no split needed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["buffer", "transposed", "stepped", "offset"])
@pytest.mark.parametrize("width", [16, 64])
def test_cache_layouts_are_read_in_place_or_copied(dtype, layout, width):
    q, k, v = _inputs(1, 2, 97, dk=width, dv=width, dtype=dtype, seed=4)
    ks = T._cache_layouts(k.float()[None])[layout][0].to(dtype)
    vs = T._cache_layouts(v.float()[None])[layout][0].to(dtype)
    out = SK.attend_split_k(q, ks, vs, 0.25, SCORE_LIMIT)
    np.testing.assert_allclose(to_np(out), _ref(q, k, v, 0.25).output, atol=F32_ABS, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("where", ["k_inf", "k_nan", "v_inf", "v_nan", "huge"])
@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("run", RUNS)
def test_policy_breaks_return_none(dtype, where, width, run, monkeypatch):
    """A score outside (-limit, limit) or not a number, or a non-finite output: None (the
    generic width and a fixed one, on every route)."""
    monkeypatch.setattr(SK, "ONE_THREAD_BYTES", 0)
    q, k, v = _inputs(2, 2, 600, dk=width, dv=width, dtype=dtype, seed=5)
    t, val = {"k_inf": (k, math.inf), "k_nan": (k, math.nan)}.get(where, (v, math.inf))
    if where == "v_nan":
        val = math.nan
    if where == "huge":
        q = q * 1e19
        k = (k.float() * 1e19).to(dtype)
    else:
        t[1, 333, 0] = val
    assert _run(run, monkeypatch, lambda: SK.attend_split_k(q, k, v, 1.0, SCORE_LIMIT)) is None


def test_limit_is_strict():
    """Scores of exactly the limit are refused, just below accepted."""
    q = torch.ones(1, 1, 1)
    k = torch.full((1, 300, 1), 4.0)
    v = torch.ones(1, 300, 1)
    assert SK.attend_split_k(q, k, v, 1.0, 4.0) is None
    out = SK.attend_split_k(q, k, v, 1.0, 4.5)
    assert out is not None and abs(float(out) - 1.0) < 1e-6


needs_bf16 = pytest.mark.skipif(
    not native_bf16(), reason="this CPU has no native bf16: attnkit never routes bf16 to decode"
)


@needs_bf16
@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("lq,lk", [(1, 1), (1, 2049), (4, 97), (16, 7)])
def test_bf16_decode_through_the_backend(g, lq, lk):
    """bf16 q, k, v: decode's output (rounded to bf16) against float64 of the same values."""
    q, k, v = T._qkv((2, 4), lq, lk, g=g, seed=lk + g)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    with torch.no_grad():
        out = F.grouped_query_attention(q, k, v, M.causal("bottom_right"), backend="decode")
    assert out.dtype == torch.bfloat16
    ref = T._ref(q.double(), k.double(), v.double(), None if lq == 1 else _br(lq, lk))
    np.testing.assert_allclose(to_np(out.double()), ref, atol=BF16_ABS, rtol=2.0**-7)


def _br(lq: int, lk: int) -> np.ndarray:
    """Bottom-right causal as a bool (Lq, Lk) array."""
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)


@needs_bf16
def test_bf16_masks_that_need_a_tile_are_redone_exactly():
    """Key padding with different lengths per batch row (a tile): the dense redo, same values."""
    q, k, v = (x.to(torch.bfloat16) for x in T._qkv((3, 2), 1, 97, seed=8))
    mask = M.key_padding([1, 50, 97])
    with torch.no_grad():
        got = F.scaled_dot_product_attention(q, k, v, mask, backend="decode")
        exact = F.scaled_dot_product_attention(q, k, v, mask, backend="dense")
    torch.testing.assert_close(got, exact, rtol=0, atol=0)


@needs_bf16
def test_auto_picks_decode_for_bf16_steps():
    q, k, v = (x.to(torch.bfloat16) for x in T._qkv((1, 8), 1, 600, d=64, dv=64))
    assert F.explain_dispatch(q, k, v).chosen == "decode"


def test_bf16_is_refused_with_a_reason_without_native_bf16(monkeypatch):
    monkeypatch.setattr(decode_backend, "_native_bf16", lambda: False)
    q, k, v = (x.to(torch.bfloat16) for x in T._qkv((1, 8), 1, 600, d=64, dv=64))
    report = F.explain_dispatch(q, k, v, backend="auto")
    assert report.chosen != "decode"
    assert any("native bf16" in w for w in report.reasons["decode"]), report.reasons


@pytest.fixture
def split_k_for_float32():
    """Every float32 decode step on the split-K kernel (where the mask allows its whole range)."""
    with use(dataclasses.replace(current(), decode_split_k_ranges=((2**40, "split-k"),))):
        yield


@pytest.fixture
def counted(monkeypatch):
    """The calls that ran on the split-K kernel."""
    runs = []

    def count(*args):
        runs.append(1)
        return SK.attend_split_k(*args)

    monkeypatch.setattr(decode_kernel, "attend_split_k", count)
    return runs


@pytest.mark.usefixtures("split_k_for_float32")
@pytest.mark.parametrize("layout", ["buffer", "transposed", "stepped", "offset", "expanded"])
@pytest.mark.parametrize("g", [None, 1, 2])
@pytest.mark.parametrize("lk", [1, 97, 2049])
def test_float32_cache_layouts_on_the_split_k_kernel(layout, g, lk, counted):
    """One generated token (bottom-right causal: every key allowed) against each cache layout."""
    batch = (2, 4)
    q, k, v = T._qkv(batch, 1, lk, d=16, dv=16, g=g, seed=lk)
    if layout == "expanded":
        ks, vs = k[:1, :1].expand(k.shape), v[:1, :1].expand(v.shape)
    else:
        ks, vs = T._cache_layouts(k)[layout], T._cache_layouts(v)[layout]
    fn = F.scaled_dot_product_attention if g is None else F.grouped_query_attention
    with torch.no_grad():
        out = fn(q, ks, vs, M.causal("bottom_right"), backend="decode")
    T._close(out, T._ref(q, ks.contiguous(), vs.contiguous(), None))
    assert counted


@pytest.mark.usefixtures("split_k_for_float32")
def test_float32_step_equals_the_last_row_of_a_full_forward(counted):
    """Bottom-right causal and a 64-key window at Lq = 1 against the full forward's last row."""
    lk = 2049
    q, k, v = T._qkv((1, 4), lk, lk, seed=9)
    for full_mask, step_mask in [
        (M.causal(), M.causal("bottom_right")),
        (M.sliding_window(64, 0), M.sliding_window(64, 0, "bottom_right")),
    ]:
        with torch.no_grad():
            full = F.scaled_dot_product_attention(q, k, v, full_mask, backend="math")
            step = F.scaled_dot_product_attention(q[..., -1:, :], k, v, step_mask, backend="decode")
        T._close(step, to_np(full[..., -1:, :]))
    assert len(counted) == 2


@pytest.mark.usefixtures("split_k_for_float32")
def test_float32_huge_scores_on_the_split_k_kernel_are_redone_in_float64(counted):
    T.test_huge_scores_are_redone_in_float64()
    assert counted
