"""attnkit.explain.walkthrough: seed 000's walkthrough and its JSON form, checked against NumPy
float64 computed here (expected values from the formulas, never copied from attnkit's output)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit import explain as ex

RTOL = 1e-10


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def close(a, b, rtol: float = RTOL) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and float(np.max(np.abs(a - b))) <= rtol * max(
        1.0, float(np.max(np.abs(b)))
    )


def test_default_walkthrough_matches_numpy():
    w = ex.walkthrough()
    assert w.words == ("humpty", "dumpty", "sat", "on") and w.word == "on" and w.position == 3
    assert (w.d_model, w.d_k, w.d_v) == (512, 512, 512)
    assert w.x.shape == (4, 512) and w.w_q.shape == w.w_k.shape == w.w_v.shape == (512, 512)
    q, k, v = w.x @ w.w_q, w.x @ w.w_k, w.x @ w.w_v
    scores = q @ k.T
    weights = softmax(scores / math.sqrt(512))
    out = weights @ v
    tr = w.trace
    assert close(tr.q, q) and close(tr.k, k) and close(tr.v, v)
    assert close(tr.scores, scores) and close(tr.weights, weights) and close(tr.output, out)
    # the one-word computation
    assert close(w.row_scores, scores[3]) and close(w.row_scaled, scores[3] / math.sqrt(512))
    assert close(w.row_weights, weights[3]) and close(w.row_output, out[3])
    assert close(w.row_weights_unscaled, softmax(scores[3]))
    assert abs(w.row_weights.sum() - 1.0) <= 1e-12
    assert w.check_row_vs_matrix <= 1e-12
    assert w.check_functional_output <= 1e-10 and w.check_functional_weights <= 1e-10


def test_inputs_follow_the_documented_procedure():
    words = "the cat saw the dog".split()
    x, w_q, w_k, w_v = ex.make_inputs(words, 7, 5, 3, seed=11)
    rng = np.random.default_rng(11)
    emb = rng.standard_normal((4, 7))  # vocab: the, cat, saw, dog
    assert np.array_equal(x, emb[[0, 1, 2, 0, 3]])
    assert np.array_equal(w_q, rng.standard_normal((7, 5)) / math.sqrt(7))
    assert np.array_equal(w_k, rng.standard_normal((7, 5)) / math.sqrt(7))
    assert np.array_equal(w_v, rng.standard_normal((7, 3)) / math.sqrt(7))


@pytest.mark.parametrize(
    "sentence, word, d_model, d_k, d_v, seed",
    [
        ("one", None, 1, None, None, 0),
        ("the cat saw the dog", "the", 7, 5, 3, 3),
        ("a b c d e f g h i j k", "f", 97, 13, 1, 42),
    ],
)
def test_walkthrough_odd_sizes(sentence, word, d_model, d_k, d_v, seed):
    w = ex.walkthrough(sentence, word, d_model, d_k, d_v, seed)
    words = sentence.split()
    d_k = d_model if d_k is None else d_k
    d_v = d_k if d_v is None else d_v
    pos = words.index(word) if word is not None else len(words) - 1
    assert w.position == pos
    q, k, v = w.x @ w.w_q, w.x @ w.w_k, w.x @ w.w_v
    assert q.shape == (len(words), d_k) and v.shape == (len(words), d_v)
    weights = softmax(q @ k.T / math.sqrt(d_k))
    assert close(w.trace.output, weights @ v)
    assert close(w.row_output, (weights @ v)[pos]) and close(w.row_weights, weights[pos])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(word="off"), "word"),
        (dict(sentence="   "), "sentence"),
        (dict(d_model=0), "d_model"),
        (dict(d_model=-4), "d_model"),
        (dict(d_k=0), "d_k"),
        (dict(d_v=ex.MAX_D_MODEL + 1), "d_v"),
        (dict(seed=-1), "seed"),
    ],
)
def test_walkthrough_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ex.walkthrough(**kwargs)


def test_walkthrough_bad_word_lists_the_words():
    with pytest.raises(ValueError, match="humpty, dumpty, sat, on"):
        ex.walkthrough(word="the")


def test_walkthrough_json_truncation():
    w = ex.walkthrough(d_model=20, d_k=9, d_v=11)
    full, cut = ex.walkthrough_to_dict(w, full=True), ex.walkthrough_to_dict(w)
    assert full["truncated"] is False and full["preview"] is None
    assert cut["truncated"] is True and cut["preview"] == ex.PREVIEW == 8
    assert full["shapes"] == cut["shapes"]
    assert cut["shapes"]["inputs.w_v"] == [20, 11] and cut["shapes"]["matrix.output"] == [4, 11]
    assert np.shape(cut["inputs"]["w_v"]) == (8, 8) and np.shape(cut["inputs"]["x"]) == (4, 8)
    assert np.shape(cut["matrix"]["weights"]) == (4, 4)  # word axes are never cut
    assert np.array_equal(np.array(full["inputs"]["w_q"])[:8, :8], cut["inputs"]["w_q"])
    for name, shape in full["shapes"].items():
        section, key = name.split(".")
        assert list(np.shape(full[section][key])) == shape
    # small widths: nothing to cut
    assert ex.walkthrough_to_dict(ex.walkthrough(d_model=8))["truncated"] is False
