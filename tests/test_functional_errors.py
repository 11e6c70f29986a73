"""Bad input to every public function of attnkit.functional: the exception type, a message that
starts with the argument name the caller used, and no work done before the error (no backend
ran, no projection or attention was computed: see tests/support/no_work.py).

Both a fresh signature and a remembered one (the same call made once with valid arguments
first) are tried, so the per-signature memory of dispatch never lets a bad argument through.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels import dispatch
from tests.support.no_work import no_work

g = torch.Generator().manual_seed(8)


def rand(*shape, dtype=torch.float64):
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


q, k, v = rand(2, 3, 4), rand(2, 5, 4), rand(2, 5, 6)
wq, wk, wv = rand(7, 4), rand(7, 4), rand(7)
X = rand(2, 5, 8)
W8 = rand(8, 8)
sdpa, dpa = F.scaled_dot_product_attention, F.dot_product_attention


def mha(**kw):
    args = dict(query=X, key=X, value=X, num_heads=2, w_q=W8, w_k=W8, w_v=W8, w_o=W8)
    args.update(kw)
    return lambda: F.multi_head_attention(**args)


def gqa(**kw):
    """num_heads 4, num_kv_heads 2, d_k = d_v = 2: w_k and w_v have 4 rows."""
    args = dict(num_heads=4, num_kv_heads=2, w_k=W8[:4], w_v=W8[:4])
    args.update(kw)
    return mha(**args)


Q4, K4, V4 = rand(2, 4, 3, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 6)


def gq(**kw):
    args = dict(q=Q4, k=K4, v=V4) | kw
    return F.grouped_query_attention(**args)


BIG = rand(1, 8193, 2)  # weights of 2 heads x 8193 x 8193 exceed dispatch.WEIGHTS_LIMIT
BIG_W = dict(w_q=W8[:, :2], w_k=W8[:, :2], w_v=W8[:, :2])

BAD = [
    # scaled / unscaled dot product
    ("q list", lambda: sdpa([[1.0]], k, v), TypeError, "q"),
    ("q int", lambda: sdpa(q.long(), k, v), TypeError, "q"),
    ("k float32", lambda: sdpa(q, k.float(), v), TypeError, "k"),
    ("k width", lambda: sdpa(q, k[..., :3], v), ValueError, "k"),
    ("v rows", lambda: sdpa(q, k, v[:, :4]), ValueError, "v"),
    ("mask str", lambda: sdpa(q, k, v, "causal"), TypeError, "mask"),
    ("mask int tensor", lambda: sdpa(q, k, v, torch.ones(3, 5).long()), TypeError, "mask"),
    ("mask shape", lambda: sdpa(q, k, v, torch.ones(5, 3, dtype=torch.bool)), ValueError, "mask"),
    ("mask object batch", lambda: sdpa(q, k, v, M.key_padding([1, 2, 3])), ValueError, "mask"),
    (
        "mask object lengths",
        lambda: sdpa(q, k, v, M.from_tensor(torch.ones(3, 4, dtype=torch.bool))),
        ValueError,
        "mask",
    ),
    ("scale bool", lambda: sdpa(q, k, v, scale=True), TypeError, "scale"),
    ("scale nan", lambda: sdpa(q, k, v, scale=math.nan), ValueError, "scale"),
    ("dropout 1", lambda: dpa(q, k, v, dropout_p=1.0), ValueError, "dropout_p"),
    ("dropout bool", lambda: sdpa(q, k, v, dropout_p=False), TypeError, "dropout_p"),
    ("return_weights int", lambda: sdpa(q, k, v, return_weights=1), TypeError, "return_weights"),
    ("backend None", lambda: dpa(q, k, v, backend=None), TypeError, "backend"),
    ("backend unknown", lambda: sdpa(q, k, v, backend="flash"), ValueError, "backend"),
    (
        "backend cannot serve",
        lambda: sdpa(q, k, v, return_weights=True, backend="dense"),
        ValueError,
        "backend",
    ),
    (
        "weights too large",
        lambda: sdpa(BIG[0], BIG[0], BIG[0], return_weights=True),
        ValueError,
        "return_weights",
    ),
    # general
    ("general w shape", lambda: F.general_attention(q, k, v, W8), ValueError, "w"),
    ("general w numpy", lambda: F.general_attention(q, k, v, np.eye(4)), TypeError, "w"),
    (
        "general mask",
        lambda: F.general_attention(q, k, v, W8[:4, :4], torch.ones(4, 4, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "general backend",
        lambda: F.general_attention(q, k, v, W8[:4, :4], backend=1),
        TypeError,
        "backend",
    ),
    # additive
    ("additive w_v 2-D", lambda: F.additive_attention(q, k, v, wq, wk, wq), ValueError, "w_v"),
    ("additive w_q", lambda: F.additive_attention(q, k, v, wq[:, :3], wk, wv), ValueError, "w_q"),
    ("additive w_k", lambda: F.additive_attention(q, k, v, wq, wk[:6], wv), ValueError, "w_k"),
    (
        "additive w_k dtype",
        lambda: F.additive_attention(q, k, v, wq, wk.float(), wv),
        TypeError,
        "w_k",
    ),
    (
        "additive mask",
        lambda: F.additive_attention(q, k, v, wq, wk, wv, torch.ones(2, 2, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "additive backend",
        lambda: F.additive_attention(q, k, v, wq, wk, wv, backend="dense"),
        ValueError,
        "backend",
    ),
    # explain_dispatch
    ("explain kind", lambda: F.explain_dispatch(q, k, v, kind="cosine"), ValueError, "kind"),
    ("explain kind type", lambda: F.explain_dispatch(q, k, v, kind=1), TypeError, "kind"),
    ("explain dropout", lambda: F.explain_dispatch(q, k, v, dropout_p=2), ValueError, "dropout_p"),
    # multi-head attention: inputs
    ("mha query rank", mha(query=X[0]), ValueError, "query"),
    ("mha query int", mha(query=X.long()), TypeError, "query"),
    ("mha key float32", mha(key=X.float()), TypeError, "key"),
    ("mha key batch", mha(key=X[:1], value=X[:1]), ValueError, "key"),
    ("mha value Lk", mha(value=X[:, :4]), ValueError, "value"),
    ("mha value empty", mha(value=X[:, :, :0]), ValueError, "value"),
    # heads
    ("mha num_heads bool", mha(num_heads=True), TypeError, "num_heads"),
    ("mha num_heads float", mha(num_heads=2.0), TypeError, "num_heads"),
    ("mha num_heads 0", mha(num_heads=0), ValueError, "num_heads"),
    ("mha num_kv_heads divisor", gqa(num_kv_heads=3), ValueError, "num_kv_heads"),
    ("mha num_kv_heads bool", gqa(num_kv_heads=True), TypeError, "num_kv_heads"),
    # weights: each disagreement blamed on the weight that disagrees
    ("mha w_q rows", mha(num_heads=3), ValueError, "w_q"),
    ("mha w_q in dim", mha(w_q=W8[:, :6]), ValueError, "w_q"),
    ("mha w_k head width", mha(w_k=W8[:6]), ValueError, "w_k"),
    ("mha w_k vs num_kv_heads", gqa(w_k=W8), ValueError, "w_k"),
    ("mha w_k in dim", mha(w_k=W8[:, :5]), ValueError, "w_k"),
    ("mha w_v rows", gqa(w_v=W8[:5]), ValueError, "w_v"),
    ("mha w_v dtype", mha(w_v=W8.float()), TypeError, "w_v"),
    ("mha w_o in dim", mha(w_o=W8[:, :6]), ValueError, "w_o"),
    ("mha w_o numpy", mha(w_o=W8.numpy()), TypeError, "w_o"),
    ("mha b_q shape", mha(b_q=rand(7)), ValueError, "b_q"),
    ("mha b_k shape", gqa(b_k=rand(8)), ValueError, "b_k"),
    ("mha b_v shape", gqa(b_v=rand(8)), ValueError, "b_v"),
    ("mha b_o dtype", mha(b_o=rand(8, dtype=torch.float32)), TypeError, "b_o"),
    ("mha b_o shape", mha(b_o=rand(7)), ValueError, "b_o"),
    # the rest of the call, all before any projection
    ("mha mask heads", mha(mask=torch.ones(2, 3, 5, 5, dtype=torch.bool)), ValueError, "mask"),
    ("mha mask object", mha(mask=M.key_padding([1, 2, 3])), ValueError, "mask"),
    ("mha scale", mha(scale=math.inf), ValueError, "scale"),
    ("mha dropout", mha(dropout_p=1.5), ValueError, "dropout_p"),
    ("mha return_weights", mha(return_weights="yes"), TypeError, "return_weights"),
    ("mha average_weights", mha(average_weights=1), TypeError, "average_weights"),
    ("mha backend", mha(backend="nope"), ValueError, "backend"),
    ("mha backend cannot serve", mha(return_weights=True, backend="dense"), ValueError, "backend"),
    (
        "mha weights too large",
        mha(query=BIG, key=BIG, value=BIG, **BIG_W, return_weights=True),
        ValueError,
        "return_weights",
    ),
    # grouped-query attention: q (B, H, Lq, d), k / v (B, G, Lk, d)
    ("gqa q rank", lambda: gq(q=Q4[0, 0]), ValueError, "q"),
    ("gqa k heads", lambda: gq(k=rand(2, 3, 5, 4)), ValueError, "k"),
    ("gqa k batch", lambda: gq(k=K4[:1], v=V4[:1]), ValueError, "k"),
    ("gqa k width", lambda: gq(k=K4[..., :3]), ValueError, "k"),
    ("gqa k dtype", lambda: gq(k=K4.float()), TypeError, "k"),
    ("gqa v heads", lambda: gq(v=V4[:, :1]), ValueError, "v"),
    ("gqa v rows", lambda: gq(v=V4[:, :, :4]), ValueError, "v"),
    ("gqa mask", lambda: gq(mask=torch.ones(2, 3, 3, 5, dtype=torch.bool)), ValueError, "mask"),
    ("gqa scale", lambda: gq(scale="x"), TypeError, "scale"),
    ("gqa dropout", lambda: gq(dropout_p=-1.0), ValueError, "dropout_p"),
    ("gqa return_weights", lambda: gq(return_weights=None), TypeError, "return_weights"),
    ("gqa backend", lambda: gq(backend="dense", return_weights=True), ValueError, "backend"),
    # head plumbing
    ("split_heads x", lambda: F.split_heads(X.numpy(), 2), TypeError, "x"),
    ("split_heads width", lambda: F.split_heads(X, 3), ValueError, "x"),
    ("split_heads num_heads", lambda: F.split_heads(X, 0), ValueError, "num_heads"),
    ("merge_heads rank", lambda: F.merge_heads(X), ValueError, "x"),
    ("repeat_kv_heads groups", lambda: F.repeat_kv_heads(rand(1, 3, 2, 2), 4), ValueError, "x"),
]


@pytest.mark.parametrize("call,exc,name", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument_and_does_no_work(call, exc, name):
    with no_work() as seen:
        with pytest.raises(exc) as info:
            call()
    msg = str(info.value)
    assert re.match(rf"{re.escape(name)}: ", msg), f"message should start with {name!r}: {msg}"
    assert not seen, f"work done before the error: {seen}"


def test_num_kv_heads_disagreement_says_both():
    with pytest.raises(ValueError) as info:
        gqa(w_k=W8)()
    msg = str(info.value)
    assert msg.startswith("w_k: ") and "num_kv_heads=2" in msg and "(8, 8)" in msg


def test_a_remembered_signature_still_rejects_bad_arguments():
    dispatch.clear_cache()
    sdpa(q, k, v, M.causal(), scale=0.5, dropout_p=0.0)  # remembered
    for kw, exc, name in (
        (dict(scale=True), TypeError, "scale"),
        (dict(scale=math.nan), ValueError, "scale"),
        (dict(dropout_p=1.0), ValueError, "dropout_p"),
        (dict(backend="nope"), ValueError, "backend"),
    ):
        with no_work() as seen, pytest.raises(exc, match=rf"^{name}: "):
            sdpa(q, k, v, M.causal(), **({"scale": 0.5, "dropout_p": 0.0} | kw))
        assert not seen
