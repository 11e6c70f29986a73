"""The policy's input scan and decision (``attnkit.kernels.policy.scan``, ``numerics.numerics``).

The fast scan (``scan.absmax_bits``: an integer max over bit patterns, numba) must return exactly
what the torch reference scan (``scan.absmax_torch``: ``torch.aminmax``) returns, for every
dtype, layout and value, including NaN, +-inf, subnormals and magnitudes at the P5 thresholds;
and ``numerics()`` (which uses the fast scan) must decide every call as the reference decision
built on the torch scan does: compute dtype, finiteness and fused-backward verdict.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import masks as M
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.call.layout import ScanPlan, Span
from attnkit.kernels.policy import numerics as N
from attnkit.kernels.policy import scan as S
from tests.support.layouts import LAYOUTS, make

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# around the float32 thresholds: max / 16 (overflow) and 2**-10 / eps (fused backward)
MAGNITUDES = (0.0, 1e-45, 1e-30, 1.0, 1e3, 1e8, 1e15, 1e18, 1e19, 1e150)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.fixture(autouse=True)
def fast_scan(monkeypatch):
    """Every scan of these tests goes to the numba kernels (loaded here, as a first call does)."""
    monkeypatch.setitem(S._state, "ready", S._kernels())
    if S._kernels() is None:
        pytest.skip("numba is not usable here: the bit scan is never used")


def _put(t: torch.Tensor, i: int, value: float) -> None:
    """t's i-th entry in index order set to ``value`` (any memory format)."""
    t[tuple(int(j) for j in torch.unravel_index(torch.tensor(i % t.numel()), t.shape))] = value


def _reference(call: AttentionCall) -> tuple:
    """numerics()' outcome built on the torch reference scan, on a fresh call."""
    fresh = AttentionCall("dot", call.q, call.k, call.v, mask=call.mask, scale=call.scale)
    d = N.decide(fresh, *N.input_scan(fresh, S.absmax_torch))
    return (d.compute, d.finite), d.fused_backward_ok


def _call(dtype, magnitude, grad, mask=None, special=None, shape=(2, 3, 7, 8), layout="contiguous"):
    gen = torch.Generator().manual_seed(int(math.log10(magnitude + 1e-300)) + 400)
    qkv = []
    for _ in range(3):
        leaf, view = make(shape, layout, torch.float64, gen)
        qkv.append(view((leaf * magnitude).to(dtype)))
    q, k, v = qkv
    if special is not None:
        name, value = special
        {"q": q, "k": k, "v": v}[name][0, 1, 2, 3] = value
    q.requires_grad_(grad)
    return AttentionCall("dot", q, k, v, mask=mask, scale=1 / math.sqrt(shape[-1]))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_numerics_decides_as_the_reference_scan(dtype, magnitude, grad):
    for mask in (None, M.causal(), M.key_padding([3, 7]), M.from_additive(torch.zeros(7, 7))):
        call = _call(dtype, magnitude, grad, mask)
        assert (N.numerics(call), N.fused_backward_ok(call)) == _reference(call)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_scan_equals_torch_scan_in_every_layout(dtype, layout):
    gen = torch.Generator().manual_seed(3)
    leaf, view = make((2, 3, 5, 6), layout, dtype, gen)
    t = view(leaf)
    if layout in ("contiguous", "transposed", "expanded", "channels_last", "offset"):
        assert S.dense_span(t) is not None  # these are read by the bit scan, not the fallback
    fast = S.absmax_bits(t)
    assert fast is None or _same(fast, S.absmax_torch(t))
    assert _same(S.absmax(t), S.absmax_torch(t))
    for value in (math.nan, math.inf, -math.inf):
        leaf2 = leaf.clone()
        _put(leaf2, leaf2.numel() // 2, value)
        t2 = view(leaf2)
        assert _same(S.absmax(t2), S.absmax_torch(t2))


def test_dense_span_covers_exactly_the_entries():
    """Where dense_span gives a block, the block's values are exactly the tensor's values."""
    gen = torch.Generator().manual_seed(5)
    for layout in LAYOUTS:
        leaf, view = make((2, 3, 5, 6), layout, torch.float32, gen)
        t = view(leaf)
        n = S.dense_span(t)
        if n is None:
            assert layout == "stepped"
            continue
        block = torch.as_strided(t, (n,), (1,))
        assert sorted(block.tolist()) == sorted(set(t.reshape(-1).tolist()))
    base = torch.randn(40, generator=gen)
    for t in (base.unfold(0, 4, 1), base[:36].view(9, 4)[:, None, :].expand(9, 3, 4)):
        want = None if t.stride() == (1, 1) else 36  # overlapping windows / expanded dim
        assert S.dense_span(t) == want
        assert _same(S.absmax(t), S.absmax_torch(t))


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    exponent=st.integers(-320, 310),
    layout=st.sampled_from(LAYOUTS),
    special=st.sampled_from([None, math.nan, math.inf, -math.inf, 0.0, -0.0]),
    at=st.integers(0, 10**6),
    n=st.integers(1, 97),
)
def test_bit_scan_equals_torch_scan_hypothesis(dtype, exponent, layout, special, at, n):
    gen = torch.Generator().manual_seed(at)
    leaf, view = make((2, n, 3), layout, torch.float64, gen)
    leaf = (leaf * 10.0**exponent if exponent < 308 else leaf * 1e308).to(dtype)
    if special is not None:
        _put(leaf, at, special)
    t = view(leaf)
    assert _same(S.absmax(t), S.absmax_torch(t))


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from((torch.float32, torch.float64, torch.bfloat16)),
    scale_exp=st.floats(-1.0, 1.0),
    grad=st.booleans(),
    layout=st.sampled_from(LAYOUTS),
)
def test_numerics_at_the_thresholds_hypothesis(dtype, scale_exp, grad, layout):
    """Inputs whose cheap bound max|q| max|k| d scale lands within a factor 10 of a P5 threshold
    (overflow, or the fused backward's) are decided as the reference decides them."""
    fi = torch.finfo(N.compute_dtype(dtype))
    for limit in (fi.max / N.OVERFLOW_MARGIN, N.GRAD_SCORE_ERROR / fi.eps):
        magnitude = math.sqrt(limit * 10.0**scale_exp / (8 * (1 / math.sqrt(8)) * 16))
        call = _call(dtype, magnitude, grad, layout=layout)
        assert (N.numerics(call), N.fused_backward_ok(call)) == _reference(call)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_inputs_are_found(name, value):
    call = _call(torch.float32, 1.0, False, special=(name, value))
    assert N.numerics(call)[1] is False


