"""The ``flex`` backend as dispatch sees it: what it refuses and why, when ``auto`` chooses it
(only on CUDA, only for a structured mask), the compile note of ``explain_dispatch``, the plan
kept per mask and shape (and dropped when the mask's data changes in place), one compiled CPU
call against float64; and, on a CUDA GPU only, the compiled kernel in bf16 against float64
with forward and backward."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels import BACKENDS, dispatch
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.flex import FlexBackend
from attnkit.kernels.policy import numerics
from tests.support.masks import ref_mask
from tests.support.masks import sliding_window as spec_window
from tests.support.numerics import split_mask
from tests.support.sinks import check_close, torch_reference

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _qkv(shape=(2, 2, 33, 16), dtype=torch.float32, grad=False, device="cpu", kv_len=None):
    g = torch.Generator().manual_seed(0)
    kshape = shape[:-2] + (kv_len or shape[-2], shape[-1])
    return [
        torch.randn(s, generator=g, dtype=torch.float64)
        .to(device=device, dtype=dtype)
        .requires_grad_(grad)
        for s in (shape, kshape, kshape)
    ]


def _call(q, k, v, mask, **kw):
    p, rw = kw.pop("dropout_p", 0.0), kw.pop("rw", False)
    return AttentionCall(
        "dot", q, k, v, mask=mask, scale=0.25, dropout_p=p, return_weights=rw, **kw
    )


def test_registered_after_decode_in_the_preference_order():
    assert isinstance(BACKENDS["flex"], FlexBackend)
    order = dispatch.preference("dot")
    assert order.index("decode") < order.index("flex") < order.index("dense")


def test_auto_never_chooses_flex_on_a_cpu():
    q, k, v = _qkv()
    d = F.explain_dispatch(q, k, v, M.sliding_window(3) & M.causal())
    assert d.chosen != "flex"
    assert "CPU" in " ".join(d.reasons["flex"])


def test_auto_would_choose_it_on_cuda_for_structured_masks_only():
    """speed_reasons on a stand-in for a CUDA call (no GPU needed: only the device is read)."""
    b = FlexBackend()
    cuda_q = types.SimpleNamespace(device=torch.device("cuda"))
    lens = dict(q_len=5, kv_len=9, scale=0.125)
    window = types.SimpleNamespace(q=cuda_q, mask=M.sliding_window(3) & M.causal(), **lens)
    assert b.speed_reasons(window) == []
    for mask in (None, M.causal(), M.causal("bottom_right")):
        why = b.speed_reasons(types.SimpleNamespace(q=cuda_q, mask=mask, **lens))
        assert why and "SDPA" in why[0]


@pytest.mark.parametrize(
    "case, words",
    [
        ("float64", "dtype"),
        ("dropout", "dropout"),
        ("weights", "weights"),
        ("cpu_grad", "backward on CPU"),
        ("bias_grad", "learned score bias"),
        ("three_batch_dims", "batch dims"),
    ],
)
def test_refusals_say_why(case, words):
    mask = M.sliding_window(2)
    if case == "float64":
        call = _call(*_qkv(dtype=torch.float64), mask)
    elif case == "dropout":
        call = _call(*_qkv(), mask, dropout_p=0.1)
    elif case == "weights":
        call = _call(*_qkv(), mask, rw=True)
    elif case == "cpu_grad":
        call = _call(*_qkv(grad=True), mask)
    elif case == "bias_grad":
        bias = torch.zeros(33, 33, requires_grad=True)
        call = _call(*_qkv(), M.TensorMask(bias))
    else:
        call = _call(*_qkv(shape=(2, 2, 2, 9, 8)), mask)
    why = " ".join(BACKENDS["flex"].not_supported_reasons(call))
    assert words in why, why
    # dispatch still serves the call with another backend
    assert dispatch.select(call).name != "flex"


def test_forced_on_cpu_and_the_plan_is_kept_per_mask_and_shape():
    q, k, v = _qkv(kv_len=41)
    lengths = torch.tensor([41, 20])
    mask = M.key_padding(lengths) & M.causal("bottom_right")
    backend = FlexBackend(compiled=False, block_size=16)
    plan = backend.plan(_call(q, k, v, mask))
    assert backend.plan(_call(q, k, v, mask)) is plan  # from the mask's plan cache
    assert backend.plan(_call(*_qkv(shape=(2, 2, 17, 16), kv_len=41), mask)) is not plan
    mask.leaves()[0].lengths[1] = 5  # the mask's data changes in place: a new plan
    new = backend.plan(_call(q, k, v, mask))
    assert new is not plan
    out, _ = dispatch.run(_call(q, k, v, mask), backend)
    spec = _reference_mask(mask, 33, 41)
    o64, _ = torch_reference(q.double(), k.double(), v.double(), spec, None, 0.25, None, None)
    check_close(out.double().numpy(), o64.numpy(), torch.float32, "output after the change")


def _reference_mask(mask, lq, lk):
    # the independent reference of key padding & bottom-right causal, written out
    lengths = mask.leaves()[0].lengths
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    return ((j < lengths[:, None, None]) & (j <= i + lk - lq))[:, None]


def test_compile_note_until_the_first_compiled_call():
    """One compiled CPU call (about 20 s on a loaded 2-core machine): the note, then the
    result against float64, then no note for the same kind of call."""
    q, k, v = _qkv()
    spec = spec_window(5, 0)
    backend = FlexBackend(compiled=True, block_size=16)
    call = _call(q, k, v, spec.mask)
    notes = backend.choice_notes(call)
    assert notes and "compiles" in notes[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = dispatch.run(call, backend)
    allowed, _ = split_mask(ref_mask(spec, (2, 2), 33, 33))
    o64, _ = torch_reference(
        q.double(), k.double(), v.double(), torch.from_numpy(np.asarray(allowed)), None, 0.25,
        None, None,
    )  # fmt: skip
    check_close(out.double().numpy(), o64.numpy(), torch.float32, "compiled output")
    assert backend.choice_notes(_call(q, k, v, spec.mask)) == []


@CUDA
@pytest.mark.parametrize("kind", ["window", "document", "key_padding", "alibi_causal"])
@pytest.mark.parametrize("extras", [{}, {"softcap": 20.0}, {"sinks": True}, {"gqa": True}])
def test_compiled_cuda_bf16_matches_float64(kind, extras):
    """The compiled kernel, bf16, forward and backward (q, k, v, sinks) against float64 on the
    CPU; bf16 tolerance: 3e-2 relative (8 bits of mantissa, long sums in float32)."""
    b, h, lq, lk, d = 2, 4, 300, 333, 64
    g = 2 if extras.get("gqa") else h
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, lq, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, g, lk, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, g, lk, d, generator=gen, dtype=torch.float64)
    ids = torch.sort(torch.randint(0, 4, (b, lk), generator=gen), -1).values
    mask = {
        "window": M.sliding_window(64, 0, "bottom_right"),
        "document": M.document(ids[:, :lq], ids),
        "key_padding": M.key_padding([lk, 100]),
        "alibi_causal": M.ALiBi(M.alibi_slopes(h)) & M.causal("bottom_right"),
    }[kind]
    sinks = torch.randn(h, generator=gen, dtype=torch.float64) if extras.get("sinks") else None
    cap = extras.get("softcap")
    leaves = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)]
    s_dev = None if sinks is None else sinks.cuda().bfloat16().requires_grad_()
    fn = F.grouped_query_attention if g != h else F.scaled_dot_product_attention
    out = fn(*leaves, mask, backend="flex", softcap=cap, sinks=s_dev)
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    ins = [*leaves, *([s_dev] if s_dev is not None else [])]
    got = torch.autograd.grad(out, ins, go.cuda().bfloat16())
    x64 = [t.detach().cpu().double().requires_grad_() for t in leaves]
    s64 = None if sinks is None else s_dev.detach().cpu().double().requires_grad_()
    k64, v64 = (t.repeat_interleave(h // g, 1) for t in x64[1:])
    allowed = mask.materialize(lq, lk)
    allowed = allowed[:, None] if allowed.dim() == 3 else allowed  # (B, Lq, Lk): per batch
    bias = mask.materialize_bias(lq, lk, torch.float64)
    o64, _ = torch_reference(x64[0], k64, v64, allowed, bias, d**-0.5, cap, s64)
    refs = torch.autograd.grad(o64, [*x64, *([s64] if s64 is not None else [])], go)
    for name, a, r in zip(("out", "dq", "dk", "dv", "dsinks"), (out, *got), (o64, *refs)):
        a, r = a.detach().cpu().double(), r.detach()
        err = (a - r).norm() / max(r.norm(), 1e-6)
        assert err <= 3e-2, (name, kind, extras, float(err))


def test_a_float64_decision_goes_to_math_with_its_reason():
    """The policy's stage decides float64 (scores that would overflow float32) or an explicit
    softmax's backward: flex cannot compute either, so dispatch hands the call to math and says
    why; the result is math's, checked against float64."""
    from attnkit.kernels.policy.decision import NumericsDecision

    q, k, v = _qkv(kv_len=41)
    call = _call(q, k, v, M.causal("bottom_right"))
    wide = NumericsDecision(torch.float64, True)
    why = dispatch.fallbacks(call, "flex", wide)
    assert why and why[0].startswith("flex hands the call to math") and "float64" in why[0]
    grad = NumericsDecision(torch.float32, True, fused_backward_ok=False)
    assert "flex hands the call to math" in dispatch.fallbacks(call, "flex", grad)[0]
    assert dispatch.fallbacks(call, "flex", NumericsDecision(torch.float32, True)) == ()
    big = 1e37  # |score| up to ~1e39: overflows float32, so the host path decides float64
    call = _call(q * big, k, v, M.causal("bottom_right"))
    assert numerics.prepare(call)[1].compute == torch.float64  # the decision flex refuses
    out, _ = dispatch.run(call, FlexBackend(False, 16))
    spec = torch.ones(33, 41, dtype=torch.bool).tril(41 - 33)
    o64, _ = torch_reference(
        (q * big).double(), k.double(), v.double(), spec, None, 0.25, None, None
    )
    check_close(out.double().numpy(), o64.numpy(), torch.float32, "float64 fallback output")


