"""attnkit.explain.seed_examples: the seeds' worked examples computed by the library, checked
against NumPy float64 computed here.

Expected values are computed inside the tests from the formulas (never copied from the seed text
or from attnkit's output); the seed's *printed* numbers are read from attnkit's data only to
check the agreement flags, with the tolerance recomputed here from the printed text.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from attnkit import explain as ex
from attnkit.explain.shared import shared_dir

SEEDS = shared_dir() / "seeds"
RTOL = 1e-10


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


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
        "from the tutorial's numbers",
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
    d = ex.example_to_dict(ex.seed_example("bahdanau-vs-dot", SEEDS))
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
    values = ex.example_to_dict(ex.seed_example("bahdanau-vs-dot", SEEDS))["values"]
    d = {v["key"]: v for v in values}
    assert d["additive.e11"]["computed"]["library"] == pytest.approx(2 * np.tanh(2.0), rel=1e-12)
    assert d["additive.e11"]["agrees"] == {"library": False}
    assert d["dot.alpha11"]["agrees"] == {"library, ÷√d_k": False, "library, unscaled": True}
    assert d["dot.alpha12"]["agrees"] == {"library, ÷√d_k": False, "library, unscaled": True}
    assert not any(d["dot.out11"]["agrees"].values())
    assert 0.1192 * 5 + 0.8808 * 7 == pytest.approx(6.7616, abs=1e-9)


def test_seed002_softmax():
    d = ex.example_to_dict(ex.seed_example("softmax", SEEDS))
    w = softmax(np.array([2.0, 1.0, 0.1]))
    flags = []
    for i, v in enumerate(d["values"]):
        assert v["computed"]["library"] == pytest.approx(w[i], rel=RTOL)
        printed, tol = printed_tolerance(v["printed"])
        assert v["agrees"]["library"] == (abs(w[i] - printed) <= tol + 1e-12)
        flags.append(v["agrees"]["library"])
    assert flags == [abs(w[i] - p) <= 0.005 for i, p in enumerate([0.65, 0.24, 0.11])]


def test_example_without_seed_files(tmp_path):
    result = ex.seed_example("bahdanau-vs-dot", tmp_path / "nowhere")
    assert not result.seed_file_found and result.seed_file is None
    assert all(c.snippet_found is None and c.seed_line is None for c in result.comparisons)


def test_unknown_example():
    with pytest.raises(ValueError, match="example"):
        ex.seed_example("seed999")


def test_seed_file_that_is_a_directory_or_not_utf8(tmp_path):
    (tmp_path / "004_x.txt").mkdir()
    with pytest.raises(ValueError, match=r"^seeds_dir: .*004_x\.txt is not a regular file"):
        ex.seed_example("bahdanau-vs-dot", tmp_path)
    (tmp_path / "004_x.txt").rmdir()
    (tmp_path / "004_x.txt").write_bytes(b"ok\n\xff")
    with pytest.raises(ValueError, match=r"^seeds_dir: .*004_x\.txt is not UTF-8"):
        ex.seed_example("bahdanau-vs-dot", tmp_path)
