"""Valid dot-product calls drawn at random, on every backend that can serve them, against the
float64 reference: scaled_dot_product_attention, dot_product_attention, general_attention.

Each example draws batch dims (0-2), Lq != Lk (1..300, odd sizes), d_k != d_v (1..80), a memory
layout per input, a dtype, magnitudes (q, k, v scaled by 1e-30..1e30; float16 1e-2..1e2), a mask
kind from the catalogue and whether to return the weights; outputs, weights and the gradients of
every input (and of float mask tensors that require grad) are checked (tests/fuzz/harness.py).
"""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import reference as R
from tests.fuzz.harness import Problem, make_input, run
from tests.fuzz.profiles import budget
from tests.fuzz.strategies import dot_calls
from tests.support import grads as G
from tests.support.backends import serving
from tests.support.masks import make_case
from tests.support.numerics import mm, plain_attention


def _inputs(c, gen, dq=None):
    b, dt = c["batch"], c["dtype"]
    shapes = ((*b, c["lq"], dq or c["dk"]), (*b, c["lk"], c["dk"]), (*b, c["lk"], c["dv"]))
    return {
        n: make_input(s, lay, dt, gen, e)
        for n, s, lay, e in zip("qkv", shapes, c["layouts"], c["exps"])
    }


def _problem(c, gen, **kw) -> Problem:
    spec = make_case(c["mask"], c["batch"], c["lq"], c["lk"], gen)
    where = f"{c['mask']} {c['dtype']} batch={c['batch']} Lq={c['lq']} Lk={c['lk']}"
    return Problem(
        dtype=c["dtype"],
        spec=spec,
        ref_batch=c["batch"],
        lq=c["lq"],
        lk=c["lk"],
        rw=c["weights"],
        where=f"{kw['kind']}: {where} layouts={c['layouts']} exps={c['exps']}",
        **kw,
    )


def _dot_reference(fn, scale):
    def reference(x, mask, d_out, d_w):
        t = fn(x["q"], x["k"], x["v"], mask, **({"scale": scale} if scale else {}))
        g = None if d_out is None else G.dot(t, d_out, d_w)
        return t.output, t.weights, g

    return reference


def _dot_plain(s):
    def plain(x, allowed, bias, r):
        s_ = r(mm(x["q"], x["k"].transpose(-1, -2))) * s
        return plain_attention(s_, x["v"], allowed, bias, r)

    return plain


@budget("sdpa")
@given(c=dot_calls(), scale=st.one_of(st.none(), st.floats(1e-3, 1e3)))
def test_scaled_dot_product_attention(c, scale):
    gen = torch.Generator().manual_seed(c["seed"])
    inputs = _inputs(c, gen)

    def call(x, mask, rw, backend):
        return F.scaled_dot_product_attention(
            x["q"], x["k"], x["v"], mask, scale=scale, return_weights=rw, backend=backend
        )

    s = scale if scale is not None else 1 / math.sqrt(c["dk"])
    p = _problem(
        c,
        gen,
        kind=f"sdpa scale={scale}",
        inputs=inputs,
        call=call,
        reference=_dot_reference(R.scaled_dot_product, scale),
        plain=_dot_plain(s),
    )
    x = p.xs()
    names = serving("dot", x["q"], x["k"], x["v"], p.spec.mask, rw=c["weights"], scale=scale)
    run(p, names, gen)


@budget("dot")
@given(c=dot_calls())
def test_dot_product_attention(c):
    gen = torch.Generator().manual_seed(c["seed"])

    def call(x, mask, rw, backend):
        return F.dot_product_attention(
            x["q"], x["k"], x["v"], mask, return_weights=rw, backend=backend
        )

    p = _problem(
        c,
        gen,
        kind="dot_product_attention",
        inputs=_inputs(c, gen),
        call=call,
        reference=_dot_reference(R.dot_product, None),
        plain=_dot_plain(1.0),
    )
    x = p.xs()
    names = serving("dot", x["q"], x["k"], x["v"], p.spec.mask, rw=c["weights"], scale=1.0)
    run(p, names, gen)


@budget("general")
@given(c=dot_calls(), dq=st.integers(1, 40))
def test_general_attention(c, dq):
    gen = torch.Generator().manual_seed(c["seed"])
    inputs = _inputs(c, gen, dq=dq)
    inputs["w"] = make_input((dq, c["dk"]), c["layouts"][0], c["dtype"], gen)

    def call(x, mask, rw, backend):
        return F.general_attention(
            x["q"], x["k"], x["v"], x["w"], mask, return_weights=rw, backend=backend
        )

    def reference(x, mask, d_out, d_w):
        t = R.general(x["q"], x["k"], x["v"], x["w"], mask)
        return t.output, t.weights, None if d_out is None else G.general(t, x["w"], d_out, d_w)

    def plain(x, allowed, bias, r):
        s = r(mm(r.stored(x["q"] @ x["w"]), x["k"].transpose(-1, -2)))  # q @ w: inputs' dtype
        return plain_attention(s, x["v"], allowed, bias, r)

    p = _problem(
        c, gen, kind="general_attention", inputs=inputs, call=call, reference=reference,
        plain=plain,
    )  # fmt: skip
    x = p.xs()
    names = serving("dot", x["q"] @ x["w"], x["k"], x["v"], p.spec.mask, rw=c["weights"], scale=1.0)
    run(p, names, gen)
