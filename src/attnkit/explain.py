"""The seed walkthroughs as data, computed by :mod:`attnkit.reference`, rendered for a terminal
(rich) or as JSON. The command-line front end is ``attnkit explain`` (:mod:`attnkit.cli`).

Two kinds of explanation:

* :func:`walkthrough` — seed 000's self-attention walkthrough ("humpty dumpty sat on"):
  seeded embeddings X (n, d_model) and projections W^Q (d_model, d_k), W^K (d_model, d_k),
  W^V (d_model, d_v); Q, K, V; one word's score row, ÷ sqrt(d_k), softmax, weighted sum; the
  matrix form for all words; and checks (one-word row vs matrix row, reference vs
  :func:`attnkit.functional.scaled_dot_product_attention` in float64).
* :func:`seed_example` — a seed's worked numbers (``"seed004"``: additive, scaled and unscaled
  dot-product on Q = [[1,0],[0,1]], K = [[1,2],[3,4]], V = [[5,6],[7,8]]; ``"seed002"``: the
  softmax of [2.0, 1.0, 0.1]) computed by the library, next to each value the seed prints, with
  the exact seed text it comes from and whether it agrees.

Seeded inputs (the documented procedure, reproducible with NumPy alone)::

    rng = numpy.random.default_rng(seed)
    vocab = distinct words in order of first occurrence; ids = index of each word in vocab
    E   = rng.standard_normal((len(vocab), d_model))        # one embedding per distinct word
    X   = E[ids]                                             # (n, d_model)
    W_q = rng.standard_normal((d_model, d_k)) / sqrt(d_model)
    W_k = rng.standard_normal((d_model, d_k)) / sqrt(d_model)
    W_v = rng.standard_normal((d_model, d_v)) / sqrt(d_model)

(The 1/sqrt(d_model) keeps the entries of Q, K, V near unit variance, so the scaled scores are
near unit variance too, as the ÷ sqrt(d_k) intends.)

Agreement with a printed value: the seed prints ``digits`` decimals, so a computed value agrees
when ``|computed - printed| <= 0.5 * 10**-digits`` (+1e-12); an exact printed value (such as
1/√2) must agree within 1e-12.

JSON (``attnkit explain --json``), schema ``attnkit.explain/1``; arrays are nested lists of
floats (row-major), NaN never occurs (``allow_nan=False``).

Walkthrough::

    {"schema": "attnkit.explain/1", "mode": "walkthrough",
     "sentence": str, "words": [str], "word": str, "position": int (0-based, first occurrence),
     "d_model": int, "d_k": int, "d_v": int, "seed": int, "rng": str (the procedure above),
     "full": bool, "preview": int | null, "truncated": bool,
     "shapes": {"inputs.x": [n, d_model], ...},   # the full shape of every array below
     "inputs": {"x", "w_q", "w_k", "w_v"},
     "projections": {"q", "k", "v"},
     "one_word": {"scores" (n,), "scaled" (n,), "weights" (n,), "weights_sum": float,
                  "weights_unscaled" (n,), "output" (d_v,)},
     "matrix": {"scores" (n, n), "scaled" (n, n), "weights" (n, n), "output" (n, d_v)},
     "checks": {"one_word_vs_matrix_max_abs_diff": float,
                "functional_output_max_abs_diff": float,
                "functional_weights_max_abs_diff": float}}

Unless ``full`` is true, every feature axis (of length d_model, d_k or d_v; never a word axis)
is cut to its first ``preview`` entries; ``shapes`` still gives the full shapes and
``truncated`` says whether anything was cut.

Seed example::

    {"schema": "attnkit.explain/1", "mode": "example", "example": "seed004", "title": str,
     "seed_file": str | null, "seed_file_found": bool, "seeds_dir": str,
     "inputs": {name: array}, "cases": {case: {field: array}},
     "values": [{"key", "section", "label", "printed", "printed_value", "digits" (int | null),
                 "tolerance", "snippet", "snippet_found" (bool | null), "seed_line" (int | null),
                 "computed": {column: float}, "agrees": {column: bool}}],
     "notes": [str]}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnkit import reference

__all__ = [
    "DEFAULT_SENTENCE",
    "EXAMPLES",
    "Comparison",
    "PrintedValue",
    "SeedExample",
    "Walkthrough",
    "default_seeds_dir",
    "example_to_dict",
    "make_inputs",
    "render_example",
    "render_walkthrough",
    "seed_example",
    "walkthrough",
    "walkthrough_to_dict",
]

DEFAULT_SENTENCE = "humpty dumpty sat on"
DEFAULT_D_MODEL = 512  # seed 000: 512-dimensional embeddings, 512 × 512 projections
DEFAULT_SEED = 0
MAX_D_MODEL = 2048
MAX_WORDS = 512
PREVIEW = 8  # JSON: feature axes are cut to this many leading entries unless full=True
SCHEMA = "attnkit.explain/1"
RNG_PROCEDURE = (
    "rng = numpy.random.default_rng(seed); E = rng.standard_normal((len(vocab), d_model)) "
    "with vocab = distinct words in order of first occurrence; X = E[ids]; then "
    "W_q = rng.standard_normal((d_model, d_k)) / sqrt(d_model), W_k likewise, "
    "W_v = rng.standard_normal((d_model, d_v)) / sqrt(d_model), drawn in this order"
)


def default_seeds_dir() -> Path:
    """``<repo root>/../shared/seeds`` when it exists (repo root = three levels above this file
    in a source checkout), else ``./../shared/seeds`` relative to the working directory."""
    repo_root = Path(__file__).resolve().parents[2]
    candidate = repo_root.parent / "shared" / "seeds"
    if candidate.is_dir():
        return candidate
    return Path("..") / "shared" / "seeds"


# =============================================================================================
# seed 000: the walkthrough
# =============================================================================================
def _positive_int(name: str, value: object, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected a positive int, got {value!r}")
    if not 0 < int(value) <= limit:
        raise ValueError(f"{name}: expected an int in [1, {limit}], got {value!r}")
    return int(value)


def make_inputs(
    words: Sequence[str], d_model: int, d_k: int, d_v: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeded float64 inputs by the documented procedure (module docstring).

    Returns:
        X (n, d_model), W_q (d_model, d_k), W_k (d_model, d_k), W_v (d_model, d_v).
    """
    vocab = list(dict.fromkeys(words))
    ids = [vocab.index(w) for w in words]
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((len(vocab), d_model))
    x = emb[ids]
    w_q = rng.standard_normal((d_model, d_k)) / math.sqrt(d_model)
    w_k = rng.standard_normal((d_model, d_k)) / math.sqrt(d_model)
    w_v = rng.standard_normal((d_model, d_v)) / math.sqrt(d_model)
    return x, w_q, w_k, w_v


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


