"""Training steps end to end (issue 12): attnkit's models against the same models in plain PyTorch,
side by side in one process (interleaved repeats, medians), same weights, same batches, same
optimiser (AdamW, betas 0.9/0.98, eps 1e-9, gradient norm clipped to 1) and the same loss
(cross-entropy, label smoothing 0.1, PAD ignored).

- ``train-seq2seq``: ``Seq2SeqTransformer`` (d_model 256, 3+3 layers, 8 heads, FF 1024, pre-norm,
  tied embeddings, dropout 0.1) on eng-fra-5k pairs tokenised with attnkit's word tokenizer,
  batches of 64 random pairs padded to their longest (as PyTorch's translation tutorial batches
  them), against the tutorial's model on ``torch.nn.Transformer`` with the same weights (the
  loss of one batch in eval mode is checked equal first). Time per step and tokens/s
  (source + target tokens, padding excluded).
- ``train-seq2seq-packed``: the same steps, attnkit packing each step's pairs into rows
  (``attnkit.train.packing.pack_seq2seq``, document masks, positions restarting per pair)
  against the same padded peer.
- ``train-lm-8k``: decoder-only LM (4 layers, d_model 256, 8 heads, FF 1024, BPE 2000) at
  L = 8192 with a local-causal window of 256, against the same model with
  ``F.scaled_dot_product_attention`` and the dense boolean mask of that window. Same weights
  and batch: the step-1 losses must agree to 1e-5 relative. Peak memory of one training step of
  each side is measured in its own fresh process.
Both sides run with one torch thread (:data:`THREADS`). (The DDP row is in ``bench_ddp.py``.)

``--quick``: 2 steps of 16 pairs, L = 512 with window 64.

    python benchmarks/bench_train.py --list
    python benchmarks/bench_train.py --row train-lm-8k [--quick]
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import numpy as np
import torch
import torch.nn.functional as F
from common import (
    child,
    main,
    max_rel_err,
    measure_pair,
    row,
    run_child,
    trimmed_peak_memory_mib,
)
from train_peers import SDPALanguageModel, TutorialSeq2Seq, seq2seq_state_from_attnkit

from attnkit import masks
from attnkit.explain.shared import shared_dir
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnkit.train import tokenizer as tk
from attnkit.train.batches import collate_seq2seq
from attnkit.train.data import read_pairs
from attnkit.train.tasks import lm_stream, seq2seq_example

DATA = shared_dir() / "data" / "eng-fra-5k.tsv"
SMOOTHING = 0.1
CLIP = 1.0
LOSS_RTOL = 1e-5
"""float32 tolerance of the step-1 loss agreement (relative)."""
PACK_LEN = 128
"""Row length of the packed seq2seq batches."""
THREADS = 1
"""torch threads of both sides: the trainer's default (``attnkit train --threads 1``). On this
shared 2-core machine two threads per process contend with every other job (a 2-thread step of
the seq2seq row took 12 s under load against about 1 s with one thread), so one thread gives the
steadier comparison; both sides always run with the same count, reported in the notes."""
SEQ2SEQ = dict(d_model=256, nhead=8, layers=3, dim_feedforward=1024, dropout=0.1)
LM = dict(d_model=256, nhead=8, num_layers=4, dim_feedforward=1024)


torch.set_num_threads(THREADS)


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=tk.PAD,
        label_smoothing=SMOOTHING,
    )


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn) -> float:
    """One training step: loss, backward, clip, AdamW; the loss."""
    loss = loss_fn()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return float(loss.detach())


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


# ---------------------------------------------------------------------------------------------
# short sequences: Seq2SeqTransformer vs the translation tutorial's nn.Transformer
# ---------------------------------------------------------------------------------------------
def translation_batches(steps: int, batch: int, seed: int = 0) -> tuple[int, list[list]]:
    """(vocabulary size, ``steps`` batches of ``batch`` random eng-fra pairs as attnkit
    examples (source + [EOS], [BOS] + target + [EOS])), word tokenizer trained on every
    pair."""
    if not DATA.is_file():
        raise FileNotFoundError(f"{DATA}: the eng-fra-5k data (../shared/data) is needed")
    pairs = read_pairs(DATA)
    tok = tk.train([s for p in pairs for s in p], "word")
    examples = [seq2seq_example(tok, s, t) for s, t in pairs]
    order = np.random.default_rng(seed).permutation(len(examples))
    if steps * batch > len(order):
        raise ValueError(f"steps x batch = {steps * batch} exceeds the {len(order)} pairs")
    out = [[examples[i] for i in order[k * batch : (k + 1) * batch]] for k in range(steps)]
    return tok.get_vocab_size(), out


def seq2seq_models(vocab: int, dropout: float) -> tuple[Seq2SeqTransformer, TutorialSeq2Seq]:
    """attnkit's model (seeded) and the tutorial's, holding the same weights."""
    c = SEQ2SEQ
    torch.manual_seed(0)
    ours = Seq2SeqTransformer(
        Seq2SeqConfig(
            vocab,
            vocab,
            d_model=c["d_model"],
            nhead=c["nhead"],
            num_encoder_layers=c["layers"],
            num_decoder_layers=c["layers"],
            dim_feedforward=c["dim_feedforward"],
            dropout=dropout,
            max_len=256,
            pad_id=tk.PAD,
            bos_id=tk.BOS,
            eos_id=tk.EOS,
            tie_embeddings="all",
            norm_first=True,
        )
    )
    peer = TutorialSeq2Seq(
        vocab, c["d_model"], c["nhead"], c["layers"], c["dim_feedforward"], dropout, tk.PAD, True
    )
    peer.load_state_dict(seq2seq_state_from_attnkit(ours.state_dict()))
    return ours, peer


def _tokens(batches: list[list]) -> int:
    """Source + target tokens the loss trains on (padding excluded), over all batches."""
    return sum(len(s) + len(t) - 1 for b in batches for s, t in b)


def _seq2seq_row(quick: bool, packed: bool) -> dict:
    steps, batch, reps = (2, 16, 2) if quick else (8, 64, 3)
    vocab, batches = translation_batches(steps, batch)
    padded = [collate_seq2seq(b) for b in batches]
    ours, peer = seq2seq_models(vocab, SEQ2SEQ["dropout"])
    ours.eval()
    peer.eval()
    with torch.no_grad():
        src, tgt_in, y = padded[0]
        loss_ours = float(_loss(ours(src, tgt_in), y))
        loss_diff = _rel(loss_ours, float(_loss(peer(src, tgt_in), y)))
    if loss_diff > LOSS_RTOL:
        raise AssertionError(f"same weights, different losses: relative difference {loss_diff}")
    ours.train()
    peer.train()
    o_opt, p_opt = _optimizer(ours), _optimizer(peer)

    def peer_run() -> None:
        for src, tgt_in, y in padded:
            _step(peer, p_opt, lambda: _loss(peer(src, tgt_in), y))  # noqa: B023

    extra: dict = {}
    if packed:
        from attnkit.train.packing import pack_seq2seq, packed_loss

        packs = [pack_seq2seq(b, PACK_LEN) for b in batches]
        ours.eval()
        with torch.no_grad():  # packing changes the layout, not the loss
            packed_diff = _rel(float(packed_loss(ours, packs[0], SMOOTHING)[0]), loss_ours)
        ours.train()
        if packed_diff > LOSS_RTOL:
            raise AssertionError(f"packed and padded losses differ: relative {packed_diff:.1e}")
        extra["packed_loss_rel_diff"] = f"{packed_diff:.1e}"

        def ours_run() -> None:
            for p in packs:
                _step(ours, o_opt, lambda: packed_loss(ours, p, SMOOTHING)[0])  # noqa: B023

        rows = sum(p.src.shape[0] for p in packs)
        extra["packed_rows"] = f"{rows / steps:.1f} x {PACK_LEN} per step"
    else:

        def ours_run() -> None:
            for src, tgt_in, y in padded:
                _step(ours, o_opt, lambda: _loss(ours(src, tgt_in), y))  # noqa: B023

    tokens = _tokens(batches)
    cells = sum(s.numel() + t.numel() for s, t, _ in padded)
    res = measure_pair(ours_run, peer_run, reps, step1_loss_rel_diff=f"{loss_diff:.1e}", **extra)
    res["extra"].update(
        tok_s=round(tokens / res["impl_s"]),
        peer_tok_s=round(tokens / res["peer_s"]),
        tokens_per_step=tokens // steps,
        padding=f"{1 - tokens / cells:.0%} of the peer's cells",
        threads=torch.get_num_threads(),
    )
    res["impl_s"] /= steps
    res["peer_s"] /= steps
    how = f"packed into rows of {PACK_LEN}" if packed else "padded batches"
    return dict(
        case=f"{steps} steps x {batch} pairs, {how} (time per step)",
        peer="nn.Transformer (tutorial), padded",
        **res,
    )


@row(
    "train-seq2seq",
    "training step",
    "Seq2SeqTransformer 256d 3+3 layers, eng-fra batches of 64, padded",
    ">=1.0x",
)
def train_seq2seq(quick: bool) -> dict:
    return _seq2seq_row(quick, packed=False)


@row(
    "train-seq2seq-packed",
    "training step",
    "Seq2SeqTransformer 256d 3+3 layers, eng-fra batches of 64, packed",
    ">=1.3x",
)
def train_seq2seq_packed(quick: bool) -> dict:
    if importlib.util.find_spec("attnkit.train.packing") is None:
        return dict(
            peer="nn.Transformer (tutorial), padded",
            case="NOT AVAILABLE",
            extra=dict(status="not available: attnkit.train.packing does not exist yet"),
        )
    return _seq2seq_row(quick, packed=True)


# ---------------------------------------------------------------------------------------------
# long context: windowed TransformerLM vs SDPA with a dense boolean mask
# ---------------------------------------------------------------------------------------------
def lm_batch(length: int) -> tuple[int, torch.Tensor]:
    """(vocabulary size, (1, length + 1) ids): eng-fra sentences (both sides of every pair,
    each followed by [EOS]) tokenised with attnkit's BPE tokenizer (2000 ids)."""
    if not DATA.is_file():
        raise FileNotFoundError(f"{DATA}: the eng-fra-5k data (../shared/data) is needed")
    lines = [s for p in read_pairs(DATA) for s in p]
    tok = tk.train(lines, "bpe", vocab_size=2000)
    stream = lm_stream(tok, lines)
    reps = math.ceil((length + 1) / len(stream))
    ids = torch.tensor((stream * reps)[: length + 1], dtype=torch.long)[None]
    return tok.get_vocab_size(), ids


