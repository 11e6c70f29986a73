"""Hypothesis strategies for valid attention calls: shapes, dtypes, layouts, magnitudes, masks.

Sizes lean towards the edges (1, odd, block boundaries 127/128/129/255/257) but cover 1..300;
magnitudes are powers of ten that scale q, k and v (1e-30..1e30; float16 1e-2..1e2), so that
scores range from tiny through saturated (one-hot softmax) to overflowing the compute dtype (P5).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.support.layouts import LAYOUTS
from tests.support.masks import CATALOGUE

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

EDGE_LENGTHS = (1, 2, 7, 13, 64, 97, 127, 128, 129, 255, 257, 300)


def lengths(max_len: int = 300) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(1, 9),
        st.sampled_from([n for n in EDGE_LENGTHS if n <= max_len]),
        st.integers(1, max_len),
    )


def widths(max_d: int = 80) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(1, 8), st.sampled_from([16, 31, 64, max_d]), st.integers(1, max_d))


batch_dims = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


def exponents(dtype: torch.dtype) -> st.SearchStrategy[int]:
    """Power of ten that scales one input (0 most often)."""
    if dtype == torch.float16:
        return st.sampled_from([0, 0, 0, -2, -1, 1, 2])
    return st.sampled_from([0, 0, 0, 0, -30, -10, -3, 1, 3, 10, 30])


def mask_kinds(batch: tuple[int, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from([n for n, (_, needs) in CATALOGUE.items() if needs <= len(batch)])


def _layouts(batch: tuple[int, ...]) -> tuple[str, ...]:
    """Layouts for inputs with batch dims ``batch``. "expanded" shares one slice along the first
    dim: along a batch dim that is a shared k/v; with no batch dim it would make every key (or
    query) identical, a degenerate problem whose gradients cancel to exactly 0 and have no
    relative error to check, so it is drawn only when there is a batch dim."""
    return LAYOUTS if batch else tuple(lay for lay in LAYOUTS if lay != "expanded")


@st.composite
def dot_calls(draw, max_len: int = 300):
    """Everything a dot-product call needs except the tensors: a dict."""
    dtype = draw(st.sampled_from(DTYPES))
    batch = draw(batch_dims)
    lq, lk = draw(lengths(max_len)), draw(lengths(max_len))
    return dict(
        dtype=dtype,
        batch=batch,
        lq=lq,
        lk=lk,
        dk=draw(widths()),
        dv=draw(widths()),
        layouts=tuple(draw(st.sampled_from(_layouts(batch))) for _ in range(3)),
        exps=tuple(draw(exponents(dtype)) for _ in range(3)),
        mask=draw(mask_kinds(batch)),
        seed=draw(st.integers(0, 2**31 - 1)),
        weights=draw(st.booleans()),
    )
