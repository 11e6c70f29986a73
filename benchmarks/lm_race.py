"""``make lm-bench``: attnkit's language model against a plain-PyTorch GPT (``lm_peer.py``) on
tiny Shakespeare, side by side (two processes, one thread each), same data split (first 90% /
last 10% of the characters), same tokens (one per character), same recipe.

Rows:
  same   nanoGPT's CPU recipe on both (see lm_peer.py): steps/s, and validation nats/char over
         the whole validation stream (non-overlapping windows of the block, float64 sums).
         Targets: attnkit within 0.03 nats/char of the peer and of nanoGPT's 1.88, at >= 1.2x
         the peer's steps/s.
  best   attnkit's best recipe (BEST below), beside a second peer run (same load), for about
         the peer's training time (steps estimated from the first row's rates).
         Target: validation <= 1.75 nats/char within the peer's training time.

    python benchmarks/lm_race.py [--steps 2000] [--rows same,best] [--data FILE] [--bf16]

Prints the CPU, the load (``uptime``) before and after, and one line per side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "tinyshakespeare.txt"
NANOGPT_VAL = 1.88

SAME = dict(
    tokenizer="char", block_size=64, batch_size=12, d_model=128, nhead=4, layers=4,
    dim_feedforward=512, dropout=0.0, schedule="cosine", lr=1e-3, min_lr=1e-4, warmup=100,
    betas=(0.9, 0.99), weight_decay=0.1, clip=1.0, tie_embeddings=True, norm_first=True,
    bias=False, activation="gelu", label_smoothing=0.0, seed=1337,
)  # fmt: skip
"""nanoGPT's CPU recipe in attnkit's TrainConfig fields."""

BEST = dict(SAME, block_size=256, batch_size=4, lr=2e-3, min_lr=2e-4)
"""attnkit's best recipe: windows of 256 characters (more context per prediction), a higher
peak learning rate, and (with --bf16) bf16 autocast."""


def _child(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    text = Path(args.data).read_text(encoding="utf-8")
    if args.child == "peer":
        from lm_peer import Recipe, train

        return train(text, Recipe(steps=args.steps))
    from attnkit.train import TrainConfig, load, train
    from attnkit.train import tokenizer as tk
    from attnkit.train.lm_eval import score_stream
    from attnkit.train.stream import split_text

    recipe = dict(SAME if args.child == "attnkit" else BEST)
    if args.bf16:
        recipe["bf16"] = True
    limit = dict(max_steps=args.steps)
    c = TrainConfig(task="lm", data=str(args.data), threads=1, eval_every=10**9,
                    save_every=10**9, log_every=args.steps, **limit, **recipe)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = train(c, Path(tmp) / "run", echo=lambda _: None)
        rows = [json.loads(s) for s in (Path(tmp) / "run" / "log.jsonl").read_text().splitlines()]
        loaded = load(ckpt)
    train_s = max(r["elapsed_s"] for r in rows if "elapsed_s" in r)
    val = split_text(text, c.resolved().valid_fraction).valid
    score = score_stream(loaded.model, tk.encode(loaded.tokenizer, val), recipe["block_size"])
    return {
        "steps_per_s": args.steps / train_s,
        "train_s": train_s,
        "val_nats": score.nats_per_token,
        "last_loss": [r["loss"] for r in rows if "loss" in r][-1],
    }


def _spawn(side: str, steps: int, data: Path, bf16: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", side, "--steps", str(steps), "--data", str(data)]
    if bf16:
        cmd.append("--bf16")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE)


def _result(p: subprocess.Popen) -> dict:
    out, _ = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"lm_race: a child failed (exit {p.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _line(name: str, r: dict) -> str:
    return (f"  {name:<22} {r['steps_per_s']:6.2f} steps/s  {r['train_s']:7.1f} s  "
            f"val {r['val_nats']:.4f} nats/char ({r['val_nats'] / 0.6931471805599453:.3f} "
            f"bits/char)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--rows", default="same,best")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--bf16", action="store_true", help="attnkit sides use bf16 autocast")
    p.add_argument("--child", choices=("peer", "attnkit", "best"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    if not args.data.is_file():
        print(f"lm_race: {args.data} not found (the shared data directory)", file=sys.stderr)
        return 2
    rows = args.rows.split(",")
    print(f"CPU: {_cpu()}, 1 thread per process; load before: {_load()}")
    t0 = time.monotonic()
    peer_p, ours_p = (_spawn(s, args.steps, args.data, args.bf16) for s in ("peer", "attnkit"))
    peer, ours = _result(peer_p), _result(ours_p)
    print(f"same recipe ({args.steps} steps, side by side; load after: {_load()}):")
    print(_line("plain-PyTorch GPT", peer))
    print(_line("attnkit", ours))
    speed = ours["steps_per_s"] / peer["steps_per_s"]
    gap_peer, gap_pub = ours["val_nats"] - peer["val_nats"], ours["val_nats"] - NANOGPT_VAL
    ok = speed >= 1.2 and abs(gap_peer) <= 0.03 and abs(gap_pub) <= 0.03
    print(f"  speed {speed:.2f}x the peer (target >= 1.2x); val - peer {gap_peer:+.4f}, "
          f"val - nanoGPT's 1.88 {gap_pub:+.4f} (targets within 0.03): "
          f"{'met' if ok else 'NOT met'}")  # fmt: skip
    if "best" in rows:  # side by side with the peer again, so both see the same load
        budget = peer["train_s"]
        rate = ours["steps_per_s"] * (64 * 12) / (BEST["block_size"] * BEST["batch_size"])
        steps = max(100, int(0.9 * budget * rate))
        print(f"best recipe, {steps} steps, beside the peer again (load {_load()}):")
        peer_p, best_p = (_spawn(s, n, args.data, args.bf16) for s, n in
                          (("peer", args.steps), ("best", steps)))  # fmt: skip
        peer2, best = _result(peer_p), _result(best_p)
        print(_line("plain-PyTorch GPT", peer2))
        print(_line("attnkit best", best))
        met = best["val_nats"] <= 1.75 and best["train_s"] <= peer2["train_s"]
        verdict = "met" if met else "NOT met"
        print(f"  val {best['val_nats']:.4f} nats/char in {best['train_s']:.0f} s (target <= "
              f"1.75 in the peer's {peer2['train_s']:.0f} s): {verdict}")  # fmt: skip
    print(f"total {time.monotonic() - t0:.0f} s; load after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
