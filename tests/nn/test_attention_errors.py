"""MultiHeadAttention's argument checks: constructor and forward arguments raise TypeError /
ValueError naming the argument the caller passed, before torch sees the value."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.nn.attention import MultiHeadAttention

LQ, LK = 7, 13


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"embed_dim": 10, "num_heads": 3}, "embed_dim: expected a multiple of num_heads=3"),
        ({"embed_dim": 12, "num_heads": 4, "num_kv_heads": 3}, "num_kv_heads: expected a divisor"),
        ({"embed_dim": 0, "num_heads": 1}, "embed_dim"),
        ({"embed_dim": 8, "num_heads": 2, "dropout": 1.0}, "dropout"),
        ({"embed_dim": 8, "num_heads": 2, "kdim": -1}, "kdim"),
    ],
)
def test_constructor_validation(kwargs, match):
    e, h = kwargs.pop("embed_dim"), kwargs.pop("num_heads")
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(e, h, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"num_heads": True}, TypeError, "num_heads: expected a positive int, got True"),
        ({"embed_dim": 8.0}, TypeError, "embed_dim"),
        ({"kdim": 0}, ValueError, "kdim"),
        ({"num_kv_heads": False}, TypeError, "num_kv_heads"),
        ({"bias": "no"}, TypeError, "bias: expected a bool"),
        ({"batch_first": 1}, TypeError, "batch_first"),
        ({"dropout": -0.1}, ValueError, "dropout"),
        ({"dropout": "0.1"}, TypeError, "dropout"),
        ({"dtype": 3}, TypeError, "dtype"),
        ({"dtype": torch.int64}, ValueError, "dtype"),
        ({"device": "nope"}, ValueError, "device"),
        ({"device": 0.5}, TypeError, "device"),
        ({"rotary": 3}, TypeError, "rotary"),
    ],
)
def test_constructor_rejects_bad_types_before_torch(kwargs, exc, match):
    args = {"embed_dim": 8, "num_heads": 2} | kwargs
    with pytest.raises(exc, match=match):
        MultiHeadAttention(args.pop("embed_dim"), args.pop("num_heads"), **args)


@pytest.mark.parametrize("bad", [torch.float64, torch.int64, torch.float16])
@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_forward_refuses_other_dtypes_naming_the_input(bad, which):
    mha = MultiHeadAttention(12, 3, kdim=5, vdim=7)
    args = {"query": torch.randn(2, LQ, 12), "key": torch.randn(2, LK, 5)}
    args["value"] = torch.randn(2, LK, 7)
    args[which] = args[which].to(bad)
    with pytest.raises(TypeError, match=f"{which}: expected dtype torch.float32.*got {bad}"):
        mha(**args)


def test_value_without_key_is_refused():
    mha = MultiHeadAttention(8, 2)
    x, mem = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="key: value was given without key"):
        mha(x, value=mem)
    with pytest.raises(ValueError, match="key: value was given without key"):
        mha(x, None, mem)
    with pytest.raises(TypeError, match="return_weights"):
        mha(x, return_weights="yes")
    with pytest.raises(TypeError, match="average_weights"):
        mha(x, average_weights=1)


def test_forward_validation():
    mha = MultiHeadAttention(12, 3, kdim=5, vdim=7)
    q, k, v = torch.randn(2, LQ, 12), torch.randn(2, LK, 5), torch.randn(2, LK, 7)
    with pytest.raises(ValueError, match=r"query: expected last dim embed_dim=12.*\(2, 7, 11\)"):
        mha(torch.randn(2, LQ, 11), k, v)
    with pytest.raises(ValueError, match="key: expected last dim kdim=5"):
        mha(q, torch.randn(2, LK, 12), v)
    with pytest.raises(ValueError, match="value: expected last dim vdim=7"):
        mha(q, k, torch.randn(2, LK, 5))
    with pytest.raises(ValueError, match="query: expected 3 dims"):
        mha(q[0], k, v)
    with pytest.raises(ValueError, match="key/value"):
        mha(q, k, v[:, :-1])
    with pytest.raises(TypeError, match="query: expected dtype torch.float32"):
        mha(q.double(), k, v)
    with pytest.raises(ValueError, match="mask: expected a shape broadcastable"):
        mha(q, k, v, torch.ones(LQ, LK + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask: a 3-D tensor"):
        mha(q, k, v, torch.ones(2, LQ, LK, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask: expected"):
        mha(q, k, v, masks.from_tensor(torch.ones(LQ, LK - 1, dtype=torch.bool)))
    with pytest.raises(ValueError, match="mask: its batch shape"):
        mha(q, k, v, masks.key_padding([1, 2, 3]))
    with pytest.raises(ValueError, match="key_padding_mask"):
        mha(q, k, v, masks.from_key_padding_mask(torch.zeros(2, LK + 2, dtype=torch.bool)))