@dataclass(frozen=True)
class Walkthrough:
    """Everything seed 000's walkthrough shows. Shapes: n words, d_model, d_k, d_v.

    ``x`` (n, d_model), ``w_q``/``w_k`` (d_model, d_k), ``w_v`` (d_model, d_v);
    ``trace``: the :func:`attnkit.reference.self_attention` trace (q, k, v, scores, scaled,
    weights, output); ``row_*``: the chosen word's step-by-step computation, (n,) each, and
    ``row_output`` (d_v,); ``check_*``: max abs differences.
    """

    sentence: str
    words: tuple[str, ...]
    word: str
    position: int
    d_model: int
    d_k: int
    d_v: int
    seed: int
    x: np.ndarray
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    trace: Any
    row_scores: np.ndarray
    row_scaled: np.ndarray
    row_weights: np.ndarray
    row_weights_unscaled: np.ndarray
    row_output: np.ndarray
    check_row_vs_matrix: float
    check_functional_output: float
    check_functional_weights: float


def walkthrough(
    sentence: str = DEFAULT_SENTENCE,
    word: str | None = None,
    d_model: int = DEFAULT_D_MODEL,
    d_k: int | None = None,
    d_v: int | None = None,
    seed: int = DEFAULT_SEED,
) -> Walkthrough:
    """Seed 000's walkthrough on ``sentence`` (whitespace tokenisation).

    Args:
        sentence: the words; at least one, at most ``MAX_WORDS``.
        word: the word whose attention row is computed step by step (its first occurrence);
            default the last word ("on" in the default sentence, as in seed 000).
        d_model: embedding width (seed 000: 512). d_k: query/key width, default d_model (seed
            000's 512 × 512 projections). d_v: value width, default d_k.
        seed: seed of ``numpy.random.default_rng`` (non-negative int).

    The matrix form comes from :func:`attnkit.reference.self_attention`; the one-word row is
    computed separately with the seed's per-word formulas (dot products, softmax, weighted sum
    of the V rows), and both are checked against each other and against
    :func:`attnkit.functional.scaled_dot_product_attention` in float64.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence: expected a str, got {type(sentence).__name__}")
    words = tuple(sentence.split())
    if not words:
        raise ValueError("sentence: expected at least one word, got an empty sentence")
    if len(words) > MAX_WORDS:
        raise ValueError(f"sentence: expected at most {MAX_WORDS} words, got {len(words)}")
    d_model = _positive_int("d_model", d_model, MAX_D_MODEL)
    d_k = d_model if d_k is None else _positive_int("d_k", d_k, MAX_D_MODEL)
    d_v = d_k if d_v is None else _positive_int("d_v", d_v, MAX_D_MODEL)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
    if word is None:
        word = words[-1]
    if word not in words:
        raise ValueError(
            f"word: {word!r} is not a word of the sentence; the words are: {', '.join(words)}"
        )
    pos = words.index(word)

    x, w_q, w_k, w_v = make_inputs(words, d_model, d_k, d_v, int(seed))
    tr = reference.self_attention(x, w_q, w_k, w_v)

    # the chosen word, step by step as in seed 000 section 3
    q_w = tr.q[pos]
    row_scores = np.array([float(np.dot(q_w, tr.k[j])) for j in range(len(words))])
    row_scaled = row_scores / math.sqrt(d_k)
    row_weights = _softmax(row_scaled)
    row_output = np.zeros(d_v)
    for j in range(len(words)):
        row_output = row_output + row_weights[j] * tr.v[j]
    row_weights_unscaled = _softmax(row_scores)

    diff_row = max(
        float(np.max(np.abs(row_weights - tr.weights[pos]))),
        float(np.max(np.abs(row_output - tr.output[pos]))),
    )
    f_out, f_w = _functional_check(tr.q, tr.k, tr.v)
    return Walkthrough(
        sentence=" ".join(words),
        words=words,
        word=word,
        position=pos,
        d_model=d_model,
        d_k=d_k,
        d_v=d_v,
        seed=int(seed),
        x=x,
        w_q=w_q,
        w_k=w_k,
        w_v=w_v,
        trace=tr,
        row_scores=row_scores,
        row_scaled=row_scaled,
        row_weights=row_weights,
        row_weights_unscaled=row_weights_unscaled,
        row_output=row_output,
        check_row_vs_matrix=diff_row,
        check_functional_output=float(np.max(np.abs(f_out - tr.output))),
        check_functional_weights=float(np.max(np.abs(f_w - tr.weights))),
    )


def _functional_check(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    """Output and weights of attnkit.functional.scaled_dot_product_attention in float64."""
    import torch

    from attnkit.functional import scaled_dot_product_attention

    out, w = scaled_dot_product_attention(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), return_weights=True
    )
    return out.numpy(), w.numpy()


def _cut(a: np.ndarray, feature_axes: Sequence[int], full: bool) -> tuple[list, bool]:
    if full:
        return a.tolist(), False
    index = [slice(None)] * a.ndim
    cut = False
    for ax in feature_axes:
        if a.shape[ax] > PREVIEW:
            index[ax] = slice(0, PREVIEW)
            cut = True
    return a[tuple(index)].tolist(), cut


def walkthrough_to_dict(w: Walkthrough, full: bool = False) -> dict:
    """The walkthrough as a JSON-ready dict (schema in the module docstring)."""
    tr = w.trace
    shapes: dict[str, list[int]] = {}
    any_cut = False

    def put(name: str, a: np.ndarray, feature_axes: Sequence[int]) -> list:
        nonlocal any_cut
        a = np.asarray(a, dtype=np.float64)
        shapes[name] = list(a.shape)
        data, cut = _cut(a, feature_axes, full)
        any_cut = any_cut or cut
        return data

    out = {
        "schema": SCHEMA,
        "mode": "walkthrough",
        "sentence": w.sentence,
        "words": list(w.words),
        "word": w.word,
        "position": w.position,
        "d_model": w.d_model,
        "d_k": w.d_k,
        "d_v": w.d_v,
        "seed": w.seed,
        "rng": RNG_PROCEDURE,
        "full": full,
        "preview": None if full else PREVIEW,
        "truncated": False,
        "shapes": shapes,
        "inputs": {
            "x": put("inputs.x", w.x, [1]),
            "w_q": put("inputs.w_q", w.w_q, [0, 1]),
            "w_k": put("inputs.w_k", w.w_k, [0, 1]),
            "w_v": put("inputs.w_v", w.w_v, [0, 1]),
        },
        "projections": {
            "q": put("projections.q", tr.q, [1]),
            "k": put("projections.k", tr.k, [1]),
            "v": put("projections.v", tr.v, [1]),
        },
        "one_word": {
            "scores": put("one_word.scores", w.row_scores, []),
            "scaled": put("one_word.scaled", w.row_scaled, []),
            "weights": put("one_word.weights", w.row_weights, []),
            "weights_sum": float(w.row_weights.sum()),
            "weights_unscaled": put("one_word.weights_unscaled", w.row_weights_unscaled, []),
            "output": put("one_word.output", w.row_output, [0]),
        },
        "matrix": {
            "scores": put("matrix.scores", tr.scores, []),
            "scaled": put("matrix.scaled", tr.scaled, []),
            "weights": put("matrix.weights", tr.weights, []),
            "output": put("matrix.output", tr.output, [1]),
        },
        "checks": {
            "one_word_vs_matrix_max_abs_diff": w.check_row_vs_matrix,
            "functional_output_max_abs_diff": w.check_functional_output,
            "functional_weights_max_abs_diff": w.check_functional_weights,
        },
    }
    out["truncated"] = any_cut
    return out


# =============================================================================================
# seed examples: printed values as data, with the exact seed text they come from
# =============================================================================================
@dataclass(frozen=True)
class PrintedValue:
    """One number a seed prints. ``snippet`` is the exact seed text it is read from.

    ``digits``: decimals printed (tolerance 0.5 * 10**-digits), or None for an exact value
    (tolerance 1e-12). ``compare``: (column label, case, field, index) — which computed values
    to put next to it; ``case`` names an entry of the example's computed cases.
    """

    key: str
    section: str
    label: str
    printed: str
    value: float
    digits: int | None
    snippet: str
    compare: tuple[tuple[str, str, str, tuple[int, ...]], ...]

    @property
    def tolerance(self) -> float:
        return 1e-12 if self.digits is None else 0.5 * 10.0**-self.digits + 1e-12


@dataclass(frozen=True)
class Comparison:
    """A printed value next to the computed ones: ``computed`` and ``agrees`` by column."""

    printed: PrintedValue
    computed: dict[str, float]
    agrees: dict[str, bool]
    snippet_found: bool | None
    seed_line: int | None


@dataclass(frozen=True)
class SeedExample:
    """A seed's worked example computed by the library and compared with what the seed prints."""

    name: str
    title: str
    seed_file: str | None
    seed_file_found: bool
    seeds_dir: str
    inputs: dict[str, np.ndarray]
    cases: dict[str, dict[str, np.ndarray]]
    comparisons: tuple[Comparison, ...]
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class _ExampleSpec:
    title: str
    file_glob: str
    compute: Callable[[], tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]]
    values: tuple[PrintedValue, ...]
    notes: Callable[[dict[str, dict[str, np.ndarray]]], list[str]]


