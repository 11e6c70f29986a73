"""attnkit.kernels.dispatch: the preference order, the choice, the reasons and the remembered
choices (per call signature).

The remembered choice must never change an outcome: every test compares the backend a call
runs on with what :func:`attnkit.kernels.dispatch.explain` (which never remembers) chooses for
the same call, and checks that every argument is still validated on a repeated signature.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import BACKENDS, dispatch
from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.dispatch import WEIGHTS_LIMIT
from tests.support.numerics import TOL, rel_err


@pytest.fixture(autouse=True)
def fresh_cache():
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


class Recorder:
    """Wraps every registered backend's ``run`` and records which backend ran."""

    def __init__(self, monkeypatch):
        self.ran: list[str] = []
        for name, b in BACKENDS.items():
            monkeypatch.setattr(b, "run", self._wrap(name, b.run))

    def _wrap(self, name, run):
        def wrapped(call, decision):
            self.ran.append(name)
            return run(call, decision)

        return wrapped


def _qkv(*shape, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=dtype).requires_grad_(grad) for _ in "qkv")


def _expected(q, k, v, mask=None, **kw) -> str:
    return F.explain_dispatch(q, k, v, mask, **kw).chosen


# ---------------------------------------------------------------------------------------------
# preference order and reasons
# ---------------------------------------------------------------------------------------------
def test_preference_order_lives_in_dispatch():
    assert dispatch.preference("dot") == tuple(
        n for n in dispatch.PREFERENCE["dot"] if n in BACKENDS
    )
    assert dispatch.preference("additive")[-1] == "math"  # math serves everything, last
    from attnkit import kernels

    assert kernels.preference is dispatch.preference  # the old import path still works


def test_reasons_are_formatted_in_one_place():
    q, k, v = _qkv(1, 5, 4)
    d = F.explain_dispatch(q, k, v, return_weights=True, backend="dense")
    assert d.chosen is None and d.reasons["dense"]
    err = d.error()
    assert isinstance(err, ValueError)
    assert str(err).startswith("backend: 'dense' cannot serve this call: ")
    assert all(r in str(err) for r in d.reasons["dense"])
    with pytest.raises(ValueError) as info:
        F.scaled_dot_product_attention(q, k, v, return_weights=True, backend="dense")
    assert str(info.value) == str(err)


def test_select_reads_capabilities_from_backend_classes(monkeypatch):
    """Dispatch never restates a capability: flip one on the class, and the choice follows."""
    q, k, v = _qkv(2, 7, 4)
    dense = type(BACKENDS["dense"])
    assert F.explain_dispatch(q, k, v, dropout_p=0.5).chosen == "dense"
    monkeypatch.setattr(dense, "supports_dropout", False)
    dispatch.clear_cache()
    d = F.explain_dispatch(q, k, v, dropout_p=0.5)
    assert d.chosen == "math" and "no dropout" in d.reasons["dense"]


def test_no_backend_can_serve_lists_every_reason(monkeypatch):
    class Nothing(Backend):
        name = "nothing"
        kinds = ("dot",)
        dtypes = ()

    monkeypatch.setitem(BACKENDS, "nothing", Nothing())
    monkeypatch.setitem(dispatch.PREFERENCE, "dot", ("nothing",))
    q, k, v = _qkv(1, 3, 2)
    with pytest.raises(
        ValueError, match=r"(?s)^backend: no backend can serve this call:\n.*nothing: dtype"
    ):
        F.scaled_dot_product_attention(q, k, v)


