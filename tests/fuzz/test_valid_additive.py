"""Valid additive (Bahdanau) attention calls drawn at random, on every backend that can serve
them, against the float64 reference: output, weights and the gradients of q, k, v, w_q, w_k, w_v
and float mask tensors (draws as in test_valid_dot.py; lengths up to 160 and hidden width up to
8 keep the reference's (..., Lq, Lk, h) tanh layer small)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import reference as R
from tests.fuzz.harness import Problem, make_input, run
from tests.fuzz.profiles import budget
from tests.fuzz.strategies import dot_calls, exponents
from tests.support import grads as G
from tests.support.backends import serving
from tests.support.masks import make_case
from tests.support.numerics import mm, plain_attention


@budget("additive")
@given(c=dot_calls(max_len=160), dq=st.integers(1, 40), h=st.integers(1, 8), ev=st.data())
def test_additive_attention(c, dq, h, ev):
    gen = torch.Generator().manual_seed(c["seed"])
    b, dt = c["batch"], c["dtype"]
    shapes = ((*b, c["lq"], dq), (*b, c["lk"], c["dk"]), (*b, c["lk"], c["dv"]))
    inputs = {
        n: make_input(s, lay, dt, gen, e)
        for n, s, lay, e in zip("qkv", shapes, c["layouts"], c["exps"])
    }
    e_v = ev.draw(exponents(dt), label="w_v exponent")  # |scores| up to |w_v|_1: 1e30 (P2, P3)
    for n, s, e in (("w_q", (h, dq), 0), ("w_k", (h, c["dk"]), 0), ("w_v", (h,), e_v)):
        inputs[n] = make_input(s, c["layouts"][1], dt, gen, e)
    spec = make_case(c["mask"], b, c["lq"], c["lk"], gen)
    names6 = ("q", "k", "v", "w_q", "w_k", "w_v")

    def call(x, mask, rw, backend):
        args = [x[n] for n in names6]
        return F.additive_attention(*args, mask, return_weights=rw, backend=backend)

    def reference(x, mask, d_out, d_w):
        t = R.additive(*(x[n] for n in names6), mask)
        g = None if d_out is None else G.additive(t, x["w_q"], x["w_k"], x["w_v"], d_out, d_w)
        return t.output, t.weights, g

    def plain(x, allowed, bias, r):
        qp = r(mm(x["q"], x["w_q"].transpose(0, 1)))
        kp = r(mm(x["k"], x["w_k"].transpose(0, 1)))
        s = r(r(torch.tanh(r(qp[..., :, None, :] + kp[..., None, :, :]))) @ x["w_v"].to(qp.dtype))
        return plain_attention(s, x["v"], allowed, bias, r)

    def scores(x):
        # the exact scores and the size of their terms: a float32 score is off by a few eps of
        # Σ_h |w_v,h| (|tanh(pre)| + sech²(pre) |pre's terms|), the rounding of each tanh and
        # of its argument pre = q W_qᵀ + k W_kᵀ (|d tanh| = sech² |d pre|), summed over h
        qp, kp = x["q"] @ x["w_q"].T, x["k"] @ x["w_k"].T
        pre = qp[..., :, None, :] + kp[..., None, :, :]
        terms = (np.abs(x["q"]) @ np.abs(x["w_q"]).T)[..., :, None, :]
        terms = terms + (np.abs(x["k"]) @ np.abs(x["w_k"]).T)[..., None, :, :]
        with np.errstate(over="ignore"):
            sech2 = 1.0 / np.cosh(pre) ** 2
        size = (np.abs(np.tanh(pre)) + sech2 * terms) @ np.abs(x["w_v"])
        return np.tanh(pre) @ x["w_v"], size

    where = f"{c['mask']} {dt} batch={b} Lq={c['lq']} Lk={c['lk']} h={h} w_v=1e{e_v}"
    p = Problem(
        kind="additive",
        dtype=dt,
        inputs=inputs,
        spec=spec,
        ref_batch=b,
        lq=c["lq"],
        lk=c["lk"],
        call=call,
        reference=reference,
        plain=plain,
        scores=scores,
        rw=c["weights"],
        where=f"additive_attention: {where} layouts={c['layouts']} exps={c['exps']}",
    )
    x = p.xs()
    w = {n: x[n] for n in ("w_q", "w_k", "w_v")}
    names = serving("additive", x["q"], x["k"], x["v"], spec.mask, rw=c["weights"], **w)
    run(p, names, gen)
