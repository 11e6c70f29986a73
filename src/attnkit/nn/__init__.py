"""``nn.Module`` layers built on :mod:`attnkit.functional` (masks: True = may attend).

Shape legend: ``B`` batch, ``L``/``Lq``/``Lk`` lengths, ``E`` embedding width, ``H`` heads,
``G`` key/value heads, ``d`` head width.
"""

from attnkit.nn.additive import AdditiveAttention, GeneralAttention
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.cache import DecoderCache, DecoderLayerCache, KVCache
from attnkit.nn.dropout import Dropout
from attnkit.nn.positional import (
    ALiBi,
    ALiBiMask,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)
from attnkit.nn.self_attention import SelfAttention
from attnkit.nn.transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "ALiBi",
    "ALiBiMask",
    "AdditiveAttention",
    "DecoderCache",
    "DecoderLayerCache",
    "Dropout",
    "GeneralAttention",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SelfAttention",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]