def lm_models(vocab: int, length: int, window: int) -> tuple:
    """(attnkit's windowed TransformerLM, its forward, the SDPA peer with the same weights, the
    peer's dense (L, L) boolean mask)."""
    torch.manual_seed(0)
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    native = "window" in fields
    kw = dict(vocab_size=vocab, dropout=0.0, max_len=length, **LM)
    ours = TransformerLM(LMConfig(**kw, **({"window": window} if native else {})))
    mask = masks.sliding_window(window, 0)
    if native:
        forward = ours
    else:  # before LMConfig.window: the model's own modules under the windowed mask

        def forward(tokens: torch.Tensor) -> torch.Tensor:
            x = ours.positional(ours.embed(tokens) * math.sqrt(ours.config.d_model))
            for layer in ours.layers:
                x = layer(x, mask)
            return ours.generator(ours.norm(x))

    peer = SDPALanguageModel(vocab, LM["d_model"], LM["nhead"], LM["num_layers"], 1024)
    peer.load_state_dict(ours.state_dict())
    return ours, forward, peer, mask.materialize(length, length)


def _lm_sizes(quick: bool) -> tuple[int, int, int]:
    return (512, 64, 2) if quick else (8192, 256, 3)


@child("lm-memory")
def lm_memory(arg: str) -> float:
    """Peak RSS (MiB) of one training step of one side (``attnkit:L:W`` or ``peer:L:W``) above
    the RSS before it (model, optimiser state and batch), in this fresh process, after a warm-up
    step at L = 64. The peer's step includes building its dense (L, L) boolean mask."""
    side, length, window = arg.split(":")
    length, window = int(length), int(window)
    vocab, ids = lm_batch(length)
    ours, forward, peer, dense = lm_models(vocab, length, window)
    x, y = ids[:, :-1], ids[:, 1:]
    if side == "attnkit":
        model, fn, warm = ours, forward, forward
        del peer, dense
    else:  # the peer's (L, L) mask is built inside the measured step: it is part of its cost
        small = dense[:64, :64].clone()
        model = peer
        fn = lambda t: peer(t, masks.sliding_window(window, 0).materialize(length, length))  # noqa: E731
        warm = lambda t: peer(t, small)  # noqa: E731
        del ours, forward, dense
    opt = _optimizer(model)
    _step(model, opt, lambda: _loss(warm(x[:, :64]), y[:, :64]))
    return trimmed_peak_memory_mib(lambda: _step(model, opt, lambda: _loss(fn(x), y)))


