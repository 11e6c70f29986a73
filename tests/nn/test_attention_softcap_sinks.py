"""MultiHeadAttention with ``softcap`` and learned ``sinks``: against an independent float64
computation (the module's weights, transformers' eager formula of tests/support/sinks.py) for the
output and the gradients (the sinks parameter and a projection), cached vs full decoding, bad
arguments, and the state_dict / safetensors round trip.

Tolerances: float32 1e-5 relative (absolute floor 1e-6), tests/support/sinks.py.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit import masks
from attnkit.nn.attention import MultiHeadAttention
from tests.support import masks as S
from tests.support.sinks import check_close, torch_reference

B, L, E, H = 2, 11, 32, 4

MASKS = {
    "causal": S.causal(),
    "window&causal": S.sliding_window(3, 0),
    "key_padding": S.key_padding([L, 6]),
}
"""Catalogue masks (tests/support/masks.py); the reference reads their dense form."""


def _module(g: int, cap, sinks: bool, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    m = MultiHeadAttention(E, H, num_kv_heads=g, softcap=cap, sinks=sinks)
    if sinks:
        with torch.no_grad():
            m.sinks.normal_(0.0, 2.0)  # large enough to matter
    return m


def _reference(m: MultiHeadAttention, x: torch.Tensor, allowed: torch.Tensor):
    """float64 forward with the module's weights (a copy): (output, the copied parameters)."""
    p = {n: t.detach().double().requires_grad_() for n, t in m.named_parameters()}
    x = x.double()
    d, g = E // H, m.num_kv_heads

    rows = [E, g * d, g * d]
    w, b = p["in_proj.weight"].split(rows), p["in_proj.bias"].split(rows)

    def proj(i, n):
        y = x @ w[i].T + b[i]
        return y.view(B, L, n, d).transpose(1, 2)

    q, k, v = proj(0, H), proj(1, g), proj(2, g)
    k, v = k.repeat_interleave(H // g, 1), v.repeat_interleave(H // g, 1)
    o, _ = torch_reference(q, k, v, allowed, None, d**-0.5, m.softcap, p.get("sinks"))
    o = o.transpose(1, 2).reshape(B, L, E)
    return o @ p["out_proj.weight"].T + p["out_proj.bias"], p


@pytest.mark.parametrize("kind", list(MASKS))
@pytest.mark.parametrize("g", [H, 2])
@pytest.mark.parametrize("cap, sinks", [(5.0, False), (None, True), (5.0, True)])
def test_forward_and_gradients_match_float64(kind, g, cap, sinks):
    """Output and the gradients of the sinks parameter and of the packed in-projection."""
    m = _module(g, cap, sinks)
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(1))
    spec = MASKS[kind]
    out, _ = m(x, mask=spec.mask)
    allowed = torch.from_numpy(S.ref_mask(spec, (B, H), L, L))
    ref, p = _reference(m, x, allowed)
    check_close(out.detach().double().numpy(), ref.detach().numpy(), torch.float32, "output")
    go = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    names = ["in_proj.weight"] + (["sinks"] if sinks else [])
    got = torch.autograd.grad(out, [dict(m.named_parameters())[n] for n in names], go.float())
    want = torch.autograd.grad(ref, [p[n] for n in names], go)
    for n, a, r in zip(names, got, want, strict=True):
        check_close(a.double().numpy(), r.numpy(), torch.float32, f"d {n}")


@pytest.mark.parametrize("cap, sinks", [(5.0, True), (None, True), (5.0, False)])
def test_cached_decoding_matches_the_full_forward(cap, sinks):
    """Prefill of 5 tokens then one token at a time with a KV cache, against one full causal
    forward."""
    m = _module(2, cap, sinks).eval()
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, _ = m(x, mask=masks.causal())
        cache, outs = m.new_cache(), []
        mask = masks.causal("bottom_right")
        outs.append(m(x[:, :5], mask=mask, cache=cache)[0])
        for i in range(5, L):
            outs.append(m(x[:, i : i + 1], mask=mask, cache=cache)[0])
    got = torch.cat(outs, 1)
    check_close(got.double().numpy(), full.double().numpy(), torch.float32, "cached")


def test_state_dict_round_trips_through_safetensors(tmp_path):
    """The sinks parameter is saved and loaded with the projections; a module without sinks
    has no such key."""
    m = _module(2, 5.0, True)
    path = tmp_path / "attn.safetensors"
    save_file(m.state_dict(), str(path))
    loaded = load_file(str(path))
    assert "sinks" in loaded and loaded["sinks"].shape == (H,)
    n = _module(2, 5.0, True, seed=9)
    n.load_state_dict(loaded)
    x = torch.randn(B, L, E)
    assert torch.equal(m(x, mask=masks.causal())[0], n(x, mask=masks.causal())[0])
    assert "sinks" not in _module(2, None, False).state_dict()


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(softcap=0.0), ValueError, "softcap"),
        (dict(softcap=-2.0), ValueError, "softcap"),
        (dict(softcap=float("inf")), ValueError, "softcap"),
        (dict(softcap="50"), TypeError, "softcap"),
        (dict(sinks="yes"), TypeError, "sinks"),
        (dict(sinks=torch.zeros(H)), TypeError, "sinks"),
    ],
)
def test_bad_softcap_and_sinks_are_refused(kw, err, match):
    with pytest.raises(err, match=match):
        MultiHeadAttention(E, H, **kw)


def test_to_torch_refuses_and_repr_names_them():
    m = _module(H, 5.0, True)
    assert "softcap=5" in repr(m) and "sinks=True" in repr(m)
    with pytest.raises(ValueError, match="softcap"):
        m.to_torch()
    with pytest.raises(ValueError, match="sinks"):
        _module(H, None, True).to_torch()