def _fields(tr: Any) -> dict[str, np.ndarray]:
    out = {}
    for name in ("scores", "scaled", "weights", "output"):
        val = getattr(tr, name, None)
        if val is not None:
            out[name] = np.asarray(val, dtype=np.float64)
    if "scaled" not in out:
        out["scaled"] = out["scores"]
    return out


# --- seed 004 --------------------------------------------------------------------------------
_S4_Q = [[1.0, 0.0], [0.0, 1.0]]
_S4_K = [[1.0, 2.0], [3.0, 4.0]]
_S4_V = [[5.0, 6.0], [7.0, 8.0]]
# the seed's own printed intermediates, used to re-check its later arithmetic
_S4_ADD_E = [1.0, 0.999]
_S4_ADD_W = [0.5001, 0.4999]
_S4_DOT_W = [0.1192, 0.8808]


def _seed004_compute() -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    q, k, v = np.array(_S4_Q), np.array(_S4_K), np.array(_S4_V)
    eye, w_v = np.eye(2), np.ones(2)
    inputs = {"Q": q, "K": k, "V": v, "W_q": eye, "W_k": eye, "w_v": w_v}
    cases = {
        "scaled": _fields(reference.scaled_dot_product(q, k, v)),
        "unscaled": _fields(reference.dot_product(q, k, v)),
        "additive": _fields(reference.additive(q, k, v, eye, eye, w_v)),
    }
    # re-doing the seed's later steps from its own printed earlier numbers (row Q_1 only)
    cases["seed_additive"] = {
        "weights": reference.softmax_rows(np.array([_S4_ADD_E])),
        "output": np.array(_S4_ADD_W)[None, :] @ v,
    }
    cases["seed_dot"] = {"output": np.array(_S4_DOT_W)[None, :] @ v}
    return inputs, cases


