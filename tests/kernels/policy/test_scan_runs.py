"""The bit scan on tensors whose entries lie in equal runs at a fixed stride (``scan.row_span``):
the q, k and v slices of a packed in-projection's output. Checked against torch's own
reduction (``absmax_torch``) and against the entries themselves; values planted in the gaps
between runs (NaN, inf, huge) must never be read."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.kernels.call.layout import ScanPlan, Span
from attnkit.kernels.policy import scan as S


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _packed_slices(b: int, length: int, heads: int, d: int, dtype: torch.dtype, gen):
    """q, k, v as nn.MultiHeadAttention's packed projection gives them: (b, heads, length, d)
    views of one (b, length, 3 * heads * d) tensor, and that tensor."""
    e = heads * d
    packed = torch.randn(b, length, 3 * e, generator=gen).to(dtype)
    views = [
        packed[..., i * e : (i + 1) * e].view(b, length, heads, d).transpose(1, 2) for i in range(3)
    ]
    return packed, views


def test_packed_slice_is_runs_of_one_token():
    gen = torch.Generator().manual_seed(1)
    _, (q, k, v) = _packed_slices(2, 5, 3, 4, torch.float32, gen)
    assert S.row_span(q) == Span(12, 10, 36)
    assert S.dense_span(q) is None  # not one dense block: the runs path serves it
    assert S.plan3(q, k, v) == ScanPlan(*[Span(12, 10, 36)] * 3)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    length=st.integers(1, 9),
    heads=st.integers(1, 4),
    d=st.integers(1, 9),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
    which=st.integers(0, 2),
    planted=st.sampled_from([math.nan, math.inf, -math.inf, 6e4]),
)
def test_runs_scan_reads_the_entries_and_never_the_gaps(b, length, heads, d, dtype, which, planted):
    gen = torch.Generator().manual_seed(b * 1000 + length * 100 + heads * 10 + d)
    packed, views = _packed_slices(b, length, heads, d, dtype, gen)
    t = views[which]
    span = S.row_span(t)
    assert span is not None
    runs = torch.as_strided(t, (span.rows, span.width), (span.stride, 1))
    assert sorted(runs.reshape(-1).tolist()) == sorted(t.reshape(-1).tolist())
    e = heads * d
    others = [i for i in range(3) if i != which]
    packed[..., others[0] * e] = planted  # in the gaps: not t's entries
    assert _same(S.absmax(t), S.absmax_torch(t))
    assert S.absmax_torch(t) < 100  # randn entries: the planted value is not among them
    packed[-1, -1, which * e + e - 1] = planted  # the last entry of t's last run
    assert _same(S.absmax(t), S.absmax_torch(t))
    for got, x in zip(S.absmax3(*views), views, strict=True):
        assert _same(got, S.absmax_torch(x))


def test_runs_that_overlap_or_break_the_lattice_are_not_read():
    base = torch.randn(64)
    overlapping = torch.as_strided(base, (4, 8), (4, 1))  # runs of 8 every 4: shared entries
    assert S.row_span(overlapping) is None
    irregular = torch.randn(4, 6, 10)[:, :, :3]  # runs of 3 at stride 10, then 60: a lattice
    assert S.row_span(irregular) == Span(3, 24, 10)
    broken = torch.randn(4, 6, 10)[:, ::2, :3]  # stride 20 then 60 over 3 rows: 60 == 20 * 3
    assert S.row_span(broken) == Span(3, 12, 20)
    gap = torch.randn(4, 7, 10)[:, ::2, :3]  # strides 20 over 4 rows then 70: no lattice
    assert S.row_span(gap) is None
    for t in (overlapping, irregular, broken, gap):
        assert _same(S.absmax(t), S.absmax_torch(t))
