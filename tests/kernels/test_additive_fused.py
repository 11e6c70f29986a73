"""The fused additive kernel (``additive_fused``) against float64 oracles.

Outputs are compared with :func:`attnkit.reference.additive` (float64 NumPy), gradients with the
``math`` backend run in float64 through torch autograd. Tolerance: relative error
norm(diff) / norm(oracle) <= 1e-5 for the float32 kernel, outputs and every gradient. Rows a
mask leaves without keys must be exactly 0, gradients finite.

The kernels are compiled once per session (first call; later sessions load numba's disk cache).
One test re-runs edge shapes in a subprocess with numba's bounds checking switched on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import BACKENDS
from attnkit.kernels import additive as AF
from attnkit.kernels.call.base import AttentionCall
from tests.support import masks as S
from tests.support.numerics import rel_err

TOL = 1e-5
ATOL = 1e-6
"""Absolute slack per entry, for gradients that vanish mathematically (e.g. w.r.t. q when there
is a single key: the softmax is 1 whatever the score). Inputs and upstream gradients are O(1), so
float32 rounding leaves ~1e-7 there; a relative error of ~1e-7 / 0 would mean nothing."""
BACKEND = BACKENDS["additive_fused"]

pytestmark = pytest.mark.skipif(
    BACKEND.available() is not None, reason=f"additive_fused unavailable: {BACKEND.available()}"
)


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile the kernels (or load them from numba's disk cache) once, before the tests."""
    xs = make_inputs((1,), 3, 4, 2, 2, 2, 2)
    F.additive_attention(*xs, backend="additive_fused").sum().backward()


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def make_inputs(batch, lq, lk, dq, dk, dv, h, seed=0, sharp=1.0):
    """float32 q (batch, Lq, dq), k (batch, Lk, dk), v (batch, Lk, dv), w_q (h, dq), w_k (h, dk),
    w_v (h,), all requiring grad. ``sharp`` scales w_v (larger = peakier softmax)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).float()

    xs = [
        rnd(*batch, lq, dq),
        rnd(*batch, lk, dk),
        rnd(*batch, lk, dv),
        rnd(h, dq, scale=dq**-0.5),
        rnd(h, dk, scale=dk**-0.5),
        rnd(h, scale=2.0 * sharp * h**-0.5),
    ]
    return [x.requires_grad_() for x in xs]


def reference_output(xs, spec: S.Spec | None) -> np.ndarray:
    """float64 reference output; the catalogue's mask (tests/support/masks.py) as the NumPy
    array the reference takes, its batch dims lined up with the leading batch dims of q."""
    q, k, v, wq, wk, wv = (x.detach().double().numpy() for x in xs)
    m = None if spec is None else S.ref_mask(spec, q.shape[:-2], q.shape[-2], k.shape[-2])
    return R.additive(q, k, v, wq, wk, wv, mask=m).output


def check(xs, spec: S.Spec | None = None, grads=True):
    """Run the fused kernel with ``spec``'s mask (a catalogue mask); compare output (and
    gradients) with the float64 oracles."""
    mask = None if spec is None else spec.mask
    out = F.additive_attention(*xs, mask, backend="additive_fused")
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert rel_err(out, reference_output(xs, spec), entry_floor=ATOL / TOL) <= TOL
    if not grads:
        return out
    g_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(out, xs, g_out.float())
    x64 = [x.detach().double().requires_grad_() for x in xs]
    ref = torch.autograd.grad(F.additive_attention(*x64, mask, backend="math"), x64, g_out)
    for name, a, b in zip(("q", "k", "v", "w_q", "w_k", "w_v"), got, ref):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b, entry_floor=ATOL / TOL) <= TOL, (
            name,
            rel_err(a, b, entry_floor=ATOL / TOL),
        )
    return out


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------
SHAPES = {
    # batch, Lq, Lk, dq, dk, dv, h
    "tiny 1x1": ((1,), 1, 1, 1, 1, 1, 1),
    "no batch dims": ((), 7, 5, 3, 4, 6, 8),
    "Lq 97, Lk 1025": ((2, 3), 97, 1025, 16, 12, 20, 24),
    "Lq 1025, Lk 7": ((2,), 1025, 7, 8, 8, 5, 16),
    "one head, Lq 129, Lk 130": ((1, 1), 129, 130, 32, 32, 64, 64),
    "huge d": ((1,), 33, 130, 64, 48, 1000, 300),
}


@pytest.mark.parametrize("name", SHAPES)
def test_matches_float64_reference(name):
    check(make_inputs(*SHAPES[name]))


def test_peaky_softmax():
    """Scores spread over tens of units (std ~25): online max and rescaling must stay exact, and
    the backward must recompute exactly the forward's scores (else P drifts from its lse)."""
    check(make_inputs((2,), 45, 300, 8, 8, 8, 32, seed=3, sharp=20.0))


