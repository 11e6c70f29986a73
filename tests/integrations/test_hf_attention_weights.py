"""attnkit.integrations.hf_attention_weights: any transformers model's attention on a text, through
attnkit's attention, against transformers' own ``attn_implementation="eager"`` weights
(``output_attentions=True``) on the same saved directory: within 1e-5 for every kind of model
(encoder-only, decoder-only, encoder-decoder), with the tokens the tokenizer gives."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from support.tiny_hf_dirs import ENCODER_DECODERS, KINDS, TEXT, eager_attentions, save_tiny

from attnkit.integrations.hf_attention_weights import LoadedModel, load_model, model_attentions

TOL = 1e-5  # float32 softmax rows: attnkit's kernels vs eager's matmul + softmax


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-hf")
    return {k: save_tiny(k, root / k) for k in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_weights_match_eager(saved, kind):
    path = saved[kind]
    ref = eager_attentions(path, TEXT)
    got = model_attentions(load_model(path, name=kind), TEXT)
    assert got.name == kind
    if kind in ENCODER_DECODERS:
        assert got.kind == "encoder-decoder"
        titles = [s.title for s in got.sections]
        assert titles == ["encoder self-attention", "decoder self-attention", "cross-attention"]
        for section, key in zip(got.sections, ("encoder", "decoder", "cross"), strict=True):
            w = section.weights.double().numpy()
            assert w.shape == ref[key].shape, (kind, key)
            np.testing.assert_allclose(w, ref[key], rtol=0, atol=TOL, err_msg=f"{kind} {key}")
        enc, dec, cross = got.sections
        t = ref["output_ids"].size - 1  # the produced tokens (after the decoder's start token)
        assert cross.weights.shape[2:] == (t, len(got.tokens))
        assert len(cross.q_tokens) == t and cross.k_tokens == got.tokens
        assert "produced" in cross.note
    else:
        assert got.kind == ("decoder" if kind in ("gpt2", "llama") else "encoder")
        (section,) = got.sections
        w = section.weights.double().numpy()
        assert w.shape == ref["self"].shape
        np.testing.assert_allclose(w, ref["self"], rtol=0, atol=TOL, err_msg=kind)
        assert len(got.tokens) == ref["input_ids"].size
    # every row is a softmax row (sums to 1): the weights are not, e.g., pre-softmax scores
    for s in got.sections:
        np.testing.assert_allclose(s.weights.double().sum(-1).numpy(), 1.0, atol=1e-5)


def test_tokens_offsets_and_special_tokens(saved):
    got = model_attentions(load_model(saved["bert"]), TEXT)
    assert got.tokens[0] == "[CLS]" and got.tokens[-1] == "[SEP]"
    assert got.special[0] and got.special[-1] and not any(got.special[1:-1])
    for tok, (a, b), sp in zip(got.tokens, got.offsets, got.special, strict=True):
        if not sp:
            assert TEXT[a:b] == tok
    causal = model_attentions(load_model(saved["gpt2"]), TEXT).sections[0].weights
    upper = np.triu(np.ones(causal.shape[-2:], bool), 1)
    assert float(causal.numpy()[..., upper].max()) == 0.0  # decoder-only: causal rows


def test_long_text_is_cut_and_says_so(saved):
    text = " ".join(["the animal"] * 40)  # 80 words; the tiny tokenizer's limit is 48
    got = model_attentions(load_model(saved["roberta"]), text)
    assert got.truncated_to == 48 and len(got.tokens) == 48
    assert model_attentions(load_model(saved["roberta"]), TEXT).truncated_to is None


def test_bad_input(saved, tmp_path):
    loaded = load_model(saved["gpt2"])
    assert isinstance(loaded, LoadedModel)
    with pytest.raises(ValueError, match="text: expected a non-empty str"):
        model_attentions(loaded, "  ")
    with pytest.raises(TypeError, match="loaded: expected a LoadedModel"):
        model_attentions("gpt2", TEXT)
    with pytest.raises(ValueError, match="max_output_tokens"):
        model_attentions(loaded, TEXT, max_output_tokens=0)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((saved["gpt2"] / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="no .safetensors weights"):
        load_model(pickled)


@pytest.mark.parametrize("kind", KINDS)
def test_a_gpu_model_under_a_gpu_default_device(saved, kind):
    """``load_model(device="cuda")`` inside ``with torch.device("cuda")`` (emulated on the CPU
    by tests/support/fake_device.py): read without accelerate, inputs beside the model, the
    weights returned on the host and equal to a CPU run's."""
    import torch

    from tests.support.fake_device import HOST, FakeCuda

    fake = FakeCuda(default_gpu=True)
    with fake:
        got = model_attentions(load_model(saved[kind], device="cuda"), TEXT)
    assert not fake.mixed, fake.mixed
    plain = model_attentions(load_model(saved[kind]), TEXT)
    for s, p in zip(got.sections, plain.sections, strict=True):
        assert fake.where(s.weights) == HOST and s.weights.device.type == "cpu", s.title
        assert (s.q_tokens, s.k_tokens) == (p.q_tokens, p.k_tokens)
        torch.testing.assert_close(s.weights, p.weights, rtol=0, atol=TOL)
