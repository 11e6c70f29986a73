"""P6, drawn at random: NaN in q, k or v, or +-inf in v, on every backend that can serve the
call. The oracle is the reference's steps in float64 NumPy, letting non-finite values through
(``attnkit.reference`` itself refuses them): a row it makes non-finite must be non-finite (never
silently dropped or zeroed), every other row must equal it within the dtype's tolerance. Rows
that do not attend to a non-finite v entry are unspecified (0 * NaN) and not checked."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import functional as F
from tests.fuzz.profiles import budget
from tests.fuzz.strategies import batch_dims, lengths, mask_kinds, widths
from tests.support.backends import serving
from tests.support.masks import make_case, ref_mask
from tests.support.numerics import TOL, rel_err, split_mask


def _oracle(q, k, v, m) -> np.ndarray:
    """softmax(q kᵀ / sqrt(d) + bias, masked) v in float64, NaN/inf passed through; rows
    without any allowed key give 0 (P1)."""
    allowed, bias = split_mask(m)
    with np.errstate(invalid="ignore", over="ignore"):
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]) + (0.0 if bias is None else bias)
        if allowed is not None:
            s = np.where(allowed, s, -np.inf)
        empty = np.all(s == -np.inf, axis=-1, keepdims=True)
        e = np.exp(s - np.where(empty, 0.0, s.max(-1, keepdims=True)))
        w = np.where(empty, 0.0, e / np.where(empty, 1.0, e.sum(-1, keepdims=True)))
        return w @ v


@st.composite
def poisoned_calls(draw):
    batch = draw(batch_dims)
    return dict(
        dtype=draw(st.sampled_from([torch.float64, torch.float32])),
        batch=batch,
        lq=draw(lengths(160)),
        lk=draw(lengths(160)),
        d=draw(widths(32)),
        mask=draw(mask_kinds(batch)),
        where=draw(st.sampled_from(["q", "k", "v", "v_inf"])),
        frac=draw(st.floats(0, 1)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@budget("nonfinite")
@given(c=poisoned_calls())
def test_non_finite_inputs_poison_exactly_the_rows_that_see_them(c):
    gen = torch.Generator().manual_seed(c["seed"])
    b, dt, lq, lk, d = c["batch"], c["dtype"], c["lq"], c["lk"], c["d"]
    x = {
        n: torch.randn((*b, m, d), generator=gen, dtype=torch.float64).to(dt)
        for n, m in (("q", lq), ("k", lk), ("v", lk))
    }
    where = c["where"][0]
    t = x[where]
    row = min(int(c["frac"] * t.shape[-2]), t.shape[-2] - 1)
    value = math.nan if c["where"] != "v_inf" else (math.inf if c["seed"] % 2 else -math.inf)
    t[..., row, 0] = value  # one entry of one row (in every batch element)
    spec = make_case(c["mask"], b, lq, lk, gen)
    m = ref_mask(spec, b, lq, lk)
    ref = _oracle(*(x[n].double().numpy() for n in "qkv"), m)
    bad = ~np.isfinite(ref).all(-1)  # (..., Lq) rows the reference makes non-finite
    check = np.ones(bad.shape, bool)
    if where == "v":  # rows that do not attend to the bad value row are unspecified
        allowed = split_mask(m)[0]
        sees = np.ones(bad.shape, bool) if allowed is None else allowed[..., row]
        check = np.broadcast_to(sees, bad.shape)
    label = f"{where}[{row}]={value} {c['mask']} {dt} batch={b} Lq={lq} Lk={lk} d={d}"
    names = serving("dot", x["q"], x["k"], x["v"], spec.mask, rw=False)
    assert "math" in names, label
    for name in names:
        out = F.scaled_dot_product_attention(x["q"], x["k"], x["v"], spec.mask, backend=name)
        o = out.detach().double().numpy()
        got_bad = ~np.isfinite(o).all(-1)
        lost = bad & check & ~got_bad
        assert not lost.any(), (
            f"{label} backend={name}: non-finite input dropped on {lost.sum()} rows"
        )
        spurious = ~bad & check & got_bad
        assert not spurious.any(), f"{label} backend={name}: {spurious.sum()} rows made non-finite"
        good = ~bad & check
        if good.any():
            err = rel_err(o[good], ref[good])
            assert err <= TOL[dt], f"{label} backend={name}: finite rows rel err {err:.3g}"
