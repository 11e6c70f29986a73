"""``attn_implementation="attnkit"`` against ``"eager"`` (transformers' plain softmax(QK^T)V, the
reference) on tiny random models with the same weights, float32: logits, attention weights,
gradients of a training step, packed sequences, cached decoding and greedy generation.

Tolerance 1e-5 (float32). Positions compared: every position of a real token. A padding
position whose query has no allowed key (left padding under a causal mask, a sliding window that
only covers padding) gives output 0 in attnkit (its policy for fully masked rows) where eager
averages every value; real tokens never attend to padding, so every real position agrees.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install 'attnkit[hf]')")

sys.path.insert(0, str(Path(__file__).parent))

import hf_models as M  # noqa: E402

import attnkit.integrations.transformers as ak_hf  # noqa: E402
from attnkit.integrations.hf_masks import HFMask  # noqa: E402
from attnkit.masks import Predicate  # noqa: E402

ak_hf.register()
TOL = dict(rtol=1e-5, atol=1e-5)


def forward(model, name, ids, am, **kw):
    if name in M.ENCODER_DECODERS:
        dec = ids[:, :7].clone()
        dec[:, 0] = 2
        return model(input_ids=ids, attention_mask=am, decoder_input_ids=dec, **kw)
    return model(input_ids=ids, attention_mask=am, **kw)


def all_attentions(out, name):
    if name in M.ENCODER_DECODERS:
        return out.encoder_attentions + out.decoder_attentions + out.cross_attentions
    return out.attentions


@pytest.mark.parametrize("name", sorted(M.BUILDERS))
def test_logits_and_attentions_equal_eager_with_padding(name):
    eager, ours = M.pair(name)
    pad = "left" if name in M.DECODERS else "right"
    ids, am = M.batch(3, 11, pad=pad)
    with torch.no_grad():
        a = forward(eager, name, ids, am, output_attentions=True)
        b = forward(ours, name, ids, am, output_attentions=True)
    real = am.bool() if name not in M.ENCODER_DECODERS else torch.ones(3, 7, dtype=torch.bool)
    torch.testing.assert_close(b.logits[real], a.logits[real], **TOL)
    wa, wb = all_attentions(a, name), all_attentions(b, name)
    assert len(wa) == len(wb) > 0 and all(w is not None for w in wb)
    for x, y in zip(wa, wb):
        rows = torch.ones(x.shape[0], 1, x.shape[2], 1, dtype=torch.bool)
        if x.shape[2] == 11:  # self-attention of the padded sequence: rows of real tokens
            rows = am.bool()[:, None, :, None]
        torch.testing.assert_close(y * rows, x * rows, **TOL)


def test_sliding_window_smaller_than_the_sequence_is_structured(monkeypatch):
    """Mistral, window 5 < 19 tokens: the mask reaching the attention is attnkit's sliding
    window (no dense tensor, no predicate), and the logits equal eager's."""
    from transformers.masking_utils import AttentionMaskInterface

    seen = []
    real = AttentionMaskInterface._global_mapping["attnkit"]

    def spy(*args, **kw):
        out = real(*args, **kw)
        seen.append(out)
        return out

    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "attnkit", spy)
    eager, ours = M.pair("mistral")
    ids, am = M.batch(2, 19, pad="right")
    with torch.no_grad():
        a, b = eager(ids, attention_mask=am).logits, ours(ids, attention_mask=am).logits
    torch.testing.assert_close(b[am.bool()], a[am.bool()], **TOL)
    ak_hf.register("attnkit-bs", backend="blocksparse")
    ours.set_attn_implementation("attnkit-bs")
    ours.train()
    ours.config.attention_dropout = 0.5
    for layer in ours.model.layers:
        layer.self_attn.attention_dropout = 0.5
    drop = ours(ids, attention_mask=am).logits  # blocksparse has dropout since issue 12
    assert torch.isfinite(drop[am.bool()]).all() and not torch.equal(drop, b)
    assert seen and all(isinstance(m, HFMask) for m in seen)
    kinds = {type(leaf).__name__ for m in seen for leaf in m.mask.leaves()}
    assert kinds == {"SlidingWindow", "KeyPadding"}, seen