_ADD = "additive, W_q = W_k = I, v = [1, 1]"
_DOT = "dot-product, d_k = 2"
_LIB = "library"
_LIB_S = "library, ÷√d_k"
_LIB_U = "library, unscaled"
_OWN = "from seed's numbers"

_SEED004_VALUES = (
    PrintedValue(
        "additive.e11", _ADD, "e11", "1", 1.0, 0,
        r"\begin{bmatrix} 1 & 0 \\ 0 & 1 \end{bmatrix} \begin{bmatrix} 1 \\ 2 \end{bmatrix}"
        r"\right) = 1",
        ((_LIB, "additive", "scores", (0, 0)),),
    ),
    PrintedValue(
        "additive.e12", _ADD, "e12", "0.999", 0.999, 3,
        r"\tanh\left(\begin{bmatrix} 4 \\ 4 \end{bmatrix}\right) \approx 0.999",
        ((_LIB, "additive", "scores", (0, 1)),),
    ),
    PrintedValue(
        "additive.alpha11", _ADD, "α11", "0.5001", 0.5001, 4,
        r"\alpha_{11} = \frac{\exp(1)}{\exp(1) + \exp(0.999)} \approx 0.5001",
        ((_LIB, "additive", "weights", (0, 0)), (_OWN, "seed_additive", "weights", (0, 0))),
    ),
    PrintedValue(
        "additive.alpha12", _ADD, "α12", "0.4999", 0.4999, 4,
        r"\alpha_{12} = \frac{\exp(0.999)}{\exp(1) + \exp(0.999)} \approx 0.4999",
        ((_LIB, "additive", "weights", (0, 1)), (_OWN, "seed_additive", "weights", (0, 1))),
    ),
    PrintedValue(
        "additive.out11", _ADD, "Attention(Q1)[1]", "6", 6.0, 0,
        r"\approx \begin{bmatrix} 6 & 7 \end{bmatrix}",
        ((_LIB, "additive", "output", (0, 0)), (_OWN, "seed_additive", "output", (0, 0))),
    ),
    PrintedValue(
        "additive.out12", _ADD, "Attention(Q1)[2]", "7", 7.0, 0,
        r"\approx \begin{bmatrix} 6 & 7 \end{bmatrix}",
        ((_LIB, "additive", "output", (0, 1)), (_OWN, "seed_additive", "output", (0, 1))),
    ),
    PrintedValue(
        "dot.e11", _DOT, "e11", "1/√2", 1.0 / math.sqrt(2.0), None,
        r"e_{11} = \frac{1 \cdot 1 + 0 \cdot 2}{\sqrt{2}} = \frac{1}{\sqrt{2}}",
        ((_LIB_S, "scaled", "scaled", (0, 0)), (_LIB_U, "unscaled", "scaled", (0, 0))),
    ),
    PrintedValue(
        "dot.e12", _DOT, "e12", "3/√2", 3.0 / math.sqrt(2.0), None,
        r"e_{12} = \frac{1 \cdot 3 + 0 \cdot 4}{\sqrt{2}} = \frac{3}{\sqrt{2}}",
        ((_LIB_S, "scaled", "scaled", (0, 1)), (_LIB_U, "unscaled", "scaled", (0, 1))),
    ),
    PrintedValue(
        "dot.alpha11", _DOT, "α11", "0.1192", 0.1192, 4,
        r"\exp(\frac{3}{\sqrt{2}})} \approx 0.1192",
        ((_LIB_S, "scaled", "weights", (0, 0)), (_LIB_U, "unscaled", "weights", (0, 0))),
    ),
    PrintedValue(
        "dot.alpha12", _DOT, "α12", "0.8808", 0.8808, 4,
        r"\exp(\frac{3}{\sqrt{2}})} \approx 0.8808",
        ((_LIB_S, "scaled", "weights", (0, 1)), (_LIB_U, "unscaled", "weights", (0, 1))),
    ),
    PrintedValue(
        "dot.out11", _DOT, "Attention(Q1)[1]", "6.7624", 6.7624, 4,
        r"\approx \begin{bmatrix} 6.7624 & 7.7624 \end{bmatrix}",
        (
            (_LIB_S, "scaled", "output", (0, 0)),
            (_LIB_U, "unscaled", "output", (0, 0)),
            (_OWN, "seed_dot", "output", (0, 0)),
        ),
    ),
    PrintedValue(
        "dot.out12", _DOT, "Attention(Q1)[2]", "7.7624", 7.7624, 4,
        r"\approx \begin{bmatrix} 6.7624 & 7.7624 \end{bmatrix}",
        (
            (_LIB_S, "scaled", "output", (0, 1)),
            (_LIB_U, "unscaled", "output", (0, 1)),
            (_OWN, "seed_dot", "output", (0, 1)),
        ),
    ),
)  # fmt: skip


