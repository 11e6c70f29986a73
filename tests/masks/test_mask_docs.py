"""attnkit.masks docstrings and arguments: every grid drawn in a docstring equals the mask it
describes, and every bad constructor argument raises TypeError / ValueError naming itself."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch

from attnkit import masks as M

# ---------------------------------------------------------------------------------------------
# docstring grids are right
# ---------------------------------------------------------------------------------------------
_INT_ROW = re.compile(r"^(?:\w+=\d+:\s*)?(-?\d+(?: +-?\d+)*)$")


def docstring_grids(obj) -> list[np.ndarray]:
    """Every integer grid in the literal blocks (after '::') of ``obj``'s docstring; grids side
    by side are told apart by their column position."""
    doc = inspect.getdoc(obj)
    grids: list[np.ndarray] = []
    lines = doc.splitlines()
    k = 0
    while k < len(lines):
        if not lines[k].rstrip().endswith("::"):
            k += 1
            continue
        k += 1
        starts: list[int] = []
        rows: dict[int, list[list[int]]] = {}
        while k < len(lines) and (not lines[k].strip() or lines[k].startswith("    ")):
            line = lines[k]
            k += 1
            groups = [
                (g.start(), g.group().strip()) for g in re.finditer(r"\S+(?: {1,2}\S+)*", line)
            ]
            parsed = [(col, _INT_ROW.match(text)) for col, text in groups]
            if not parsed or not all(p for _, p in parsed):
                continue  # blank line or a header such as "top_left   bottom_right"
            for col0, p in parsed:
                col = col0 + p.start(1)  # where the numbers start (after a "b=0:" label)
                if not starts or all(abs(col - s) > 3 for s in starts):
                    starts.append(col)
                s = min(starts, key=lambda x: abs(x - col))
                rows.setdefault(s, []).append([int(x) for x in p.group(1).split()])
        grids.extend(np.array(rows[s]) for s in sorted(rows))
    return grids


def _grid(m: M.Mask, lq: int, lk: int) -> list[np.ndarray]:
    t = m.materialize(lq, lk).numpy().astype(int)
    return [t] if t.ndim == 2 else list(t.reshape(-1, lq, lk))


DOC_GRIDS = [
    (M.causal, lambda: _grid(M.causal(), 3, 5) + _grid(M.causal("bottom_right"), 3, 5)),
    (
        M.sliding_window,
        lambda: _grid(M.sliding_window(1), 5, 5) + _grid(M.sliding_window(2, 0), 5, 5),
    ),
    (M.key_padding, lambda: _grid(M.key_padding([3, 1]), 2, 4)),
    (
        M.document,
        lambda: _grid(M.document([0, 0, 1, 1, 1]), 5, 5) + _grid(M.document([0, 1, 0]), 3, 3),
    ),
    (
        M.prefix_lm,
        lambda: _grid(M.prefix_lm(2), 4, 4) + _grid(M.prefix_lm(2, "bottom_right"), 2, 5),
    ),
    (M.Band, lambda: _grid(M.Band(-1, 0, "top_left"), 3, 3)),
    (M.from_predicate, lambda: _grid(M.from_predicate(lambda b, h, q, k: (q + k) % 2 == 0), 3, 3)),
    (
        M.from_tensor,
        lambda: _grid(M.from_tensor(torch.tensor([[1, 0, 1], [0, 1, 1]]).bool()), 2, 3),
    ),
    (
        M.from_key_padding_mask,
        lambda: _grid(M.from_key_padding_mask(torch.tensor([[False, False, True]])), 2, 3),
    ),
    (
        M.from_additive,
        lambda: _grid(M.from_additive(torch.tensor([[0.0, -math.inf], [0.5, 0.0]])), 2, 2),
    ),
    (M.alibi, lambda: [M.alibi(1).materialize_bias(3, 4).numpy().astype(int)]),
]


@pytest.mark.parametrize("obj,expected", DOC_GRIDS, ids=[o.__name__ for o, _ in DOC_GRIDS])
def test_docstring_grids_match_the_masks(obj, expected):
    got = docstring_grids(obj)
    want = expected()
    assert len(got) == len(want), f"{obj.__name__}: {len(got)} grids in the docstring"
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=obj.__name__)


# classes whose grids live on their factory (or that only combine other masks)
NO_GRID = {M.Intersection: "a & b", M.Union: "a | b", M.KeyColumns: M.from_key_padding_mask}
NO_GRID[M.ALiBi] = M.alibi


def test_every_public_mask_docstring_is_checked():
    checked = {o for o, _ in DOC_GRIDS}
    for name in M.__all__:
        obj = getattr(M, name)
        if inspect.isclass(obj) and issubclass(obj, M.Mask) and obj is not M.Mask:
            assert obj in checked or obj in NO_GRID, name
    assert M.from_key_padding_mask in checked and M.from_additive in checked
    assert M.alibi in checked


# ---------------------------------------------------------------------------------------------
# bad arguments name themselves
# ---------------------------------------------------------------------------------------------
def _not_bool(b, h, q, k):
    return q + k


BAD = [
    (lambda: M.causal("left"), ValueError, "alignment"),
    (lambda: M.sliding_window(-1), ValueError, "left"),
    (lambda: M.sliding_window(2, -1), ValueError, "right"),
    (lambda: M.sliding_window(1.5), TypeError, "left"),
    (lambda: M.sliding_window(True), TypeError, "left"),
    (lambda: M.sliding_window(10**30), ValueError, "left"),
    (lambda: M.sliding_window(2, 2**63), ValueError, "right"),
    (lambda: M.sliding_window(2, alignment="middle"), ValueError, "alignment"),
    (lambda: M.key_padding([[1, 2]]), ValueError, "lengths"),
    (lambda: M.key_padding([1.5]), TypeError, "lengths"),
    (lambda: M.key_padding([-1, 2]), ValueError, "lengths"),
    (lambda: M.key_padding([]), ValueError, "lengths"),
    (lambda: M.key_padding("abc"), TypeError, "lengths"),
    (lambda: M.key_padding([3, 10**30]), ValueError, "lengths"),
    (lambda: M.key_padding(torch.tensor([2**63 - 1])), ValueError, "lengths"),
    (lambda: M.key_padding([True, False]), TypeError, "lengths"),
    (lambda: M.document([0.5, 1.0]), TypeError, "ids"),
    (lambda: M.document([[[0]]]), ValueError, "ids"),
    (lambda: M.document([[0, 1]], kv_ids=[0, 1]), ValueError, "kv_ids"),
    (lambda: M.document([0, -(10**20)]), ValueError, "ids"),
    (lambda: M.document([0, 1]).materialize(3, 3), ValueError, "ids"),
    (lambda: M.prefix_lm(-1), ValueError, "prefix_len"),
    (lambda: M.prefix_lm(1.5), TypeError, "prefix_len"),
    (lambda: M.prefix_lm([[1]]), ValueError, "prefix_len"),
    (lambda: M.prefix_lm(10**30), ValueError, "prefix_len"),
    (lambda: M.prefix_lm(True), TypeError, "prefix_len"),
    (lambda: M.prefix_lm([1, -2]), ValueError, "prefix_len"),
    (lambda: M.prefix_lm(2, "middle"), ValueError, "alignment"),
    (lambda: M.prefix_lm(2, alignment=None), TypeError, "alignment"),
    (lambda: M.from_predicate(3), TypeError, "fn"),
    (lambda: M.from_predicate(_not_bool, batch_size=0), ValueError, "batch_size"),
    (lambda: M.from_predicate(_not_bool, alignment="left"), ValueError, "alignment"),
    (lambda: M.from_predicate(_not_bool, num_heads=True), TypeError, "num_heads"),
    (lambda: M.from_predicate(_not_bool).materialize(2, 2), TypeError, "fn"),
    (
        lambda: M.from_predicate(lambda b, h, q, k: torch.ones(5, 1, 1, dtype=torch.bool), 2).tile(
            0, 2, 0, 2, 2, 2
        ),
        ValueError,
        "fn",
    ),
    (lambda: M.from_tensor([[True]]), TypeError, "mask"),
    (lambda: M.from_tensor(torch.ones(3, dtype=torch.bool)), ValueError, "mask"),
    (lambda: M.from_tensor(torch.ones(2, 2, dtype=torch.int64)), TypeError, "mask"),
    (
        lambda: M.from_tensor(torch.ones(2, 3, dtype=torch.bool)).materialize(3, 2),
        ValueError,
        "mask",
    ),
    (
        lambda: M.from_key_padding_mask(torch.ones(2, 3, 4, dtype=torch.bool)),
        ValueError,
        "key_padding_mask",
    ),
    (
        lambda: M.from_key_padding_mask(torch.ones(2, 3, dtype=torch.int32)),
        TypeError,
        "key_padding_mask",
    ),
    (lambda: M.from_key_padding_mask([[True]]), TypeError, "key_padding_mask"),
    (lambda: M.from_additive(torch.ones(2, 2, dtype=torch.bool)), TypeError, "m"),
    (lambda: M.from_additive(torch.zeros(3)), ValueError, "m:"),
    (lambda: M.alibi(float("nan")), ValueError, "slope"),
    (lambda: M.alibi("1"), TypeError, "slope"),
    (lambda: M.alibi(True), TypeError, "slope"),
    (lambda: M.alibi(float("inf")), ValueError, "slope"),
    (lambda: M.ALiBi(torch.ones(2, 2)), ValueError, "slopes"),
    (lambda: M.ALiBi([1.0, float("nan")]), ValueError, "slopes"),
    (lambda: M.ALiBi(torch.tensor([True])), TypeError, "slopes"),
    (lambda: M.ALiBi(torch.ones(0)), ValueError, "slopes"),
    (lambda: M.alibi_slopes(0), ValueError, "num_heads"),
    (lambda: M.alibi_slopes(2.0), TypeError, "num_heads"),
    (lambda: M.Band(1.5, 2), TypeError, "lo"),
    (lambda: M.Band(0, 2**63), ValueError, "hi"),
    (lambda: M.causal().block_map(4, 4, 0, 2), ValueError, "block_q"),
    (lambda: M.causal().block_map(4, 4, 2, 1.5), TypeError, "block_kv"),
    (lambda: M.causal().materialize(0, 3), ValueError, "q_len"),
    (lambda: M.causal().materialize(3, -1), ValueError, "kv_len"),
    (lambda: M.causal() & 3, TypeError, "&"),
    (lambda: M.causal() | "x", TypeError, "|"),
    (lambda: M.alibi(1.0) | M.causal(), ValueError, "|"),
    (lambda: M.key_padding([1, 2]) & M.key_padding([1, 2, 3]), ValueError, "batch shapes"),
    (lambda: M.as_mask(3), TypeError, "mask"),
    (lambda: M.normalize(3, (2,), 3, 3), TypeError, "mask"),
    (lambda: M.normalize(torch.ones(3, 4, dtype=torch.bool), (2,), 3, 3), ValueError, "mask"),
    (lambda: M.normalize(torch.ones(3, 3, dtype=torch.int8), (2,), 3, 3), TypeError, "mask"),
    (lambda: M.normalize(M.key_padding([1, 2, 3]), (2,), 3, 3), ValueError, "mask"),
    (lambda: M.normalize(M.document([0, 1]), (2,), 3, 3), ValueError, "document"),
    (
        lambda: M.normalize(torch.ones(3, 3, dtype=torch.bool), (2,), 3, 3, "nope"),
        ValueError,
        "device",
    ),
]


@pytest.mark.parametrize("make,exc,name", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_arguments_name_the_argument(make, exc, name):
    with pytest.raises(exc) as info:
        make()
    assert name in str(info.value), str(info.value)