def test_auto_on_cuda_leaves_bottom_right_causal_to_sdpa():
    """Cached decoding and chunked prefill (bottom-right causal, Lq <= Lk) go to dense, which
    takes them as SDPA's causal_lower_right without a mask; a window goes to flex. Emulated GPU
    (tests/support/fake_device.py): the tensors answer ``cuda``."""
    from tests.support.fake_device import FakeCuda

    q, k, v = _qkv(shape=(1, 8, 1, 64), kv_len=300)
    with FakeCuda():
        qc, kc, vc = q.cuda(), k.cuda(), v.cuda()
        assert qc.device.type == "cuda"
        step = F.explain_dispatch(qc, kc, vc, M.causal("bottom_right"))
        window = F.explain_dispatch(qc, kc, vc, M.causal("bottom_right") & M.sliding_window(64, 0))
    assert step.chosen == "dense", step
    assert window.chosen == "flex", window


@pytest.mark.parametrize("mask_dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_float_mask(mask_dtype):
    """A float16 / bfloat16 bias tensor with float32 inputs raised "value cannot be converted
    to type c10::Half without overflow" (the bias was clamped to float32's range in its own
    dtype). The float64 reference (torch math), 1e-5."""
    q, k, v = _qkv((1, 2, 9, 8), kv_len=11)
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(9, 11, generator=g).to(mask_dtype)
    bias[2, 3:] = -torch.inf
    out = F.scaled_dot_product_attention(q, k, v, bias, backend="flex")
    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = q64 @ k64.transpose(-2, -1) / 8**0.5 + bias.double()
    ref = torch.softmax(s, -1) @ v64
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_an_intersection_of_bias_only_masks(with_sinks):
    """ALiBi & ALiBi allows every key: its block classes are all full, and refining them called
    the allowed part's mask_mod, which is None for such a mask ("'NoneType' object is not
    callable"). The float64 reference (torch math, the two biases added), 1e-5."""
    q, k, v = _qkv((1, 2, 9, 8), kv_len=11)
    sinks = torch.tensor([0.5, -1.0]) if with_sinks else None
    mask = M.alibi(0.1) & M.alibi(1.0)
    out = F.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, backend="flex")
    i, j = torch.arange(9)[:, None] + 2, torch.arange(11)[None, :]  # bottom-right aligned
    bias = -(0.1 + 1.0) * (i - j).abs().double()
    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = q64 @ k64.transpose(-2, -1) / 8**0.5 + bias
    if with_sinks:
        s = torch.cat([s, sinks.double().view(1, 2, 1, 1).expand(1, 2, 9, 1)], -1)
    ref = torch.softmax(s, -1)[..., :11] @ v64
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