def test_large_projections_take_the_direct_tanh_path():
    """|W_q q| beyond EXP_LIMIT: the kernels evaluate tanh(qp + kp) directly (tanh_f32) instead
    of the exp form; both paths must agree with the reference."""
    xs = make_inputs((2,), 50, 140, 8, 8, 8, 16, seed=11)
    typical = [(x @ w.T).detach() for x, w in zip(xs[:2], xs[3:5])]
    assert AF.tanh_operands(*typical)[2] is False  # the other tests use the exp form
    with torch.no_grad():
        xs[0].mul_(40.0)  # qp entries up to ~100, kp ~N(0, 1): saturated and unsaturated tanh
        xs[1][0, :3].mul_(40.0)  # a few keys with large kp of either sign as well
    qp = (xs[0] @ xs[3].T).detach()
    assert float(qp.abs().max()) > AF.EXP_LIMIT
    assert AF.tanh_operands(qp, (xs[1] @ xs[4].T).detach())[2] is True
    check(xs)


def test_one_thread_and_non_contiguous_inputs():
    xs = make_inputs((2, 2), 40, 70, 8, 8, 8, 16, seed=4)
    q_t = xs[0].detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()
    assert not q_t.is_contiguous()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check([q_t] + xs[1:])
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------------
KINDS = (
    "causal_tl",
    "causal_br",
    "window",
    "window_asym",
    "window_br",
    "window&causal",
    "key_padding",
    "key_padding_b1",
    "document",
    "document_1d",
    "document_unsorted",
    "document&causal",
    "prefix_lm",
    "prefix_lm_batch",
    "predicate",
    "predicate_bh",
    "tensor_bool",
    "key_padding_mask",
    "causal|window",
    "key_padding|prefix",
    "document|key_padding",
    "prefix&causal|window",
    "raw_bool",
    "all_masked",
)
"""The catalogue's kinds without a score bias (tests/support/masks.py): what the fused kernel
serves (a biased mask goes to the math backend)."""


@pytest.mark.parametrize("name", KINDS)
def test_masks(name):
    lq, lk = 161, 290
    xs = make_inputs((2, 3), lq, lk, 8, 8, 12, 16, seed=6)
    check(xs, S.make_case(name, (2, 3), lq, lk, seed=5))


def test_mask_with_head_dim():
    """A mask with batch and head dims (batch_shape (2, 3)) against q (2, 3, Lq, d)."""
    mask = S.predicate(lambda b, h, i, j: (j + b + h) % 3 != 0, batch_size=2, num_heads=3)
    check(make_inputs((2, 3), 37, 150, 8, 8, 8, 8, seed=7), mask)


def test_fully_masked_rows_are_zero():
    lq, lk = 70, 140
    allowed = torch.rand((lq, lk), generator=torch.Generator().manual_seed(8)) < 0.5
    allowed[::3] = False  # every third row sees no key
    mask = S.tensor(allowed) & S.key_padding([0, lk])  # batch 0 sees nothing at all
    xs = make_inputs((2, 2), lq, lk, 8, 8, 8, 16, seed=9)
    out = check(xs, mask)
    assert (out[0] == 0).all()
    assert (out[1, :, ::3] == 0).all()
    out = F.additive_attention(*xs, mask.mask, backend="additive_fused")
    g = torch.autograd.grad(out.sum(), xs[0])[0]
    assert (g[0] == 0).all() and (g[1, :, ::3] == 0).all()


def test_causal_bottom_right_more_queries_than_keys():
    """Lq > Lk with bottom-right alignment: the first Lq - Lk query rows see no key."""
    xs = make_inputs((1, 2), 100, 37, 8, 8, 8, 16, seed=10)
    out = check(xs, S.causal("bottom_right"))
    assert (out[..., : 100 - 37, :] == 0).all()


def test_structured_masks_pack_only_partial_tiles():
    """Causal / window masks at L = 4096: only diagonal tiles are evaluated and stored."""
    length = 4096
    q = torch.zeros((1, 2, length, 1))
    w = torch.zeros((1, 1))
    nq, nk = length // AF.BLOCK_Q, length // AF.BLOCK_K
    for mask, most in ((M.causal(), nq), (M.sliding_window(128), 3 * nq)):
        call = AttentionCall("additive", q, q, q, mask=mask, w_q=w, w_k=w, w_v=w[0])
        tiles = AF.mask_tiles(call)
        assert tiles.classes.shape == (1, nq, nk)
        assert 1 < tiles.tiles.shape[0] <= most + 1  # + the unused filler tile 0
        assert (tiles.tile_id >= 0).sum() == tiles.tiles.shape[0] - 1


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
def test_dispatch_and_reasons():
    xs = [x.detach() for x in make_inputs((1,), 5, 6, 3, 3, 3, 4)]
    assert F.explain_dispatch(*xs[:3], kind="additive", w_q=xs[3], w_k=xs[4], w_v=xs[5]).chosen == (
        "additive_fused"
    )
    x64 = [x.double() for x in xs]
    d = F.explain_dispatch(*x64[:3], kind="additive", w_q=x64[3], w_k=x64[4], w_v=x64[5])
    assert d.chosen == "math"
    assert any("float64" in r and "math" in r for r in d.reasons["additive_fused"])
    bias = M.from_tensor(torch.zeros((5, 6)))
    d = F.explain_dispatch(*xs[:3], bias, kind="additive", w_q=xs[3], w_k=xs[4], w_v=xs[5])
    assert d.chosen == "math" and any("bias" in r for r in d.reasons["additive_fused"])
    d = F.explain_dispatch(
        *xs[:3], kind="additive", return_weights=True, w_q=xs[3], w_k=xs[4], w_v=xs[5]
    )
    assert d.chosen == "math" and any("weights" in r for r in d.reasons["additive_fused"])
    with pytest.raises(ValueError, match="additive_fused"):
        F.additive_attention(*x64, backend="additive_fused")


