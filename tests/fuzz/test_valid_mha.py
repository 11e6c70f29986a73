"""multi_head_attention calls drawn at random (grouped-query heads, optional biases, any mask
kind of the catalogue for a (B, H) batch, layouts, dtypes), on every backend that can serve the
per-head call, against the float64 reference (``attnkit.reference.multi_head``): output, per-head
or averaged weights, and the gradients of the inputs, all weights and biases and float masks.

The reference takes X @ W weights without biases, so it runs on inputs with a column of ones
appended and the biases as an extra weight row; grouped key/value heads become their blocks
repeated for every query head of the group (as in tests/test_functional.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import reference as R
from tests.fuzz.harness import Problem, make_input, run
from tests.fuzz.profiles import budget
from tests.fuzz.strategies import DTYPES, exponents, lengths, mask_kinds
from tests.support import grads as G
from tests.support.backends import serving
from tests.support.layouts import LAYOUTS
from tests.support.masks import make_case
from tests.support.numerics import mm, plain_attention


@st.composite
def mha_calls(draw):
    dt = draw(st.sampled_from(DTYPES))
    b, h = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    g = draw(st.sampled_from([n for n in range(1, h + 1) if h % n == 0]))
    return dict(
        dtype=dt, b=b, h=h, g=g, lq=draw(lengths(160)), lk=draw(lengths(160)),
        e=draw(st.integers(1, 24)), e_kv=draw(st.integers(1, 24)), e_out=draw(st.integers(1, 24)),
        dk=draw(st.integers(1, 12)), dv=draw(st.integers(1, 12)), biases=draw(st.booleans()),
        layouts=(draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(LAYOUTS))),
        exps=(draw(exponents(dt)), draw(exponents(dt))), mask=draw(mask_kinds((1, 1))),
        weights=draw(st.booleans()), average=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )  # fmt: skip


def _aug(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, np.ones(x.shape[:-1] + (1,))], axis=-1)


def _stack(w: np.ndarray, b: np.ndarray | None, g: int, rep: int, d: int) -> np.ndarray:
    """torch (G*d, E) weight + bias -> X @ W layout (E+1, G*rep*d), each head repeated."""
    m = np.concatenate([w.T, (np.zeros(w.shape[0]) if b is None else b)[None]], axis=0)
    m = m.reshape(m.shape[0], g, 1, d)
    return np.broadcast_to(m, (m.shape[0], g, rep, d)).reshape(m.shape[0], g * rep * d)


@budget("mha")
@given(c=mha_calls())
def test_multi_head_attention(c):
    gen = torch.Generator().manual_seed(c["seed"])
    dt, b, h, g, lq, lk = c["dtype"], c["b"], c["h"], c["g"], c["lq"], c["lk"]
    dk, dv, rep = c["dk"], c["dv"], c["h"] // c["g"]
    shapes = {
        "query": (b, lq, c["e"]), "key_value": (b, lk, c["e_kv"]),
        "w_q": (h * dk, c["e"]), "w_k": (g * dk, c["e_kv"]), "w_v": (g * dv, c["e_kv"]),
        "w_o": (c["e_out"], h * dv),
    }  # fmt: skip
    if c["biases"]:
        shapes.update(b_q=(h * dk,), b_k=(g * dk,), b_v=(g * dv,), b_o=(c["e_out"],))
    lays = dict(query=c["layouts"][0], key_value=c["layouts"][1])
    exps = dict(query=c["exps"][0], key_value=c["exps"][1])
    inputs = {
        n: make_input(s, lays.get(n, "contiguous"), dt, gen, exps.get(n, 0))
        for n, s in shapes.items()
    }
    spec = make_case(c["mask"], (b, h), lq, lk, gen)
    rw, avg = c["weights"], c["weights"] and c["average"]

    def call(x, mask, rw, backend):
        xkv = x["key_value"]
        ws = [x[n] for n in ("w_q", "w_k", "w_v", "w_o")]
        bs = [x.get(n) for n in ("b_q", "b_k", "b_v", "b_o")]
        out, w = F.multi_head_attention(
            x["query"], xkv, xkv, h, *ws, *bs, mask, num_kv_heads=g, return_weights=rw,
            average_weights=avg, backend=backend,
        )  # fmt: skip
        return (out, w) if rw else out

    def reference(x, mask, d_out, d_w):
        w = {
            "q": _stack(x["w_q"], x.get("b_q"), h, 1, dk),
            "k": _stack(x["w_k"], x.get("b_k"), g, rep, dk),
            "v": _stack(x["w_v"], x.get("b_v"), g, rep, dv),
            "o": x["w_o"].T,
        }
        xq, xkv = _aug(x["query"]), _aug(x["key_value"])
        t = R.multi_head(xq, xkv, w["q"], w["k"], w["v"], w["o"], h, mask=mask)
        out = t.output + (x["b_o"] if "b_o" in x else 0.0)
        weights = t.weights.mean(axis=1) if avg else t.weights
        if d_out is None:
            return out, weights, None
        if avg and d_w is not None:
            d_w = np.broadcast_to(d_w[:, None] / h, t.weights.shape)
        return out, weights, G.multi_head(t, xq, xkv, w, g, d_out, d_w)

    def plain(x, allowed, bias, r):
        def proj(n, inp, heads):
            y = r.stored(inp @ x[f"w_{n}"].transpose(0, 1))  # projections: inputs' dtype
            y = r.stored(y + x[f"b_{n}"]) if f"b_{n}" in x else y
            y = y.reshape(b, y.shape[1], heads, -1).transpose(1, 2)
            return y.repeat_interleave(h // heads, dim=1)

        q, k, v = (
            proj("q", x["query"], h),
            proj("k", x["key_value"], g),
            proj("v", x["key_value"], g),
        )
        s = r(mm(q, k.transpose(-1, -2))) / math.sqrt(dk)  # projections in the inputs' dtype
        o, w = plain_attention(s, v, allowed, bias, r)
        o = r(o.transpose(1, 2).reshape(b, lq, h * dv) @ x["w_o"].transpose(0, 1))
        return (r(o + x["b_o"]) if "b_o" in x else o), (w.mean(1) if avg else w)

    where = f"{c['mask']} {dt} b={b} h={h} g={g} Lq={lq} Lk={lk} dk={dk} dv={dv}"
    p = Problem(
        kind="mha", dtype=dt, inputs=inputs, spec=spec, ref_batch=(b, h), lq=lq, lk=lk,
        call=call, reference=reference, plain=plain, rw=rw, p1=False,
        where=f"multi_head_attention: {where} avg={avg} layouts={c['layouts']} exps={c['exps']}",
    )  # fmt: skip
    probe = [
        torch.zeros((b, h, n, d), dtype=dt, requires_grad=True)
        for n, d in ((lq, dk), (lk, dk), (lk, dv))
    ]
    run(p, serving("dot", *probe, spec.mask, rw=rw), gen)
