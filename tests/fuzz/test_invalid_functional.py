"""Invalid calls to attnkit.functional drawn at random: a valid call (random shapes) with one
argument made wrong (type, dtype, shape, device, value, mask of the wrong length or batch),
which must raise the ValueError/TypeError naming that argument (tests/fuzz/errors.py)."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from tests.fuzz.errors import expect_error
from tests.fuzz.profiles import budget

V, T = ValueError, TypeError
FNS = ("sdpa", "dot", "general", "additive", "mha")


def _grown(fn: str, name: str, dim: int, n: int) -> tuple[str, ...] | None:
    """Names a message may start with when dim ``dim`` (of ``n``) of ``name`` grows (the
    argument it now disagrees with is as much to blame), or None when the call stays valid."""
    last, length = dim == n - 1, dim == n - 2
    if fn == "mha":
        if name.startswith("b_"):
            return (name, "w_" + name[2:])
        if name.startswith("w_"):
            return (name,) if dim == 1 else None  # the in-width must match the input's
        if name == "query":
            return None
        return (name, "key", "value") if length or not last else (name, "w_" + name[0])
    partner = {"general": "w", "additive": "w_k"}.get(fn, "q")
    table = {
        "k": ("k", "v") if length else ("k", partner) if last else ("k",),
        "v": None if last else ("k", "v") if length else ("v",),
        "w": ("w", "q") if dim == 0 else ("w", "k"),
        "w_q": ("w_q", "w_k", "w_v") if dim == 0 else ("w_q", "q"),
        "w_k": ("w_k", "w_q", "w_v") if dim == 0 else ("w_k", "k"),
        "w_v": ("w_v", "w_q", "w_k"),
    }
    return table[name]


def _bad_tensor(draw, fn: str, name: str, t: torch.Tensor, first: bool):
    """(value, exception, names) for a tensor argument; ``first`` is the argument the others are
    compared with (its dtype/device/rank define the call, so only self-contained faults)."""
    n = t.dim()
    other = torch.float32 if t.dtype == torch.float64 else torch.float64
    options = [
        (t.numpy(), T), (t.tolist(), T), (3, T), ("x", T), (t.long(), T), (t > 0, T),
        (t.to(torch.complex128), T), (t[(slice(None),) * (n - 1) + (slice(0, 0),)], V),
    ]  # fmt: skip
    if not name.startswith("b_"):
        options.append((None, T))
    if first:
        options.append((t.reshape(-1)[0], V))  # a 0-d tensor
    else:
        options += [(t.to(other), T), (t.to("meta"), V), (t[None], V)]
    bad, exc = draw(st.sampled_from(options))
    names = (name,)
    if not first and draw(st.booleans()):  # one dim too long instead
        dim = draw(st.integers(0, n - 1))
        names = _grown(fn, name, dim, n)
        if names is not None:
            grow = list(t.shape)
            grow[dim] += draw(st.integers(1, 3))
            return torch.zeros(grow, dtype=t.dtype), V, names
        names = (name,)
    return bad, exc, names


SCALARS = {
    "scale": [(math.nan, V), (math.inf, V), (-math.inf, V), ("0.5", T), (True, T),
              (torch.tensor([0.5, 1.0]), T), (1j, T)],
    "dropout_p": [(1.0, V), (-0.1, V), (math.nan, V), (1.5, V), ("0.1", T), (True, T), (2, V)],
    # NumPy bools are flags (attnkit.checks.flag); NumPy ints are not
    "return_weights": [(1, T), ("yes", T), (None, T), (0.0, T), (np.int64(1), T)],
    "backend": [("flash9", V), ("", V), (None, T), (1, T), ("AUTO", V)],
}  # fmt: skip
MHA_SCALARS = {
    "num_heads": [(0, V), (-2, V), (True, T), (2.5, T), ("2", T), (None, T)],
    "num_kv_heads": [(0, V), (3, V), (-1, V), (True, T), (1.0, T), ("1", T)],
    "average_weights": [(1, T), ("no", T), (None, T)],
}  # fmt: skip


def _bad_mask(draw, batch, lq, lk):
    """(mask, exception) that does not fit inputs with batch dims ``batch`` and Lq x Lk."""
    b0 = batch[0] if batch else 1
    wrong_b = b0 + draw(st.integers(1, 3))
    b = torch.bool
    options = [
        (torch.ones(lq, lk + 1, dtype=b), V), (torch.ones(lq + 1, lk, dtype=b), V),
        (torch.ones(lk, dtype=b), V), (torch.ones((1,) * (len(batch) + 1) + (lq, lk)) > 0, V),
        (torch.ones(lq, lk, dtype=torch.long), T), ([[True] * lk] * lq, T),
        (np.ones((lq, lk), bool), T), ("causal", T), (1, T),
        (torch.ones(lq, lk, dtype=b, device="meta"), V),
        (M.key_padding([1] * wrong_b), V), (M.from_tensor(torch.ones(lq, lk + 2) > 0), V),
        (M.document(torch.zeros(lq + 1, dtype=torch.long)), V),
        (M.document(torch.zeros(lq, dtype=torch.long), torch.zeros(lk + 1, dtype=torch.long)), V),
        (M.prefix_lm([1] * wrong_b), V),
        (M.from_predicate(lambda b, h, q, k: q >= k, batch_size=wrong_b), V),
        (M.from_key_padding_mask(torch.zeros(b0, lk + 1, dtype=b)), V),
        (M.from_key_padding_mask(torch.zeros(wrong_b, lk, dtype=b)), V),
        (M.causal() & M.from_tensor(torch.zeros(wrong_b, lq, lk)), V),
    ]  # fmt: skip
    return draw(st.sampled_from(options))


@st.composite
def bad_calls(draw):
    """(label, thunk, exception, names)."""
    fn = draw(st.sampled_from(FNS))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dt = draw(st.sampled_from([torch.float64, torch.float32]))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2))) if fn != "mha" else (2,)
    lq, lk, d, dv, h = (draw(st.integers(1, 9)) for _ in range(5))

    def rnd(*s):
        return torch.randn(s, generator=gen, dtype=torch.float64).to(dt)

    if fn == "mha":
        nh = draw(st.sampled_from([1, 2, 4]))
        e = nh * d
        args = dict(query=rnd(*batch, lq, e), key=rnd(*batch, lk, e), value=rnd(*batch, lk, e),
                    num_heads=nh, w_q=rnd(e, e), w_k=rnd(e, e), w_v=rnd(e, e), w_o=rnd(e, e),
                    b_q=rnd(e), b_k=rnd(e), b_v=rnd(e), b_o=rnd(e))  # fmt: skip
        tensors, scalars = list(args)[:3] + list(args)[4:], {**SCALARS, **MHA_SCALARS}
        scalars["num_heads"] = scalars["num_heads"] + [(e + 1, V)]  # does not divide the width
        first = "query"
    else:
        dq = d if fn in ("sdpa", "dot") else draw(st.integers(1, 9))
        args = dict(q=rnd(*batch, lq, dq), k=rnd(*batch, lk, d), v=rnd(*batch, lk, dv))
        if fn == "general":
            args["w"] = rnd(dq, d)
        if fn == "additive":
            args.update(w_q=rnd(h, dq), w_k=rnd(h, d), w_v=rnd(h))
        tensors, first = list(args), "q"
        keep = {"sdpa": SCALARS, "dot": ("dropout_p", "return_weights", "backend")}
        scalars = {
            k: v for k, v in SCALARS.items() if k in keep.get(fn, ("return_weights", "backend"))
        }
    what = draw(st.sampled_from(["tensor", "scalar", "mask"]))
    if what == "tensor":
        name = draw(st.sampled_from(tensors))
        bad, exc, names = _bad_tensor(draw, fn, name, args[name], first=name == first)
    elif what == "scalar":
        name = draw(st.sampled_from(sorted(scalars)))
        bad, exc = draw(st.sampled_from(scalars[name]))
        names = ("num_heads", "w_q") if name == "num_heads" and bad == e + 1 else (name,)
    else:
        name = "mask"
        bad, exc = _bad_mask(draw, batch + ((nh,) if fn == "mha" else ()), lq, lk)
        names = (name,)
    call = {"sdpa": F.scaled_dot_product_attention, "dot": F.dot_product_attention,
            "general": F.general_attention, "additive": F.additive_attention,
            "mha": F.multi_head_attention}[fn]  # fmt: skip
    kw = {**args, name: bad}
    label = f"{fn}({name}={_show(bad)}) dtype={dt} batch={batch} Lq={lq} Lk={lk}"
    return label, lambda: call(**kw), exc, names


def _show(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor{tuple(x.shape)} {x.dtype} {x.device}"
    return repr(x) if len(repr(x)) < 60 else type(x).__name__


@budget("invalid_functional")
@given(case=bad_calls())
def test_invalid_call_names_the_argument(case):
    label, thunk, exc, names = case
    expect_error(thunk, exc, names, label)
