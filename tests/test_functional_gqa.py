"""Grouped-query attention (H query heads over G key/value heads) on every dot backend, against
the float64 reference with k and v repeated in NumPy: outputs and the gradients of q, k, v and
of every float mask tensor that requires grad, relative error <= 1e-10 (float64) / 1e-5
(float32), for H/G in (8/2, 6/3, 4/1), Lq != Lk, masks of the shared catalogue and the memory
layouts of :mod:`tests.support.layouts`. Also: the native path (``dense``, SDPA's
``enable_gqa``) receives k and v with G heads and repeats nothing, the others receive them
repeated, and a repeated signature is not dispatched again.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from attnkit import call_checks, calls, heads, kernels, reference
from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels import blocksparse as bs
from attnkit.kernels import dispatch
from attnkit.kernels.call import base as call_base
from attnkit.nn import MultiHeadAttention
from tests.support import grads as G
from tests.support import layouts
from tests.support.masks import make_case, reduce_grad, ref_mask
from tests.support.numerics import TOL, rel_err, to_np

GROUPS = ((8, 2), (6, 3), (4, 1))
BACKENDS = ("math", "dense", "blocksparse", "auto")
KINDS = ("none", "causal_br", "window", "key_padding", "tensor_float_grad", "all_masked")
B, LQ, LK, D = 2, 7, 13, 8


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """blocksparse with 4 x 4 blocks accepting any sparsity, so that it serves these sizes."""
    monkeypatch.setitem(kernels.BACKENDS, "blocksparse", bs.BlocksparseBackend(4, 4, 0.0))
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def _leaf_grad(leaf: torch.Tensor, view, g: np.ndarray) -> np.ndarray:
    """The float64 gradient of ``leaf`` given the gradient ``g`` of ``view(leaf)``."""
    x = leaf.detach().double().requires_grad_()
    (dx,) = torch.autograd.grad(view(x), x, torch.from_numpy(np.ascontiguousarray(g)))
    return dx.numpy()


def check(h, g, kind, backend, layout="contiguous", dtype=torch.float64, lq=LQ, lk=LK, seed=0):
    """grouped_query_attention: output and every gradient against the float64 reference."""
    spec = make_case(kind, (B, h), lq, lk, seed)
    if backend == "blocksparse" and spec.mask is None:
        backend = "dense"  # blocksparse serves masked calls only (test_blocksparse covers that)
    gen = torch.Generator().manual_seed(seed)
    ins = {}
    for name, shape in (("q", (B, h, lq, D)), ("k", (B, g, lk, D)), ("v", (B, g, lk, D))):
        leaf, view = layouts.make(shape, layout, dtype, gen)
        ins[name] = (leaf.requires_grad_(), view)
    xs = {n: view(leaf) for n, (leaf, view) in ins.items()}
    out = F.grouped_query_attention(xs["q"], xs["k"], xs["v"], spec.mask, backend=backend)
    where = f"H={h} G={g} {kind} {backend} {layout} {dtype}"
    np64 = {n: to_np(view(leaf.detach().double())) for n, (leaf, view) in ins.items()}
    kr, vr = (np.repeat(np64[n], h // g, axis=1) for n in ("k", "v"))
    trace = reference.scaled_dot_product(np64["q"], kr, vr, mask=ref_mask(spec, (B, h), lq, lk))
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == trace.output.shape, where
    assert rel_err(out, trace.output) <= tol, f"{where}: output"
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(dtype)
    ref_g = G.dot(trace, to_np(d_out))
    for n in ("k", "v"):  # a shared head's gradient sums over the query heads that read it
        ref_g[n] = ref_g[n].reshape(B, g, h // g, lk, D).sum(2)
    out.backward(d_out)
    for n, (leaf, view) in ins.items():
        err = rel_err(leaf.grad, _leaf_grad(leaf, view, ref_g[n]))
        assert err <= tol, f"{where}: gradient of {n} rel err {err:.3g}"
    for i, (t, shape, nb) in enumerate(spec.leaves()):
        want = reduce_grad(ref_g["bias"], shape, nb).reshape(t.shape)
        assert rel_err(t.grad, want) <= tol, f"{where}: gradient of mask tensor {i}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h,g", GROUPS)
def test_grouped_query_attention_against_reference(h, g, backend, kind):
    check(h, g, kind, backend, seed=zlib.crc32(f"{h}{g}{kind}".encode()) % 1000)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_query_attention_layouts(layout, backend):
    check(8, 2, "window", backend, layout=layout, seed=3)
    check(6, 3, "none", backend, layout=layout, seed=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_query_attention_float32_lk_lt_lq(backend):
    check(4, 1, "causal_br", backend, dtype=torch.float32, lq=13, lk=5, seed=5)
    check(8, 2, "tensor_float_grad", backend, dtype=torch.float32, lq=1, lk=9, seed=6)


# ---------------------------------------------------------------------------------------------
# what the backends receive
# ---------------------------------------------------------------------------------------------
class Seen:
    """Records the k shape each backend's run receives; fails on any repeat of k/v heads."""

    def __init__(self, monkeypatch):
        self.k_shapes: dict[str, list] = {}
        for name, b in list(kernels.BACKENDS.items()):
            monkeypatch.setattr(b, "run", self._wrap(name, b.run))

        def no_repeat(*a, **kw):
            raise AssertionError("k/v heads were repeated")

        self.no_repeat = no_repeat
        self.monkeypatch = monkeypatch

    def _wrap(self, name, run):
        def recorded(call, decision):
            self.k_shapes.setdefault(name, []).append(tuple(call.k.shape))
            return run(call, decision)

        return recorded

    def forbid_repeats(self):
        for mod in (heads, calls, call_base):
            for attr in ("repeat_heads", "repeat_kv_heads"):
                if hasattr(mod, attr):
                    self.monkeypatch.setattr(mod, attr, self.no_repeat)
        self.monkeypatch.setattr(torch.Tensor, "repeat_interleave", self.no_repeat)
        self.monkeypatch.setattr(torch, "repeat_interleave", self.no_repeat)


