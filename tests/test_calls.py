"""The one front door (:func:`attnkit.calls.parse`): what it returns, that a remembered
signature skips every check and the choice yet builds the same call, that it is the only
constructor of ``AttentionCall`` in the library and ``functional.py`` validates nothing itself.
Outputs are compared with torch's own math (float64)."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from attnkit import call_checks, calls
from attnkit import masks as M
from attnkit.calls import Parsed, Signature, parse
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"


@pytest.fixture(autouse=True)
def fresh_cache():
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def _qkv(*shape, heads_kv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_shape = shape if heads_kv is None else shape[:-3] + (heads_kv,) + shape[-2:]
    return (
        torch.randn(shape, generator=g, dtype=torch.float64),
        torch.randn(kv_shape, generator=g, dtype=torch.float64),
        torch.randn(kv_shape, generator=g, dtype=torch.float64),
    )


def _torch_math(q, k, v, causal=False, scale=None):
    """softmax(q k^T scale + causal) v in float64 torch, k/v heads repeated to q's."""
    rep = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v


def test_parse_returns_the_call_its_backend_and_a_named_signature():
    q, k, v = _qkv(2, 3, 5, 4)
    p = parse("dot", q, k, v, M.causal(), scale=0.5)
    assert isinstance(p, Parsed) and isinstance(p.call, AttentionCall)
    assert p.backend is dispatch.select(p.call)
    sig = p.signature
    assert isinstance(sig, Signature) and sig.kind == "dot" and sig.grad == torch.is_grad_enabled()
    assert sig.q[1:4] == (q.shape, q.stride(), q.dtype) and sig.scale == (float, 0.5)
    assert hash(sig) == hash(tuple(sig))
    out, _ = dispatch.run(p.call, p.backend)
    torch.testing.assert_close(
        out, _torch_math(q, k, v, causal=True, scale=0.5), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("kind,heads_kv", [("dot", None), ("gqa", 1), ("gqa", 3)])
def test_a_remembered_signature_skips_the_checks_and_builds_the_same_call(
    kind, heads_kv, monkeypatch
):
    q, k, v = _qkv(2, 3, 5, 4, heads_kv=heads_kv)
    mask = M.causal()
    first = parse(kind, q, k, v, mask)
    for name in ("check_qkv", "check_grouped", "check_mask", "check_softcap_sinks"):
        monkeypatch.setattr(call_checks, name, lambda *a, **kw: 1 / 0)
    monkeypatch.setattr(dispatch, "select", lambda *a, **kw: 1 / 0)
    again = parse(kind, q, k, v, mask)
    assert again.signature == first.signature and again.backend is first.backend
    assert again.call == first.call and again.call.memo is not first.call.memo
    assert {f.name for f in dataclasses.fields(AttentionCall)} <= set(vars(again.call))
    out, _ = dispatch.run(again.call, again.backend)
    torch.testing.assert_close(out, _torch_math(q, k, v, causal=True), rtol=0, atol=1e-12)


def test_a_grouped_call_with_as_many_kv_heads_is_remembered_too(monkeypatch):
    """G = H through ``"gqa"`` is checked and chosen as plain attention, then remembered."""
    q, k, v = _qkv(1, 4, 6, 8)
    first = parse("gqa", q, k, v)
    assert first.signature is not None and not first.call.grouped
    monkeypatch.setattr(dispatch, "select", lambda *a, **kw: 1 / 0)
    assert parse("gqa", q, k, v).call == first.call


def test_without_select_nothing_is_chosen_or_remembered():
    q, k, v = _qkv(2, 5, 4)
    p = parse("dot", q, k, v, select=False)
    assert p.backend is None and p.signature is None and len(dispatch.CACHE) == 0


def test_bad_kind_and_dot_only_options_name_the_argument():
    q, k, v = _qkv(2, 5, 4)
    with pytest.raises(ValueError, match="^kind: expected one of"):
        parse("cosine", q, k, v)  # type: ignore[arg-type]
    w = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="^softcap, sinks: defined for dot-product scores only"):
        parse("additive", q, k, v, softcap=5.0, w_q=w, w_k=w, w_v=w[0])


def test_the_parser_is_the_only_constructor_of_attention_call():
    """No module of the library but calls.py builds an AttentionCall (``AttentionCall(...)``
    or a classmethod of it); kernels derive calls from calls (``dataclasses.replace``)."""
    builders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
            owner = (
                f.value.id
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                else None
            )
            if name == "AttentionCall" or owner == "AttentionCall":
                builders.append(path.relative_to(SRC).as_posix())
    assert builders and set(builders) == {"calls.py"}


def test_functional_validates_nothing_itself():
    """functional.py holds the public signatures and docstrings: no raise, no check."""
    tree = ast.parse((SRC / "functional.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imported.isdisjoint({"checks", "tensor_checks", "dispatch"})
    assert calls.parse is parse
