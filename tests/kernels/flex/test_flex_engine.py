"""Flex's CPU forward (eager) and eager backward through the ``flex`` backend and its engine,
against float64 autograd through transformers' eager formula (tests/support/sinks.py), with
the catalogue's masks (tests/support/masks.py, NumPy reference).

Axes (hypothesis, derandomized): every mask kind Flex serves, batch and heads, grouped-query
heads, odd sizes with Lq != Lk, memory layouts, widths, softcap, sinks; fully masked rows
(their output and gradients are 0, never NaN). Tolerance: float32 1e-5 relative
(tests/support/numerics.py), with an absolute floor for results near 0.

torch's FlexAttention refuses a backward on a CPU (a device check before it runs, not a
missing implementation): the backward tests lift that check for their duration
(``monkeypatch``) and run Flex's own eager backward, the same autograd graph a GPU runs.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.flex import FlexBackend
from attnkit.kernels.flex.mods import supported_mask
from attnkit.kernels.policy import numerics
from tests.support import layouts
from tests.support.host_sync import NoHostSync
from tests.support.masks import KINDS, make_case, ref_mask
from tests.support.numerics import split_mask
from tests.support.sinks import check_close, torch_reference

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _grouped(h: int):
    return st.sampled_from([d for d in (1, 2, 4) if h % d == 0])


def cases():
    """Batch, heads (query h, key/value g), lengths, widths, mask kind, layouts, softcap and
    sinks of one call."""
    sizes = st.integers(1, 70)
    widths = st.sampled_from([4, 8, 16])
    rest = st.fixed_dictionaries(
        dict(
            b=st.integers(1, 2), lq=sizes, lk=sizes, d=widths, dv=widths,
            kind=st.sampled_from(KINDS),
            layouts=st.lists(st.sampled_from(layouts.LAYOUTS), min_size=3, max_size=3),
            cap=st.sampled_from([None, None, 0.5, 5.0]), sinks=st.sampled_from([None, 1.0, 4.0]),
            seed=st.integers(0, 2**20),
        )
    )  # fmt: skip
    heads = st.sampled_from([1, 2, 4]).flatmap(lambda h: _grouped(h).map(lambda g: dict(h=h, g=g)))
    return st.tuples(heads, rest).map(lambda t: {**t[0], **t[1]})


def _inputs(c, grad):
    gen = torch.Generator().manual_seed(c["seed"])
    b, h, g, lq, lk = c["b"], c["h"], c["g"], c["lq"], c["lk"]
    spec = make_case(c["kind"], (b, h), lq, lk, gen)
    shapes = ((b, h, lq, c["d"]), (b, g, lk, c["d"]), (b, g, lk, c["dv"]))
    made = [layouts.make(s, lay, torch.float32, gen) for s, lay in zip(shapes, c["layouts"])]
    leaves = [leaf.requires_grad_(grad) for leaf, _ in made]
    views = [view(leaf) for leaf, (_, view) in zip(leaves, made)]
    sinks = None
    if c["sinks"] is not None:
        sinks = (torch.randn(h, generator=gen) * c["sinks"]).requires_grad_(grad)
    return gen, spec, views, sinks


def _reference(c, spec, views, sinks):
    b, h, g, lq, lk = c["b"], c["h"], c["g"], c["lq"], c["lk"]
    x64 = [t.detach().double().requires_grad_() for t in views]
    s64 = None if sinks is None else sinks.detach().double().requires_grad_()
    k64, v64 = (t.repeat_interleave(h // g, 1) for t in x64[1:])
    allowed, bias = split_mask(ref_mask(spec, (b, h), lq, lk))
    shape = (b, h, lq, lk)
    al = None if allowed is None else torch.from_numpy(np.broadcast_to(allowed, shape).copy())
    bi = None if bias is None else torch.from_numpy(np.broadcast_to(bias, shape).copy())
    scale = 1.0 / c["d"] ** 0.5
    o64, _ = torch_reference(x64[0], k64, v64, al, bi, scale, c["cap"], s64)
    return x64, s64, o64, scale


@SETTINGS
@given(c=cases())
def test_forward_matches_float64(c):
    gen, spec, (q, k, v), sinks = _inputs(c, grad=False)
    mask = None if spec is None else spec.mask
    call_mask = M.normalize(mask, (c["b"], c["h"]), c["lq"], c["lk"])
    if supported_mask(call_mask, 2):
        return
    x64, s64, o64, _ = _reference(c, spec, (q, k, v), sinks)
    fn = F.grouped_query_attention if c["g"] != c["h"] else F.scaled_dot_product_attention
    with torch.no_grad():  # forward only (learned biases included)
        out = fn(q, k, v, mask, backend="flex", softcap=c["cap"], sinks=sinks)
    assert not torch.isnan(out).any(), c
    check_close(out.double().numpy(), o64.detach().numpy(), torch.float32, f"output {c}")


@pytest.fixture
def cpu_backward(monkeypatch):
    """Lift torch's refusal of a Flex backward on a CPU (see the module docstring)."""
    monkeypatch.setattr(flex_module, "_validate_device", lambda *a: None)


