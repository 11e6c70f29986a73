"""MultiHeadAttention's ``attention_fn``: the documented call (shapes, mask, dropout, weights
flag), its result used as the heads' output, and a float64 NumPy implementation
(:mod:`attnkit.reference`) passed as ``attention_fn`` agreeing with the default within 1e-10
relative, full forward and cached decoding (grouped-query heads included).

The reference attention_fn builds its mask from the catalogue's parameters
(:func:`tests.support.masks.ref_mask`), never from attnkit's materialisation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnkit import reference as R
from attnkit.nn.attention import MultiHeadAttention, default_attention
from tests.support import masks as S
from tests.support.no_work import no_work
from tests.support.numerics import rel_err

B, LQ, LK, E, H = 3, 7, 13, 30, 6  # d = E / H = 5
REL64 = 1e-10


class ReferenceFn:
    """A float64 NumPy attention_fn (attnkit.reference.scaled_dot_product per query head, key/
    value head h // (H / G)); records every call's shapes, mask, dropout_p, return_weights."""

    def __init__(self, spec: S.Spec | None) -> None:
        self.spec = spec
        self.calls: list[dict] = []

    def __call__(self, q, k, v, mask, *, dropout_p, return_weights):
        self.calls.append(
            dict(
                shapes=(tuple(q.shape), tuple(k.shape), tuple(v.shape)),
                mask=mask,
                dropout_p=dropout_p,
                return_weights=return_weights,
            )
        )
        h, g = q.shape[1], k.shape[1]
        heads = np.arange(h) // (h // g)  # query head -> key/value head
        qn, kn, vn = (t.detach().numpy() for t in (q, k, v))
        ref = S.ref_mask(self.spec, (q.shape[0], h), q.shape[2], k.shape[2])
        t = R.scaled_dot_product(qn, kn[:, heads], vn[:, heads], ref)
        out = torch.from_numpy(np.array(t.output))
        return out, torch.from_numpy(np.array(t.weights)) if return_weights else None


def pair(num_kv_heads, seed, **kw):
    """(default module, module with the reference attention_fn) sharing float64 weights."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(E, H, num_kv_heads=num_kv_heads, dtype=torch.float64, **kw).eval()
    for p in mha.parameters():
        nn.init.normal_(p, std=0.3)
    fn = ReferenceFn(None)
    custom = MultiHeadAttention(
        E, H, num_kv_heads=num_kv_heads, dtype=torch.float64, attention_fn=fn, **kw
    ).eval()
    custom.load_state_dict(mha.state_dict())
    return mha, custom, fn


SPECS = {
    "none": lambda: S.none(),
    "key_padding": lambda: S.key_padding([13, 1, 6]),
    "causal_br&padding": lambda: S.causal("bottom_right") & S.key_padding([13, 2, 9]),
    "window_br": lambda: S.sliding_window(3, 0, "bottom_right"),
    "alibi": lambda: S.alibi(0.5),
    "alibi&causal_br": lambda: S.alibi(0.5) & S.causal("bottom_right"),
}


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("num_kv_heads", [1, 2, 3, 6])
def test_reference_attention_fn_equals_default(num_kv_heads, spec_name):
    mha, custom, fn = pair(num_kv_heads, 0)
    fn.spec = spec = SPECS[spec_name]()
    x = torch.randn(B, LQ, E, dtype=torch.float64)
    mem = torch.randn(B, LK, E, dtype=torch.float64)
    ref_out, ref_w = mha(x, mem, mask=spec.mask, return_weights=True)
    out, w = custom(x, mem, mask=spec.mask, return_weights=True)
    assert rel_err(out, ref_out) <= REL64
    assert rel_err(w, ref_w) <= REL64
    (call,) = fn.calls
    d, g = E // H, num_kv_heads
    assert call["shapes"] == ((B, H, LQ, d), (B, g, LK, d), (B, g, LK, d))
    assert call["mask"] is spec.mask  # the caller's mask, as given (already checked)
    assert call["dropout_p"] == 0.0 and call["return_weights"] is True
    fast, none = custom(x, mem, mask=spec.mask)
    assert none is None and fn.calls[-1]["return_weights"] is False
    assert rel_err(fast, ref_out) <= REL64


@pytest.mark.parametrize(
    ("num_kv_heads", "chunks", "spec_name"),
    [
        (2, [1] * 13, "causal_br&padding"),
        (3, [4, 1, 7, 1], "window_br"),
        (1, [6, 7], "alibi&causal_br"),
    ],
)
def test_cached_decoding_with_reference_fn_equals_full_forward(num_kv_heads, chunks, spec_name):
    """Causal masks only: there, the cached steps must reproduce the full forward."""
    mha, custom, fn = pair(num_kv_heads, 1)
    fn.spec = spec = SPECS[spec_name]()
    x = torch.randn(B, LK, E, dtype=torch.float64)
    full, full_w = mha(x, mask=spec.mask, return_weights=True)
    for module in (mha, custom):
        cache = module.new_cache()
        outs, pos = [], 0
        for n in chunks:
            o, w = module(x[:, pos : pos + n], mask=spec.mask, cache=cache, return_weights=True)
            assert rel_err(w, full_w[:, :, pos : pos + n, : pos + n]) <= REL64
            outs.append(o)
            pos += n
        assert rel_err(torch.cat(outs, dim=1), full) <= REL64
    d, pos = E // H, 0
    for call, n in zip(fn.calls, chunks, strict=True):  # k/v: every cached key, G heads
        pos += n
        assert call["shapes"] == (
            (B, H, n, d),
            (B, num_kv_heads, pos, d),
            (B, num_kv_heads, pos, d),
        )


def test_attention_fn_result_is_used():
    torch.manual_seed(2)
    seen = []

    def zeros(q, k, v, mask, *, dropout_p, return_weights):
        seen.append(dropout_p)
        return torch.zeros_like(q), None

    mha = MultiHeadAttention(12, 3, dropout=0.25, attention_fn=zeros)
    nn.init.normal_(mha.out_proj.bias)
    x = torch.randn(2, LQ, 12)
    out, _ = mha(x)  # every head outputs 0: the result is out_proj's bias
    assert torch.equal(out, mha.out_proj.bias.expand(2, LQ, 12))
    mha.eval()
    mha(x)
    assert seen == [0.25, 0.0]  # dropout only in training mode
    assert mha.attention_fn is zeros
    assert "attention_fn=zeros" in repr(mha)
    with pytest.raises(ValueError, match="attention_fn: torch.nn.MultiheadAttention has no"):
        mha.to_torch()
    assert MultiHeadAttention(12, 3).attention_fn is default_attention


def test_default_attention_returns_a_pair_and_matches_reference():
    torch.manual_seed(3)
    q = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    k, v = (
        torch.randn(2, 2, 9, 3, dtype=torch.float64),
        torch.randn(2, 2, 9, 3, dtype=torch.float64),
    )
    out, none = default_attention(q, k, v)
    assert none is None
    out2, w = default_attention(q, k, v, return_weights=True)
    heads = [0, 0, 1, 1]
    t = R.scaled_dot_product(q.numpy(), k.numpy()[:, heads], v.numpy()[:, heads])
    assert rel_err(out, t.output) <= REL64 and rel_err(out2, t.output) <= REL64
    assert rel_err(w, t.weights) <= REL64


def test_bad_attention_fn():
    with pytest.raises(TypeError, match="attention_fn: expected a callable or None, got int"):
        MultiHeadAttention(8, 2, attention_fn=3)
    x = torch.randn(2, 3, 8)
    wrong = MultiHeadAttention(8, 2, attention_fn=lambda q, k, v, m, **kw: (q[..., :1], None))
    with pytest.raises(
        ValueError, match=r"attention_fn: expected .* \(2, 2, 3, 4\), got \(2, 2, 3, 1\)"
    ):
        wrong(x)
    single = MultiHeadAttention(8, 2, attention_fn=lambda q, k, v, m, **kw: q)
    with pytest.raises(ValueError, match="attention_fn: expected to return"):
        single(x)
    no_w = MultiHeadAttention(8, 2, attention_fn=lambda q, k, v, m, **kw: (q, None))
    assert no_w(x)[1] is None
    with pytest.raises(ValueError, match="attention_fn: expected weights of shape"):
        no_w(x, return_weights=True)


@pytest.mark.parametrize("use_cache", [False, True])
def test_bad_mask_is_refused_before_any_work(use_cache):
    calls = []
    mha = MultiHeadAttention(8, 2, attention_fn=lambda *a, **kw: calls.append(a))
    x = torch.randn(2, 3, 8)
    cache = mha.new_cache() if use_cache else None
    with no_work() as seen, pytest.raises(ValueError, match="mask: expected a shape broadcastable"):
        mha(x, mask=torch.ones(3, 4, dtype=torch.bool), cache=cache)
    assert not seen and not calls
    if use_cache:
        assert cache.size == 0


def test_a_remembered_mask_is_checked_again_at_other_sizes():
    """The module skips re-checking the mask object of its previous call only at equal sizes."""
    mha = MultiHeadAttention(8, 2)
    t = torch.ones(5, 5, dtype=torch.bool)
    obj = S.tensor(torch.ones(2, 5, 5, dtype=torch.bool)).mask  # from_tensor: batch dim B = 2
    for mask in (t, obj):
        mha(torch.randn(2, 5, 8), mask=mask)
        mha(torch.randn(2, 5, 8), mask=mask)
        with no_work() as seen, pytest.raises(ValueError, match="mask: "):
            mha(torch.randn(2, 3, 8), mask=mask)
        assert not seen
        with pytest.raises(ValueError, match="mask: "):
            mha(torch.randn(3, 5, 8), mask=obj)