def test_kernels_are_plain_njit_functions():
    """The kernel module is imported once, through the numba runtime, and its entry points are
    the dispatchers its ``@njit`` decorators made (no module rewrites its own globals)."""
    from numba.core.registry import CPUDispatcher

    kernels = AF.load_kernels()
    assert AF.load_kernels() is kernels
    for fn in (kernels.forward_units, kernels.backward_units):
        assert isinstance(fn, CPUDispatcher) and fn.signatures  # compiled by the tests above


def test_first_writable_cache_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert AF.first_writable([blocker / "cache"]) is None
    assert AF.first_writable([blocker / "cache", tmp_path / "ok"]) == str(tmp_path / "ok")


def test_cache_dir_is_per_cpu_target(tmp_path, monkeypatch):
    """Kernels compiled for NUMBA_CPU_NAME=generic (make test-portable) get their own directory."""
    from attnkit.kernels.numba.runtime import cache_dir

    src = tmp_path / "k.py"
    src.write_text("x = 1\n")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    native = cache_dir("k", [src])
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    generic = cache_dir("k", [src])
    assert native != generic and "generic" in Path(generic).name


# ---------------------------------------------------------------------------------------------
# bounds checking
# ---------------------------------------------------------------------------------------------
BOUNDSCHECK_SCRIPT = textwrap.dedent(
    """
    import json, numba, numpy as np, torch
    from attnkit import functional as F, masks as M
    from attnkit.kernels import additive as AF

    @numba.njit
    def oob(a):
        return a[a.size]

    try:
        oob(np.zeros(3))
        checking = False
    except IndexError:
        checking = True
    errors = {}
    cases = [((1,), 1, 1, None), ((1,), 1, 129, None), ((2,), 33, 1, None),
             ((1, 2), 129, 257, M.causal()), ((2,), 31, 131, M.key_padding([0, 130])),
             ((1,), 5, 300, M.sliding_window(3)), ((1,), 3, 2, M.causal("bottom_right"))]
    for n, (batch, lq, lk, mask) in enumerate(cases):
        g = torch.Generator().manual_seed(n)
        shapes = (batch + (lq, 3), batch + (lk, 2), batch + (lk, 5), (4, 3), (4, 2), (4,))
        scales = (1.0, 1.0, 1.0, 3**-0.5, 2**-0.5, 1.0)
        xs = [(torch.randn(s, generator=g) * c).requires_grad_() for s, c in zip(shapes, scales)]
        out = F.additive_attention(*xs, mask, backend="additive_fused")
        g_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
        grads = torch.autograd.grad(out, xs, g_out.float())
        x64 = [x.detach().double().requires_grad_() for x in xs]
        ref = F.additive_attention(*x64, mask, backend="math")
        ref_grads = torch.autograd.grad(ref, x64, g_out)
        err = [float((a.double() - b).norm() / max(float(b.norm()), 0.1 * b.numel() ** 0.5))
               for a, b in zip((out,) + grads, (ref,) + ref_grads)]
        errors[str((batch, lq, lk, repr(mask)))] = max(err)
    print("RESULT " + json.dumps(dict(checking=checking, errors=errors)))
    """
)


def test_edge_shapes_under_boundscheck(tmp_path):
    """Edge shapes with numba's bounds checks on (fresh compile, no optimisation): no
    out-of-bounds access (it would raise IndexError), results still correct."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_OPT="0", NUMBA_CACHE_DIR=str(tmp_path))
    p = subprocess.run(
        [sys.executable, "-c", BOUNDSCHECK_SCRIPT], env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(s for s in p.stdout.splitlines() if s.startswith("RESULT "))
    res = json.loads(line[len("RESULT ") :])
    assert res["checking"], "bounds checking was not active in the subprocess"
    for case, err in res["errors"].items():
        assert err <= TOL, (case, err)
