"""attnkit.explain.token_attention (every token's most-attended tokens per layer, head-averaged)
against a NumPy float64 reference, and locate_word (a word found among any tokenizer's tokens by
character offsets) on hand-made offsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.explain.model_attention import locate_word
from attnkit.explain.token_attention import all_tokens_report


def _weights(n: int, h: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, h, length, length, generator=g) * 3, dim=-1)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3),
    h=st.integers(1, 5),
    length=st.integers(1, 9),
    k=st.integers(1, 4),
    skip=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_rankings_match_a_numpy_reference(n, h, length, k, skip, seed):
    w = _weights(n, h, length, seed)
    tokens = [f"t{i}" for i in range(length)]
    special = [i in (0, length - 1) for i in range(length)]
    r = all_tokens_report("m", "text", tokens, special, w, top_k=k, skip_special=skip)
    avg = w.double().numpy().mean(axis=1)  # (N, L, L)
    allowed = np.array([not (skip and s) for s in special])
    assert (r.num_layers, r.num_heads, len(r.rows)) == (n, h, length)
    for i in range(length):
        for layer in range(n):
            row = np.where(allowed, avg[layer, i], -1.0)
            want = np.sort(row)[::-1][: min(k, int(allowed.sum()))]
            got = [a.weight for a in r.rows[i][layer]]
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
            for a in r.rows[i][layer]:
                assert allowed[a.index] and a.token == tokens[a.index]
                assert abs(avg[layer, i, a.index] - a.weight) <= 1e-12


def test_bad_input_names_the_argument():
    w = _weights(1, 2, 3, 0)
    toks, sp = ["a", "b", "c"], [False] * 3
    with pytest.raises(ValueError, match=r"weights: expected \(N, H, 4, 4\)"):
        all_tokens_report("m", "t", toks + ["d"], sp + [False], w)
    with pytest.raises(ValueError, match="top_k"):
        all_tokens_report("m", "t", toks, sp, w, top_k=0)
    with pytest.raises(TypeError, match="skip_special"):
        all_tokens_report("m", "t", toks, sp, w, skip_special="yes")


TEXT = "The cat saw the other cat's tail"
# byte-level-BPE-like tokens with their character offsets; "cat's" is split in two
TOKENS = ["<s>", "The", " cat", " saw", " the", " other", " cat", "'s", " tail", "</s>"]
OFFSETS = [(0, 0), (0, 3), (4, 7), (8, 11), (12, 15), (16, 21), (22, 25), (25, 27), (28, 32)]
OFFSETS += [(0, 0)]
SPECIAL = [True] + [False] * 8 + [True]


def test_locate_word_by_offsets():
    p = locate_word(TEXT, "cat", TOKENS, OFFSETS, SPECIAL)
    assert p.starts == [2, 6] and p.query_index == 2 and p.pieces == [" cat"]
    assert "occurs 2 times" in p.notes[0]
    assert locate_word(TEXT, "cat", TOKENS, OFFSETS, SPECIAL, occurrence=1).query_index == 6
    p = locate_word(TEXT, "cat's", TOKENS, OFFSETS, SPECIAL)
    assert p.query_index == 6 and p.pieces == [" cat", "'s"] and "split" in p.notes[0]
    assert locate_word(TEXT, "the", TOKENS, OFFSETS, SPECIAL).query_index == 4  # exact case
    assert locate_word(TEXT, "TAIL", TOKENS, OFFSETS, SPECIAL).query_index == 8  # any case
    with pytest.raises(ValueError, match="word: 'dog' is not in the text's tokens"):
        locate_word(TEXT, "dog", TOKENS, OFFSETS, SPECIAL)
    with pytest.raises(ValueError, match="word: 'ca' is not"):  # whole words only
        locate_word(TEXT, "ca", TOKENS, OFFSETS, SPECIAL)
    with pytest.raises(ValueError, match="occurrence: 'cat' occurs 2 time"):
        locate_word(TEXT, "cat", TOKENS, OFFSETS, SPECIAL, occurrence=2)
    with pytest.raises(ValueError, match="word: expected a non-empty str"):
        locate_word(TEXT, " ", TOKENS, OFFSETS, SPECIAL)
