"""attnkit.explain: the seed walkthroughs, checked against NumPy float64 computed here.

Expected values are computed inside the tests from the formulas (never copied from the seed text
or from attnkit's output); the seed's *printed* numbers are read from attnkit's data only to
check the agreement flags, with the tolerance recomputed here from the printed text.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from attnkit import explain as ex

SEEDS = Path(__file__).resolve().parents[1].parent / "shared" / "seeds"
RTOL = 1e-10


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def close(a, b, rtol: float = RTOL) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and float(np.max(np.abs(a - b))) <= rtol * max(
        1.0, float(np.max(np.abs(b)))
    )


# ---------------------------------------------------------------------------------------------
# walkthrough (seed 000)
# ---------------------------------------------------------------------------------------------
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


def test_render_walkthrough_fits_100_columns():
    console = Console(width=100, record=True, color_system=None)
    ex.render_walkthrough(ex.walkthrough(), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "(4 × 512)" in text and "(512 × 512)" in text and "(4 × 4)" in text
    assert "] (512)" in text and "Checks" in text and "MISMATCH" not in text


def test_fmt_vector():
    a = np.arange(512) / 4
    assert ex.fmt_vector(a) == "[0.0000, 0.2500, 0.5000, ..., 127.7500] (512)"
    assert ex.fmt_vector([1.0, -2.0], decimals=1) == "[1.0, -2.0]"


# ---------------------------------------------------------------------------------------------
# seed examples: computed independently here
# ---------------------------------------------------------------------------------------------
def seed004_expected() -> dict[str, dict[str, float]]:
    """key -> {column: value}, from the formulas in seed 004, NumPy float64."""
    Q = np.array([[1.0, 0.0], [0.0, 1.0]])
    K = np.array([[1.0, 2.0], [3.0, 4.0]])
    V = np.array([[5.0, 6.0], [7.0, 8.0]])
    # additive: e_ij = v^T tanh(W_q Q_i + W_k K_j) with W_q = W_k = I, v = [1, 1]
    e = np.array([[np.tanh(Q[i] + K[j]).sum() for j in range(2)] for i in range(2)])
    a_add = softmax(e)
    s = Q @ K.T
    a_scaled, a_unscaled = softmax(s / math.sqrt(2)), softmax(s)
    lib, lib_s, lib_u, own = (
        "library",
        "library, ÷√d_k",
        "library, unscaled",
        "from seed's numbers",
    )
    own_add_w = softmax(np.array([1.0, 0.999]))  # from the seed's printed e11, e12
    own_add_out = np.array([0.5001, 0.4999]) @ V  # from the seed's printed alphas
    own_dot_out = np.array([0.1192, 0.8808]) @ V
    out = {
        "additive.e11": {lib: e[0, 0]},
        "additive.e12": {lib: e[0, 1]},
        "dot.e11": {lib_s: s[0, 0] / math.sqrt(2), lib_u: s[0, 0]},
        "dot.e12": {lib_s: s[0, 1] / math.sqrt(2), lib_u: s[0, 1]},
    }
    for j in range(2):
        out[f"additive.alpha1{j + 1}"] = {lib: a_add[0, j], own: own_add_w[j]}
        out[f"additive.out1{j + 1}"] = {lib: (a_add @ V)[0, j], own: own_add_out[j]}
        out[f"dot.alpha1{j + 1}"] = {lib_s: a_scaled[0, j], lib_u: a_unscaled[0, j]}
        out[f"dot.out1{j + 1}"] = {
            lib_s: (a_scaled @ V)[0, j],
            lib_u: (a_unscaled @ V)[0, j],
            own: own_dot_out[j],
        }
    return out


def printed_tolerance(printed: str) -> tuple[float, float]:
    """(value, tolerance) from the printed text: half a unit of the last printed decimal;
    exact for a symbolic k/√2."""
    m = re.fullmatch(r"(\d+)/√2", printed)
    if m:
        return int(m.group(1)) / math.sqrt(2), 1e-12
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return float(printed), 0.5 * 10.0**-decimals


def test_seed004_values_and_flags():
    d = ex.example_to_dict(ex.seed_example("seed004", SEEDS))
    expected = seed004_expected()
    assert sorted(v["key"] for v in d["values"]) == sorted(expected)
    for v in d["values"]:
        want = expected[v["key"]]
        assert set(v["computed"]) == set(want), v["key"]
        printed, tol = printed_tolerance(v["printed"])
        assert v["printed_value"] == pytest.approx(printed, abs=1e-15)
        for col, val in want.items():
            assert v["computed"][col] == pytest.approx(val, rel=RTOL, abs=1e-15), (v["key"], col)
            assert v["agrees"][col] == (abs(val - printed) <= tol + 1e-12), (v["key"], col)


def test_seed004_known_disagreements():
    """The facts the docs state, recomputed: additive e11 = 2 tanh 2 != 1; the printed dot
    weights are the UNscaled softmax; 6.7624 != 0.1192*5 + 0.8808*7."""
    d = {v["key"]: v for v in ex.example_to_dict(ex.seed_example("seed004", SEEDS))["values"]}
    assert d["additive.e11"]["computed"]["library"] == pytest.approx(2 * np.tanh(2.0), rel=1e-12)
    assert d["additive.e11"]["agrees"] == {"library": False}
    assert d["dot.alpha11"]["agrees"] == {"library, ÷√d_k": False, "library, unscaled": True}
    assert d["dot.alpha12"]["agrees"] == {"library, ÷√d_k": False, "library, unscaled": True}
    assert not any(d["dot.out11"]["agrees"].values())
    assert 0.1192 * 5 + 0.8808 * 7 == pytest.approx(6.7616, abs=1e-9)


def test_seed002_softmax():
    d = ex.example_to_dict(ex.seed_example("seed002", SEEDS))
    w = softmax(np.array([2.0, 1.0, 0.1]))
    flags = []
    for i, v in enumerate(d["values"]):
        assert v["computed"]["library"] == pytest.approx(w[i], rel=RTOL)
        printed, tol = printed_tolerance(v["printed"])
        assert v["agrees"]["library"] == (abs(w[i] - printed) <= tol + 1e-12)
        flags.append(v["agrees"]["library"])
    assert flags == [abs(w[i] - p) <= 0.005 for i, p in enumerate([0.65, 0.24, 0.11])]


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"seed files not found at {SEEDS} (../shared)")
@pytest.mark.parametrize("name", sorted(ex.EXAMPLES))
def test_snippets_occur_in_the_seed_files(name):
    prefix = {"seed004": "004_", "seed002": "002_"}[name]
    (seed_file,) = sorted(SEEDS.glob(prefix + "*.txt"))
    text = seed_file.read_text(encoding="utf-8")
    result = ex.seed_example(name, SEEDS)
    assert result.seed_file_found and Path(result.seed_file) == seed_file
    for c in result.comparisons:
        assert c.printed.snippet in text, c.printed.key
        if "√" not in c.printed.printed:  # a number as printed is part of its snippet
            assert c.printed.printed in c.printed.snippet, c.printed.key
        assert c.snippet_found is True
        assert text.splitlines()[c.seed_line - 1].find(c.printed.snippet) >= 0


def test_example_without_seed_files(tmp_path):
    result = ex.seed_example("seed004", tmp_path / "nowhere")
    assert not result.seed_file_found and result.seed_file is None
    assert all(c.snippet_found is None and c.seed_line is None for c in result.comparisons)
    console = Console(width=100, record=True, color_system=None)
    ex.render_example(result, console)
    assert "seed file not found" in console.export_text()


def test_unknown_example():
    with pytest.raises(ValueError, match="example"):
        ex.seed_example("seed999")


def test_render_example_fits_100_columns():
    console = Console(width=100, record=True, color_system=None)
    ex.render_example(ex.seed_example("seed004", SEEDS), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "0.1192" in text and "✗" in text and "✓" in text
