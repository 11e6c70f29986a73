"""The fused softcap path of ``blocksparse`` (kernels/blocksparse/softcap.py: torch products with
one numba pass between them) against the float64 references of test_sinks_softcap.py (the NumPy
reference for outputs, autograd through transformers' eager formula in float64 for gradients).

Axes (hypothesis, derandomized): every band mask of the catalogue (causal top-left and
bottom-right, windows symmetric / asymmetric / bottom-right, local-causal; bottom-right with
Lq > Lk leaves rows without keys), Lq != Lk, widths dk != dv, grouped-query heads, memory layouts,
softcap mild and hard, sinks, forward and backward; tiles cut small so that many occur. Each
example asserts that the fused path ran. Tolerance: float32 1e-5 relative (absolute floor 1e-6).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit.kernels.blocksparse.softcap as fused
from attnkit import functional as F
from attnkit.kernels.numba.runtime import numba_missing
from attnkit.masks import Causal, SlidingWindow
from tests.kernels.test_sinks_softcap import _check
from tests.support import layouts
from tests.support.sinks import check_close, torch_reference

pytestmark = pytest.mark.skipif(numba_missing() is not None, reason="numba is not usable")

BANDS = ("causal_tl", "causal_br", "window", "window_asym", "window_br", "window&causal")


@st.composite
def band_cases(draw):
    h = draw(st.sampled_from([1, 2, 4]))
    return dict(
        b=draw(st.integers(1, 2)),
        h=h,
        g=draw(st.sampled_from([d for d in (1, 2, 4) if h % d == 0])),
        lq=draw(st.integers(1, 130)),
        lk=draw(st.integers(1, 130)),
        d=draw(st.integers(1, 20)),
        dv=draw(st.integers(1, 20)),
        kind=draw(st.sampled_from(BANDS)),
        layouts=draw(st.lists(st.sampled_from(layouts.LAYOUTS), min_size=3, max_size=3)),
        dtype=torch.float32,
        cap=draw(st.sampled_from([0.5, 5.0, 50.0])),
        sinks=draw(st.sampled_from([None, 1.0, 4.0])),
        grad=draw(st.booleans()),
        seed=draw(st.integers(0, 2**20)),
    )


def _counting(monkeypatch) -> list:
    """Record every call that takes the fused path; tiles of a few hundred scores."""
    seen = []
    orig = fused.fused_attend
    monkeypatch.setattr(fused, "fused_attend", lambda c, s: seen.append(c) or orig(c, s))
    monkeypatch.setattr(fused, "CHUNK_ENTRIES", 600)
    return seen


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(c=band_cases())
def test_fused_band_softcap_matches_the_reference(c):
    """Forward and gradients (q, k, v, sinks) of the fused path on every band mask."""
    with pytest.MonkeyPatch.context() as mp:
        seen = _counting(mp)
        fn = F.grouped_query_attention if c["g"] != c["h"] else F.scaled_dot_product_attention
        _check(c, lambda *a, backend, return_weights, **kw: fn(*a, backend="blocksparse", **kw))
        assert seen, "the fused path did not run"


@pytest.mark.parametrize("grad", [False, True])
def test_rows_without_keys_give_zero_with_and_without_sinks(grad, monkeypatch):
    """Bottom-right causal with Lq > Lk: the first Lq - Lk rows see no key. Their output is 0
    (with a sink too: the sink is the row's only weight) and so is every gradient through them;
    the other rows match the float64 reference."""
    seen = _counting(monkeypatch)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (40, 25, 25))
    for sinks in (None, torch.tensor([0.5, -1.0])):
        xs = [t.clone().requires_grad_(grad) for t in (q, k, v)]
        s = None if sinks is None else sinks.clone().requires_grad_(grad)
        mask = Causal("bottom_right")
        out = F.scaled_dot_product_attention(*xs, mask, softcap=3.0, sinks=s, backend="blocksparse")
        assert float(out[..., :15, :].abs().max()) == 0.0
        x64 = [t.detach().double().requires_grad_(grad) for t in xs]
        s64 = None if s is None else s.detach().double().requires_grad_(grad)
        allowed = torch.ones(40, 25, dtype=torch.bool).tril(25 - 40)  # key j <= i - 15
        o64, _ = torch_reference(*x64, allowed, None, 8**-0.5, 3.0, s64)
        check_close(out.detach().double().numpy(), o64.detach().numpy(), torch.float32, "out")
        if grad:
            go = torch.randn(o64.shape, generator=g, dtype=torch.float64)
            ins, ins64 = (
                xs + ([s] if s is not None else []),
                x64 + ([s64] if s64 is not None else []),
            )
            for a, r, n in zip(
                torch.autograd.grad(out, ins, go.float()),
                torch.autograd.grad(o64, ins64, go),
                "qkvs",
            ):
                check_close(a.double().numpy(), r.numpy(), torch.float32, f"d{n}")
    assert len(seen) == 2


@pytest.mark.parametrize(
    "what, kw",
    [
        ("dropout", dict(dropout_p=0.2)),
        ("float64", dict(dtype=torch.float64)),
        ("no softcap", dict(softcap=None)),
    ],
)
def test_other_calls_keep_the_explicit_tiles(what, kw, monkeypatch):
    """Dropout, float64 and calls without softcap never take the fused path (and still run)."""
    seen = _counting(monkeypatch)
    dt = kw.pop("dtype", torch.float32)
    q, k, v = (torch.randn(1, 2, 50, 8, dtype=dt) for _ in range(3))
    kw.setdefault("softcap", 5.0)
    out = F.scaled_dot_product_attention(q, k, v, SlidingWindow(7, 0), backend="blocksparse", **kw)
    assert out.shape == (1, 2, 50, 8) and bool(torch.isfinite(out).all())
    assert not seen, what


def test_bfloat16_runs_in_float32_and_rounds_once(monkeypatch):
    """bf16 inputs take the fused path in float32 (P4) and match the float64 reference within
    bf16's rounding of the result."""
    seen = _counting(monkeypatch)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 64, 16, generator=g).bfloat16() for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, Causal(), softcap=5.0, backend="blocksparse")
    allowed = torch.ones(64, 64, dtype=torch.bool).tril()
    o64, _ = torch_reference(*(t.double() for t in (q, k, v)), allowed, None, 0.25, 5.0, None)
    assert out.dtype == torch.bfloat16 and seen
    err = float((out.double() - o64).abs().max() / o64.abs().max())
    assert err <= 2 * 2**-8, err  # one bf16 rounding of values of magnitude <= max |o|