def _seed004_notes(cases: dict[str, dict[str, np.ndarray]]) -> list[str]:
    add, sc, un = cases["additive"], cases["scaled"], cases["unscaled"]
    own_w = cases["seed_additive"]["weights"][0]
    own_dot = cases["seed_dot"]["output"][0]
    return [
        "additive e11: v^T tanh(W_q q_1 + W_k k_1) = [1, 1]·tanh([2, 2]) = 2·tanh(2) = "
        f"{add['scores'][0, 0]:.6f}; the seed prints 1.",
        "additive e12: [1, 1]·tanh([4, 4]) = 2·tanh(4) = "
        f"{add['scores'][0, 1]:.6f}; the seed prints 0.999 = tanh(4), one component only.",
        f"additive α11, α12 from the seed's own e11 = 1, e12 = 0.999 are {own_w[0]:.5f}, "
        f"{own_w[1]:.5f}, not 0.5001, 0.4999; from the computed e they are "
        f"{add['weights'][0, 0]:.4f}, {add['weights'][0, 1]:.4f}.",
        "dot-product α11, α12: the seed prints softmax of the UNscaled scores [1, 3] "
        f"({un['weights'][0, 0]:.4f}, {un['weights'][0, 1]:.4f}) although its formula divides "
        f"by √2, which gives {sc['weights'][0, 0]:.4f}, {sc['weights'][0, 1]:.4f}.",
        f"dot-product output: 0.1192·[5, 6] + 0.8808·[7, 8] = [{own_dot[0]:.4f}, "
        f"{own_dot[1]:.4f}], not the printed [6.7624, 7.7624]; the scaled attention gives "
        f"[{sc['output'][0, 0]:.4f}, {sc['output'][0, 1]:.4f}], the unscaled "
        f"[{un['output'][0, 0]:.4f}, {un['output'][0, 1]:.4f}].",
    ]