def _qkv(h, g, grad=False, lq=5, lk=9):
    gen = torch.Generator().manual_seed(0)
    shapes = ((B, h, lq, D), (B, g, lk, D), (B, g, lk, D))
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_(grad) for s in shapes]


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("mask", [None, M.causal("bottom_right"), M.key_padding([9, 4])])
def test_native_path_does_not_repeat_k_and_v(monkeypatch, mask, grad):
    """dense (SDPA enable_gqa) gets k with G heads, forward and backward, and no repeat runs."""
    seen = Seen(monkeypatch)
    q, k, v = _qkv(8, 2, grad)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), mask, backend="math"
    )
    seen.forbid_repeats()
    out = F.grouped_query_attention(q, k, v, mask, backend="dense")
    if grad:
        out.sum().backward()
    assert seen.k_shapes["dense"] == [(B, 2, 9, D)]
    assert rel_err(out, ref.detach()) <= 1e-10


def test_backends_without_supports_gqa_get_repeated_heads(monkeypatch):
    seen = Seen(monkeypatch)
    q, k, v = _qkv(6, 3)
    for name in ("math",):
        assert not kernels.BACKENDS[name].supports_gqa
        F.grouped_query_attention(q, k, v, M.causal(), backend=name)
        assert seen.k_shapes[name] == [(B, 6, 9, D)], name
    assert kernels.BACKENDS["dense"].supports_gqa
    assert kernels.BACKENDS["blocksparse"].supports_gqa  # folds the heads (blocksparse/fold.py)


def test_a_grouped_call_refused_by_a_backend_without_gqa():
    """A grouped call given straight to a backend without supports_gqa is refused, by name."""
    q, k, v = _qkv(4, 2)
    call = call_base.AttentionCall("dot", q, k, v, scale=1.0)
    assert call.grouped
    assert "no grouped k/v heads (supports_gqa)" in kernels.BACKENDS["math"].not_supported_reasons(
        call
    )
    assert kernels.BACKENDS["dense"].not_supported_reasons(call) == []


def test_module_native_path_does_not_repeat(monkeypatch):
    """nn.MultiHeadAttention with num_kv_heads < num_heads, full and cached, reaches dense
    with G heads and equals the float64 ``math`` backend on repeated heads."""
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 8, num_kv_heads=2, dtype=torch.float64).eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    seen = Seen(monkeypatch)
    monkeypatch.setitem(dispatch.PREFERENCE, "dot", ("dense", "math"))
    dispatch.clear_cache()
    want, _ = F.multi_head_attention(
        x, x, x, 8, *m.in_proj.weights(), m.out_proj.weight,
        *m.in_proj.biases(), m.out_proj.bias,
        mask=M.causal("bottom_right"), num_kv_heads=2, backend="math",
    )  # fmt: skip
    seen.forbid_repeats()
    out, _ = m(x, mask=M.causal("bottom_right"))
    cache = m.new_cache()
    steps = [m(x[:, i : i + 1], mask=M.causal("bottom_right"), cache=cache)[0] for i in range(6)]
    assert all(s[1] == 2 for s in seen.k_shapes["dense"]), seen.k_shapes
    want = want.detach()
    assert rel_err(out, want) <= 1e-10
    assert rel_err(torch.cat(steps, 1), want) <= 1e-10


def test_repeated_grouped_signature_is_not_dispatched_again(monkeypatch):
    """The second call with the same signature skips validation and selection."""
    q, k, v = _qkv(8, 2)
    mask = M.causal("bottom_right")
    F.grouped_query_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), mask, backend="math"
    )
    selects = []
    monkeypatch.setattr(dispatch, "select", lambda *a, **kw: selects.append(a) or 1 / 0)
    monkeypatch.setattr(call_checks, "check_grouped", lambda *a: 1 / 0)
    out = F.grouped_query_attention(q, k, v, mask)
    assert selects == []
    assert rel_err(out, ref) <= 1e-10


@pytest.mark.parametrize("case", ["nan_k", "inf_v", "huge_scores_grad"])
def test_dense_grouped_calls_off_the_fused_path(case):
    """Non-finite inputs (policy P6) and scores too large for a fused backward take dense's
    repeated-heads path: the same NaN rows and values as math on repeated heads (float64)."""
    q, k, v = _qkv(6, 2, lq=5, lk=9)
    mask = M.key_padding([9, 4])
    if case == "nan_k":
        k[0, 0, 6, 2] = math.nan  # attended by heads 0-2 of batch element 0
        k[1, 1, 6, 2] = math.nan  # padding of batch element 1: attended by no row
    elif case == "inf_v":
        v[0, 1, 3, 0] = math.inf
    else:
        q, k = q * 1e9, k * 1e9
    q, k, v = (t.requires_grad_(case == "huge_scores_grad") for t in (q, k, v))
    out = F.grouped_query_attention(q, k, v, mask, backend="dense")
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask, backend="math"
    )
    assert torch.equal(out.isnan(), ref.isnan())
    if case != "huge_scores_grad":
        assert out.isnan().any() and not out.isnan().all()
    ok = ~ref.isnan()
    assert rel_err(out[ok], ref[ok].detach()) <= 1e-10
    if case == "huge_scores_grad":
        g = torch.autograd.grad(out.sum(), (q, k, v))
        want = torch.autograd.grad(ref.sum(), (q, k, v))
        for a, b in zip(g, want, strict=True):
            assert rel_err(a, b) <= 1e-10