# ---------------------------------------------------------------------------------------------
# remembered choices
# ---------------------------------------------------------------------------------------------
CALLS = {
    "plain": lambda: (_qkv(2, 3, 9, 8), None, {}),
    "causal": lambda: (_qkv(1, 2, 300, 8), M.causal(), {}),
    "window": lambda: (_qkv(1, 2, 300, 8), M.sliding_window(16), {}),
    "tensor mask": lambda: (_qkv(2, 5, 6), torch.rand(5, 5) > 0.3, {}),
    "weights": lambda: (_qkv(2, 5, 6), M.causal(), {"return_weights": True}),
    "dropout": lambda: (_qkv(2, 5, 6), None, {"dropout_p": 0.25}),
    "grad": lambda: (_qkv(2, 5, 6, grad=True), None, {}),
    "float64": lambda: (_qkv(2, 5, 6, dtype=torch.float64), M.key_padding([3, 5]), {}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_repeated_calls_run_the_chosen_backend_and_equal_the_first(name, monkeypatch):
    (q, k, v), mask, kw = CALLS[name]()
    want = _expected(q, k, v, mask, **kw)
    rec = Recorder(monkeypatch)
    results = []
    for _ in range(3):
        torch.manual_seed(0)
        results.append(F.scaled_dot_product_attention(q, k, v, mask, **kw))
    assert rec.ran == [want] * 3
    assert len(dispatch.CACHE) == 1  # one signature, remembered once
    first = results[0] if isinstance(results[0], tuple) else (results[0],)
    for r in results[1:]:
        for a, b in zip(r if isinstance(r, tuple) else (r,), first, strict=True):
            assert torch.equal(a, b)


def test_signature_changes_are_new_choices(monkeypatch):
    """Each property a backend may read is part of the key: change it and the choice is made
    again (and is the one explain gives)."""
    rec = Recorder(monkeypatch)
    q, k, v = _qkv(1, 2, 300, 8)
    window = M.sliding_window(16)
    variants = [
        ((q, k, v), window, {}),
        ((q, k, v), None, {}),  # no mask: dense
        ((q, k, v), M.sliding_window(16), {}),  # another mask object
        ((q.double(), k.double(), v.double()), window, {}),
        ((q, k, v), window, {"return_weights": True}),  # math
        ((q.detach().clone().requires_grad_(), k, v), window, {}),
    ]
    for (a, b, c), mask, kw in variants:
        want = _expected(a, b, c, mask, **kw)
        rec.ran.clear()
        F.scaled_dot_product_attention(a, b, c, mask, **kw)
        assert rec.ran == [want]
    assert len(dispatch.CACHE) == len(variants)
    with torch.no_grad():  # grad mode is part of the key
        F.scaled_dot_product_attention(q, k, v, window)
    assert len(dispatch.CACHE) == len(variants) + 1


def test_in_place_change_of_a_mask_tensor_is_seen(monkeypatch):
    """A float mask tensor modified in place (its version counter moves) is checked again."""
    rec = Recorder(monkeypatch)
    q, k, v = _qkv(1, 1, 300, 8)
    bias = torch.zeros(300, 300)
    F.scaled_dot_product_attention(q, k, v, bias)
    first = rec.ran[-1]
    i = torch.arange(300)
    band = (i[:, None] - i[None, :]).abs() <= 8
    bias.copy_(torch.where(band, 0.0, float("-inf")))  # now a narrow band: mostly empty
    want = _expected(q, k, v, bias)
    F.scaled_dot_product_attention(q, k, v, bias)
    assert rec.ran[-1] == want and len(dispatch.CACHE) == 2
    assert first == "dense"


def test_a_reused_id_is_not_mistaken_for_the_old_mask():
    q, k, v = _qkv(1, 4, 4)
    m = M.causal()
    F.scaled_dot_product_attention(q, k, v, m)
    (entry,) = dispatch.CACHE._entries.values()
    assert entry.mask_ref() is m
    del m
    gc.collect()
    assert entry.mask_ref() is None  # a new object at the same address cannot match it
    F.scaled_dot_product_attention(q, k, v, M.causal())


def test_repeated_signature_still_validates_every_option():
    """A remembered signature never lets a bad option through: bools are not numbers, wrong
    types are not equal values."""
    q, k, v = _qkv(2, 3, 4)
    F.scaled_dot_product_attention(q, k, v, scale=1.0, dropout_p=0.0, return_weights=True)
    bad = [
        (dict(scale=True, dropout_p=0.0, return_weights=True), TypeError, "scale"),
        (dict(scale=1.0, dropout_p=False, return_weights=True), TypeError, "dropout_p"),
        (dict(scale=1.0, dropout_p=0.0, return_weights=1), TypeError, "return_weights"),
        (dict(scale=float("nan")), ValueError, "scale"),
    ]
    for kw, exc, name in bad:
        with pytest.raises(exc, match=rf"^{name}: "):
            F.scaled_dot_product_attention(q, k, v, **kw)


def test_cache_is_bounded():
    cache = dispatch.ChoiceCache(size=3)
    b = BACKENDS["math"]
    for i in range(5):
        cache.put(("k", i), b, (), None)
    assert len(cache) == 3 and cache.get(("k", 0), None) is None
    assert cache.get(("k", 4), None).backend is b


def test_replaced_backend_is_not_served_from_the_cache(monkeypatch):
    q, k, v = _qkv(2, 3, 4)
    F.scaled_dot_product_attention(q, k, v)
    ran = []

    class Dense(type(BACKENDS["dense"])):
        def run(self, call, decision):
            ran.append(call)
            return super().run(call, decision)

    monkeypatch.setitem(BACKENDS, "dense", Dense())
    F.scaled_dot_product_attention(q, k, v)
    assert len(ran) == 1


def test_explain_never_remembers():
    q, k, v = _qkv(2, 3, 4)
    F.explain_dispatch(q, k, v)
    assert len(dispatch.CACHE) == 0
    call = AttentionCall(kind="dot", q=q, k=k, v=v)
    assert dispatch.explain(call).chosen == dispatch.select(call).name


def rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# dispatcher (moved from tests/test_functional.py)
# ---------------------------------------------------------------------------------------------
def test_explain_dispatch_chooses_dense_without_mask():
    q = torch.randn(2, 3, 8, 16)
    d = F.explain_dispatch(q, q, q)
    assert d.chosen == "dense", str(d)
    assert set(d.reasons) >= {"dense", "math"}
    assert d.reasons["math"] == []  # math could serve it, but comes later
    text = str(d)
    assert "backend: dense" in text and "math" in text


def test_explain_dispatch_weights_go_to_math():
    q = torch.randn(1, 5, 4)
    d = F.explain_dispatch(q, q, q, M.causal(), return_weights=True)
    assert d.chosen == "math"
    assert any("weights" in r for r in d.reasons["dense"])


def test_forced_backend_that_cannot_serve_raises_with_reasons():
    q = torch.randn(1, 5, 4)
    reasons = F.explain_dispatch(q, q, q, return_weights=True, backend="dense").reasons["dense"]
    assert reasons
    with pytest.raises(ValueError) as info:
        F.scaled_dot_product_attention(q, q, q, return_weights=True, backend="dense")
    msg = str(info.value)
    assert msg.startswith("backend") and "'dense'" in msg
    for reason in reasons:
        assert reason in msg
    w = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"^backend.*'dense'.*score kind"):
        F.additive_attention(q, q, q, w, w, torch.randn(3), backend="dense")


def test_forced_backend_ignores_speed_reasons():
    """auto skips blocksparse on plain causal (dense is faster); forcing it still runs, exactly."""
    g = torch.Generator().manual_seed(3)
    q, k, v = rand(g, 2, 97, 8), rand(g, 2, 97, 8), rand(g, 2, 97, 5)
    auto = F.explain_dispatch(q, k, v, M.causal())
    assert auto.chosen == "dense" and any("causal" in r for r in auto.reasons["blocksparse"])
    forced = F.explain_dispatch(q, k, v, M.causal(), backend="blocksparse")
    assert forced.chosen == "blocksparse"
    out = F.scaled_dot_product_attention(q, k, v, M.causal(), backend="blocksparse")
    ref = R.scaled_dot_product(
        q.numpy(), k.numpy(), v.numpy(), mask=np.tril(np.ones((97, 97), bool))
    )
    assert rel_err(out, ref.output) <= TOL[torch.float64]


def test_return_weights_too_large_raises_and_explains():
    lq = WEIGHTS_LIMIT // 4096 + 1
    q, k = torch.randn(lq, 1), torch.randn(4096, 1)
    with pytest.raises(ValueError) as info:
        F.scaled_dot_product_attention(q, k, k, return_weights=True)
    msg = str(info.value)
    assert msg.startswith("return_weights") and f"{lq * 4096:,}" in msg
    assert "slice" in msg  # says how to ask for fewer
    F.scaled_dot_product_attention(q[:5], k, k, return_weights=True)  # a slice is fine


def test_explain_lists_the_fallbacks_the_policy_decides():
    """dense hands a call whose scores are too large for a fused backward to math (the policy
    stage's decision), and explain_dispatch says so; decode says where a failed step goes."""
    q, k, v = (t * 1e17 for t in _qkv(1, 2, 4, 8))
    q.requires_grad_()
    d = F.explain_dispatch(q, k, v, backend="dense")
    assert d.chosen == "dense"
    assert any(f.startswith("dense hands the call to math") for f in d.fallbacks), d.fallbacks
    assert "fallback: dense hands the call to math" in str(d)
    q2 = _qkv(1, 2, 1, 8)[0]
    k2, v2 = _qkv(1, 2, 2048, 8, seed=1)[1:]
    d = F.explain_dispatch(q2, k2, v2, backend="decode")
    assert any("redone on dense" in f for f in d.fallbacks), d.fallbacks
    plain = F.explain_dispatch(*_qkv(1, 2, 4, 8))
    assert plain.fallbacks == ()


def test_the_fallback_runs_on_math_and_matches_it(monkeypatch):
    q, k, v = (t * 1e17 for t in _qkv(1, 2, 4, 8, dtype=torch.float64))
    q = q.detach().requires_grad_()
    rec = Recorder(monkeypatch)
    out = F.scaled_dot_product_attention(q, k, v, backend="dense")
    assert rec.ran == ["math"]  # dispatch handed it over; dense never ran
    ref = F.scaled_dot_product_attention(q.detach(), k, v, backend="math")
    torch.testing.assert_close(out.detach(), ref)


@pytest.mark.parametrize("backend", ["blocksparse", "dense", "math"])
def test_the_policy_runs_once_per_call(monkeypatch, backend):
    """The policy is one stage of dispatch: one decision per call, asked by dispatch only
    (blocksparse used to ask it up to seven times per call)."""
    from attnkit.kernels.policy import numerics

    asked = []
    real = numerics.decision
    monkeypatch.setattr(numerics, "decision", lambda call: asked.append(1) or real(call))
    q, k, v = _qkv(1, 2, 300, 16, grad=True)
    out = F.scaled_dot_product_attention(q, k, v, M.sliding_window(8), backend=backend)
    out.sum().backward()
    assert len(asked) == 1
