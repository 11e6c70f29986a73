"""Self-attention step by step, the tutorials' worked examples, and a real model's attention,
explained: computed by :mod:`attnkit.reference` (or the model), rendered for a terminal (rich)
or as JSON. The command-line front end is ``attnkit explain`` (:mod:`attnkit.cli.explain`). The
project calls the five blog posts on attention it follows its *seeds* (numbered 000 to 004);
the names below keep that word.

Every public name is imported on first use (:mod:`attnkit.lazy`), so that ``attnkit explain
--help`` imports neither numpy nor torch. One concept per module:

* :mod:`.catalog` — the walkthrough's defaults and the examples' names, no heavy import.
* :mod:`.steps` — :func:`walkthrough`: self-attention step by step on a sentence (default
  "humpty dumpty sat on", after seed 000): seeded embeddings X (n, d_model) and projections W^Q
  (d_model, d_k), W^K (d_model, d_k), W^V (d_model, d_v); Q, K, V; one word's score row,
  ÷ sqrt(d_k), softmax, weighted sum; the matrix form for all words; and checks (one-word row vs
  matrix row, reference vs :func:`attnkit.functional.scaled_dot_product_attention` in float64).
* :mod:`.printed_values` — the numbers the tutorials print, as data, with the exact text each
  comes from.
* :mod:`.seed_examples` — :func:`seed_example`: a tutorial's worked numbers
  (``"bahdanau-vs-dot"``: additive, scaled and unscaled dot-product on Q = [[1,0],[0,1]],
  K = [[1,2],[3,4]], V = [[5,6],[7,8]]; ``"softmax"``: the softmax of [2.0, 1.0, 0.1]) computed
  by the library, next to each value the tutorial prints, and whether it agrees. The texts ship
  in ``explain/texts/``.
* :mod:`.model_attention` — what a real (BERT-style) model's heads attend to for one word
  (needs torch and the model).
* :mod:`.render` — printing all of them with rich (the only importer of rich here).
* :mod:`.shared` — where the checkout's ``../shared`` directory (seeds, test data) is.

JSON (``attnkit explain --json``), schema ``attnkit.explain/1``; arrays are nested lists of
floats (row-major), NaN never occurs (``allow_nan=False``).

Walkthrough::

    {"schema": "attnkit.explain/1", "mode": "walkthrough",
     "sentence": str, "words": [str], "word": str, "position": int (0-based, first occurrence),
     "d_model": int, "d_k": int, "d_v": int, "seed": int,
     "rng": str (the procedure in attnkit.explain.steps),
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

Worked example (``seed_file``: the tutorial text read; ``seeds_dir``: null for the text shipped
with attnkit, else the override directory; ``seed_line``: the line of the text a value is
printed on)::

    {"schema": "attnkit.explain/1", "mode": "example", "example": "bahdanau-vs-dot",
     "title": str, "source": str (the tutorial, in words),
     "seed_file": str | null, "seed_file_found": bool, "seeds_dir": str | null,
     "inputs": {name: array}, "cases": {case: {field: array}},
     "values": [{"key", "section", "label", "printed", "printed_value", "digits" (int | null),
                 "tolerance", "snippet", "snippet_found" (bool | null), "seed_line" (int | null),
                 "computed": {column: float}, "agrees": {column: bool}}],
     "notes": [str]}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.lazy import lazy_exports

_WHERE = {
    "attnkit.explain.catalog": ("DEFAULT_D_MODEL", "DEFAULT_SEED", "DEFAULT_SENTENCE"),
    "attnkit.explain.printed_values": ("PrintedValue",),
    "attnkit.explain.render": ("fmt_vector", "render_example", "render_walkthrough"),
    "attnkit.explain.seed_examples": (
        "EXAMPLES",
        "Comparison",
        "SeedExample",
        "example_to_dict",
        "seed_example",
    ),
    "attnkit.explain.shared": ("default_seeds_dir", "shared_dir", "shared_path"),
    "attnkit.explain.steps": (
        "MAX_D_MODEL",
        "MAX_WORDS",
        "PREVIEW",
        "RNG_PROCEDURE",
        "SCHEMA",
        "Walkthrough",
        "make_inputs",
        "walkthrough",
        "walkthrough_to_dict",
    ),
}
__getattr__ = lazy_exports(__name__, {n: m for m, names in _WHERE.items() for n in names})

if TYPE_CHECKING:  # pragma: no cover
    from attnkit.explain.catalog import DEFAULT_D_MODEL, DEFAULT_SEED, DEFAULT_SENTENCE
    from attnkit.explain.printed_values import PrintedValue
    from attnkit.explain.render import fmt_vector, render_example, render_walkthrough
    from attnkit.explain.seed_examples import (
        EXAMPLES,
        Comparison,
        SeedExample,
        example_to_dict,
        seed_example,
    )
    from attnkit.explain.shared import default_seeds_dir, shared_dir, shared_path
    from attnkit.explain.steps import (
        MAX_D_MODEL,
        MAX_WORDS,
        PREVIEW,
        RNG_PROCEDURE,
        SCHEMA,
        Walkthrough,
        make_inputs,
        walkthrough,
        walkthrough_to_dict,
    )

__all__ = [
    "DEFAULT_D_MODEL",
    "DEFAULT_SEED",
    "DEFAULT_SENTENCE",
    "EXAMPLES",
    "MAX_D_MODEL",
    "MAX_WORDS",
    "PREVIEW",
    "RNG_PROCEDURE",
    "SCHEMA",
    "Comparison",
    "PrintedValue",
    "SeedExample",
    "Walkthrough",
    "default_seeds_dir",
    "example_to_dict",
    "fmt_vector",
    "make_inputs",
    "render_example",
    "render_walkthrough",
    "seed_example",
    "shared_dir",
    "shared_path",
    "walkthrough",
    "walkthrough_to_dict",
]