def test_ordinary_calls_stay_in_their_dtype_and_overflowing_ones_go_to_float64():
    for grad in (False, True):
        call = _call(torch.float32, 1.0, grad, M.causal())
        assert N.numerics(call) == (torch.float32, True) and N.fused_backward_ok(call)
    assert N.numerics(_call(torch.float32, 1e19, False))[0] == torch.float64


def test_without_numba_the_torch_scan_decides(monkeypatch):
    monkeypatch.setitem(S._state, "kernels", None)
    monkeypatch.delitem(S._state, "ready", raising=False)
    call = _call(torch.float32, 1e19, False)
    assert S.absmax_bits(call.q) is None
    assert N.numerics(call)[0] == torch.float64
    call = _call(torch.float32, 1.0, False, special=("v", math.inf))
    assert N.numerics(call)[1] is False


def test_the_first_scan_of_a_process_loads_every_kernel(monkeypatch):
    """The first scan pays numba's one-time cost (issue 32 section 5): the kernels of every
    width are compiled by then, and the call's own result uses them."""
    monkeypatch.delitem(S._state, "kernels", raising=False)
    monkeypatch.delitem(S._state, "ready", raising=False)
    assert S.kernels_status() == "not loaded"
    call = _call(torch.float32, 1.0, False, special=("k", math.nan))
    assert N.numerics(call)[1] is False
    assert S.kernels_status() == "ready"
    kern = S._state["ready"]
    for name in ("absmax_bits16", "absmax_bits32", "absmax_bits64"):
        assert getattr(kern, name).signatures, name
    for name in ("absmax3_bits16", "absmax3_bits32", "absmax3_bits64"):
        assert getattr(kern, name).signatures, name


def test_tensor_subclasses_get_the_torch_scan():
    class Tagged(torch.Tensor):
        pass

    t = torch.randn(3, 4).as_subclass(Tagged)
    assert S.absmax_bits(t) is None
    assert S.absmax(t) == S.absmax_torch(t)
    p = torch.nn.Parameter(torch.randn(3, 4))
    assert S.absmax_bits(p) == S.absmax_torch(p)


def test_remembered_scan_plan_is_used_only_for_its_own_tensors():
    """dispatch remembers plan3 per signature and hands it to each call of the signature in
    its memo; a call rebuilt with new q, k, v (``dataclasses.replace``) has a memo of its own
    without it, so a plan can never read the wrong memory."""
    from attnkit import calls as C

    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen) for _ in range(3))
    assert S.plan3(q, k, v) == ScanPlan(*[Span(336, 1, 336)] * 3)
    stepped = torch.randn(2, 3, 14, 16, generator=gen)[..., ::2, ::2]
    assert S.plan3(stepped, k, v) is None and S.plan3(q.double(), k, v) is None
    C.parse("dot", q, k, v)  # remembered
    call = C.parse("dot", q, k, v).call
    assert call.memo.scan_plan == ScanPlan(*[Span(336, 1, 336)] * 3)
    assert S.absmax3(q, k, v, call.memo.scan_plan) == tuple(S.absmax_torch(t) for t in (q, k, v))
    small = torch.randn(1, 1, 1, 8, generator=gen)
    small[0, 0, 0, 3] = math.inf
    rebuilt = dataclasses.replace(call, q=small, k=small, v=small)
    assert rebuilt.memo.scan_plan is None and rebuilt.memo is not call.memo
    assert N.input_scan(rebuilt) == (math.inf, math.inf, False)
