"""The policy's check of its common case for remembered signatures (``kernels/policy/steady.py``).

The check may only skip work whose outcome is known: it must return the plain decision exactly
when the full policy, on the torch reference scan, decides a call plainly (finite inputs, no
float64, fused backward exact), and None otherwise; a call of a remembered signature must give
the general stage's result bit for bit, and the float64 reference's within the policy's
tolerance, NaN rows (P6) and float64 fallbacks (P5) included.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy import numerics as N
from attnkit.kernels.policy import scan as S
from attnkit.kernels.policy.precision import PrecisionWarning
from attnkit.kernels.policy.steady import steady_for
from attnkit.kernels.registry import BACKENDS
from attnkit.kernels.tuning import current
from tests.support.layouts import LAYOUTS, make

# around the float32 thresholds: max / 16 (overflow) and 2**-10 / eps (fused backward)
MAGNITUDES = (0.0, 1e-45, 1.0, 1e3, 1e8, 1e15, 1e18, 1e19)
SPECIALS = (None, ("q", math.nan), ("k", math.inf), ("v", -math.inf), ("v", math.nan))


@pytest.fixture(autouse=True)
def loaded_scan(monkeypatch):
    """The numba scan loaded (as after a first call); remembered choices forgotten around."""
    if S._kernels() is None:
        pytest.skip("numba is not usable here: there is no steady check without the bit scan")
    monkeypatch.setitem(S._state, "ready", S._kernels())
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def _qkv(shape_q, shape_kv, layout, magnitude, special, grad, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape in (shape_q, shape_kv, shape_kv):
        leaf, view = make(shape, layout, torch.float64, gen)
        out.append(view((leaf * magnitude).float()))
    if special is not None:
        name, value = special
        t = out["qkv".index(name)]
        t[(0,) * (t.dim() - 2) + (t.shape[-2] - 1, t.shape[-1] - 1)] = value
    for t in out:
        t.requires_grad_(grad)
    return out


def _plain_by_reference(call: AttentionCall) -> bool:
    """The full policy on the torch reference scan decides ``call`` plainly."""
    d = N.decide(call, *N.input_scan(call, S.absmax_torch))
    return d == N.plain_decision(torch.float32)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_check_decides_plainly_exactly_when_the_policy_does(layout, magnitude, special, grad):
    q, k, v = _qkv((2, 3, 7, 8), (2, 3, 5, 8), layout, magnitude, special, grad)
    call = AttentionCall("dot", q, k, v, scale=1 / math.sqrt(8))
    check = steady_for(call, BACKENDS["dense"], S.plan3(q, k, v))
    if S.plan3(q, k, v) is None:  # a layout the bit scan cannot read: no check
        assert check is None
        return
    assert check is not None
    got = check.decide(q, k, v)
    qm, km, vm = (S.absmax_torch(t) for t in (q, k, v))
    cheap = qm * km * 8 / math.sqrt(8)  # P5's cheap bound of |q.k| * scale
    finite = all(math.isfinite(m) for m in (qm, km, vm))
    plain = finite and cheap < N.plain_bound(torch.float32, grad)
    assert (got is not None) == plain
    if plain:  # and then the full policy decides the same
        assert got == N.plain_decision(torch.float32) and _plain_by_reference(call)


def _reference(q, k, v) -> torch.Tensor:
    """float64 attention with P6: rows reading a NaN/inf are NaN (without a mask: a q row
    holding one, and every row of a batch element and head whose k or v holds one)."""
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    out = torch.softmax(q64 @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v64
    bad = ~(torch.isfinite(q64).all(-1, keepdim=True))
    kv_ok = torch.isfinite(k64).all(-1) & torch.isfinite(v64).all(-1)  # (..., Lk)
    kv_bad = ~kv_ok.all(-1)[..., None, None]  # every row of that batch element and head
    return torch.where(bad | kv_bad, math.nan, out)


@settings(max_examples=40, deadline=None)
@given(
    lq=st.integers(1, 19),
    lk=st.integers(1, 19),
    d=st.sampled_from([1, 3, 8, 16]),
    heads=st.integers(1, 3),
    layout=st.sampled_from(LAYOUTS),
    magnitude=st.sampled_from(MAGNITUDES),
    special=st.sampled_from(SPECIALS),
    grad=st.booleans(),
)
def test_remembered_calls_match_the_general_stage_and_float64(
    lq, lk, d, heads, layout, magnitude, special, grad
):
    """Same signature three times: the first call takes the general stage and remembers; the
    next two (clean inputs, then the case's values) may take the check. Outputs and q, k, v
    gradients equal the general stage's bit for bit and float64's within 1e-5 (abs floor 1e-6)."""
    dispatch.clear_cache()
    clean = _qkv((1, heads, lq, d), (1, heads, lk, d), layout, 1.0, None, grad, seed=1)
    case = _qkv((1, heads, lq, d), (1, heads, lk, d), layout, magnitude, special, grad, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        F.scaled_dot_product_attention(*clean)  # remembered
        got = F.scaled_dot_product_attention(*case)
        dispatch.clear_cache()  # the general stage on the same values
        want = F.scaled_dot_product_attention(*case)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    ref = _reference(*case)
    assert torch.equal(got.isnan(), ref.isnan())
    fin = ~ref.isnan()
    err = (got.double()[fin] - ref[fin]).abs()
    assert bool((err <= 1e-5 * ref[fin].abs() + 1e-6).all())
    if grad and special is None and magnitude <= 1e3:
        g = torch.randn(got.shape, generator=torch.Generator().manual_seed(3))
        ours = torch.autograd.grad(got, case, g)
        theirs = torch.autograd.grad(want, case, g)
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)


def test_a_plain_remembered_call_skips_the_stage_and_a_nan_takes_it(monkeypatch):
    calls = []
    real = N.prepare
    monkeypatch.setattr(N, "prepare", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = _qkv((2, 4, 9, 16), (2, 4, 9, 16), "contiguous", 1.0, None, False)
    F.scaled_dot_product_attention(q, k, v)
    assert len(calls) == 1  # the first call: the general stage, then remembered
    F.scaled_dot_product_attention(q, k, v)
    assert len(calls) == 1  # the check decided it
    k[0, 1, 3, 2] = math.nan
    out = F.scaled_dot_product_attention(q, k, v)
    assert len(calls) == 2  # the check declined: decided in full
    assert bool(out[0, 1].isnan().all()) and not bool(out[1].isnan().any())


def test_the_device_path_forced_is_never_skipped(monkeypatch):
    q, k, v = _qkv((1, 2, 8, 8), (1, 2, 8, 8), "contiguous", 1.0, None, False)
    F.scaled_dot_product_attention(q, k, v)
    seen = []
    real = N.prepare
    monkeypatch.setattr(N, "prepare", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    with N.use_path("device"):
        F.scaled_dot_product_attention(q, k, v)
    assert seen == [1]


@pytest.mark.parametrize(
    "what",
    ["mask", "float64", "bfloat16", "softcap", "sinks", "decode", "large"],
)
def test_no_check_outside_the_common_case(what, monkeypatch):
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(what, torch.float32)
    q, k, v = (torch.randn(1, 2, 8, 8, dtype=dtype) for _ in range(3))
    kw = {}
    if what == "mask":
        kw["mask"] = M.causal()
    elif what == "softcap":
        kw["softcap"] = 5.0
    elif what == "sinks":
        kw["sinks"] = torch.zeros(2)
    elif what == "large":  # the threaded scan's size: 8 entries and up
        small = dataclasses.replace(current(), scan_threaded_min=8)
        monkeypatch.setattr("attnkit.kernels.policy.steady.current", lambda: small)
    call = AttentionCall("dot", q, k, v, scale=0.35, **kw)
    backend = BACKENDS["decode" if what == "decode" else "dense"]
    assert steady_for(call, backend, S.plan3(q, k, v)) is None


def test_a_fresh_process_remembers_the_check_at_its_first_call():
    """The first call of a process loads the scan's kernels after the choice is remembered;
    the check must still be built then (not only once the kernels happen to be loaded)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from attnkit import functional as F\n"
        "from attnkit.kernels import dispatch\n"
        "from attnkit.kernels.policy import scan\n"
        "q, k, v = (torch.randn(1, 2, 8, 8) for _ in range(3))\n"
        "F.scaled_dot_product_attention(q, k, v)\n"
        "steady = [c.steady for c in dispatch.CACHE._entries.values()]\n"
        "print('numba' if scan._kernels() is not None else 'none', steady[0] is not None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert out == ["numba", "True"] or out == ["none", "False"]
