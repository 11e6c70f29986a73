"""Distributed training (issue 12): ``torchrun --nproc_per_node=N -m attnkit train`` with N = 2
against N = 1, the CLI in subprocesses (interleaved repeats, medians), same global batch (128
eng-fra pairs per step: 2 processes x 64, or 1 process x 64 x ``--accumulate 2``), one torch
thread per process. Tokens/s and seconds per step come from each run's ``log.jsonl`` (rank 0
logs the target tokens of all ranks), from the first logged step to the last, so start-up
(imports, tokenizer, process group) is left out. On a 2-core machine expect no speed-up: the
row shows DDP's overhead and is meant to be re-run on bigger machines.

``--quick``: a tiny model, 4 steps, one repeat.

    python benchmarks/bench_ddp.py --row train-ddp [--quick]
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

from common import main, row

from attnkit.explain.shared import shared_dir

DATA = shared_dir() / "data" / "eng-fra-5k.tsv"


def ddp_command(nproc: int, out: str, steps: int, quick: bool) -> list[str]:
    """``torchrun --standalone --nproc_per_node=N -m attnkit train ...`` on eng-fra with the
    seq2seq row's model; the global batch is 128 pairs (64 per process x 2 / N accumulation
    micro-batches), so both runs train on the same data per step."""
    size = ["--d-model", "64", "--nhead", "2", "--layers", "1", "--dim-feedforward", "128"]
    if not quick:
        size = ["--d-model", "256", "--nhead", "8", "--layers", "3", "--dim-feedforward", "1024"]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "attnkit", "train", "--task", "translate",
        "--data", str(DATA), "--out", out, "--max-steps", str(steps), "--log-every", "1",
        "--eval-every", "100000", "--save-every", "100000", "--no-progress", "--threads", "1",
        "--batch-size", "64", "--accumulate", str(2 // nproc), *size,
    ]  # fmt: skip


def ddp_speed(log: list[dict]) -> tuple[float, float]:
    """(target tokens per second, seconds per step) of a run's ``log.jsonl`` lines (one per
    step), from the first logged step to the last (the first step's start-up is left out)."""
    steps = [r for r in log if "tokens" in r and "elapsed_s" in r]
    if len(steps) < 2:
        raise ValueError(f"log: expected at least 2 step lines, got {len(steps)}")
    first, last = steps[0], steps[-1]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    return (last["tokens"] - first["tokens"]) / seconds, seconds / (last["step"] - first["step"])


def _ddp_run(nproc: int, steps: int, quick: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="attnkit-ddp-") as tmp:
        out = os.path.join(tmp, "run")
        cmd = ddp_command(nproc, out, steps, quick)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit code {p.returncode}\n{p.stderr[-1500:]}")
        with open(os.path.join(out, "log.jsonl")) as f:
            return ddp_speed([json.loads(line) for line in f if line.strip()])


def _ddp_available() -> str | None:
    """Why the DDP row cannot run, or None."""
    if importlib.util.find_spec("attnkit.train.loop.distributed") is None:
        return "attnkit.train.loop.distributed does not exist yet"
    if not DATA.is_file():
        return f"{DATA} is absent"
    return None


@row("train-ddp", "training step", "attnkit train under torchrun, 2 vs 1 processes")
def train_ddp(quick: bool) -> dict:
    peer = "torchrun, 1 process x accumulate 2"
    why = _ddp_available()
    if why:
        return dict(peer=peer, case="NOT AVAILABLE", extra=dict(status=f"not available: {why}"))
    steps, reps = (4, 1) if quick else (12, 2)
    runs: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    for r in range(reps):  # interleaved, the order flipping every round
        for n in (2, 1) if r % 2 == 0 else (1, 2):
            runs[n].append(_ddp_run(n, steps, quick))
    tok = {n: statistics.median(t for t, _ in v) for n, v in runs.items()}
    step = {n: statistics.median(s for _, s in v) for n, v in runs.items()}
    return dict(
        case=f"translate, {steps} steps of 128 pairs, 1 thread per process (time per step)",
        peer=peer,
        impl_s=step[2],
        peer_s=step[1],
        extra=dict(
            tok_s_2proc=round(tok[2]),
            tok_s_1proc=round(tok[1]),
            tok_s_ratio=round(tok[2] / tok[1], 3),
            reps=reps,
            cpus=os.cpu_count(),
            threads_per_process=1,
            largest_process_peak_mib=round(
                resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
            ),
        ),
    )


if __name__ == "__main__":
    main()