PACKING = [n for n in M.DECODERS if n != "gpt_oss"]
"""Decoders whose transformers mask builder detects packed sequences (gpt-oss's does not)."""


@pytest.mark.parametrize("name", PACKING)
def test_packed_position_ids_equal_eager(name, monkeypatch):
    """Sequences packed in one row (position_ids restart, no attention_mask, no cache: when
    transformers detects packing): documents, recovered as attnkit's Document mask, not a
    predicate."""
    from transformers.masking_utils import AttentionMaskInterface

    seen = []
    real = AttentionMaskInterface._global_mapping["attnkit"]
    monkeypatch.setitem(
        AttentionMaskInterface._global_mapping,
        "attnkit",
        lambda *a, **k: seen.append(real(*a, **k)) or seen[-1],
    )
    eager, ours = M.pair(name)
    pos = torch.tensor(
        [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]]
    )
    ids = torch.randint(3, M.VOCAB, pos.shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a = eager(ids, position_ids=pos, use_cache=False).logits
        b = ours(ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(b, a, **TOL)
    leaves = [leaf for m in seen for leaf in m.mask.leaves()]
    assert "Document" in {type(leaf).__name__ for leaf in leaves}
    assert not any(isinstance(leaf, Predicate) for leaf in leaves)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3", "bert", "bart", "t5"])
def test_training_step_gradients_equal_eager(name):
    """Including T5's relative-position embedding, whose bias reaches attnkit as a float mask."""
    eager, ours = M.pair(name)
    ids, am = M.batch(3, 11, pad="right")
    labels = ids.masked_fill(am == 0, -100)
    if name in M.ENCODER_DECODERS:
        labels = labels[:, :7].contiguous()
    for m in (eager, ours):
        m.train()
        forward(m, name, ids, am, labels=labels).loss.backward()
    ga = dict(eager.named_parameters())
    n = 0
    for k, p in ours.named_parameters():
        if p.grad is None:
            assert ga[k].grad is None, k
            continue
        torch.testing.assert_close(p.grad, ga[k].grad, **TOL, msg=lambda s, k=k: f"{k}: {s}")
        n += 1
    assert n > 10


def test_packed_training_step_gradients_equal_eager():
    eager, ours = M.pair("qwen2")
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2]])
    ids = torch.randint(3, M.VOCAB, pos.shape, generator=torch.Generator().manual_seed(2))
    for m in (eager, ours):
        m.train()
        m(ids, position_ids=pos, labels=ids, use_cache=False).loss.backward()
    ga = dict(eager.named_parameters())
    for k, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, ga[k].grad, **TOL, msg=lambda s, k=k: f"{k}: {s}")


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "gemma3"])
def test_greedy_generation_same_tokens_and_scores(name):
    """Left-padded prompts, 8 new tokens through the KV cache (past Mistral's window of 5)."""
    eager, ours = M.pair(name)
    ids, am = M.batch(2, 9, pad="left")
    kw = dict(
        attention_mask=am,
        max_new_tokens=8,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=M.PAD,
    )
    with torch.no_grad():
        a, b = eager.generate(ids, **kw), ours.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    for x, y in zip(a.scores, b.scores):
        torch.testing.assert_close(y, x, **TOL)


