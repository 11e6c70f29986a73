"""Generation (issue 20): top-k / top-p filtering against transformers' logits warpers, the
cached and cropped decoding against plain full forwards, and the CLI: streamed, detokenised,
multi-line text and a warning for unknown prompt words."""

from __future__ import annotations

import pytest
import torch

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.train.inference.lm_generate import filter_logits, generate_ids


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(1.0, None, 0.9), (0.7, None, 0.5), (1.3, 5, 0.8), (1.0, 3, None),
                          (1.0, None, 1.0), (0.5, None, 0.01)])  # fmt: skip
def test_filtering_matches_transformers_warpers(seed, temperature, top_k, top_p):
    gen = pytest.importorskip("transformers.generation")
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 50, generator=g, dtype=torch.float64) * 3
    want = gen.TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        want = gen.TopKLogitsWarper(top_k)(None, want)
    if top_p is not None:
        want = gen.TopPLogitsWarper(top_p)(None, want)
    got = filter_logits(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    kept = ~torch.isinf(want)
    torch.testing.assert_close(got[kept], want[kept], rtol=1e-12, atol=1e-12)
    assert bool(kept.any(-1).all())  # the most likely token always stays


def test_filter_bad_arguments():
    x = torch.zeros(5)
    for kw, msg in [
        (dict(temperature=0.0), "^temperature: expected a finite number > 0"),
        (dict(temperature=1.0, top_p=0.0), r"^top_p: expected a number in \(0, 1\]"),
        (dict(temperature=1.0, top_p=1.5), "^top_p: "),
        (dict(temperature=1.0, top_k=0), "^top_k: "),
    ]:
        with pytest.raises(ValueError, match=msg):
            filter_logits(x, **kw)


def make_lm(window=None) -> TransformerLM:
    torch.manual_seed(1)
    cfg = LMConfig(20, d_model=16, nhead=2, num_layers=2, dim_feedforward=32, dropout=0.0,
                   window=window)  # fmt: skip
    return TransformerLM(cfg).eval()


@pytest.mark.parametrize("window", [None, 3])
def test_greedy_equals_full_forward_on_the_cropped_context(window):
    model, block, prompt = make_lm(window), 6, [5, 9, 4, 7]
    got = list(generate_ids(model, prompt, 12, block, banned=model.banned_ids()))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ctx = ids[-block:] if window is None else ids  # a local model: its window, any length
            logits = model(torch.tensor([ctx]))[0, -1]
            logits[list(model.banned_ids())] = float("-inf")
            ids.append(int(logits.argmax()))
    assert got == ids[len(prompt) :]


def test_sampling_is_seeded_and_stops():
    model = make_lm()
    run = lambda s: list(generate_ids(model, [5, 6], 10, 8, temperature=1.0, top_p=0.9,  # noqa: E731
                                      generator=torch.Generator().manual_seed(s)))  # fmt: skip
    assert run(0) == run(0) and len(run(0)) == 10
    first = run(0)[0]
    assert list(generate_ids(model, [5, 6], 10, 8, stop=first,
                             generator=torch.Generator().manual_seed(0), temperature=1.0,
                             top_p=0.9)) == [first]  # fmt: skip
    with pytest.raises(ValueError, match="^temperature: expected a number >= 0"):
        generate_ids(model, [5], 3, 8, temperature=-1.0)
    with pytest.raises(ValueError, match="^prompt: expected at least one token"):
        generate_ids(model, [], 3, 8)


def test_bf16_autocast_attends_in_float32_and_tracks_float32():
    model = make_lm()
    x = torch.randint(4, 20, (3, 17))
    want = model(x).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(x)
        q = torch.randn(2, 2, 5, 8, dtype=torch.bfloat16)
        from attnkit.models.lm import float32_attention

        out, w = float32_attention(q, q, q, None, dropout_p=0.0, return_weights=True)
    assert out.dtype == w.dtype == torch.bfloat16
    ref = torch.softmax(q.double() @ q.double().transpose(-1, -2) / 8**0.5, -1)
    torch.testing.assert_close(w.double(), ref, atol=2e-2, rtol=2e-2)  # bf16 rounding
    torch.testing.assert_close(got.double(), want, atol=0.1, rtol=0.05)  # bf16 projections
