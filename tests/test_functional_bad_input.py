"""Bad input to the public functions of attnkit.functional: the exception type, and a message
that starts with the offending argument's name (before any work is done)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M


def rand(gen: torch.Generator, *shape: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------------------------------------
# bad input: exception type, and the message starts with the offending argument's name
# ---------------------------------------------------------------------------------------------
_g = torch.Generator().manual_seed(17)
q_, k_, v_ = rand(_g, 2, 3, 4), rand(_g, 2, 5, 4), rand(_g, 2, 5, 6)
wq_, wk_, wv_ = rand(_g, 7, 4), rand(_g, 7, 4), rand(_g, 7)
sdpa, dpa = F.scaled_dot_product_attention, F.dot_product_attention
X_ = rand(_g, 2, 5, 8)
W8_ = rand(_g, 8, 8)


def _mha(**kw):
    args = dict(query=X_, key=X_, value=X_, num_heads=2, w_q=W8_, w_k=W8_, w_v=W8_, w_o=W8_)
    args.update(kw)
    return lambda: F.multi_head_attention(**args)


BAD = [
    ("q rank 1", lambda: sdpa(q_[0, 0], k_, v_), ValueError, "q"),
    ("q numpy", lambda: sdpa(q_.numpy(), k_, v_), TypeError, "q"),
    ("q int", lambda: sdpa(q_.long(), k_, v_), TypeError, "q"),
    ("q empty", lambda: sdpa(q_[:, :0], k_, v_), ValueError, "q"),
    ("k rank", lambda: sdpa(q_, k_[0], v_), ValueError, "k"),
    ("k d_k", lambda: sdpa(q_, k_[..., :3], v_), ValueError, "k"),
    ("k batch", lambda: sdpa(q_, k_[:1], v_), ValueError, "k"),
    ("k float32", lambda: sdpa(q_, k_.float(), v_), TypeError, "k"),
    ("k bool", lambda: sdpa(q_, k_ > 0, v_), TypeError, "k"),
    ("v Lk", lambda: sdpa(q_, k_, v_[:, :4]), ValueError, "v"),
    ("v batch", lambda: sdpa(q_, k_, v_[:1]), ValueError, "v"),
    ("v float16", lambda: sdpa(q_, k_, v_.half()), TypeError, "v"),
    (
        "mask shape",
        lambda: sdpa(q_, k_, v_, torch.ones(5, 3, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "mask batch",
        lambda: sdpa(q_, k_, v_, torch.ones(3, 3, 5, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "mask too many dims",
        lambda: sdpa(q_, k_, v_, torch.ones(1, 2, 3, 5, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    ("mask rank 1", lambda: sdpa(q_, k_, v_, torch.ones(5, dtype=torch.bool)), ValueError, "mask"),
    ("mask int", lambda: sdpa(q_, k_, v_, torch.ones(3, 5, dtype=torch.long)), TypeError, "mask"),
    ("mask list", lambda: sdpa(q_, k_, v_, [[True] * 5] * 3), TypeError, "mask"),
    ("mask numpy", lambda: sdpa(q_, k_, v_, np.ones((3, 5), bool)), TypeError, "mask"),
    ("mask object batch", lambda: sdpa(q_, k_, v_, M.key_padding([1, 2, 3])), ValueError, "mask"),
    (
        "mask tensor object",
        lambda: sdpa(q_, k_, v_, M.from_tensor(torch.ones(3, 4, dtype=torch.bool))),
        ValueError,
        "mask",
    ),
    ("dropout 1", lambda: sdpa(q_, k_, v_, dropout_p=1.0), ValueError, "dropout_p"),
    ("dropout < 0", lambda: sdpa(q_, k_, v_, dropout_p=-0.1), ValueError, "dropout_p"),
    ("dropout nan", lambda: sdpa(q_, k_, v_, dropout_p=math.nan), ValueError, "dropout_p"),
    ("dropout str", lambda: sdpa(q_, k_, v_, dropout_p="0.1"), TypeError, "dropout_p"),
    ("dropout bool", lambda: dpa(q_, k_, v_, dropout_p=True), TypeError, "dropout_p"),
    ("scale -inf", lambda: sdpa(q_, k_, v_, scale=-math.inf), ValueError, "scale"),
    ("scale inf", lambda: sdpa(q_, k_, v_, scale=math.inf), ValueError, "scale"),
    ("scale nan", lambda: sdpa(q_, k_, v_, scale=math.nan), ValueError, "scale"),
    ("scale str", lambda: sdpa(q_, k_, v_, scale="0.5"), TypeError, "scale"),
    ("scale tensor", lambda: sdpa(q_, k_, v_, scale=torch.tensor([0.5, 1.0])), TypeError, "scale"),
    ("scale bool", lambda: sdpa(q_, k_, v_, scale=True), TypeError, "scale"),
    ("backend unknown", lambda: sdpa(q_, k_, v_, backend="flash9"), ValueError, "backend"),
    ("backend type", lambda: sdpa(q_, k_, v_, backend=None), TypeError, "backend"),
    ("return_weights int", lambda: sdpa(q_, k_, v_, return_weights=1), TypeError, "return_weights"),
    (
        "return_weights str",
        lambda: dpa(q_, k_, v_, return_weights="yes"),
        TypeError,
        "return_weights",
    ),
    (
        "additive w_v 2-D",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wq_),
        ValueError,
        "w_v",
    ),
    (
        "additive w_q shape",
        lambda: F.additive_attention(q_, k_, v_, wq_[:, :3], wk_, wv_),
        ValueError,
        "w_q",
    ),
    (
        "additive w_k shape",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_[:6], wv_),
        ValueError,
        "w_k",
    ),
    (
        "additive w_q int",
        lambda: F.additive_attention(q_, k_, v_, wq_.long(), wk_, wv_),
        TypeError,
        "w_q",
    ),
    (
        "additive w_v float32",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wv_.float()),
        TypeError,
        "w_v",
    ),
    (
        "additive Lk",
        lambda: F.additive_attention(q_, k_, v_[:, :2], wq_, wk_, wv_),
        ValueError,
        "v",
    ),
    (
        "additive return_weights",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wv_, return_weights=None),
        TypeError,
        "return_weights",
    ),
    (
        "additive backend",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wv_, backend="nope"),
        ValueError,
        "backend",
    ),
    ("general w shape", lambda: F.general_attention(q_, k_, v_, W8_), ValueError, "w"),
    ("general w 1-D", lambda: F.general_attention(q_, k_, v_, wv_), ValueError, "w"),
    (
        "general w float32",
        lambda: F.general_attention(q_, k_, v_, W8_[:4, :4].float()),
        TypeError,
        "w",
    ),
    ("general w numpy", lambda: F.general_attention(q_, k_, v_, np.eye(4)), TypeError, "w"),
    ("mha query rank", _mha(query=X_[0]), ValueError, "query"),
    ("mha key batch", _mha(key=X_[:1], value=X_[:1]), ValueError, "key"),
    ("mha value float32", _mha(value=X_.float()), TypeError, "value"),
    ("mha num_heads 0", _mha(num_heads=0), ValueError, "num_heads"),
    ("mha num_heads split", _mha(num_heads=3), ValueError, "w_q"),
    ("mha num_kv_heads", _mha(num_heads=4, num_kv_heads=3), ValueError, "num_kv_heads"),
    ("mha w_q in dim", _mha(w_q=W8_[:, :6]), ValueError, "w_q"),
    ("mha w_o in dim", _mha(w_o=W8_[:, :6]), ValueError, "w_o"),
    ("mha b_q shape", _mha(b_q=torch.zeros(7, dtype=torch.float64)), ValueError, "b_q"),
    ("mha b_o dtype", _mha(b_o=torch.zeros(8, dtype=torch.float32)), TypeError, "b_o"),
    ("mha average_weights", _mha(average_weights=1), TypeError, "average_weights"),
    ("mha mask shape", _mha(mask=torch.ones(2, 3, 5, 5, dtype=torch.bool)), ValueError, "mask"),
    ("mha scale", _mha(scale=math.nan), ValueError, "scale"),
    ("explain kind", lambda: F.explain_dispatch(q_, k_, v_, kind="cosine"), ValueError, "kind"),
    # weights of additive attention with kind="dot" were silently ignored
    ("explain w_q for dot", lambda: F.explain_dispatch(q_, k_, v_, w_q=W8_), ValueError, "w_q"),
    ("check_mask batch", lambda: F.check_mask(M.causal(), 2, 5, 5), TypeError, "batch"),
    (
        "explain backend",
        lambda: F.explain_dispatch(q_, k_, v_, backend="nope"),
        ValueError,
        "backend",
    ),
]


@pytest.mark.parametrize("call,exc,name", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(call, exc, name):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert re.match(rf"{re.escape(name)}\b", msg), f"message should start with {name!r}: {msg}"
