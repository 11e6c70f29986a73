"""The data, models, losses and memory probes of the training rows (``bench_train.py``), kept
apart from the rows themselves: eng-fra batches, attnkit's models and their plain-PyTorch peers
(``train_peers.py``) holding the same weights, the training configurations of the long-context
row, one attention call's memory, and the per-module breakdown of the activations an LM keeps.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from common import trimmed_peak_memory_mib
from train_peers import SDPALanguageModel, TutorialSeq2Seq, seq2seq_state_from_attnkit

from attnkit import masks
from attnkit.explain.shared import shared_dir
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnkit.nn.projection import unpack
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.sources import read_pairs
from attnkit.train.data.tasks import lm_stream, seq2seq_example
from attnkit.train.loop.steps import CHUNK, LMHeadLoss
from attnkit.train.loss import chunked_head_loss

DATA = shared_dir() / "data" / "eng-fra-5k.tsv"
SMOOTHING = 0.1
CLIP = 1.0
LOSS_RTOL = 1e-5
"""float32 tolerance of the step-1 loss agreement (relative)."""
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


def tokens_of(batches: list[list]) -> int:
    """Source + target tokens the loss trains on (padding excluded), over all batches."""
    return sum(len(s) + len(t) - 1 for b in batches for s, t in b)


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
    """(attnkit's windowed TransformerLM, the SDPA peer with the same weights, the peer's dense
    (L, L) boolean mask)."""
    torch.manual_seed(0)
    kw = dict(vocab_size=vocab, dropout=0.0, max_len=length, window=window, **LM)
    ours = TransformerLM(LMConfig(**kw))
    peer = SDPALanguageModel(vocab, LM["d_model"], LM["nhead"], LM["num_layers"], 1024)
    peer.load_state_dict(unpack(ours.state_dict()))  # q, k, v apart, as the peer keeps them
    return ours, peer, masks.sliding_window(window, 0).materialize(length, length)


def _lm_sizes(quick: bool) -> tuple[int, int, int]:
    return (512, 64, 2) if quick else (8192, 256, 3)


SIDES = ("attnkit", "attnkit-ckpt", "peer", "peer-ckpt")
"""Training configurations of the long-context row: each model as is, and each with its layers
checkpointed (``torch.utils.checkpoint``, non-reentrant) and the loss computed
:data:`attnkit.train.loop.steps.CHUNK` positions at a time (``attnkit train --checkpoint``; the peer
the same two techniques in plain PyTorch)."""


def lm_loss(side: str, ours, peer, x, y, peer_mask) -> Callable[[], torch.Tensor]:
    """The mean token loss of one side (label smoothing 0.1); ``peer_mask()`` gives the
    peer's dense mask (built inside the step for the memory measurement)."""
    n = int((y != tk.PAD).sum())
    if side == "attnkit":
        return lambda: _loss(ours(x), y)
    if side == "attnkit-ckpt":
        ours.checkpoint_layers = True
        lm_loss = LMHeadLoss(ours, SMOOTHING)
        return lambda: lm_loss(x, y) / n
    if side == "peer":
        return lambda: _loss(peer(x, peer_mask()), y)
    peer.checkpoint_layers = True
    return lambda: (
        chunked_head_loss(
            peer.hidden(x, peer_mask()),
            y,
            peer.head,
            pad_id=tk.PAD,
            label_smoothing=SMOOTHING,
            chunk=CHUNK,
        )[0]
        / n
    )


def attention_memory(side: str, length: int, window: int) -> float:
    """Peak RSS (MiB) of one attention call forward and backward, q, k, v (1, 8, L, 32):
    attnkit with ``sliding_window(W, 0)`` or SDPA with the dense mask built in the call, after
    a warm-up call of the same side at L = 64, as the step rows have a warm-up step: the
    process's one-time loads (attnkit's numba kernels, about 200 MiB of RSS, once per
    process) are not one call's memory."""
    from attnkit.functional import scaled_dot_product_attention

    g = torch.Generator().manual_seed(0)

    def inputs(n: int) -> list[torch.Tensor]:
        shape = (1, LM["nhead"], n, LM["d_model"] // LM["nhead"])
        return [torch.randn(shape, generator=g).requires_grad_() for _ in range(3)]

    band = masks.sliding_window(window, 0)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if side == "attn-attnkit":
            scaled_dot_product_attention(q, k, v, band).sum().backward()
        else:
            dense = band.materialize(q.shape[-2], k.shape[-2])
            F.scaled_dot_product_attention(q, k, v, attn_mask=dense).sum().backward()

    call(*inputs(64))
    q, k, v = inputs(length)
    return trimmed_peak_memory_mib(lambda: call(q, k, v))


def saved_activations(length: int, window: int) -> dict:
    """MiB of the tensors one forward of attnkit's LM (L, window W, no checkpointing) keeps for its
    backward, by the module that saved them (layers summed; storages counted once, parameters
    not counted), plus the sizes of parameters, gradients and AdamW state: where the activation
    floor of the long-context row comes from."""
    vocab, ids = lm_batch(length)
    ours, _, _ = lm_models(vocab, length, window)
    x, y = ids[:, :-1], ids[:, 1:]
    seen = {p.untyped_storage().data_ptr() for p in ours.parameters()}
    where, tally = ["loss (outside the model)"], collections.Counter()

    def name_of(path: str) -> str:
        parts = [t for t in path.split(".") if not t.isdigit()]
        return ".".join(parts) or "model"

    def enter(name: str) -> Callable:
        def hook(*_: object) -> None:
            where.append(name)

        return hook

    def leave(*_: object) -> None:
        where.pop()

    hooks = []
    for path, m in ours.named_modules():
        hooks.append(m.register_forward_pre_hook(enter(name_of(path))))
        hooks.append(m.register_forward_hook(leave))

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            tally[where[-1]] += st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _loss(ours(x), y)
    for h in hooks:
        h.remove()
    mib = {k: round(v / 2**20, 1) for k, v in tally.most_common()}
    params = sum(p.numel() * p.element_size() for p in ours.parameters()) / 2**20
    mib["TOTAL saved activations"] = round(sum(tally.values()) / 2**20, 1)
    mib["parameters"] = round(params, 1)
    mib["gradients"] = round(params, 1)
    mib["AdamW state (exp_avg, exp_avg_sq)"] = round(2 * params, 1)
    mib["logits (L, V) float32, each of logits/log-softmax/grad"] = round(
        length * vocab * 4 / 2**20, 1
    )
    del loss
    return mib
