"""Mask objects. **True = may attend**, everywhere in attnkit.

A mask says which keys each query may attend to. Mask objects are small and lazy: they never
build the full ``Lq x Lk`` grid unless asked (:meth:`Mask.materialize`), and they classify blocks
of the grid as empty, full or partial cheaply and exactly (:meth:`Mask.block_map`), which is what
lets the block-sparse kernel skip masked work. Block maps are kept per mask object in a bounded
LRU cache (:attr:`Mask.block_map_cache`), kernel plans in another (:attr:`Mask.plan_cache`);
masks that hold tensors are immutable by convention (do not modify the tensors you passed in
after building the mask). Masks compute on the host: every tensor they build (tiles, block
maps, biases) is a CPU tensor whatever torch's default device (``with torch.device("cuda")``),
and the kernels copy what they need to the inputs' device.

Shape legend
------------
``B``   batch (the leading batch dimension of ``q``; masks built from per-batch data carry it)
``H``   heads (per-head masks such as :class:`ALiBi` with per-head slopes carry (1, H))
``Lq``  query length, ``i`` a query position
``Lk``  key length, ``j`` a key position
``nq``, ``nk``  numbers of query / key blocks

Classes and factories
---------------------
Every mask kind is a CamelCase class; the lower-case names used so far stay (the same class, or
a small factory function): :class:`Causal` (``causal``), :class:`SlidingWindow`
(``sliding_window``), :class:`KeyPadding` (``key_padding``), :class:`Document` (``document``),
:class:`PrefixLM` (``prefix_lm``), :class:`Predicate` (``from_predicate``), :class:`TensorMask`
(``from_tensor``), :class:`ALiBi` (``alibi(slope)``), :class:`Intersection` (``a & b``),
:class:`Union` (``a | b``), and :class:`Band`, the structural view of causal masks and windows.

Structure (for kernels and caches, instead of private names): :attr:`Mask.parts` (the two
operands of an Intersection / Union), :meth:`Mask.leaves`, :meth:`Mask.as_band`,
:attr:`Mask.is_plain_causal` and :attr:`Mask.alignment`.

Alignment
---------
Masks that compare query and key positions (:class:`Causal`, :class:`SlidingWindow`,
:class:`PrefixLM`, :class:`Predicate`) take ``alignment``: ``"top_left"`` (query ``i`` is
position ``i``; PyTorch's ``causal_upper_left``) or ``"bottom_right"`` (the last query lines up
with the last key; ``causal_lower_right``), which is what decoding with a KV cache needs: the new
queries come after the cached keys. :class:`ALiBi` is always bottom-right aligned.

Masks that depend on the batch element (:class:`KeyPadding`, :class:`Document`, per-batch
:class:`PrefixLM`, :class:`Predicate`, batched :class:`TensorMask`) align their batch dimension
with the *leading* batch dimension of the attention inputs; every other batch dimension (heads,
...) is broadcast.

Combine masks with ``&`` (both allow) and ``|`` (either allows). Additive float masks (seed 001's
``M``, ALiBi) carry a score bias; ``&`` adds biases, ``|`` with a bias is refused (ambiguous).

Values a mask cannot represent are refused when it is built (ints beyond 2**62, NaN slopes);
counts larger than the sequence (``key_padding([99])``, ``prefix_lm(99)`` on 5 keys) are clamped
to Lk, so one mask serves every step of cached decoding.

The other convention (True = *ignore*, as in ``torch.nn.MultiheadAttention``'s
``key_padding_mask``) is converted only through the named helper :func:`from_key_padding_mask`.

The grids in the docstrings are checked against :meth:`Mask.materialize` by the tests.
"""

from attnkit.masks.alibi import ALiBi, alibi, alibi_slopes
from attnkit.masks.band import Band, Causal, SlidingWindow
from attnkit.masks.base import Intersection, Mask, Union
from attnkit.masks.blocks import (
    BLOCK_MAP_CACHE_SIZE,
    EMPTY,
    FULL,
    PARTIAL,
    PLAN_CACHE_SIZE,
    Alignment,
    LRUCache,
)
from attnkit.masks.indexed import Document, KeyPadding, PrefixLM
from attnkit.masks.tensor import (
    KeyColumns,
    Predicate,
    TensorMask,
    as_mask,
    from_additive,
    from_key_padding_mask,
    normalize,
)

# lower-case names (the same classes; kept for existing code)
causal = Causal
sliding_window = SlidingWindow
key_padding = KeyPadding
document = Document
prefix_lm = PrefixLM
from_predicate = Predicate
from_tensor = TensorMask

# private names other modules imported before the structure was public
_And = Intersection
_Or = Union
_Band = Band
_KeyColumns = KeyColumns

__all__ = [
    "BLOCK_MAP_CACHE_SIZE",
    "EMPTY",
    "FULL",
    "PARTIAL",
    "PLAN_CACHE_SIZE",
    "ALiBi",
    "Alignment",
    "Band",
    "Causal",
    "Document",
    "Intersection",
    "KeyColumns",
    "KeyPadding",
    "LRUCache",
    "Mask",
    "Predicate",
    "PrefixLM",
    "SlidingWindow",
    "TensorMask",
    "Union",
    "alibi",
    "alibi_slopes",
    "as_mask",
    "causal",
    "document",
    "from_additive",
    "from_key_padding_mask",
    "from_predicate",
    "from_tensor",
    "key_padding",
    "normalize",
    "prefix_lm",
    "sliding_window",
]
