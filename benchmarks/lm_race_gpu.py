"""``make lm-bench-gpu``: nanoGPT's ``config/train_shakespeare_char.py`` on one GPU, the
plain-PyTorch peer (``lm_peer.py``: compiled, bf16, as nanoGPT runs it) and ``attnkit train``
(``--compile --bf16``), one after the other on the same GPU, same data split (first 90% / last
10% of the characters), same tokens (one per character), same recipe: 6 layers, 6 heads, 384
wide, block 256, batch 64, dropout 0.2, lr 1e-3 -> 1e-4 cosine, 100 warm-up steps, beta2 0.99,
weight decay 0.1, clip 1.0, 5,000 steps.

Evaluation, identical on both sides: every ``--eval-every`` steps (nanoGPT: 250) the mean
nats/char of the whole validation stream in non-overlapping windows of the block (about 436
windows of 256, float64 sums) instead of nanoGPT's ``eval_iters`` = 200 random batches per
split, which costs about 7x more and samples the same stream.

Rows: the best validation loss and its step, the wall time (compile and evaluations included)
to reach 1.48 nats/char, the 5,000-step wall time, ms/step and MFU (nanoGPT's estimate: 6N +
12·L·H·Q·T flops per token; ``--peak-tflops``, default from the GPU's name: H100/H200 989,
A100 312). Targets (issue 30): best validation within 0.02 nats/char of the peer; attnkit
reaches 1.48 no later than the peer; both sides together under 6 minutes.

    python benchmarks/lm_race_gpu.py [--device cuda] [--steps 5000] [--eval-every 250]
    python benchmarks/lm_race_gpu.py --dry-run     # the plan, nothing trained
    python benchmarks/lm_race_gpu.py --tiny        # the whole pipeline on the CPU in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lm_race import DATA, LN2, SAME

HERE = Path(__file__).resolve().parent
TARGET = 1.48
BUDGET_S = 360.0

GPU_RECIPE = dict(SAME, block_size=256, batch_size=64, d_model=384, nhead=6, layers=6,
                  dim_feedforward=1536, dropout=0.2, positions="learned")  # fmt: skip
"""nanoGPT's train_shakespeare_char in attnkit's TrainConfig fields: the CPU recipe of
lm_race.py (schedule, betas, weight decay, clip, no biases, tied embeddings) scaled up, with
dropout 0.2 and learned positions (nanoGPT's wpe)."""

TINY = dict(GPU_RECIPE, block_size=16, batch_size=4, d_model=32, nhead=2, layers=1,
            dim_feedforward=128, warmup=2)  # fmt: skip
"""--tiny: the same pipeline on the CPU in seconds (for the tests)."""


def peer_recipe(recipe: dict, steps: int, device: str, eval_every: int, fast: bool):
    """``recipe`` in the peer's names (lm_peer.Recipe)."""
    from lm_peer import Recipe

    return Recipe(
        layers=recipe["layers"], heads=recipe["nhead"], d=recipe["d_model"],
        block=recipe["block_size"], batch=recipe["batch_size"], steps=steps, lr=recipe["lr"],
        min_lr=recipe["min_lr"], warmup=recipe["warmup"], betas=recipe["betas"],
        weight_decay=recipe["weight_decay"], clip=recipe["clip"], seed=recipe["seed"],
        dropout=recipe["dropout"], device=device, compile=fast, bf16=fast, eval_every=eval_every,
    )  # fmt: skip


def flops_per_step(recipe: dict, vocab: int) -> float:
    """nanoGPT's estimate_mfu numerator for one step: (6N + 12·L·H·Q·T) · T · B, N the
    parameters without the position table."""
    d, layers, t = recipe["d_model"], recipe["layers"], recipe["block_size"]
    n = layers * (12 * d * d + 2 * d) + d + vocab * d
    per_token = 6 * n + 12 * layers * recipe["nhead"] * (d // recipe["nhead"]) * t
    return per_token * t * recipe["batch_size"]


def _attnkit(text_path: Path, recipe: dict, steps: int, device: str, every: int, fast: bool):
    from attnkit.devices import resolve, use_device
    from attnkit.train import TrainConfig, train

    c = TrainConfig(task="lm", data=str(text_path), threads=None, eval_every=every,
                    save_every=10**9, log_every=every, max_steps=steps, bf16=fast, compile=fast,
                    **recipe)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, use_device(resolve(device)):
        train(c, Path(tmp) / "run", echo=lambda _: None)
        rows = [json.loads(s) for s in (Path(tmp) / "run" / "log.jsonl").read_text().splitlines()]
    elapsed = {r["step"]: r["elapsed_s"] for r in rows if "elapsed_s" in r}
    curve = [(r["step"], elapsed[r["step"]], r["val_loss"]) for r in rows if "val_loss" in r]
    last = max(elapsed)
    return {"steps_per_s": last / elapsed[last], "train_s": elapsed[last], "curve": curve}


def _child(args: argparse.Namespace) -> dict:
    text = Path(args.data).read_text(encoding="utf-8")
    recipe, fast = (TINY, False) if args.tiny else (GPU_RECIPE, True)
    if args.child == "peer":
        from lm_peer import train

        r = peer_recipe(recipe, args.steps, args.device, args.eval_every, fast)
        out = train(text, r)
    else:
        out = _attnkit(Path(args.data), recipe, args.steps, args.device, args.eval_every, fast)
    return out | {"vocab": len(set(text))}


def summary(r: dict, recipe: dict, steps: int, peak_tflops: float | None) -> dict:
    """Best validation (value, step), wall seconds to reach TARGET (None when never), ms per
    step and MFU of one side's result ``r``."""
    best = min(r["curve"], key=lambda row: row[2])
    reach = next((t for _, t, v in r["curve"] if v <= TARGET), None)
    ms = 1000 * r["train_s"] / steps
    mfu = None
    if peak_tflops:
        mfu = flops_per_step(recipe, r["vocab"]) * steps / r["train_s"] / (peak_tflops * 1e12)
    return {"best": best[2], "best_step": best[0], "reach_s": reach, "ms": ms, "mfu": mfu}


def _line(name: str, s: dict, r: dict) -> str:
    reach = "never" if s["reach_s"] is None else f"{s['reach_s']:.1f} s"
    mfu = "" if s["mfu"] is None else f"  MFU {100 * s['mfu']:.1f}%"
    return (f"  {name:<18} best val {s['best']:.4f} nats/char ({s['best'] / LN2:.3f} bits) at "
            f"step {s['best_step']}; {TARGET} reached at {reach}; wall {r['train_s']:.1f} s, "
            f"{s['ms']:.1f} ms/step{mfu}")  # fmt: skip


def verdicts(ours: dict, peer: dict, total_s: float) -> list[str]:
    """The issue's targets, met or not."""
    gap = ours["best"] - peer["best"]
    reach_ok = ours["reach_s"] is not None and (
        peer["reach_s"] is None or ours["reach_s"] <= peer["reach_s"]
    )
    close = "met" if abs(gap) <= 0.02 else "NOT met"
    return [
        f"  best val: attnkit - peer {gap:+.4f} (within 0.02: {close})",
        f"  time to {TARGET}: {'met' if reach_ok else 'NOT met'} (attnkit no later than the peer)",
        f"  both sides {total_s:.0f} s (under {BUDGET_S:.0f} s: "
        f"{'met' if total_s <= BUDGET_S else 'NOT met'})",
    ]  # fmt: skip


def default_peak(device: str) -> float | None:
    """bf16 dense peak TFLOPS from the GPU's name (None when unknown or on the CPU)."""
    if not device.startswith("cuda"):
        return None
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    return next((v for k, v in (("H100", 989.0), ("H200", 989.0), ("A100", 312.0)) if k in name),
                None)  # fmt: skip


def _spawn(side: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", side, "--steps", str(args.steps), "--data",
           str(args.data), "--device", args.device, "--eval-every",
           str(args.eval_every)]  # fmt: skip
    if args.tiny:
        cmd.append("--tiny")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=HERE, check=False)
    if done.returncode != 0:
        raise SystemExit(f"lm_race_gpu: the {side} side failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (a smoke run)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, train nothing")
    p.add_argument("--child", choices=("peer", "attnkit"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny and args.device == "cuda":
        args.device = "cpu"
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    recipe = TINY if args.tiny else GPU_RECIPE
    fast = "" if args.tiny else ", compiled, bf16 autocast"
    print(f"recipe ({args.steps} steps on {args.device}{fast}; validation every "
          f"{args.eval_every} steps, the whole stream): {recipe}")  # fmt: skip
    print("sides, one after the other: plain-PyTorch GPT (lm_peer.py), then attnkit train")
    if args.dry_run:
        return 0
    if not args.data.is_file():
        print(f"lm_race_gpu: {args.data} not found (the shared data directory)", file=sys.stderr)
        return 2
    peak = args.peak_tflops or default_peak(args.device)
    t0 = time.monotonic()
    peer, ours = _spawn("peer", args), _spawn("attnkit", args)
    total = time.monotonic() - t0
    s_peer, s_ours = (summary(r, recipe, args.steps, peak) for r in (peer, ours))
    print(_line("plain-PyTorch GPT", s_peer, peer))
    print(_line("attnkit", s_ours, ours))
    print("\n".join(verdicts(s_ours, s_peer, total)))
    if peak is None:
        print("  MFU: pass --peak-tflops (the GPU's bf16 dense peak) to report it")
    print(f"total {total:.0f} s (processes, data, compile and evaluations included)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
