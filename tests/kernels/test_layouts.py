"""Memory layout as a test axis for the dot-product backends (math, dense, blocksparse).

Every layout of :mod:`tests.support.layouts` (contiguous, transposed, stepped, expanded,
channels-last, storage offset) for q, k and v, every dot backend forced with ``backend=``, and the
mask kinds of the shared catalogue (:mod:`tests.support.masks`): outputs and the gradients of
q, k, v and of every float mask tensor that requires grad, against the float64 NumPy reference
(:mod:`attnkit.reference`, gradients from :mod:`tests.support.grads`), relative error <= 1e-10
in float64 and <= 1e-5 in float32.

``blocksparse`` runs with 16 x 16 blocks (registered in place of the default instance for the
test) so that its band plan (interior windows and edge blocks), docs plan and rows plan (shared
and per-batch-element ranges) all run at L = 97, 300 and 1025.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import kernels, reference
from attnkit.kernels import blocksparse as bs
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall
from tests.support import grads as G
from tests.support import layouts
from tests.support.masks import make_case, reduce_grad, ref_mask
from tests.support.numerics import TOL, rel_err, to_np

BACKENDS = ("math", "dense", "blocksparse")
BLOCK = 16

KINDS = (
    "none",
    "causal_tl",
    "causal_br",
    "window",
    "window&causal",
    "window_br",
    "key_padding",
    "document",
    "document_unsorted",
    "document&causal",
    "prefix_lm",
    "tensor_bool",
    "tensor_float_grad",
    "key_padding_mask_float",
    "alibi",
    "causal&additive_grad",
    "window&tensor_grad",
    "raw_float_grad",
    "all_masked",
)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Register a blocksparse backend with small blocks that accepts any sparsity."""
    monkeypatch.setitem(kernels.BACKENDS, "blocksparse", bs.BlocksparseBackend(BLOCK, BLOCK, 0.0))
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def _leaf_grad(leaf: torch.Tensor, view, g: np.ndarray) -> np.ndarray:
    """The gradient of ``leaf`` from the gradient ``g`` of ``view(leaf)``, in float64."""
    x = torch.zeros(leaf.shape, dtype=torch.float64, requires_grad=True)
    view(x).backward(torch.from_numpy(np.ascontiguousarray(g)))
    return x.grad.numpy()


def check(kind, layout, backend, lq, lk, dtype, seed, batch=(2, 2), d=8):
    """One call: output and every gradient against the float64 reference."""
    spec = make_case(kind, batch, lq, lk, seed)
    if backend == "blocksparse" and spec.mask is None:
        pytest.fail("blocksparse needs a mask: the grid must not generate this case")
    gen = torch.Generator().manual_seed(seed)
    ins = {}
    for name, length in (("q", lq), ("k", lk), ("v", lk)):
        leaf, view = layouts.make(batch + (length, d), layout, dtype, gen)
        ins[name] = (leaf.requires_grad_(), view)
    xs = {n: view(leaf) for n, (leaf, view) in ins.items()}
    out = F.scaled_dot_product_attention(xs["q"], xs["k"], xs["v"], spec.mask, backend=backend)
    where = f"{kind} {layout} {backend} {lq}x{lk} {dtype}"
    np64 = {n: to_np(view(leaf.detach().double())) for n, (leaf, view) in ins.items()}
    trace = reference.scaled_dot_product(
        np64["q"], np64["k"], np64["v"], mask=ref_mask(spec, batch, lq, lk)
    )
    assert out.dtype == dtype and out.shape == trace.output.shape, where
    tol = TOL[dtype]
    err = rel_err(out, trace.output)
    assert err <= tol, f"{where}: output rel err {err:.3g}"
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(dtype)
    ref_g = G.dot(trace, to_np(d_out))
    out.backward(d_out)
    for n, (leaf, view) in ins.items():
        err = rel_err(leaf.grad, _leaf_grad(leaf, view, ref_g[n]))
        assert err <= tol, f"{where}: gradient of {n} rel err {err:.3g}"
    for i, (t, shape, nb) in enumerate(spec.leaves()):
        assert t.grad is not None, f"{where}: gradient of mask tensor {i} dropped"
        want = reduce_grad(ref_g["bias"], shape, nb).reshape(t.shape)
        err = rel_err(t.grad, want)
        assert err <= tol, f"{where}: gradient of mask tensor {i} rel err {err:.3g}"


TORCH_KINDS = (
    "none",
    "causal_tl",
    "causal_br",
    "window",
    "key_padding",
    "document",
    "tensor_float_grad",
    "causal&additive_grad",
    "raw_float_grad",
    "all_masked",
)
"""The kinds for math and dense, whose strided reads are torch's own (blocksparse gets all)."""

GRID = [
    (kind, layout, backend)
    for backend in BACKENDS
    for kind in (KINDS[1:] if backend == "blocksparse" else TORCH_KINDS)
    for layout in layouts.LAYOUTS
]


