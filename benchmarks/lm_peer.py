"""The peer of ``make lm-bench``: a plain-PyTorch GPT trained the way nanoGPT trains the
character-level Shakespeare on a CPU (README of karpathy/nanoGPT: ``--device=cpu --compile=False
--eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
--n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``, with
``config/train_shakespeare_char.py``'s betas (0.9, 0.99), lr 1e-3 → 1e-4, 100 warm-up steps,
weight decay 0.1 on matrices only, clip 1.0).

The model follows nanoGPT's ``model.py``: token + learned position embeddings, pre-LayerNorm
blocks (no biases), causal self-attention through ``F.scaled_dot_product_attention(is_causal=
True)``, a GELU MLP of 4·d, a final LayerNorm and an output layer tied to the token embedding;
weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2·layers)). Batches are nanoGPT's
``get_batch``: ``batch`` windows at uniform random offsets of the first 90% of the characters.
Only torch and the standard library are used here (no attnkit), so the peer is independent.

On a GPU (``make lm-bench-gpu``, ``lm_race_gpu.py``) the recipe is
``config/train_shakespeare_char.py`` as nanoGPT runs it: dropout 0.2 (embeddings, attention
weights, residual branches), ``torch.compile``, bf16 autocast, batches copied from pinned host
memory with ``non_blocking``, and a validation score every ``eval_every`` steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Recipe:
    """The training recipe (nanoGPT's names in comments)."""

    layers: int = 4  # n_layer
    heads: int = 4  # n_head
    d: int = 128  # n_embd
    block: int = 64  # block_size
    batch: int = 12  # batch_size
    steps: int = 2000  # max_iters = lr_decay_iters
    lr: float = 1e-3  # learning_rate
    min_lr: float = 1e-4
    warmup: int = 100  # warmup_iters
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 1337
    dropout: float = 0.0
    device: str = "cpu"
    compile: bool = False
    bf16: bool = False  # autocast, as nanoGPT's dtype="bfloat16"
    eval_every: int = 0  # eval_interval (0: only at the end)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.p = heads, dropout
        self.drop = nn.Dropout(dropout)
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hs)
        x = x + self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.drop(self.fc_proj(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab: int, r: Recipe) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, r.d), nn.Embedding(r.block, r.d)
        self.blocks = nn.ModuleList(Block(r.d, r.heads, r.dropout) for _ in range(r.layers))
        self.drop = nn.Dropout(r.dropout)
        self.ln_f = nn.LayerNorm(r.d, bias=False)
        self.head = nn.Linear(r.d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
        for b in self.blocks:
            for p in (b.proj.weight, b.fc_proj.weight):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * r.layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def lr_at(it: int, r: Recipe) -> float:
    """nanoGPT's ``get_lr`` (iterations from 0)."""
    if it < r.warmup:
        return r.lr * (it + 1) / (r.warmup + 1)
    if it > r.steps:
        return r.min_lr
    ratio = (it - r.warmup) / (r.steps - r.warmup)
    return r.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (r.lr - r.min_lr)


def encode(text: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(train ids, validation ids, vocabulary): nanoGPT's prepare.py, first 90% / last 10%."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(len(ids) * 0.9)
    return ids[:n], ids[n:], len(chars)


@torch.no_grad()
def val_nats(model: nn.Module, val: torch.Tensor, block: int) -> float:
    """Mean nats/char over the whole validation stream, non-overlapping windows of ``block``
    (each target scored once), summed in float64."""
    model.eval()
    device = next(model.parameters()).device
    starts = list(range(0, len(val) - 1, block))
    full = [s for s in starts if s + block <= len(val) - 1]
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for i in range(0, len(full), 64):  # 64 full windows per forward, then the short last one
        chunk = torch.tensor(full[i : i + 64])[:, None] + torch.arange(block)
        x, y = val[chunk].to(device), val[chunk + 1].to(device)
        total += F.cross_entropy(model(x).double().flatten(0, 1), y.flatten(), reduction="sum")
        count += y.numel()
    for s in starts[len(full) :]:
        x = val[s : len(val) - 1][None].to(device)
        y = val[s + 1 : s + 1 + x.shape[1]].to(device)
        total += F.cross_entropy(model(x)[0].double(), y, reduction="sum")
        count += y.numel()
    model.train()
    return float(total) / count


def train(text: str, r: Recipe) -> dict:
    """Train the peer; {"steps_per_s", "train_s", "cpu_s", "val_nats", "last_loss", "curve"}
    (train_s: wall seconds of the training loop, compile and evaluations included; cpu_s: the
    CPU seconds the process spent in it; curve: (step, wall seconds before that step's
    evaluation, validation nats/char) every ``eval_every`` steps)."""
    torch.manual_seed(r.seed)
    device = torch.device(r.device)
    tr, va, vocab = encode(text)
    model = GPT(vocab, r).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": r.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=r.lr, betas=r.betas)
    gen = torch.Generator().manual_seed(r.seed)
    step_model = torch.compile(model) if r.compile else model
    cuda = device.type == "cuda"
    t0, cpu0 = time.perf_counter(), time.process_time()
    loss, curve = torch.zeros(()), []
    for it in range(r.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(it, r)
        ix = torch.randint(len(tr) - r.block, (r.batch,), generator=gen)
        x = torch.stack([tr[i : i + r.block] for i in ix])
        y = torch.stack([tr[i + 1 : i + 1 + r.block] for i in ix])
        if cuda:  # nanoGPT's get_batch: pinned, non_blocking
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=r.bf16):
            logits = step_model(x)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.clip)
        opt.step()
        if r.eval_every and (it + 1) % r.eval_every == 0 and it + 1 < r.steps:
            if cuda:
                torch.cuda.synchronize()
            curve.append((it + 1, time.perf_counter() - t0, val_nats(model, va, r.block)))
    if cuda:
        torch.cuda.synchronize()
    train_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    final = val_nats(model, va, r.block)
    return {
        "steps_per_s": r.steps / train_s,
        "train_s": train_s,
        "cpu_s": cpu_s,
        "val_nats": final,
        "last_loss": loss.item(),
        "curve": curve + [(r.steps, train_s, final)],
    }