# --- seed 002 --------------------------------------------------------------------------------
_S2_SCORES = [2.0, 1.0, 0.1]
_S2_SNIPPET = "假设三个位置的分数为[2.0, 1.0, 0.1],经过softmax后变为[0.65, 0.24, 0.11]"


def _seed002_compute() -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    scores = np.array([_S2_SCORES])
    return {"scores": scores}, {"softmax": {"weights": reference.softmax_rows(scores)}}


_SM = "softmax([2.0, 1.0, 0.1])"
_SEED002_VALUES = tuple(
    PrintedValue(
        f"softmax.{i}", _SM, f"softmax[{i}]", text, float(text), 2, _S2_SNIPPET,
        ((_LIB, "softmax", "weights", (0, i)),),
    )
    for i, text in enumerate(["0.65", "0.24", "0.11"])
)  # fmt: skip


def _seed002_notes(cases: dict[str, dict[str, np.ndarray]]) -> list[str]:
    w = cases["softmax"]["weights"][0]
    return [
        f"softmax([2.0, 1.0, 0.1]) = [{w[0]:.4f}, {w[1]:.4f}, {w[2]:.4f}], i.e. "
        f"[{w[0]:.2f}, {w[1]:.2f}, {w[2]:.2f}] to two decimals; the seed prints "
        "[0.65, 0.24, 0.11] (which sums to 1.00, but the first and last entries are off)."
    ]


EXAMPLES: dict[str, _ExampleSpec] = {
    "seed004": _ExampleSpec(
        title="Seed 004: additive vs dot-product attention, worked numbers (row Q_1)",
        file_glob="004_*.txt",
        compute=_seed004_compute,
        values=_SEED004_VALUES,
        notes=_seed004_notes,
    ),
    "seed002": _ExampleSpec(
        title="Seed 002: the softmax example",
        file_glob="002_*.txt",
        compute=_seed002_compute,
        values=_SEED002_VALUES,
        notes=_seed002_notes,
    ),
}


def _find_seed_file(seeds_dir: Path | None, pattern: str) -> Path | None:
    if seeds_dir is None or not seeds_dir.is_dir():
        return None
    hits = sorted(seeds_dir.glob(pattern))
    return hits[0] if hits else None


def seed_example(name: str = "seed004", seeds_dir: Path | str | None = None) -> SeedExample:
    """Compute example ``name`` (a key of :data:`EXAMPLES`) and compare with the seed.

    ``seeds_dir``: the directory holding the seed files (default :func:`default_seeds_dir`).
    When the seed file is missing the comparison still runs on the embedded values and
    snippets; ``snippet_found`` / ``seed_line`` are then None.
    """
    if name not in EXAMPLES:
        raise ValueError(f"example: expected one of {sorted(EXAMPLES)}, got {name!r}")
    spec = EXAMPLES[name]
    seeds_path = default_seeds_dir() if seeds_dir is None else Path(seeds_dir)
    seed_file = _find_seed_file(seeds_path, spec.file_glob)
    text = seed_file.read_text(encoding="utf-8") if seed_file is not None else None
    inputs, cases = spec.compute()

    comparisons = []
    for pv in spec.values:
        computed, agrees = {}, {}
        for column, case, fld, index in pv.compare:
            val = float(cases[case][fld][index])
            computed[column] = val
            agrees[column] = bool(abs(val - pv.value) <= pv.tolerance)
        found, line = None, None
        if text is not None:
            at = text.find(pv.snippet)
            found = at >= 0
            line = text.count("\n", 0, at) + 1 if found else None
        comparisons.append(Comparison(pv, computed, agrees, found, line))
    return SeedExample(
        name=name,
        title=spec.title,
        seed_file=str(seed_file) if seed_file is not None else None,
        seed_file_found=seed_file is not None,
        seeds_dir=str(seeds_path),
        inputs=inputs,
        cases=cases,
        comparisons=tuple(comparisons),
        notes=tuple(spec.notes(cases)),
    )