@SETTINGS
@given(c=cases())
def test_eager_backward_matches_float64(c):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flex_module, "_validate_device", lambda *a: None)
        _backward(c)


def _backward(c):
    gen, spec, views, sinks = _inputs(c, grad=True)
    mask = None if spec is None else spec.mask
    call_mask = M.normalize(mask, (c["b"], c["h"]), c["lq"], c["lk"])
    if supported_mask(call_mask, 2) or (call_mask is not None and any(
        t.requires_grad for t in call_mask.tensors()
    )):  # fmt: skip
        return
    x64, s64, o64, scale = _reference(c, spec, views, sinks)
    q, k, v = views
    call = AttentionCall(
        "dot",
        q,
        k,
        v,
        mask=call_mask,
        scale=scale,
        dropout_p=0.0,
        return_weights=False,
        softcap=c["cap"],
        sinks=sinks,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = dispatch.run(call, FlexBackend(compiled=False))
    go = torch.randn(o64.shape, generator=gen, dtype=torch.float64)
    ins64 = [*x64, *([s64] if s64 is not None else [])]
    refs = torch.autograd.grad(o64, ins64, go)
    ins = [*views, *([sinks] if sinks is not None else [])]
    got = torch.autograd.grad(out, ins, go.float(), allow_unused=True)
    check_close(out.detach().double().numpy(), o64.detach().numpy(), torch.float32, f"out {c}")
    for n, a, r in zip("qkvs", got, refs):
        a = torch.zeros_like(r) if a is None else a
        assert not torch.isnan(a).any(), (n, c)
        check_close(a.double().numpy(), r.numpy(), torch.float32, f"d{n} {c}")


def test_fully_masked_rows_give_zero_with_and_without_sinks(cpu_backward):
    """Batch 1 has no valid key, rows 0..4 of batch 0 none either (bottom-right causal with
    Lq > Lk): output 0 and gradients 0 there, never NaN."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 9, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 4, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 4, 8, generator=g, requires_grad=True)
    mask = M.causal("bottom_right") & M.key_padding([4, 0])
    for sinks in (None, torch.tensor([0.5, -1.0], requires_grad=True)):
        call = AttentionCall(
            "dot",
            q,
            k,
            v,
            mask=mask,
            scale=0.3,
            dropout_p=0.0,
            return_weights=False,
            softcap=None,
            sinks=sinks,
        )
        out, _ = dispatch.run(call, FlexBackend(compiled=False))
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        assert torch.equal(out[0, :, :5], torch.zeros_like(out[0, :, :5]))
        assert out[0, :, 5:].abs().sum() > 0
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert not any(torch.isnan(t).any() for t in grads)
        assert torch.equal(grads[0][1], torch.zeros_like(grads[0][1]))


def test_plan_and_forward_read_nothing_back_to_the_host():
    """Block classes, BlockMask and the Flex call with sinks: no .item(), .tolist(),
    bool(tensor) or .cpu() (what would stall a CUDA call until the GPU drains)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.sort(torch.randint(0, 5, (2, 300), generator=g), -1).values
    mask = M.document(ids) & M.causal()
    q = torch.randn(2, 2, 300, 16, generator=g)
    call = AttentionCall(
        "dot",
        q,
        q,
        q,
        mask=mask,
        scale=0.25,
        dropout_p=0.0,
        return_weights=False,
        softcap=30.0,
        sinks=torch.zeros(2),
    )
    # Flex's eager path runs under dynamo; after calls with many scales in this process
    # dynamo passes the scale as a CPU scalar tensor read with .item() (host data, no GPU
    # wait, but the spy cannot tell): start from fresh compile caches
    torch.compiler.reset()
    with numerics.use_path("device"), NoHostSync():
        dispatch.run(call, FlexBackend(compiled=False, block_size=64))