def _lm_times(length: int, window: int, reps: int) -> tuple[dict, str]:
    """Step-1 loss check, then interleaved training steps of both sides; (row fields, where the
    window comes from)."""
    vocab, ids = lm_batch(length)
    x, y = ids[:, :-1], ids[:, 1:]
    ours, forward, peer, dense = lm_models(vocab, length, window)
    # step 1: same weights, same batch -> the same loss (before any update)
    with torch.no_grad():
        logits_ours, logits_peer = forward(x), peer(x, dense)
        loss_ours = float(_loss(logits_ours, y))
        loss_peer = float(_loss(logits_peer, y))
        logits_diff = max_rel_err(logits_ours, logits_peer)
        del logits_ours, logits_peer
    diff = _rel(loss_ours, loss_peer)
    print(f"step-1 loss: attnkit {loss_ours:.7f}, peer {loss_peer:.7f}, relative diff {diff:.1e}")
    if diff > LOSS_RTOL:
        raise AssertionError(f"step-1 losses differ: {loss_ours} vs {loss_peer} (rel {diff:.1e})")
    o_opt, p_opt = _optimizer(ours), _optimizer(peer)
    res = measure_pair(
        lambda: _step(ours, o_opt, lambda: _loss(forward(x), y)),
        lambda: _step(peer, p_opt, lambda: _loss(peer(x, dense), y)),
        reps,
        step1_loss=round(loss_ours, 6),
        step1_loss_rel_diff=f"{diff:.1e}",
        step1_logits_rel_diff=f"{logits_diff:.1e}",
    )
    return res, "LMConfig.window" if forward is ours else "bench (model modules + mask)"


@row(
    "train-lm-8k",
    "training step",
    "TransformerLM 4x256d, L=8192, window 256",
    ">=5x, <=1/4 memory",
)
def train_lm_8k(quick: bool) -> dict:
    length, window, reps = _lm_sizes(quick)
    res, where = _lm_times(length, window, reps)
    arg = f"{length}:{window}"
    mem = {s: run_child(__file__, "lm-memory", f"{s}:{arg}") for s in ("attnkit", "peer")}
    mem_ratio = mem["peer"] / max(mem["attnkit"], 1e-9)
    ratio = res["peer_s"] / res["impl_s"]
    res["extra"].update(
        attnkit_step_peak_mib=round(mem["attnkit"], 1),
        peer_step_peak_mib=round(mem["peer"], 1),
        mem_ratio=round(mem_ratio, 2),
        tok_s=round(length / res["impl_s"]),
        peer_tok_s=round(length / res["peer_s"]),
        threads=torch.get_num_threads(),
        window_in=where,
    )
    return dict(
        case=f"L={length}, window {window}, B=1, fwd+bwd+AdamW",
        peer="SDPA + dense bool mask",
        target_met=ratio >= 5.0 and mem_ratio >= 4.0,
        **res,
    )


if __name__ == "__main__":
    main()
