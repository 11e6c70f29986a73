"""Bad arguments to the mask constructors, drawn at random: each must raise the ValueError /
TypeError naming the argument (tests/fuzz/errors.py). Values a constructor cannot represent
(``sliding_window(10**30)``, lengths longer than the sequence) may instead be clamped, as the
issue allows: then the mask must work in a call and equal the clamped mask."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from tests.fuzz.errors import expect_error, run_bounded
from tests.fuzz.profiles import budget
from tests.support import masks as S
from tests.support.numerics import TOL, rel_err

V, T = ValueError, TypeError
HUGE = (10**30, 2**63, 2**64 + 1)

BAD_COUNT = [(-1, V), (1.5, T), ("3", T), (True, T), (None, T), (math.nan, T), ([2], T)]


def _ids(n):
    return torch.zeros(n, dtype=torch.long)


# factory name -> [(call, exception, names)]
CASES = {
    "causal": [(lambda a=a: M.causal(a), e, "alignment") for a, e in
               [("top", V), ("", V), ("TOP_LEFT", V), (None, T), (1, T)]],
    "sliding_window": [(lambda x=x: M.sliding_window(x), e, "left") for x, e in BAD_COUNT]
    + [(lambda x=x: M.sliding_window(2, x), e, "right") for x, e in BAD_COUNT if x is not None]
    + [(lambda: M.sliding_window(1, 1, "middle"), V, "alignment")],
    "key_padding": [
        (lambda: M.key_padding([-1, 2]), V, "lengths"),
        (lambda: M.key_padding([1.5]), T, "lengths"),
        (lambda: M.key_padding([]), V, "lengths"), (lambda: M.key_padding([[1, 2]]), V, "lengths"),
        (lambda: M.key_padding("12"), T, "lengths"), (lambda: M.key_padding([True]), T, "lengths"),
        (lambda: M.key_padding(None), T, "lengths"),
    ],
    "document": [
        (lambda: M.document(torch.zeros(3)), T, "ids"), (lambda: M.document([]), V, "ids"),
        (lambda: M.document(torch.zeros(2, 2, 2, dtype=torch.long)), V, "ids"),
        (lambda: M.document(_ids(3), torch.zeros(3)), T, "kv_ids"),
        (lambda: M.document(torch.zeros(2, 3, dtype=torch.long), _ids(3)), V, "kv_ids"),
        (lambda: M.document(_ids(3).expand(2, 3), _ids(3).expand(3, 3)),
         V, "kv_ids"),
        (lambda: M.document("abc"), T, "ids"),
    ],
    "prefix_lm": [(lambda x=x: M.prefix_lm(x), e, "prefix_len") for x, e in BAD_COUNT if x != [2]]
    + [(lambda: M.prefix_lm([1, -1]), V, "prefix_len"), (lambda: M.prefix_lm([]), V, "prefix_len")],
    "from_predicate": [
        (lambda: M.from_predicate("q >= k"), T, "fn"), (lambda: M.from_predicate(None), T, "fn"),
        (lambda: M.from_predicate(lambda b, h, q, k: q >= k, batch_size=0), V, "batch_size"),
        (lambda: M.from_predicate(lambda b, h, q, k: q >= k, num_heads=-2), V, "num_heads"),
        (lambda: M.from_predicate(lambda b, h, q, k: q >= k, num_heads=2.0), T, "num_heads"),
        (lambda: M.from_predicate(lambda b, h, q, k: q >= k, batch_size=True), T, "batch_size"),
    ],
    "from_tensor": [
        (lambda: M.from_tensor(np.ones((2, 2), bool)), T, ("t", "mask")),
        (lambda: M.from_tensor(torch.ones(2, 2, dtype=torch.long)), T, ("t", "mask")),
        (lambda: M.from_tensor(torch.ones(3) > 0), V, ("t", "mask")),
    ],
    "from_key_padding_mask": [
        (lambda: M.from_key_padding_mask(torch.ones(2, 3, 4) > 0), V, "key_padding_mask"),
        (lambda: M.from_key_padding_mask(torch.ones(2, 3, dtype=torch.int32)), T,
         "key_padding_mask"),
        (lambda: M.from_key_padding_mask([[True]]), T, "key_padding_mask"),
        (lambda: M.from_key_padding_mask(torch.ones(2, 0) > 0), V, "key_padding_mask"),
    ],
    "from_additive": [
        (lambda: M.from_additive(torch.ones(2, 2) > 0), T, "m"),
        (lambda: M.from_additive([[0.0]]), T, "m"),
        (lambda: M.from_additive(torch.zeros(3)), V, "m"),
    ],
    "alibi": [(lambda x=x: M.alibi(x), e, "slope") for x, e in
              [(math.nan, V), (math.inf, V), ("0.5", T), (True, T), (None, T), (1j, T)]]
    + [(lambda: M.alibi_slopes(0), V, "num_heads"), (lambda: M.alibi_slopes(True), T, "num_heads")],
    "combine": [
        (lambda: M.causal() & 3, T, ("other", "mask")),
        (lambda: M.causal() | "x", T, ("other", "mask")),
        (lambda: M.alibi(0.5) | M.causal(), V, ("mask", "other")),
    ],
}  # fmt: skip
FLAT = [(k, i) for k, cases in CASES.items() for i in range(len(cases))]


@st.composite
def bad_masks(draw):
    factory, i = draw(st.sampled_from(FLAT))
    fn, exc, names = CASES[factory][i]
    return f"{factory} case {i}", fn, exc, names


@budget("invalid_masks")
@given(case=bad_masks())
def test_bad_mask_argument_names_it(case):
    label, thunk, exc, names = case
    expect_error(thunk, exc, names, label)


@budget("refused_or_clamped")
@given(
    kind=st.sampled_from(["left", "right", "key_padding", "prefix_lm"]),
    huge=st.sampled_from(HUGE + (5, 64, 10**6)),
    lq=st.integers(1, 9),
    lk=st.integers(1, 9),
)
def test_unrepresentable_values_are_refused_or_clamped(kind, huge, lq, lk):
    """Either a clear error naming the argument (at construction or at call time, then naming
    ``mask``), or a mask that equals the clamped one (a window/length/prefix beyond the sequence
    covers all of it); never OverflowError/RuntimeError."""
    spec = {
        "left": lambda: (M.sliding_window(huge, 1), S.sliding_window(min(huge, lk + lq), 1)),
        "right": lambda: (M.sliding_window(1, huge), S.sliding_window(1, min(huge, lk + lq))),
        "key_padding": lambda: (M.key_padding([huge]), S.key_padding([min(huge, lk)])),
        "prefix_lm": lambda: (M.prefix_lm(huge), S.prefix_lm(min(huge, lk))),
    }[kind]
    name = {"left": "left", "right": "right", "key_padding": "lengths", "prefix_lm": "prefix_len"}
    label = f"{kind}({huge}) Lq={lq} Lk={lk}"
    try:
        mask, clamped = run_bounded(spec)
    except (ValueError, TypeError):
        return expect_error(lambda: run_bounded(spec), ValueError, name[kind], label)
    gen = torch.Generator().manual_seed(lq * 10 + lk)
    q, k, v = (torch.randn(1, n, 3, generator=gen, dtype=torch.float64) for n in (lq, lk, lk))
    try:
        out = run_bounded(lambda: F.scaled_dot_product_attention(q, k, v, mask))
    except (ValueError, TypeError):
        thunk = lambda: F.scaled_dot_product_attention(q, k, v, mask)  # noqa: E731
        return expect_error(thunk, ValueError, ("mask", name[kind]), label)
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{label}: accepted, then raised {type(e).__name__}: {e}") from e
    ref = R.scaled_dot_product(q.numpy(), k.numpy(), v.numpy(), S.ref_mask(clamped, (1,), lq, lk))
    assert rel_err(out, ref.output) <= TOL[torch.float64], f"{label}: not the clamped mask"
