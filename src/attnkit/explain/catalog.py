"""What ``attnkit explain`` offers, with no heavy import (no numpy, no torch): the walkthrough's
defaults and the worked examples' names, so that ``attnkit explain --help`` stays fast.

* The walkthrough (:func:`attnkit.explain.walkthrough`): self-attention, step by step, on a
  sentence (default :data:`DEFAULT_SENTENCE`, the sentence of the tutorial it follows) with
  seeded random embeddings and projections.
* The worked examples (:func:`attnkit.explain.seed_example`), named by what they show
  (:data:`EXAMPLES`): a tutorial's printed numbers recomputed by the library, each next to the
  tutorial's own value. The tutorial texts ship inside the package (``explain/texts/``).
* The model examples (:data:`MODEL_EXAMPLES`): a sentence and a word run through the default
  pretrained model, as ``attnkit explain SENTENCE --model default --word WORD`` would.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_D_MODEL",
    "DEFAULT_SEED",
    "DEFAULT_SENTENCE",
    "EXAMPLES",
    "MODEL_EXAMPLES",
    "ModelExample",
]

DEFAULT_SENTENCE = "humpty dumpty sat on"
DEFAULT_D_MODEL = 512  # the tutorial's 512-dimensional embeddings and 512 x 512 projections
DEFAULT_SEED = 0

EXAMPLES: dict[str, str] = {
    "bahdanau-vs-dot": "additive (Bahdanau) vs scaled and unscaled dot-product attention on "
    "Q = [[1,0],[0,1]], K = [[1,2],[3,4]], V = [[5,6],[7,8]]",
    "softmax": "the softmax of the scores [2.0, 1.0, 0.1]",
}
"""Example name -> what it shows (one line, for ``--help``)."""


@dataclass(frozen=True)
class ModelExample:
    """A sentence and the word whose attention to show, in the default pretrained model."""

    sentence: str
    word: str
    description: str


MODEL_EXAMPLES: dict[str, ModelExample] = {
    "it-animal": ModelExample(
        sentence="The animal didn't cross the street because it was too tired",
        word="it",
        description='what "it" attends to in "The animal didn\'t cross the street because it '
        'was too tired", in every layer and head of the default pretrained model '
        "(all-MiniLM-L6-v2; needs its weights)",
    ),
}
"""Example name -> the model example (``--example NAME`` runs it with ``--model default``)."""
