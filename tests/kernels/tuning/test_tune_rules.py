"""``attnkit tune``'s noise-robust decisions without timing anything: the per-pair ratio
statistics, the choice that keeps the built-in value unless a candidate is faster beyond the
spread (with how sure it was), and the decode split-K ranges from injected (size, ratio,
spread) points, including the story of issue 32 (split-K wins at small caches and loses at
large ones on a busy host)."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.kernels.tuning import ranges as R
from attnkit.kernels.tuning import rules as tune_rules

MARGIN = 1.05
MIB = 2**20
POINTS = st.lists(  # measured (k and v bytes, median ratio, spread) points
    st.tuples(
        st.integers(1, 2**36),
        st.floats(0.1, 10.0, allow_nan=False),
        st.floats(0.0, 1.0, allow_nan=False),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda p: p[0],
)


def test_ratio_stats_are_the_median_and_half_the_interquartile_range():
    base = [2.0, 2.0, 2.0, 2.0, 2.0]
    other = [1.0, 2.0, 1.0, 1.0, 4.0]  # ratios 2, 1, 2, 2, 0.5
    median, spread, n = tune_rules.ratio_stats(base, other)
    assert (median, n) == (2.0, 5)
    q = statistics.quantiles([0.5, 1.0, 2.0, 2.0, 2.0], n=4, method="inclusive")
    assert spread == pytest.approx((q[2] - q[0]) / 2)
    assert tune_rules.ratio_stats([1.0, 3.0], [1.0, 1.0]) == (2.0, 1.0, 2)  # min-max half range
    with pytest.raises(ValueError, match="at least one raced pair"):
        tune_rules.ratio_stats([], [])


def test_a_candidate_replaces_the_built_in_only_beyond_the_spread():
    base = [1.0] * 7
    clear = [0.5, 0.52, 0.5, 0.49, 0.51, 0.5, 0.5]  # ~2x faster, tight
    noisy = [0.3, 1.5, 0.4, 1.6, 0.35, 1.4, 0.9]  # faster median, huge spread
    best, sure = tune_rules.choose({"a": base, "b": clear}, "a", MARGIN)
    assert best == "b" and sure.verdict.startswith("clear") and sure.repeats == 7
    assert sure.ratio == pytest.approx(2.0, rel=0.05)
    best, sure = tune_rules.choose({"a": base, "c": noisy}, "a", MARGIN)
    assert best == "a" and "tie" in sure.verdict and "built-in" in sure.verdict
    best, sure = tune_rules.choose({"a": base, "d": [2.0] * 7}, "a", MARGIN)
    assert best == "a" and sure.verdict == "clear: the built-in is fastest"
    # slower at the median (0.99x) but within a spread that reaches 1.0: not "clear"
    wide = [1.01, 0.88, 1.15, 1.01, 0.87, 1.16, 1.02]
    best, sure = tune_rules.choose({"a": base, "e": wide}, "a", MARGIN)
    assert sure.ratio < 1.0 <= sure.ratio + sure.spread
    assert best == "a" and sure.verdict == "tie within the noise: kept the built-in default"


def test_the_issue_32_host_gives_split_k_below_and_torch_ops_above():
    # split-K 1.39-1.52x torch ops at Lk <= 2k, 0.80x and 0.63x at 8k and 32k (k and v bytes)
    pts = [(MIB, 1.52, 0.03), (4 * MIB, 1.39, 0.04), (16 * MIB, 0.80, 0.05), (64 * MIB, 0.63, 0.02)]
    ranges, sure = tune_rules.split_k_ranges(pts, MARGIN, repeats=30)
    assert ranges == ((8 * MIB, R.SPLIT_K), (R.TOP, R.TORCH))
    assert R.route_at(ranges, 2 * MIB) == R.SPLIT_K and R.route_at(ranges, 32 * MIB) == R.TORCH
    assert sure.repeats == 30 and "torch ops faster" in sure.verdict
    assert R.words(ranges) == "split-K below 8 MiB, torch ops from 8 MiB"


def test_ties_and_noisy_losses_keep_split_k_at_every_size():
    ranges, sure = tune_rules.split_k_ranges([(MIB, 1.0, 0.0), (8 * MIB, 0.9, 0.1)], MARGIN)
    assert ranges == ((R.TOP, R.SPLIT_K),) and "kept at every size" in sure.verdict
    with pytest.raises(ValueError, match="points: expected at least one"):
        tune_rules.split_k_ranges([], MARGIN)


@settings(max_examples=200, deadline=None)
@given(POINTS)
def test_torch_ops_get_a_size_only_where_they_clearly_win(points):
    ranges, _ = tune_rules.split_k_ranges(points, MARGIN)
    assert R.checked("ranges", ranges) == ranges  # sorted, merged, ends at the top
    for size, ratio, spread in points:
        torch_clear = ratio + spread < 1.0 / MARGIN
        assert (R.route_at(ranges, size) == R.TORCH) == torch_clear, (size, ratio, spread)


def test_near_margin_names_the_closest_call():
    sure = tune_rules.near_margin([(2.0, 0.1), (1.07, 0.05), (0.5, 0.1)], MARGIN, 7, "dense kept")
    assert (sure.ratio, sure.spread, sure.repeats) == (1.07, 0.05, 7)
    assert sure.verdict == "close at some sizes: dense kept where unsure"
    sure = tune_rules.near_margin([(2.0, 0.1), (0.5, 0.1)], MARGIN, 7, "dense kept")
    assert sure.verdict == "clear at every measured size" and sure.ratio == 0.5


@settings(max_examples=200, deadline=None)
@given(POINTS, st.floats(0.0, 1.0, allow_nan=False))
def test_more_noise_never_gives_torch_ops_more_sizes(points, extra):
    ranges, _ = tune_rules.split_k_ranges(points, MARGIN)
    noisier, _ = tune_rules.split_k_ranges([(b, r, s + extra) for b, r, s in points], MARGIN)
    for size, _, _ in points:
        if R.route_at(noisier, size) == R.TORCH:
            assert R.route_at(ranges, size) == R.TORCH


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=5, max_size=9),
    st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=5, max_size=9),
)
def test_a_candidate_chosen_is_faster_beyond_the_spread(base, other):
    best, sure = tune_rules.choose({"base": base, "other": other}, "base", MARGIN)
    median, spread, n = tune_rules.ratio_stats(base, other)
    assert (best == "other") == (median - spread >= MARGIN)
    assert sure.repeats == n == min(len(base), len(other))


# ---------------------------------------------------------------------------------------------
# blocksparse_min_empty: the threshold of least summed time
# ---------------------------------------------------------------------------------------------
def _point(frac: float, dense_s: float, ratio: float) -> tuple[float, float, float]:
    return frac, dense_s, dense_s / ratio  # (fraction, dense s, blocksparse s)


def test_a_long_call_blocksparse_halves_outweighs_a_short_tie():
    """What ``attnkit tune`` measured on a 2-core AMD EPYC on 2026-11-28 (dense/blocksparse
    ratios; L=2048 calls take 4x the time of L=1024): the old per-fraction vote let the short
    calls' ties raise the threshold to 0.516, and auto then kept dense on L=2048 masks that
    blocksparse ran 1.2-1.7x faster. The summed times keep blocksparse from 35% empty."""
    pts = [
        _point(0.31, 7.0, 0.92), _point(0.47, 7.0, 1.04), _point(0.56, 7.0, 1.89),
        _point(0.35, 28.0, 1.57), _point(0.52, 28.0, 2.07), _point(0.66, 28.0, 2.45),
    ]  # fmt: skip
    assert tune_rules.least_empty(pts, 0.25, MARGIN) == 0.25  # the default within the margin
    assert tune_rules.least_empty(pts, 0.6, MARGIN) == 0.35


def test_blocksparse_losing_everywhere_keeps_dense_until_every_block_is_empty():
    pts = [_point(0.3, 5.0, 0.7), _point(0.6, 5.0, 0.8), _point(0.9, 9.0, 0.9)]
    assert tune_rules.least_empty(pts, 0.25, MARGIN) == 1.0


def test_a_noisy_tie_keeps_the_default():
    pts = [_point(0.3, 5.0, 1.02), _point(0.6, 5.0, 0.99)]
    assert tune_rules.least_empty(pts, 0.25, MARGIN) == 0.25
    with pytest.raises(ValueError, match="points: expected at least one"):
        tune_rules.least_empty([], 0.25, MARGIN)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.01, 0.99, allow_nan=False),
            st.floats(1e-4, 1.0, allow_nan=False),
            st.floats(0.2, 5.0, allow_nan=False),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([0.05, 0.25, 0.6]),
)
def test_the_threshold_never_sums_to_more_time_than_the_default_nor_beyond_the_best(pts, default):
    """Brute force over every threshold a fraction could take (0.05 steps and the measured
    fractions): the rule's sum is at most the default's, and within the margin of the least."""
    pts = [_point(f, d, r) for f, d, r in pts]

    def total(t):
        return sum(b if f >= t else d for f, d, b in pts)

    got = tune_rules.least_empty(pts, default, MARGIN)
    grid = [i / 20 for i in range(1, 21)] + [f for f, _, _ in pts if f >= 0.05]  # its floor
    assert 0.05 <= got <= 1.0
    assert total(got) <= total(default) + 1e-12
    assert total(got) <= min(total(t) for t in grid) * MARGIN + 1e-12


# ---------------------------------------------------------------------------------------------
# blocksparse_element_call_entries: unsure sizes keep the built-in default's side
# ---------------------------------------------------------------------------------------------
def test_clear_points_keep_their_scores_and_unsure_ones_vote_for_the_default():
    pts = [(4e4, 0.65, 0.01), (1.3e5, 1.05, 0.07), (3.4e5, 1.38, 0.01), (6e4, 0.99, 0.04)]
    scored = dict(tune_rules.element_points(pts, 98_304, MARGIN))
    assert scored[4e4] == pytest.approx(0.66)  # a clear loss
    assert scored[3.4e5] == pytest.approx(1.37)  # a clear win
    assert scored[1.3e5] == MARGIN  # unsure, above the default: blocksparse's side
    assert scored[6e4] == 0.0  # unsure, below the default: dense's side
    # unsure points on both sides of the crossing: the built-in threshold stays
    assert tune_rules.element_rule(pts, 98_304, MARGIN) == 98_304


def test_the_story_of_a_tune_that_measured_bert_twice():
    """2026-11-28, 2-core AMD EPYC: BERT-like (32,12,256,32) measured 0.98x +/- 0.00 in one
    tune and 1.12x in the next; the one-pass rule then set the threshold above it (556,092)
    and auto kept dense where per-element calls ran 1.2x faster. Two passes widen the spread
    and unsure sizes keep the built-in default."""
    pts = [
        (37_888, 0.70, 0.04), (102_400, 0.99, 0.06), (132_096, 1.12, 0.10),
        (344_064, 1.46, 0.12), (393_216, 1.02, 0.02), (786_432, 1.27, 0.01),
    ]  # fmt: skip
    assert tune_rules.element_rule(pts, 98_304, MARGIN) == 98_304
    clear = [(37_888, 0.70, 0.04), (132_096, 1.30, 0.02), (344_064, 1.46, 0.02)]
    assert tune_rules.element_rule(clear, 98_304, MARGIN) == math.ceil(math.sqrt(37_888 * 132_096))


ELEMENT_POINTS = st.lists(  # measured (skipped entries per call, median ratio, spread) points
    st.tuples(st.integers(1, 2**30), st.floats(0.1, 3.0, allow_nan=False), st.floats(0.0, 0.5)),
    min_size=1,
    max_size=8,
    unique_by=lambda p: p[0],
)


@settings(max_examples=200, deadline=None)
@given(ELEMENT_POINTS, st.integers(1, 2**30))
def test_every_score_is_a_clear_verdict_or_the_defaults_side(pts, default):
    for (size, ratio, spread), (s2, score) in zip(
        pts, tune_rules.element_points(pts, default, MARGIN), strict=True
    ):
        assert s2 == size
        if ratio - spread >= MARGIN:
            assert score == ratio - spread >= MARGIN
        elif ratio + spread < 1.0:
            assert score == ratio + spread < MARGIN
        else:
            assert (score >= MARGIN) == (size >= default)


@settings(max_examples=300, deadline=None)
@given(ELEMENT_POINTS, st.integers(1, 2**30))
def test_the_rule_keeps_every_clear_loss_below_and_the_top_clear_wins_above(pts, default):
    t = tune_rules.element_rule(pts, default, MARGIN)
    losses = [e for e, r, s in pts if r + s < 1.0]
    others = [e for e, r, s in pts if r - s < MARGIN]  # losses and unsure sizes
    wins = [e for e, r, s in pts if r - s >= MARGIN and e > max(others, default=0)]
    assert all(e < t for e in losses)
    assert all(t <= e for e in wins) or t == 2**40 or not wins
