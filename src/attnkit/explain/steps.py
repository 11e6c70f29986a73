"""The walkthrough: self-attention step by step on a sentence (after seed 000, "humpty dumpty
sat on") as data: seeded inputs, the chosen word's row step by step, the matrix form, and
checks; and its JSON form.

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

The JSON schema (``attnkit.explain/1``) is documented in :mod:`attnkit.explain`. Rendering for a
terminal is in :mod:`attnkit.explain.render`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnkit import reference
from attnkit.checks import integer, nonnegative_int
from attnkit.explain.catalog import DEFAULT_D_MODEL, DEFAULT_SEED, DEFAULT_SENTENCE

__all__ = [
    "DEFAULT_D_MODEL",
    "DEFAULT_SEED",
    "DEFAULT_SENTENCE",
    "MAX_D_MODEL",
    "MAX_WORDS",
    "PREVIEW",
    "RNG_PROCEDURE",
    "SCHEMA",
    "Walkthrough",
    "make_inputs",
    "walkthrough",
    "walkthrough_to_dict",
]

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
    d_model = integer("d_model", d_model, 1, MAX_D_MODEL)
    d_k = d_model if d_k is None else integer("d_k", d_k, 1, MAX_D_MODEL)
    d_v = d_k if d_v is None else integer("d_v", d_v, 1, MAX_D_MODEL)
    seed = nonnegative_int("seed", seed)
    if word is None:
        word = words[-1]
    if word not in words:
        raise ValueError(
            f"word: {word!r} is not a word of the sentence; the words are: {', '.join(words)}"
        )
    pos = words.index(word)

    x, w_q, w_k, w_v = make_inputs(words, d_model, d_k, d_v, seed)
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
        seed=seed,
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
    """The walkthrough as a JSON-ready dict (schema ``attnkit.explain/1``, documented in
    :mod:`attnkit.explain`). ``full=False`` cuts feature axes to their first ``PREVIEW`` entries."""
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
