"""``attnkit tune``'s per-element decision without timing anything: the threshold rule on
injected (size, speed ratio) points, the sizes it measures counted as dispatch counts them
(checked against a brute-force count of the empty blocks), and a tune whose injected costs
say per-element calls win at BERT-like sizes sending a BERT-shaped padded batch to blocksparse
(and one where they lose keeping dense)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import autotune
from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels.blocksparse.emptiness import empty_blocks
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.tuning import DEFAULT, use
from attnkit.kernels.tuning import rules as tune_rules

MARGIN = 1.05


def test_every_size_winning_gives_the_smallest_measured_size():
    assert tune_rules.element_threshold([(3e5, 1.2), (6e4, 1.1), (1e5, 2.0)], MARGIN) == 60_000


def test_losing_at_the_largest_size_keeps_dense_above_everything_measured():
    assert tune_rules.element_threshold([(6e4, 1.5), (8e5, 0.9)], MARGIN) == 3_200_000
    assert tune_rules.element_threshold([(2**39, 0.5)], MARGIN) == 2**40  # the range's top


def test_the_crossover_is_the_geometric_mean_of_the_last_loss_and_the_next_win():
    pts = [(1e5, 0.8), (4e5, 1.3), (5e4, 1.5), (1.6e6, 1.4)]  # a win below a loss counts not
    assert tune_rules.element_threshold(pts, MARGIN) == 200_000
    assert tune_rules.element_threshold([(1e5, 1.04), (4e5, 1.06)], MARGIN) == 200_000


def test_no_points_is_refused():
    with pytest.raises(ValueError, match="points: expected at least one"):
        tune_rules.element_threshold([], MARGIN)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 2**30), st.floats(0.1, 3.0, allow_nan=False)),
        min_size=1,
        max_size=8,
        unique_by=lambda p: p[0],
    )
)
def test_threshold_separates_every_losing_size_from_the_winning_ones_above_it(pts):
    """Every measured size at or above the threshold won; every losing size lies below it."""
    t = tune_rules.element_threshold(pts, MARGIN)
    assert 1 <= t <= 2**40
    for size, ratio in pts:
        if size >= t:
            assert ratio >= MARGIN, (size, ratio, t)
        if ratio < MARGIN:
            assert size < t, (size, ratio, t)


def _brute(lengths: torch.Tensor, h: int, n: int, bq: int, bkv: int) -> tuple[float, float, int]:
    """(fraction empty in every element, per element, per-element calls) from the boolean
    key-padding grid, block by block (numpy)."""
    allowed = np.arange(n)[None, None, :] < lengths.numpy()[:, None, None]
    allowed = np.broadcast_to(allowed, (len(lengths), n, n))
    nq, nk = math.ceil(n / bq), math.ceil(n / bkv)
    empty = np.zeros((len(lengths), nq, nk), bool)
    for i in range(nq):
        for j in range(nk):
            tile = allowed[:, i * bq : (i + 1) * bq, j * bkv : (j + 1) * bkv]
            empty[:, i, j] = ~tile.any(axis=(1, 2))
    calls = int((~empty).any(-1).sum())
    return float(empty.all(0).mean()), float(empty.mean()), calls


@settings(max_examples=25, deadline=None)
@given(
    st.integers(2, 9),
    st.integers(1, 3),
    st.integers(65, 300),
    st.sampled_from([(128, 64), (64, 32), (32, 128)]),
    st.data(),
)
def test_empty_blocks_counts_as_the_grid_does(b, h, n, blocks, data):
    lengths = torch.tensor(data.draw(st.lists(st.integers(1, n), min_size=b, max_size=b)))
    q = torch.zeros((b, h, n, 8))
    call = AttentionCall(
        "dot", q, q, q, mask=M.key_padding(lengths), scale=1.0, dropout_p=0.0, return_weights=False
    )
    e = empty_blocks(call, *blocks)
    every, each, calls = _brute(lengths, h, n, *blocks)
    assert e.every == pytest.approx(every, abs=1e-6)  # a float32 mean
    assert e.each == pytest.approx(each, abs=1e-6)
    assert e.calls == calls
    assert e.skipped_per_call == pytest.approx(e.each * n * n * b * h / calls, rel=1e-12)


def test_empty_blocks_refuses_a_call_without_mask():
    q = torch.zeros((1, 1, 4, 2))
    with pytest.raises(ValueError, match="call: expected a call with a mask"):
        empty_blocks(
            AttentionCall(
                "dot", q, q, q, mask=None, scale=1.0, dropout_p=0.0, return_weights=False
            ),
            128,
            64,
        )


def _bert_call():
    """The dispatch bench's BERT row: (32, 12, 255, 32), lengths 16-255 (seed 0)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 256, (32,), generator=g)
    lengths[0] = 255
    q = torch.randn((32, 12, 255, 32), generator=g)
    return q, q, q, M.key_padding(lengths)


def _tune_elements(monkeypatch, ratio_at) -> int:
    """Run the tune's element measurement with injected times: dense 1 s, blocksparse
    1 / ratio_at(skipped entries per call) s."""
    sizes = []

    def race(q, k, v, mask, reps, backends=("dense", "blocksparse")):
        call = AttentionCall(
            "dot", q, k, v, mask=mask, scale=1.0, dropout_p=0.0, return_weights=False
        )
        size = empty_blocks(call, DEFAULT.blocksparse_block_q, DEFAULT.blocksparse_block_kv)
        sizes.append(size.skipped_per_call)
        return {
            "dense": [1.0] * reps,
            "blocksparse": [1.0 / ratio_at(size.skipped_per_call)] * reps,
        }

    monkeypatch.setattr(autotune, "_race", race)
    with use(DEFAULT):
        found = autotune.element_calls(autotune.Budget())
    assert len(sizes) >= 4 and min(sizes) < 1.2e5 < max(sizes)  # brackets the BERT call's
    return found.values["blocksparse_element_call_entries"]


@pytest.mark.parametrize("wins_from", [1.3e5, 5e4])
def test_a_tune_that_sees_per_element_calls_win_sends_the_bert_call_to_blocksparse(
    monkeypatch, wins_from
):
    q, k, v, mask = _bert_call()
    never = dataclasses.replace(DEFAULT, blocksparse_element_call_entries=2**40)
    with use(never):  # a machine where per-element calls never paid off, before the tune
        assert F.explain_dispatch(q, k, v, mask).chosen == "dense"
    threshold = _tune_elements(monkeypatch, lambda s: 1.4 if s >= wins_from else 0.8)
    assert threshold <= 1.5e5
    tuned = dataclasses.replace(
        DEFAULT,
        blocksparse_element_call_entries=threshold,
        measured=("blocksparse_element_call_entries",),
        measured_on="2026-01-02",
    )
    with use(tuned):
        d = F.explain_dispatch(q, k, v, mask)
    assert d.chosen == "blocksparse", str(d)
    assert "measured by attnkit tune on 2026-01-02" in " ".join(d.notes)


def test_a_tune_that_sees_per_element_calls_lose_keeps_dense(monkeypatch):
    q, k, v, mask = _bert_call()
    threshold = _tune_elements(monkeypatch, lambda s: 0.3 if s < 2e6 else 1.5)
    with use(dataclasses.replace(DEFAULT, blocksparse_element_call_entries=threshold)):
        assert F.explain_dispatch(q, k, v, mask).chosen == "dense"
