"""LM evaluation (issue 20): nats/token, perplexity and bits/char of a stream against an
independent float64 computation from the model's logits; sliding windows (stride) score every
token once, equal the full evaluation when stride >= block, and never lose context; the
add-one unigram baseline against a direct count."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.train.inference.lm_eval import score_stream, stream_windows, unigram_nats

V = 23


def lm(seed: int = 0, window=None) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = LMConfig(V, d_model=16, nhead=2, num_layers=2, dim_feedforward=32, dropout=0.0,
                   window=window)  # fmt: skip
    return TransformerLM(cfg).eval()


def reference_nats(model, ids: list[int], windows: list[tuple[int, int, int]]) -> float:
    """Summed NLL (float64 log-softmax of each window's logits, one window at a time)."""
    total = 0.0
    with torch.no_grad():
        for start, end, first in windows:
            logits = model(torch.tensor([ids[start:end]]))[0].double()
            logp = logits.log_softmax(-1)
            for p in range(first, end):
                total -= float(logp[p - start, ids[p + 1]])
    return total


def stream(n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(4, V, n).tolist()


@pytest.mark.parametrize(("n", "block", "stride"), [(50, 8, None), (61, 16, 5), (9, 16, 3)])
def test_score_equals_float64_reference(n, block, stride):
    model, ids = lm(), stream(n)
    got = score_stream(model, ids, block, stride, batch_size=3, char_level=True)
    wins = stream_windows(n, block, stride)
    want = reference_nats(model, ids, wins)
    assert got.tokens == n - 1
    assert got.nats == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got.nats_per_token == pytest.approx(want / (n - 1), rel=1e-5, abs=1e-7)
    assert got.perplexity == pytest.approx(math.exp(want / (n - 1)), rel=1e-5)
    assert got.bits_per_char == pytest.approx(want / (n - 1) / math.log(2), rel=1e-5)
    assert score_stream(model, ids, block, stride).bits_per_char is None  # not char-level


def test_stride_at_least_block_is_the_full_non_overlapping_evaluation():
    model, ids = lm(2), stream(77, 3)
    full = score_stream(model, ids, 10)
    for stride in (10, 11, 1000):
        assert score_stream(model, ids, 10, stride).nats == pytest.approx(full.nats, rel=1e-6)
    # non-overlapping windows computed independently: inputs ids[s:s+10], targets shifted by one
    want = 0.0
    with torch.no_grad():
        for s in range(0, 76, 10):
            x = ids[s : min(s + 10, 76)]
            logp = model(torch.tensor([x]))[0].double().log_softmax(-1)
            want -= sum(float(logp[i, ids[s + i + 1]]) for i in range(len(x)))
    assert full.nats == pytest.approx(want, rel=1e-5)


def test_a_smaller_stride_gives_context_and_changes_the_score():
    model, ids = lm(4), stream(80, 5)
    a, b = score_stream(model, ids, 8), score_stream(model, ids, 8, 2)
    assert a.tokens == b.tokens == 79 and a.nats != pytest.approx(b.nats, rel=1e-6)


@settings(max_examples=80, deadline=None)
@given(n=hs.integers(2, 200), block=hs.integers(1, 40), stride=hs.integers(1, 60))
def test_windows_score_every_target_once_with_context(n, block, stride):
    wins = stream_windows(n, block, stride)
    scored = [p for _, end, first in wins for p in range(first, end)]
    assert scored == list(range(n - 1))  # every input position predicts its next token once
    for start, end, first in wins:
        assert end - start <= block and start <= first <= end
        if start > 0:  # a later window keeps at least block - stride tokens of context
            assert first - start >= min(block - min(stride, block), first)


def test_bad_arguments():
    model = lm()
    with pytest.raises(ValueError, match="^ids: expected at least 2 tokens"):
        score_stream(model, [5], 8)
    with pytest.raises(ValueError, match="^stride: "):
        score_stream(model, stream(10), 8, 0)
    with pytest.raises(ValueError, match="^block: "):
        stream_windows(10, 0)


def test_unigram_baseline_against_direct_counts():
    train, held = [4, 4, 5, 6, 4], [5, 4, 7, 9]
    vocab = 4 + 6  # 6 ordinary tokens
    p = {4: 4 / 11, 5: 2 / 11, 6: 2 / 11, 7: 1 / 11, 8: 1 / 11, 9: 1 / 11}
    assert sum(p.values()) == pytest.approx(1.0)
    want = -(math.log(p[4]) + math.log(p[7]) + math.log(p[9])) / 3
    assert unigram_nats(train, held, vocab) == pytest.approx(want, rel=1e-12)