def example_to_dict(ex: SeedExample) -> dict:
    """The example as a JSON-ready dict (schema in the module docstring)."""
    return {
        "schema": SCHEMA,
        "mode": "example",
        "example": ex.name,
        "title": ex.title,
        "seed_file": ex.seed_file,
        "seed_file_found": ex.seed_file_found,
        "seeds_dir": ex.seeds_dir,
        "inputs": {k: np.asarray(a).tolist() for k, a in ex.inputs.items()},
        "cases": {
            c: {f: np.asarray(a).tolist() for f, a in flds.items()} for c, flds in ex.cases.items()
        },
        "values": [
            {
                "key": c.printed.key,
                "section": c.printed.section,
                "label": c.printed.label,
                "printed": c.printed.printed,
                "printed_value": c.printed.value,
                "digits": c.printed.digits,
                "tolerance": c.printed.tolerance,
                "snippet": c.printed.snippet,
                "snippet_found": c.snippet_found,
                "seed_line": c.seed_line,
                "computed": c.computed,
                "agrees": c.agrees,
            }
            for c in ex.comparisons
        ],
        "notes": list(ex.notes),
    }


# =============================================================================================
# rendering (rich)
# =============================================================================================
def fmt_vector(a: Sequence[float] | np.ndarray, decimals: int = 4, head: int = 3) -> str:
    """``[v0, v1, v2, ..., v_last] (n)`` for long vectors, all entries for short ones."""
    a = np.asarray(a, dtype=np.float64).ravel()
    f = [f"{x:.{decimals}f}" for x in a] if a.size <= head + 3 else None
    if f is not None:
        return "[" + ", ".join(f) + "]"
    parts = [f"{x:.{decimals}f}" for x in a[:head]] + ["...", f"{a[-1]:.{decimals}f}"]
    return "[" + ", ".join(parts) + f"] ({a.size})"


def _shape(a: np.ndarray) -> str:
    return "(" + " × ".join(str(s) for s in np.shape(a)) + ")"


def _matrix_table(title: str, m: np.ndarray, rows: Sequence[str], cols: Sequence[str] | None):
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("", style="bold")
    if cols is not None:
        for c in cols:
            t.add_column(c, justify="right")
        for r, vals in zip(rows, m, strict=True):
            t.add_row(r, *[f"{x:.4f}" for x in vals])
    else:
        t.add_column("row")
        for r, vals in zip(rows, m, strict=True):
            t.add_row(r, fmt_vector(vals))
    return t


_MAX_TABLE_WORDS = 8  # a (n × n) matrix is shown as a table up to this n, else row by row


def _square(console, title: str, m: np.ndarray, words: Sequence[str]) -> None:
    cols = list(words) if len(words) <= _MAX_TABLE_WORDS else None
    console.print(_matrix_table(title, m, words, cols))


