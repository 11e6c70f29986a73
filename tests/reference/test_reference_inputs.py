"""Bad input to attnkit.reference (checked by attnkit.reference.inputs): the exception type, and
the offending argument named first in the message.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from attnkit import reference as R

_g = np.random.default_rng(14)


q3, k5, v5 = _g.normal(size=(3, 4)), _g.normal(size=(5, 4)), _g.normal(size=(5, 2))


X, W44, W42 = _g.normal(size=(5, 4)), _g.normal(size=(4, 4)), _g.normal(size=(4, 2))


MH = dict(X_q=X, X_kv=X, W_q=W44, W_k=W44, W_v=W44, W_o=_g.normal(size=(4, 3)), num_heads=2)


def _mh(**kw):
    return lambda: R.multi_head(**{**MH, **kw})


BAD = [
    ("Q rank 1", lambda: R.scaled_dot_product(q3[0], k5, v5), ValueError, "Q"),
    ("Q strings", lambda: R.scaled_dot_product([["a"]], k5, v5), TypeError, "Q"),
    ("Q None", lambda: R.scaled_dot_product(None, k5, v5), TypeError, "Q"),
    ("Q bool", lambda: R.scaled_dot_product(q3 > 0, k5, v5), TypeError, "Q"),
    ("Q complex", lambda: R.scaled_dot_product(q3 + 1j, k5, v5), TypeError, "Q"),
    ("Q NaN", lambda: R.scaled_dot_product(q3 * np.nan, k5, v5), ValueError, "Q"),
    ("Q empty", lambda: R.scaled_dot_product(np.zeros((0, 4)), k5, v5), ValueError, "Q"),
    ("K inf", lambda: R.scaled_dot_product(q3, k5 * np.inf, v5), ValueError, "K"),
    ("K width", lambda: R.scaled_dot_product(q3, k5[:, :3], v5), ValueError, "K"),
    ("K batch", lambda: R.scaled_dot_product(q3, k5[None], v5), ValueError, "K"),
    ("V batch", lambda: R.scaled_dot_product(q3, k5, np.stack([v5, v5])), ValueError, "V"),
    ("V rows", lambda: R.scaled_dot_product(q3, k5, v5[:4]), ValueError, "V"),
    ("mask int", lambda: R.scaled_dot_product(q3, k5, v5, np.ones((3, 5), int)), TypeError, "mask"),
    ("mask str", lambda: R.scaled_dot_product(q3, k5, v5, "causal"), TypeError, "mask"),
    (
        "mask shape",
        lambda: R.scaled_dot_product(q3, k5, v5, np.ones((5, 3), bool)),
        ValueError,
        "mask",
    ),
    ("mask rank 1", lambda: R.scaled_dot_product(q3, k5, v5, np.ones(5, bool)), ValueError, "mask"),
    (
        "mask too many dims",
        lambda: R.dot_product(q3, k5, v5, np.ones((2, 3, 5), bool)),
        ValueError,
        "mask",
    ),
    ("mask NaN", lambda: R.dot_product(q3, k5, v5, np.full((3, 5), np.nan)), ValueError, "mask"),
    ("mask +inf", lambda: R.dot_product(q3, k5, v5, np.full((3, 5), np.inf)), ValueError, "mask"),
    ("scale -inf", lambda: R.scaled_dot_product(q3, k5, v5, scale=-math.inf), ValueError, "scale"),
    ("scale inf", lambda: R.scaled_dot_product(q3, k5, v5, scale=math.inf), ValueError, "scale"),
    ("scale nan", lambda: R.scaled_dot_product(q3, k5, v5, scale=math.nan), ValueError, "scale"),
    ("scale str", lambda: R.scaled_dot_product(q3, k5, v5, scale="2"), TypeError, "scale"),
    ("scale bool", lambda: R.scaled_dot_product(q3, k5, v5, scale=True), TypeError, "scale"),
    ("w_v 2-D", lambda: R.additive(q3, k5, v5, W44, W44, W44), ValueError, "w_v"),
    ("W_q shape", lambda: R.additive(q3, k5, v5, W42, W44, np.ones(4)), ValueError, "W_q"),
    ("W_k shape", lambda: R.additive(q3, k5, v5, W44, W42.T, np.ones(4)), ValueError, "W_k"),
    ("W shape", lambda: R.general(q3, k5, v5, W42), ValueError, "W"),
    ("W bool", lambda: R.general(q3, k5, v5, W44 > 0), TypeError, "W"),
    ("X rank 1", lambda: R.self_attention(X[0], W44, W44, W42), ValueError, "X"),
    ("SA W_q rows", lambda: R.self_attention(X, W44[:3], W44, W42), ValueError, "W_q"),
    ("SA W_k cols", lambda: R.self_attention(X, W44, W42, W42), ValueError, "W_k"),
    ("SA W_v rows", lambda: R.self_attention(X, W44, W44, W42[:3]), ValueError, "W_v"),
    ("num_heads 0", _mh(num_heads=0), ValueError, "num_heads"),
    ("num_heads float", _mh(num_heads=1.5), TypeError, "num_heads"),
    ("MH W_q split", _mh(num_heads=3), ValueError, "W_q"),
    ("MH W_k cols", _mh(W_k=W42.repeat(3, axis=1)), ValueError, "W_k"),
    ("MH W_v rows", _mh(W_v=W44[:3]), ValueError, "W_v"),
    ("MH W_o rows", _mh(W_o=W44[:3]), ValueError, "W_o"),
    ("MH X_kv batch", _mh(X_kv=X[None]), ValueError, "X_kv"),
    ("MH mask heads", _mh(mask=np.ones((3, 5, 5), bool)), ValueError, "mask"),
    ("positions n 0", lambda: R.sinusoidal_positions(0, 4), ValueError, "n"),
    ("positions n bool", lambda: R.sinusoidal_positions(True, 4), TypeError, "n"),
    ("positions d float", lambda: R.sinusoidal_positions(3, 4.0), TypeError, "d"),
]


@pytest.mark.parametrize("call,exc,name", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(call, exc, name):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert re.match(rf"{re.escape(name)}\b", msg), f"message should start with {name!r}: {msg}"
