"""The float64 NumPy oracle: attention computed step by step, every intermediate kept.

Every other implementation in attnkit is tested against this module. It follows the seeds'
steps literally and prefers clarity over speed: project, score, scale, mask, softmax row by row,
weighted sum of the values. It never imports torch.

Shape legend
------------
``...``   leading batch dims (batch, heads, ...), identical for Q, K and V (never broadcast)
``Lq``    number of queries, ``i`` a query (a word asking, seed 000's "on")
``Lk``    number of keys / values, ``j`` a key (a word being looked at)
``d_k``   query/key width, ``d_v`` value width, ``d_q`` query width when it differs from d_k
``h``     hidden width of additive attention
``d_model`` embedding width of X, ``H`` number of heads, ``d_out`` width after W^O

Masks
-----
``mask`` is a NumPy array that broadcasts (NumPy's right-aligned rules) to (..., Lq, Lk):

* bool: True = query i may attend to key j (the convention everywhere in attnkit);
* float: *added* to the scaled scores (seed 001's ``M``); ``-inf`` disallows a key, finite
  values shift the score.

A query row with no allowed key at all gets weights 0 and output 0 (the softmax of an empty set
is undefined; 0 is what every attnkit backend returns too), never NaN.

Mask objects from :mod:`attnkit.masks` are torch objects; convert them with
``mask.materialize(Lq, Lk).numpy()`` (and add ``materialize_bias`` for biased masks). Their batch
dims line up with the *leading* batch dims of the inputs, so insert singleton dims after them
before handing them to this module.

Every function returns a frozen dataclass (:class:`Trace` or a subclass) whose arrays are
read-only float64 copies.

Files
-----
``traces``                 the frozen Trace dataclasses
``inputs``                 input checks (float64 copies, shapes, weights, mask -> arrays)
``steps``                  the shared steps: scale, mask, softmax_rows, weighted sum
``dot_product_attention``  scaled_dot_product, dot_product
``additive_general``       additive (Bahdanau), general (Luong)
``projected_attention``    self_attention, multi_head
``positions``              sinusoidal_positions
``sinks_softcap``          scaled_dot_product_sinks (logit softcapping, attention sinks)
``dropout``                keep_mask, dropout_output (blocksparse's counter-based keep mask)
"""

from __future__ import annotations

from attnkit.reference.additive_general import additive, general
from attnkit.reference.dot_product_attention import dot_product, scaled_dot_product
from attnkit.reference.positions import sinusoidal_positions
from attnkit.reference.projected_attention import multi_head, self_attention
from attnkit.reference.sinks_softcap import scaled_dot_product_sinks
from attnkit.reference.steps import softmax_rows
from attnkit.reference.traces import (
    AdditiveTrace,
    GeneralTrace,
    MultiHeadTrace,
    PositionsTrace,
    SelfAttentionTrace,
    SinkTrace,
    Trace,
)

__all__ = [
    "AdditiveTrace",
    "GeneralTrace",
    "MultiHeadTrace",
    "PositionsTrace",
    "SelfAttentionTrace",
    "SinkTrace",
    "Trace",
    "additive",
    "dot_product",
    "general",
    "multi_head",
    "scaled_dot_product",
    "scaled_dot_product_sinks",
    "self_attention",
    "sinusoidal_positions",
    "softmax_rows",
]
