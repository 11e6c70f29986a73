"""attnkit inside HuggingFace transformers on a GPU: prefill at 8k tokens with
``attn_implementation="attnkit"`` against transformers' own GPU attention, same random weights
(built locally: nothing is downloaded), bf16 on the GPU. Without CUDA every row reports
``skipped: needs a CUDA GPU`` (no time, no ratio).

Rows (issue 30, section 4; they depend on attnkit's GPU kernels):
- ``gpu-hf-mistral-8k``: Mistral-shaped (2 layers, hidden 256, 8/2 heads, sliding window 512),
  L = 8,192 prefill, against "sdpa" (a dense windowed mask): target >= 1.5x.
- ``gpu-hf-llama-8k``: Llama-shaped (same sizes, causal), against "sdpa": target >= 0.97x.
- ``gpu-hf-gemma2-8k``: Gemma 2-shaped (logit softcap 50, window 4,096 on alternate layers),
  against "flex_attention" where this transformers offers it for the model, else "eager":
  target >= 1.0x.
- ``gpu-hf-gptoss-8k``: gpt-oss-shaped (attention sinks, window 128 on alternate layers,
  a tiny MoE), against "flex_attention" where offered, else "eager": target >= 1.0x.

Each row also reports ``rel_err`` (max relative error of the last hidden state against the
peer) and the peer used. ``--quick``: L = 2,048.

    python benchmarks/bench_gpu_hf.py --list
    python benchmarks/bench_gpu_hf.py --row gpu-hf-mistral-8k [--quick]
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from common import main, max_rel_err, measure_pair, row  # noqa: E402

VOCAB = 1024
NO_GPU = "needs a CUDA GPU (torch.cuda.is_available() is False here)"


def _common(**kw) -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=16384,
                attention_dropout=0.0)  # fmt: skip
    return base | kw


def build(kind: str):
    """A tiny random transformers model of ``kind`` (mistral, llama, gemma2, gptoss), eval."""
    import transformers as tf

    torch.manual_seed(0)
    if kind == "mistral":
        return tf.MistralModel(tf.MistralConfig(**_common(sliding_window=512))).eval()
    if kind == "llama":
        return tf.LlamaModel(tf.LlamaConfig(**_common())).eval()
    if kind == "gemma2":
        cfg = tf.Gemma2Config(**_common(head_dim=32, sliding_window=4096, query_pre_attn_scalar=32,
                                        attn_logit_softcapping=50.0))  # fmt: skip
        return tf.Gemma2Model(cfg).eval()
    layers = ["sliding_attention", "full_attention"]
    cfg = tf.GptOssConfig(**_common(head_dim=32, sliding_window=128, num_local_experts=4,
                                    num_experts_per_tok=2, layer_types=layers))  # fmt: skip
    return tf.GptOssModel(cfg).eval()


def peer_implementation(model, wanted: str) -> str:
    """``wanted`` when transformers accepts it for ``model``, else "eager"."""
    probe = copy.deepcopy(model)
    try:
        probe.set_attn_implementation(wanted)
    except (ValueError, ImportError):
        return "eager"
    return wanted


def prefill_row(kind: str, wanted_peer: str, quick: bool, target: float) -> dict:
    """attnkit against ``wanted_peer`` (or eager) on a ``kind`` model's prefill, on the GPU."""
    if not torch.cuda.is_available():
        return dict(peer=wanted_peer, extra={"skipped": NO_GPU}, target_met=None)
    import attnkit.integrations.transformers as ak_hf

    ak_hf.register()
    n = 2048 if quick else 8192
    model = build(kind).to("cuda", torch.bfloat16)
    peer_name = peer_implementation(model, wanted_peer)
    peer = copy.deepcopy(model)
    peer.set_attn_implementation(peer_name)
    model.set_attn_implementation("attnkit")
    ids = torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(0)).cuda()

    def side(m):
        def run():
            out = m(ids, use_cache=False).last_hidden_state
            torch.cuda.synchronize()
            return out

        return run

    with torch.inference_mode():
        err = max_rel_err(side(model)().float(), side(peer)().float())
        res = measure_pair(side(model), side(peer), 5)
    ratio = res["peer_s"] / res["impl_s"]
    res["extra"].update(rel_err=f"{err:.1e}", gpu=torch.cuda.get_device_name(), length=n)
    return dict(res, peer=f"transformers {peer_name}", target_met=bool(ratio >= target))


@row("gpu-hf-mistral-8k", "transformers gpu", "Mistral-shaped, window 512, L=8192 prefill",
     ">=1.5x")  # fmt: skip
def mistral_8k(quick: bool) -> dict:
    return prefill_row("mistral", "sdpa", quick, 1.5)


@row("gpu-hf-llama-8k", "transformers gpu", "Llama-shaped, causal, L=8192 prefill", ">=0.97x")
def llama_8k(quick: bool) -> dict:
    return prefill_row("llama", "sdpa", quick, 0.97)


@row("gpu-hf-gemma2-8k", "transformers gpu", "Gemma 2-shaped, softcap 50, L=8192 prefill",
     ">=1.0x")  # fmt: skip
def gemma2_8k(quick: bool) -> dict:
    return prefill_row("gemma2", "flex_attention", quick, 1.0)


@row("gpu-hf-gptoss-8k", "transformers gpu", "gpt-oss-shaped, sinks, L=8192 prefill", ">=1.0x")
def gptoss_8k(quick: bool) -> dict:
    return prefill_row("gptoss", "flex_attention", quick, 1.0)


if __name__ == "__main__":
    main()
