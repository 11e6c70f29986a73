"""attnkit.functional.multi_head_attention against reference.multi_head (float64 <= 1e-10,
float32 <= 1e-5), for every backend that can serve the attention of the split heads, with
grouped-query heads, biases and the mask kinds below."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import reference as R
from tests.support import backends
from tests.support import masks as S
from tests.support.masks import ref_mask
from tests.support.numerics import TOL, rel_err

DTYPES = [torch.float64, torch.float32]
# the backends auto considers plus those it never tries for the score kind (as before the move)
serving = functools.partial(backends.serving, ignore_speed=False)


def rand(gen: torch.Generator, *shape: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------------------------------------
# multi-head attention vs reference.multi_head
# ---------------------------------------------------------------------------------------------
MH_MASKS = {
    "none": lambda b, lq, lk, h, g: S.none(),
    "causal_br": lambda b, lq, lk, h, g: S.causal("bottom_right"),
    "key_padding": lambda b, lq, lk, h, g: S.key_padding(torch.tensor([0, lk - 2])[:b]),
    "predicate_heads": lambda b, lq, lk, h, g: S.predicate(
        lambda bi, hi, qi, kj: (qi + kj + hi) % 3 != 0, num_heads=h
    ),
    "raw_heads": lambda b, lq, lk, h, g: S.raw(torch.rand((h, lq, lk), generator=g) < 0.6),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", list(MH_MASKS))
@pytest.mark.parametrize(
    "b,lq,lk,e,e_kv,h,g,dk,dv,e_out",
    [
        (2, 7, 13, 10, 6, 4, 4, 3, 5, 9),
        (1, 1, 97, 8, 8, 2, 1, 4, 4, 8),
        (2, 9, 9, 12, 12, 6, 3, 2, 3, 12),
    ],
    ids=["mha", "mqa-L1", "gqa"],
)
def test_multi_head_attention(b, lq, lk, e, e_kv, h, g, dk, dv, e_out, mask_name, dtype):
    gen = torch.Generator().manual_seed(11)
    xq, xkv = rand(gen, b, lq, e, dtype=dtype), rand(gen, b, lk, e_kv, dtype=dtype)
    # torch.nn.Linear layout (out, in) for attnkit.functional
    w_q, w_k = rand(gen, h * dk, e, dtype=dtype), rand(gen, g * dk, e_kv, dtype=dtype)
    w_v, w_o = rand(gen, g * dv, e_kv, dtype=dtype), rand(gen, e_out, h * dv, dtype=dtype)
    b_q, b_k, b_v, b_o = (rand(gen, n, dtype=dtype) for n in (h * dk, g * dk, g * dv, e_out))
    spec = MH_MASKS[mask_name](b, lq, lk, h, gen)
    mask = spec.mask

    # reference (X @ W layout): biases as an extra input column of ones and an extra weight row;
    # grouped key/value heads as their head blocks repeated for every query head of the group
    def np64(t):
        return t.double().numpy()

    def ones(x):
        return np.concatenate([np64(x), np.ones(x.shape[:-1] + (1,))], axis=-1)

    rep = h // g
    wk_full = np.concatenate([np64(w_k).T, np64(b_k)[None]], axis=0).reshape(e_kv + 1, g, 1, dk)
    wv_full = np.concatenate([np64(w_v).T, np64(b_v)[None]], axis=0).reshape(e_kv + 1, g, 1, dv)
    wk_full = np.broadcast_to(wk_full, (e_kv + 1, g, rep, dk)).reshape(e_kv + 1, h * dk)
    wv_full = np.broadcast_to(wv_full, (e_kv + 1, g, rep, dv)).reshape(e_kv + 1, h * dv)
    ref = R.multi_head(
        ones(xq),
        ones(xkv),
        np.concatenate([np64(w_q).T, np64(b_q)[None]], axis=0),
        wk_full,
        wv_full,
        np64(w_o).T,
        h,
        mask=ref_mask(spec, (b, h), lq, lk),
    )
    ref_out = ref.output + np64(b_o)
    tol = TOL[dtype]
    probe_q = torch.zeros(b, h, lq, dk, dtype=dtype)
    probe_k = torch.zeros(b, h, lk, dk, dtype=dtype)
    probe_v = torch.zeros(b, h, lk, dv, dtype=dtype)
    ran = []
    for rw in (False, True):
        for name in serving("dot", probe_q, probe_k, probe_v, mask, rw=rw):
            out, weights = F.multi_head_attention(
                xq, xkv, xkv, h, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, mask,
                num_kv_heads=g, return_weights=rw, backend=name,
            )  # fmt: skip
            where = f"backend={name} return_weights={rw}"
            assert rel_err(out, ref_out) <= tol, where
            if rw:
                assert rel_err(weights, ref.weights) <= tol, where
                _, avg = F.multi_head_attention(
                    xq, xkv, xkv, h, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, mask,
                    num_kv_heads=g, return_weights=True, average_weights=True, backend=name,
                )  # fmt: skip
                assert rel_err(avg, ref.weights.mean(axis=-3)) <= tol, where
            else:
                assert weights is None
            ran.append(name)
    assert "math" in ran and "dense" in ran, ran
