"""The nn modules on a GPU, checked on the CPU: modules moved to an emulated GPU
(tests/support/fake_device.py), inputs there too, torch's default device on the CPU (as a user
calls them) or on the GPU (as the verbs run them); nothing they create may meet the GPU tensors
from the host (positions, rotary tables, masks, caches)."""

from __future__ import annotations

import collections

import pytest
import torch

import attnkit.nn as ann
from attnkit import masks
from tests.support.fake_device import FakeCuda


def _mha_cached(x):
    m = ann.MultiHeadAttention(32, 4, num_kv_heads=2, rotary=ann.RotaryEmbedding(8)).to("cuda")
    cache = m.new_cache() if hasattr(m, "new_cache") else ann.KVCache()
    m(x[:, :5], mask=masks.causal("bottom_right"), cache=cache)
    return m(x[:, 5:], mask=masks.causal("bottom_right"), cache=cache)


CASES = {
    "multi-head, causal": lambda x: ann.MultiHeadAttention(32, 4).to("cuda")(
        x, mask=masks.causal()
    ),
    "multi-head, key padding": lambda x: ann.MultiHeadAttention(32, 4).to("cuda")(
        x, mask=masks.key_padding(torch.tensor([7, 4]).to("cuda"))
    ),
    "multi-head, rotary, grouped, cached": _mha_cached,
    "sinusoidal positions": lambda x: ann.SinusoidalPositionalEncoding(32, max_len=64).to("cuda")(
        x
    ),
    "learned positions": lambda x: ann.LearnedPositionalEmbedding(64, 32).to("cuda")(x),
    "encoder": lambda x: ann.TransformerEncoder(ann.TransformerEncoderLayer(32, 4, 64), 2).to(
        "cuda"
    )(x, mask=masks.causal()),
    "transformer": lambda x: ann.Transformer(32, 4, 1, 1, 64).to("cuda")(x, x),
    "additive": lambda x: ann.AdditiveAttention(32, 32, 16).to("cuda")(x, x, x),
}


@pytest.mark.parametrize("default_gpu", [False, True], ids=["default cpu", "default gpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_module_on_the_gpu_creates_nothing_on_the_host(case, default_gpu, monkeypatch):
    # attnkit's argument checks accept device="cuda" only where CUDA is available
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.manual_seed(0)
    fake = FakeCuda(default_gpu=default_gpu)
    with fake:
        x = torch.randn(2, 7, 32).to("cuda")
        out = CASES[case](x)
        out = out[0] if isinstance(out, tuple) else out
        assert fake.where(out) == "gpu"
    mixed = collections.Counter(fake.mixed)
    assert not mixed, "\n".join(f"{n} x {r.op} at {r.where}" for r, n in mixed.items())
