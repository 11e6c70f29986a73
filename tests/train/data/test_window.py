"""Local-causal language models (--window): the window is local, cached decoding equals the
full forward (keeping only the window's keys), greedy generation equals the full forward's
argmax; ATTNKIT_LONG=1 adds a training smoke run at --max-len 16384 (about half a minute,
checking peak memory).
"""

from __future__ import annotations

import json
import os
import resource

import numpy as np
import pytest
import torch

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.train.config import TrainConfig
from attnkit.train.data.tokenizer import EOS
from attnkit.train.loop.trainer import train
from tests.support.numerics import max_rel_err as rel_err

V = 23


def quiet(_: str) -> None:
    pass


def make_lm(dtype=torch.float32, window=None, seed=0) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = LMConfig(
        V, d_model=16, nhead=2, num_layers=2, dim_feedforward=24, dropout=0.0, window=window
    )
    return TransformerLM(cfg).to(dtype).eval()


# ---------------------------------------------------------------------------------------------
# local-causal LM (--window)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [0, 3, 8])
def test_window_cached_decoding_equals_full_forward(window):
    model = make_lm(torch.float64, window, seed=2)
    g = torch.Generator().manual_seed(5)
    x = torch.randint(4, V, (2, 19), generator=g)
    full = model(x)
    cache = model.new_cache()
    steps = [model.decode_step(x[:, :6], cache)]  # a prompt, then one token at a time
    steps += [model.decode_step(x[:, t : t + 1], cache) for t in range(6, 19)]
    assert rel_err(torch.cat(steps, dim=1), full) <= 1e-10
    assert all(c.k.shape[-2] <= max(window, 1) for c in cache.layers)  # only the window kept


def test_window_is_local():
    """One layer, window 3: logit t depends on tokens t-3..t only."""
    torch.manual_seed(0)
    model = TransformerLM(
        LMConfig(V, d_model=8, nhead=2, num_layers=1, dim_feedforward=8, dropout=0.0, window=3)
    ).eval()
    x = torch.randint(4, V, (1, 12), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, 4] = 4 if x[0, 4] != 4 else 5
    a, b = model(x), model(y)
    assert torch.equal(a[0, :4], b[0, :4]) and torch.equal(a[0, 8:], b[0, 8:])
    assert not torch.equal(a[0, 4:8], b[0, 4:8])


def test_window_generation_matches_forward_greedy():
    model = make_lm(torch.float64, 4, seed=3)
    prompt = torch.randint(4, V, (1, 7), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, max_new_tokens=8)
    seq = torch.cat([prompt, out], dim=1)
    banned = model.banned_ids()
    for t in range(out.shape[1]):  # each generated token is the full forward's argmax
        logits = model(seq[:, : prompt.shape[1] + t])[0, -1].clone()
        logits[list(banned)] = -torch.inf
        assert int(logits.argmax()) == int(out[0, t])
        if int(out[0, t]) == EOS:
            break


@pytest.mark.skipif(
    os.environ.get("ATTNKIT_LONG") != "1", reason="long-context smoke run: set ATTNKIT_LONG=1"
)
def test_long_context_16k_smoke(tmp_path):
    text = tmp_path / "long.txt"
    g = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    text.write_text(
        "\n".join(" ".join(g.choice(words, size=40)) for _ in range(1200)) + "\n", encoding="utf-8"
    )
    c = TrainConfig(
        task="lm",
        data=str(text),
        max_len=16384,
        window=256,
        batch_size=1,
        d_model=64,
        nhead=4,
        layers=2,
        dim_feedforward=128,
        max_steps=2,
        log_every=1,
        eval_every=100,
        valid_fraction=0.02,
    )
    assert c.resolved().block_size == 16384  # training windows of 16384 tokens
    ckpt = train(c, tmp_path / "long", echo=quiet)
    rows = [json.loads(s) for s in (ckpt.parent / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
    # one dense 16384 x 16384 float32 score matrix alone would be 1 GiB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 1.5 * 2**20  # KiB