def render_walkthrough(w: Walkthrough, console) -> None:
    """Print the walkthrough to a ``rich.console.Console``, shapes at every step."""
    from rich.panel import Panel
    from rich.table import Table

    tr, words, n = w.trace, w.words, len(w.words)
    labels = [f"{i + 1} {wd}" for i, wd in enumerate(words)]
    console.print(
        Panel(
            f"[bold]Self-attention, step by step[/] (seed 000)\n"
            f"sentence: [cyan]{w.sentence}[/]   n = {n} words\n"
            f"d_model = {w.d_model}, d_k = {w.d_k}, d_v = {w.d_v}, seed = {w.seed}\n"
            "[dim]inputs: numpy.random.default_rng(seed); one N(0, 1) embedding per distinct "
            "word; W ~ N(0, 1)/sqrt(d_model)[/]",
            expand=False,
        )
    )
    console.rule("[bold]1. Embeddings and projections")
    console.print(f"X = embeddings, one row per word {_shape(w.x)}")
    console.print(_matrix_table("", w.x, labels, None))
    console.print(
        f"W^Q {_shape(w.w_q)}   W^K {_shape(w.w_k)}   W^V {_shape(w.w_v)}   (seeded, fixed)"
    )
    for name, mat, wmat in (("Q", tr.q, w.w_q), ("K", tr.k, w.w_k), ("V", tr.v, w.w_v)):
        console.print(f"{name} = X W^{name}   {_shape(w.x)} @ {_shape(wmat)} -> {_shape(mat)}")
        console.print(_matrix_table("", mat, labels, None))

    p, wd = w.position, w.word
    console.rule(f"[bold]2. One word: '{wd}' (word {p + 1} of {n})")
    sq = math.sqrt(w.d_k)
    t = Table(show_edge=False, pad_edge=False)
    t.add_column("key word")
    t.add_column(f"Q_{wd} · K_j", justify="right")
    t.add_column(f"÷ √d_k = ÷ {sq:.4f}", justify="right")
    t.add_column("softmax weight", justify="right")
    t.add_column("(without ÷ √d_k)", justify="right", style="dim")
    for j in range(n):
        t.add_row(
            labels[j],
            f"{w.row_scores[j]:.4f}",
            f"{w.row_scaled[j]:.4f}",
            f"{w.row_weights[j]:.6f}",
            f"{w.row_weights_unscaled[j]:.6f}",
        )
    console.print(
        f"scores: Q_{wd} {_shape(tr.q[p])} · each K_j {_shape(tr.k[0])} -> {n} numbers; "
        f"÷ √d_k; softmax"
    )
    console.print(t)
    s = float(w.row_weights.sum())
    console.print(f"weights sum to {s:.15f} (|sum - 1| = {abs(s - 1):.1e})")
    console.print(
        f"output_{wd} = Σ_j w_j V_j   {n} weights × V {_shape(tr.v)} -> {_shape(w.row_output)}"
    )
    console.print(f"  {fmt_vector(w.row_output)}")

    console.rule("[bold]3. Matrix form, all words at once")
    console.print(f"scores = Q Kᵀ   {_shape(tr.q)} @ {_shape(tr.k.T)} -> {_shape(tr.scores)}")
    _square(console, "", tr.scores, words)
    console.print(f"scaled = scores / √d_k   {_shape(tr.scaled)}")
    _square(console, "", tr.scaled, words)
    console.print(f"weights = softmax(scaled), row by row   {_shape(tr.weights)}")
    _square(console, "", tr.weights, words)
    sums = tr.weights.sum(axis=-1)
    console.print(f"row sums: {fmt_vector(sums, decimals=12)}")
    shapes = f"{_shape(tr.weights)} @ {_shape(tr.v)} -> {_shape(tr.output)}"
    console.print(f"output = weights V   {shapes}")
    console.print(_matrix_table("", tr.output, labels, None))

    console.rule("[bold]4. Checks")
    ok = "[green]ok[/]"
    bad = "[red]MISMATCH[/]"
    tol = 1e-10 * max(1.0, float(np.max(np.abs(tr.output))))
    console.print(
        f"row {p + 1} of the matrix form vs the one-word computation: max abs diff "
        f"{w.check_row_vs_matrix:.2e} {ok if w.check_row_vs_matrix <= tol else bad}"
    )
    for what, d in (("output", w.check_functional_output), ("weights", w.check_functional_weights)):
        console.print(
            f"functional.scaled_dot_product_attention (torch, float64) vs reference, {what}: "
            f"max abs diff {d:.2e} {ok if d <= tol else bad}"
        )


def render_example(ex: SeedExample, console) -> None:
    """Print a seed example: per section a table of printed vs computed values."""
    from rich.table import Table

    console.rule(f"[bold]{ex.title}")
    if ex.seed_file_found:
        console.print(f"seed file: {ex.seed_file}")
    else:
        console.print(
            f"[yellow]seed file not found[/] in {ex.seeds_dir} (see --seeds); comparing with the "
            "values and text snippets embedded in attnkit"
        )
    for name, a in ex.inputs.items():
        console.print(f"{name} = {np.asarray(a).tolist()}")
    sections: dict[str, list[Comparison]] = {}
    for c in ex.comparisons:
        sections.setdefault(c.printed.section, []).append(c)
    for section, comps in sections.items():
        columns = list(dict.fromkeys(col for c in comps for col in c.computed))
        t = Table(title=section, title_justify="left", show_edge=False, pad_edge=False)
        t.add_column("value")
        t.add_column("seed prints", justify="right")
        for col in columns:
            t.add_column(col, justify="right")
        t.add_column("seed line", justify="right", style="dim")
        for c in comps:
            cells = []
            for col in columns:
                if col not in c.computed:
                    cells.append("")
                    continue
                mark = "[green]✓[/]" if c.agrees[col] else "[red]✗[/]"
                cells.append(f"{c.computed[col]:.6f} {mark}")
            if c.snippet_found is None:
                where = "—"
            else:
                where = str(c.seed_line) if c.snippet_found else "[red]not found[/]"
            t.add_row(c.printed.label, c.printed.printed, *cells, where)
        console.print(t)
    console.print(
        "[dim]✓ = agrees within half a unit of the last digit the seed prints "
        "(exact values: 1e-12)[/]"
    )
    if ex.notes:
        console.rule("[bold]Findings")
        for note in ex.notes:
            console.print(f"• {note}")