@pytest.mark.parametrize("kind,layout,backend", GRID)
def test_layout_grid_float64(kind, layout, backend):
    """Every layout x backend x mask kind, Lq = Lk = 97 (odd, several blocks), float64."""
    check(
        kind,
        layout,
        backend,
        97,
        97,
        torch.float64,
        seed=zlib.crc32(f"{kind}{layout}".encode()) % 1000,
    )


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["window&tensor_grad", "key_padding_mask_float"])
def test_layouts_float32_lq_ne_lk(kind, layout, backend):
    """float32 (another kernel instantiation) with Lq != Lk."""
    check(kind, layout, backend, 61, 97, torch.float32, seed=7)


PLAN_CASES = [
    # (kind, Lq, Lk, the blocksparse plan it must take)
    ("window", 300, 300, "band"),
    ("window&causal", 1025, 1025, "band"),
    ("window_br", 97, 300, "band"),
    ("document", 300, 300, "docs"),
    ("document&causal", 300, 300, "rows"),  # bottom-right causal: not the docs plan
    ("key_padding", 300, 300, "rows"),
    ("causal&additive_grad", 300, 300, "rows"),
]


STRIDED = ("transposed", "stepped", "expanded", "channels_last")


@pytest.mark.parametrize(
    "kind,lq,lk,plan,layout",
    [c + (lay,) for c in PLAN_CASES for lay in (STRIDED if c[1] < 1000 else STRIDED[:2])],
)
def test_blocksparse_plans_with_strided_inputs(kind, lq, lk, plan, layout):
    """Each plan of blocksparse (band interior and edges, docs, rows) on strided inputs."""
    spec = make_case(kind, (2, 2), lq, lk, 3)
    q = torch.zeros((2, 2, lq, 8))
    k = torch.zeros((2, 2, lk, 8))
    call = AttentionCall("dot", q, k, k, mask=spec.mask, scale=1.0)
    p = bs.make_plan(call, BLOCK, BLOCK)
    assert p.kind == plan
    assert plan != "band" or (p.interior_blocks > 0 and p.calls), "band: interior and edges"
    check(kind, layout, "blocksparse", lq, lk, torch.float64, seed=3, batch=(2, 2))


def test_the_reported_transposed_v():
    """The issue's example: v transposed, sliding_window(16), L = 1024, float32."""
    from attnkit import masks as M

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn((2, 1, 2, 1024, 16), generator=g)
    v = torch.randn((1, 2, 16, 1024), generator=g).transpose(-1, -2)
    outs = {
        b: F.scaled_dot_product_attention(q, k, v, M.sliding_window(16), backend=b)
        for b in BACKENDS
    }
    want = reference.scaled_dot_product(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        mask=M.sliding_window(16).materialize(1024, 1024).numpy(),
    ).output
    for b, out in outs.items():
        assert rel_err(out, want) <= 1e-5, b


class _Watch:
    """Records the strides of every tensor handed to the private fused ops."""

    def __init__(self, monkeypatch):
        self.bad: list[tuple] = []
        fwd, bwd = bs.tiles.sdpa_fwd, bs.tiles.sdpa_bwd

        def look(ts):
            for t in ts:
                if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[-2] > 1:
                    if t.stride(-1) != 1 or t.stride(-2) < t.shape[-1]:
                        self.bad.append((tuple(t.shape), t.stride()))

        def f(q, k, v, mask, scale, is_causal):
            look((q, k, v))
            return fwd(q, k, v, mask, scale, is_causal)

        def b(go, q, k, v, out, lse, mask, scale, is_causal):
            look((go, q, k, v, out))
            return bwd(go, q, k, v, out, lse, mask, scale, is_causal)

        monkeypatch.setattr(bs.tiles, "sdpa_fwd", f)
        monkeypatch.setattr(bs.tiles, "sdpa_bwd", b)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_fused_ops_only_see_unit_stride_rows(layout, monkeypatch):
    """Every tensor reaching the private ops (forward and backward, every plan) has a
    unit-stride last dim and rows at least a row apart, whatever the user passed."""
    from attnkit import masks as M

    watch = _Watch(monkeypatch)
    g = torch.Generator().manual_seed(1)
    for mask in (M.sliding_window(5), M.key_padding([50, 97]), M.document([0] * 40 + [1] * 57)):
        xs = [layouts.make((2, 2, 97, 8), layout, torch.float32, g) for _ in range(3)]
        leaves = [leaf.requires_grad_() for leaf, _ in xs]
        q, k, v = (view(leaf) for leaf, (_, view) in zip(leaves, xs, strict=True))
        out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
        # a gradient with a non-unit last stride (expanded from a scalar)
        out.backward(torch.ones(()).expand(out.shape))
    assert not watch.bad, watch.bad[:3]