@pytest.mark.parametrize("name", M.ENCODER_DECODERS)
def test_encoder_decoder_generation_same_tokens_and_scores(name):
    eager, ours = M.pair(name)
    ids, am = M.batch(2, 9, pad="right")
    kw = dict(
        attention_mask=am,
        max_new_tokens=6,
        do_sample=False,
        num_beams=1,
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        a, b = eager.generate(ids, **kw), ours.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    for x, y in zip(a.scores, b.scores):
        torch.testing.assert_close(y, x, **TOL)


def test_cached_chunks_equal_a_full_forward():
    """Prefill 6 tokens, then chunks of 3, 1 and 2 new tokens through the cache: the queries come
    after the cached keys (bottom-right causal); compared with eager on the whole sequence."""
    from transformers import DynamicCache

    eager, ours = M.pair("mistral", window=4)
    ids = torch.randint(3, M.VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = eager(ids).logits
        cache, parts, start = DynamicCache(config=ours.config), [], 0
        for n in (6, 3, 1, 2):
            out = ours(ids[:, start : start + n], past_key_values=cache, use_cache=True)
            parts.append(out.logits)
            start += n
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)


@pytest.mark.parametrize("softcap", [None, 50.0, 0.5])
def test_gemma2_softcapping_matches_eager(softcap):
    """Gemma 2's attn_logit_softcapping (0.5 caps hard: most scores saturate)."""
    eager, ours = M.pair("gemma2", softcap=softcap)
    ids, am = M.batch(2, 11, pad="left")
    with torch.no_grad():
        a, b = eager(ids, attention_mask=am).logits, ours(ids, attention_mask=am).logits
    torch.testing.assert_close(b[am.bool()], a[am.bool()], **TOL)


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_softcap_and_sinks_training_gradients_equal_eager(name):
    """Gradients of every parameter, gpt-oss's sinks included. gpt-oss with left padding: its
    fully masked rows give 0 in eager as well (all their weight is on the sink), so even the
    last padding position, whose output predicts the first real token, agrees; Gemma 2 with
    right padding (eager averages the values in fully masked rows, attnkit gives 0)."""
    eager, ours = M.pair(name)
    ids, am = M.batch(3, 13, pad="left" if name == "gpt_oss" else "right")
    labels = ids.masked_fill(am == 0, -100)
    for m in (eager, ours):
        m.train()
        m(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
    ga = dict(eager.named_parameters())
    sinks = 0
    for k, p in ours.named_parameters():
        if ga[k].grad is None:
            assert p.grad is None, k
            continue
        torch.testing.assert_close(p.grad, ga[k].grad, **TOL, msg=lambda s, k=k: f"{k}: {s}")
        sinks += k.endswith("sinks")
    assert sinks == (2 if name == "gpt_oss" else 0)


def test_gpt_oss_long_window_layers_reach_blocksparse(monkeypatch):
    """L = 300 > window 4: the sliding layers go to blocksparse (sinks from each tile's
    log-sum-exp); the full layers too (dense serves no sinks); logits equal eager."""
    from attnkit.kernels import blocksparse as bs

    seen = []
    orig = bs.attend
    monkeypatch.setattr(bs, "attend", lambda call, *a: seen.append(call) or orig(call, *a))
    eager, ours = M.pair("gpt_oss")
    ids = torch.randint(3, M.VOCAB, (1, 300), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a, b = eager(ids).logits, ours(ids).logits
    torch.testing.assert_close(b, a, **TOL)
    assert len(seen) == 2 and all(c.sinks is not None for c in seen)


def test_unsupported_features_are_refused_by_name():
    q = torch.randn(1, 2, 3, 4)
    for kw, what in ((dict(head_mask=torch.ones(2)), "head mask"),):
        with pytest.raises(ak_hf.UnsupportedFeatureError, match=what):
            ak_hf.attention_forward(_Attn(), q, q, q, None, **kw)


def test_output_attentions_above_the_weights_limit_is_refused():
    from attnkit.kernels.dispatch import WEIGHTS_LIMIT

    cfg = M.tf.LlamaConfig(**M._decoder_common(num_hidden_layers=1, max_position_embeddings=8192))
    m = M.tf.LlamaForCausalLM(cfg).eval()
    m.set_attn_implementation("attnkit")
    n = int((WEIGHTS_LIMIT / 4) ** 0.5) + 1  # 4 heads x n x n > limit
    with torch.no_grad(), pytest.raises(ValueError, match="return_weights"):
        m(torch.ones(1, n, dtype=torch.long), output_attentions=True)


class _Attn(torch.nn.Module):
    is_causal = False
    training = True


def test_dropout_drops_weights_in_training():
    """With v = identity, the output is the dropped-out weights: every entry is 0 or w / (1-p)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)
    v = torch.eye(7).expand(2, 2, 7, 7)
    _, w = ak_hf.attention_forward(_Attn(), q, k, v, None, output_attentions=True)
    torch.manual_seed(1)
    out, _ = ak_hf.attention_forward(_Attn(), q, k, v, None, dropout=0.25)
    out = out.transpose(1, 2)
    kept = out != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(out[kept], (w / 0.75)[kept], **TOL)


def test_bad_masks_are_refused():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match="attention_mask"):
        ak_hf.attention_forward(_Attn(), q, q, q, "causal")
    hm = HFMask(None, 1, 3, 5, "no mask")
    with pytest.raises(ValueError, match="attention_mask: built for B=1, Lq=3, Lk=5"):
        ak_hf.attention_forward(_Attn(), q, q, q, hm)


def test_register_checks_the_name():
    with pytest.raises(TypeError, match="name"):
        ak_hf.register(3)
    with pytest.raises(ValueError, match="name"):
        ak_hf.register("sdpa")
    with pytest.raises(ValueError, match="backend"):
        ak_hf.register("attnkit-x", backend="nope")
    assert ak_hf.register() == "attnkit" and ak_hf.is_registered()


def test_a_forced_backend_is_used(monkeypatch):
    """register(name, backend=...) forces attnkit's backend ("math" here), with eager's logits;
    a forced backend that cannot serve a call raises its reasons."""
    from attnkit.kernels import BACKENDS

    math_backend, used = BACKENDS["math"], []
    real_run = math_backend.run
    monkeypatch.setattr(math_backend, "run", lambda call, d: used.append(1) or real_run(call, d))
    assert ak_hf.register("attnkit-math", backend="math") == "attnkit-math"
    eager, ours = M.pair("mistral")
    ours.set_attn_implementation("attnkit-math")
    ids, am = M.batch(2, 9)
    with torch.no_grad():
        a, b = eager(ids, attention_mask=am).logits, ours(ids, attention_mask=am).logits
    torch.testing.assert_close(b[am.bool()], a[am.bool()], **TOL)
    assert len(used) == 2  # one call per layer
    ak_hf.register("attnkit-bs", backend="blocksparse")
    ours.set_attn_implementation("attnkit-bs")
    with pytest.raises(ValueError, match="blocksparse"):  # no weights (it has dropout now)
        ours(ids, attention_mask=am, output_attentions=True)


@pytest.mark.parametrize("lq", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_function_equals_eager_function(lq, padded):
    """The attention function alone against transformers' eager function (GQA 6 / 2 heads,
    cached keys, one or three new queries, with and without left padding), weights included."""
    from transformers.masking_utils import causal_mask_function, eager_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    g = torch.Generator().manual_seed(lq)
    q = torch.randn(2, 6, lq, 8, generator=g)
    k, v = torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)
    pad = torch.ones(2, 9, dtype=torch.bool)
    if padded:
        pad[1, :3] = False
    mod = _Attn()
    mod.num_key_value_groups, mod.training = 3, False
    args = dict(
        batch_size=2, q_length=lq, kv_length=9, q_offset=9 - lq, mask_function=causal_mask_function
    )
    dense = eager_mask(**args, attention_mask=pad)
    ours = ak_hf.mask_function(**args, attention_mask=pad)
    a, wa = eager_attention_forward(mod, q, k, v, dense, scaling=0.3)
    b, wb = ak_hf.attention_forward(mod, q, k, v, ours, scaling=0.3, output_attentions=True)
    torch.testing.assert_close(b, a, **TOL)
    torch.testing.assert_close(wb, wa, **TOL)
