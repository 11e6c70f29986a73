"""Tiny random transformers models built locally (nothing downloaded), float32, no dropout, for
comparing ``attn_implementation="attnkit"`` with ``"eager"`` on the same weights."""

from __future__ import annotations

import copy

import torch
import transformers as tf

VOCAB = 101
PAD = 0


def _decoder_common(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        attention_dropout=0.0,
    )
    base.update(kw)
    return base


def llama():
    return tf.LlamaForCausalLM(tf.LlamaConfig(**_decoder_common()))


def mistral(window: int = 5):
    return tf.MistralForCausalLM(tf.MistralConfig(**_decoder_common(sliding_window=window)))


def qwen2():
    cfg = tf.Qwen2Config(
        **_decoder_common(num_hidden_layers=3, use_sliding_window=True, sliding_window=4)
    )
    cfg.layer_types = ["full_attention", "sliding_attention", "full_attention"]
    return tf.Qwen2ForCausalLM(cfg)


def gemma3():
    cfg = tf.Gemma3TextConfig(
        **_decoder_common(
            num_hidden_layers=3,
            head_dim=8,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=12,
        )
    )
    return tf.Gemma3ForCausalLM(cfg)


def gemma2(softcap: float | None = 50.0):
    cfg = tf.Gemma2Config(
        **_decoder_common(
            head_dim=8,
            sliding_window=4,
            attn_logit_softcapping=softcap,
            final_logit_softcapping=None,
            query_pre_attn_scalar=8,
        )
    )
    return tf.Gemma2ForCausalLM(cfg)


def gpt_oss(window: int = 4):
    """gpt-oss: attention sinks (one learned logit per head, drawn large enough to matter),
    sliding-window layers alternating with full ones, grouped-query heads, a tiny MoE."""
    cfg = tf.GptOssConfig(
        **_decoder_common(
            head_dim=8,
            sliding_window=window,
            layer_types=["sliding_attention", "full_attention"],
            num_local_experts=4,
            num_experts_per_tok=2,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        )
    )
    m = tf.GptOssForCausalLM(cfg)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return m


def _llama_like(config: str, model: str, **kw):
    """A builder for a decoder whose config takes the Llama-style arguments."""

    def build():
        cfg = getattr(tf, config)(**_decoder_common(**kw))
        return getattr(tf, model)(cfg)

    return build


def gpt2():
    cfg = tf.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    return tf.GPT2LMHeadModel(cfg)


def bert():
    cfg = tf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD,
    )
    return tf.BertForMaskedLM(cfg)


def bart():
    cfg = tf.BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    return tf.BartForConditionalGeneration(cfg)


def t5():
    cfg = tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
    )
    return tf.T5ForConditionalGeneration(cfg)


BUILDERS = {
    "llama": llama,
    "mistral": mistral,
    "qwen2": qwen2,
    "gemma3": gemma3,
    "gemma2": gemma2,
    "gpt_oss": gpt_oss,
    "gemma": _llama_like("GemmaConfig", "GemmaForCausalLM", head_dim=8),
    "qwen3": _llama_like("Qwen3Config", "Qwen3ForCausalLM", head_dim=8),
    "phi3": _llama_like("Phi3Config", "Phi3ForCausalLM"),
    "olmo2": _llama_like("Olmo2Config", "Olmo2ForCausalLM"),
    "granite": _llama_like("GraniteConfig", "GraniteForCausalLM"),
    "smollm3": _llama_like("SmolLM3Config", "SmolLM3ForCausalLM"),
    "starcoder2": _llama_like("Starcoder2Config", "Starcoder2ForCausalLM", sliding_window=4),
    "gpt2": gpt2,
    "bert": bert,
    "bart": bart,
    "t5": t5,
}
DECODERS = ("llama", "mistral", "qwen2", "gemma3", "gemma2", "gpt_oss")
ENCODER_DECODERS = ("bart", "t5")


def pair(name: str, seed: int = 0, **kw):
    """(eager model, attnkit model) with the same random weights, in eval mode."""
    torch.manual_seed(seed)
    m = BUILDERS[name](**kw) if kw else BUILDERS[name]()
    m.set_attn_implementation("eager")
    m.eval()
    ours = copy.deepcopy(m)
    ours.set_attn_implementation("attnkit")
    return m, ours


def batch(b: int, n: int, seed: int = 1, pad: str = "right"):
    """(input_ids (B, n), attention_mask (B, n)): row 0 unpadded, the others shorter, padded on
    the ``pad`` side."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (b, n), generator=g)
    am = torch.ones(b, n, dtype=torch.long)
    for r in range(1, b):
        k = min(n - 1, 2 * r + 1)
        if pad == "right":
            am[r, n - k :] = 0
        else:
            am[r, :k] = 0
    ids[am == 0] = PAD
    return ids, am
