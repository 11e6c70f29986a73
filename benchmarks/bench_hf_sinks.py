"""Gemma 2 (attention-logit softcapping) and gpt-oss (attention sinks) inside HuggingFace
transformers: ``attn_implementation="attnkit"`` against ``"eager"`` (the only implementation
transformers offers for them on CPU: SDPA has neither feature), side by side in one process,
same random weights, built locally (nothing is downloaded).

Rows (issue 23):
- ``hf-gemma2-prefill-8k``: a Gemma 2-shaped model (2 layers, hidden 128, 4 heads of 64,
  2 key/value heads, softcap 50, layers alternating a 4,096-token sliding window and global
  attention), prefill of L = 8,192, batch 1: target >= 3x faster and <= 1/4 of eager's peak
  memory (peak RSS of the whole prefill above the start, each side in a fresh process).
- ``hf-gpt-oss-prefill-8k``: a gpt-oss-shaped model (2 layers, hidden 128, 4 heads of 64,
  2 key/value heads, attention sinks, a 128-token window alternating with full attention,
  a 4-expert MoE), L = 8,192: target >= 5x and <= 1/4 of eager's peak memory.
- ``hf-gpt-oss-train-2k``: one fine-tuning step (forward, loss, backward) of the same model at
  L = 2,048: target >= 3x.

``--quick`` runs L = 2,048 (prefills) and 1,024 (training).

    python benchmarks/bench_hf_sinks.py --list
    python benchmarks/bench_hf_sinks.py --row hf-gpt-oss-prefill-8k [--quick]
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from common import (  # noqa: E402
    child,
    main,
    max_rel_err,
    measure_pair,
    peak_memory_mib,
    row,
    run_child,
    train_step,
)

VOCAB = 1024
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=16384,
    attention_dropout=0.0,
)


def build(arch: str, causal_lm: bool = False):
    """(attnkit model, eager model) of ``arch`` ("gemma2" or "gpt_oss"), same random weights."""
    import transformers as tf

    import attnkit.integrations.transformers as ak_hf

    ak_hf.register()
    types = ["sliding_attention", "full_attention"]
    if arch == "gemma2":
        cfg = tf.Gemma2Config(
            **SHAPE, sliding_window=4096, layer_types=types, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, query_pre_attn_scalar=64,
        )  # fmt: skip
        cls = tf.Gemma2ForCausalLM if causal_lm else tf.Gemma2Model
    else:
        cfg = tf.GptOssConfig(
            **SHAPE, sliding_window=128, layer_types=types, num_local_experts=4,
            num_experts_per_tok=2, rope_parameters=dict(rope_type="default", rope_theta=1e4),
        )  # fmt: skip
        cls = tf.GptOssForCausalLM if causal_lm else tf.GptOssModel
    torch.manual_seed(0)
    model = cls(cfg)
    if arch == "gpt_oss":
        with torch.no_grad():
            for p in (n for name, n in model.named_parameters() if name.endswith("sinks")):
                p.normal_(0.0, 1.0)  # sinks large enough to matter
    model.eval()
    peer = copy.deepcopy(model)
    model.set_attn_implementation("attnkit")
    peer.set_attn_implementation("eager")
    return model, peer


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@child("prefill-memory")
def _memory_child(spec: str) -> float:
    """Peak RSS (MiB) above the start of one prefill ``arch:side:n`` in this fresh process."""
    arch, side, n = spec.split(":")
    ours, peer = build(arch)
    model = ours if side == "attnkit" else peer
    del ours, peer
    ids = _ids(int(n))
    with torch.inference_mode():
        model(ids[:, :64], use_cache=False)  # first-call set-up at a small size
        return peak_memory_mib(lambda: model(ids, use_cache=False))


def _prefill(arch: str, n: int, speed: float, what: str) -> dict:
    ours, peer = build(arch)
    ids = _ids(n)

    def impl():
        return ours(ids, use_cache=False).last_hidden_state

    def ref():
        return peer(ids, use_cache=False).last_hidden_state

    mem = {
        s: float(run_child(__file__, "prefill-memory", f"{arch}:{s}:{n}"))
        for s in ("attnkit", "eager")
    }
    with torch.inference_mode():
        err = max_rel_err(impl(), ref())
        res = measure_pair(impl, ref, 5)
    ratio, mem_ratio = res["peer_s"] / res["impl_s"], mem["attnkit"] / mem["eager"]
    res["extra"].update(
        rel_err=f"{err:.1e}",
        prefill_peak_mib=f"{mem['attnkit']:.0f}/{mem['eager']:.0f}",
        mem_ratio=round(mem_ratio, 3),
    )
    return dict(
        res,
        case=f"{what}, L={n} prefill",
        peer="transformers eager",
        target_met=bool(ratio >= speed and mem_ratio <= 0.25),
    )


@row(
    "hf-gemma2-prefill-8k", "transformers", "Gemma 2-shaped, softcap, window 4096 / global, L=8192",
    ">=3x, <=1/4 mem",
)  # fmt: skip
def gemma2_prefill(quick: bool) -> dict:
    what = "Gemma 2-shaped (2 layers, d 128, 4/2 heads), softcap 50, window 4096 / global"
    return _prefill("gemma2", 2048 if quick else 8192, 3.0, what)


@row(
    "hf-gpt-oss-prefill-8k", "transformers", "gpt-oss-shaped, sinks, window 128 / full, L=8192",
    ">=5x, <=1/4 mem",
)  # fmt: skip
def gpt_oss_prefill(quick: bool) -> dict:
    what = "gpt-oss-shaped (2 layers, d 128, 4/2 heads, 4 experts), sinks, window 128 / full"
    return _prefill("gpt_oss", 2048 if quick else 8192, 5.0, what)


@row("hf-gpt-oss-train-2k", "transformers", "gpt-oss-shaped, L=2048 fine-tuning step", ">=3x")
def gpt_oss_train(quick: bool) -> dict:
    n = 1024 if quick else 2048
    ours, peer = build("gpt_oss", causal_lm=True)
    ids = _ids(n)
    for m in (ours, peer):
        m.train()
    la, lb = train_step(ours, ids)(), train_step(peer, ids)()
    ga = [p.grad for n_, p in ours.named_parameters() if n_.endswith("sinks")]
    gb = [p.grad for n_, p in peer.named_parameters() if n_.endswith("sinks")]
    res = measure_pair(train_step(ours, ids), train_step(peer, ids), 7)
    ratio = res["peer_s"] / res["impl_s"]
    res["extra"].update(
        loss_diff=f"{abs(float(la - lb)):.1e}",
        sinks_grad_rel_err=f"{max(max_rel_err(a, b) for a, b in zip(ga, gb)):.1e}",
    )
    return dict(
        res,
        case=f"gpt-oss-shaped, sinks, window 128 / full, L={n} forward+backward",
        peer="transformers eager",
        target_met=bool(ratio >= 3.0),
    )


if __name__ == "__main__":
    main()
