"""Training on several processes (DistributedDataParallel, gloo, 2 local processes).

- :func:`shard` gives the ranks disjoint micro-batches that cover the epoch but a ragged tail.
- 2 processes x accumulate 2, 1 process x accumulate 2, and the 2 x 2 run resumed in 1 process
  x accumulate 4 end with the parameters of a plain single-process loop, written here, that
  trains on each step's sequences as ONE batch (and resuming with another product is refused).
  Tolerance: 1e-5 relative (the project's float32 tolerance) per parameter tensor, and on the
  logits of a batch. Both sides add the same float32 terms in another order (per micro-batch
  sums, the all-reduce, one scaling by W/N instead of 1/N inside the loss), so gradients differ
  by a few ulps; AdamW's update m / (sqrt(v) + eps) is invariant to the gradient's scale and
  changes by about as much: 3 steps leave differences near 2e-7 relative. One exception: the
  key projections' biases, whose true gradient is exactly 0 (adding q.b_k to every score of a
  row leaves its softmax unchanged); their computed gradient is rounding noise, which AdamW
  scales to steps of size lr with an arbitrary sign. They cannot change any output, so they are
  checked through the logits only.
- Resuming under DDP (dropout on, so every rank's generator matters) is bit-identical to an
  uninterrupted DDP run: every logged loss and the final weights, exactly.
- A rank that exits, or stops responding, makes rank 0 (the real ``python -m attnkit train``)
  exit within a bounded time with exit code 2 and one line on stderr, no traceback.

The training runs go through ``python -m torch.distributed.run --standalone --nproc_per_node=2``
and the CLI (several runs per launch: starting processes is what costs time). The death tests
start the ranks by hand with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) so that rank 0 (``python -m attnkit train``) can be watched alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import hypothesis.strategies as hs
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from safetensors.torch import load_file

from attnkit.train.checkpoint import resolve
from attnkit.train.config import TrainConfig
from attnkit.train.data.batches import batch_logits, epoch_batches
from attnkit.train.data.tasks import build_model, prepare
from attnkit.train.data.tokenizer import PAD
from attnkit.train.inference import session
from attnkit.train.loop.distributed import (
    Dist,
    DistributedError,
    environment,
    join,
    rank_seed,
    shard,
)
from attnkit.train.loop.schedule import noam_lr
from attnkit.train.loop.trainer import train
from tests.train.conftest import TINY as BASE_TINY

TINY = {**BASE_TINY, "dropout": 0.0, "eval_every": 100, "keep": 10}
TINY_ARGS = [
    "--task=reverse",
    "--train-size=400",
    "--valid-size=16",
    "--vocab=6",
    "--length=5",
    "--min-length=2",
    "--d-model=16",
    "--nhead=2",
    "--layers=1",
    "--dim-feedforward=32",
    "--dropout=0",
    "--batch-size=16",
    "--warmup=10",
    "--log-every=1",
    "--eval-every=100",
    "--no-progress",
]
STEPS = 3
RTOL = 1e-5
LAUNCH_TIMEOUT = 120  # seconds; every launch below ends in well under 30 s

WORKER = """
import json, sys
from attnkit.cli import main
for args in json.load(open(sys.argv[1])):
    if main(args):
        sys.exit(1)
"""  # several runs of the CLI in one torchrun launch (starting processes is the slow part)

# rank 1 of the death tests: the real CLI, with the schedule patched to die at step 2
DYING = """
import os, sys, time
import attnkit.train.loop.run as t
real = t.schedule_of
def schedule_of(c):
    lr = real(c)
    def dying(step):
        if step == 2:
            open("died_at", "w").write(repr(time.time()))
            os._exit(3) if sys.argv[1] == "exit" else time.sleep(600)
        return lr(step)
    return dying
t.schedule_of = schedule_of
from attnkit.cli import main
sys.exit(main(sys.argv[2:]))
"""


# --- sharding: pure functions -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(0, 60), world=hs.integers(1, 5), accumulate=hs.integers(1, 4))
def test_shards_are_disjoint_cover_all_but_a_short_tail_and_are_deterministic(n, world, accumulate):
    batches = [f"b{i}" for i in range(n)]
    shards = [shard(batches, world, r, accumulate) for r in range(world)]
    steps = n // (world * accumulate)
    assert all(len(s) == steps and all(len(m) == accumulate for m in s) for s in shards)
    taken = [b for s in shards for m in s for b in m]
    assert len(taken) == len(set(taken))  # disjoint
    assert set(taken) == set(batches[: steps * world * accumulate])  # all but the tail
    assert n - len(taken) < world * accumulate
    for s in range(steps):  # step s uses the s-th run of world*accumulate batches
        in_step = {b for r in range(world) for b in shards[r][s]}
        lo = s * world * accumulate
        assert in_step == set(batches[lo : lo + world * accumulate])
    assert shards == [shard(list(batches), world, r, accumulate) for r in range(world)]


def test_shard_example_and_bad_arguments():
    assert shard(list(range(9)), 2, 1, 2) == [[1, 3], [5, 7]]
    assert shard(list(range(9)), 2, 0, 1) == [[0], [2], [4], [6]]
    with pytest.raises(ValueError, match=r"^rank: expected an int in \[0, 2\), got 2"):
        shard([1, 2], 2, 2)
    with pytest.raises(ValueError, match=r"^world_size: expected a positive int, got 0"):
        shard([1, 2], 0, 0)
    with pytest.raises(TypeError, match=r"^accumulate: "):
        shard([1, 2], 1, 0, True)


def test_rank_seeds_differ_per_rank_and_step_and_repeat():
    seeds = {rank_seed(0, r, s) for r in range(8) for s in range(8)}
    assert len(seeds) == 64 and rank_seed(3, 1) == rank_seed(3, 1)
    assert all(0 <= x < 2**63 for x in seeds)


def test_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert environment() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert environment() is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert environment() == (1, 2, 1)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"^RANK: expected 0 <= RANK < WORLD_SIZE=2"):
        environment()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match=r"^RANK: expected an integer"):
        environment()


def test_guard_turns_only_communication_errors_into_one_line():
    d = Dist(rank=1, world_size=2, timeout=7)
    with pytest.raises(DistributedError) as e:
        with d.guard("step 5"):
            raise RuntimeError(
                "[/x/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4: Connection "
                "reset by peer. This is typically caused by a remote worker hanging"
            )
    assert str(e.value) == (
        "rank 1: lost contact with another process of the run (step 5; world size 2): one "
        "exited or did not respond within 7 s (Read error [127.0.0.1]:4: Connection reset by "
        "peer.)"
    )
    with pytest.raises(RuntimeError, match="shape mismatch"), d.guard("step 5"):
        raise RuntimeError("shape mismatch")


# --- the single-process reference ------------------------------------------------------------


def reference(config: TrainConfig, model_config: dict, per_step: int, steps: int):
    """(parameters, losses) of a plain loop: step s trains on micro-batches
    s*per_step .. s*per_step + per_step - 1 of epoch 0's order as ONE padded batch, with the
    mean token loss, clipping and AdamW + the warm-up schedule as the trainer documents."""
    c = config.resolved()
    data = prepare(c)
    torch.manual_seed(c.seed)
    model = build_model(data.kind, model_config)
    model.train()
    opt = torch.optim.AdamW(
        model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=c.weight_decay
    )
    lengths = np.array([sum(len(x) for x in e) for e in data.examples])
    order = epoch_batches(lengths, c.batch_size, c.seed, 0)
    losses = []
    for s in range(steps):
        ids = np.concatenate(order[s * per_step : (s + 1) * per_step])
        logits, y = batch_logits(model, data.kind, [data.examples[i] for i in ids])
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            y.reshape(-1),
            ignore_index=PAD,
            label_smoothing=c.label_smoothing,
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
        for g in opt.param_groups:
            g["lr"] = noam_lr(s + 1, c.d_model, c.warmup, c.lr_factor)
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def weights(ckpt: Path) -> dict:
    loaded = session.load(ckpt)
    return {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}


def log_rows(run: Path, key: str = "loss") -> dict[int, float]:
    rows = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if key in r]
    assert len(steps) == len(set(steps)), "a step was logged twice (by two ranks?)"
    return {r["step"]: r[key] for r in rows if key in r}


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (got - want).abs().max().item() <= RTOL * want.abs().max().item()


def assert_close_to_reference(run: Path, per_step: int, steps: int = STEPS) -> None:
    loaded = session.load(run)
    want, want_losses = reference(loaded.train_config, loaded.model_config, per_step, steps)
    got = weights(run)
    assert got.keys() == want.keys()
    free = [k for k in want if k.endswith("in_proj.bias")]  # q | k | v: k's block has a zero
    assert len(free) == 3  # true gradient (see above), so only the q and v blocks are compared
    for name in want.keys() - free:
        assert close(got[name], want[name]), name
    for name in free:
        e = want[name].shape[0] // 3
        keep = torch.cat([torch.arange(e), torch.arange(2 * e, 3 * e)])
        assert close(got[name][keep], want[name][keep]), name
    model = session.load(run).model
    src, tgt = torch.randint(3, 10, (4, 6)), torch.randint(3, 10, (4, 5))
    with torch.no_grad():
        ref_logits = model(src, tgt)
        model.load_state_dict(want)
        assert close(model(src, tgt), ref_logits)
    got_losses = log_rows(run)
    assert sorted(got_losses) == list(range(1, steps + 1))
    for s, loss in enumerate(want_losses, 1):
        assert abs(got_losses[s] - loss) <= RTOL * loss, (s, got_losses[s], loss)


# --- launching processes --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start(commands: list[list[str]], cwd: Path) -> list[subprocess.Popen]:
    """Start one process per command as ranks 0, 1, ... of a torchrun-style group."""
    port = free_port()
    procs = []
    for rank, cmd in enumerate(commands):
        env = clean_env() | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(len(commands)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"process did not exit within {timeout} s:\n{out}\n{err}")
    return proc.returncode, out, err


def torchrun(tmp_path: Path, runs: list[list[str]]) -> str:
    """Run ``runs`` (CLI argument lists) one after the other in 2 processes started by
    ``python -m torch.distributed.run``; their stdout."""
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.Popen(
        [*cmd, "worker.py", "runs.json"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, out, err = finish(proc, LAUNCH_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    return out


# --- two processes --------------------------------------------------------------------------


def test_ddp_equals_one_big_batch_and_resumes_bit_identically(tmp_path):
    dropout = [*TINY_ARGS, "--dropout=0.1", "--save-every=4", "--keep=10"]
    out = torchrun(
        tmp_path,
        [
            # 2 processes x 2 micro-batches: step s = micro-batches 4s .. 4s+3 as one batch
            ["train", *TINY_ARGS, "--accumulate=2", f"--max-steps={STEPS}", "--out=w2k2"],
            # dropout on: an uninterrupted run of 6 steps, and one stopped at 3 and resumed
            ["train", *dropout, "--max-steps=6", "--out=full"],
            ["train", *dropout, "--max-steps=3", "--out=part"],
            ["train", "--resume=part", "--max-steps=6", "--no-progress"],
        ],
    )
    assert out.count("stopped at step") == 4 and "2 processes" in out  # rank 0 only
    assert_close_to_reference(tmp_path / "w2k2", per_step=4)

    # resume: every logged loss and lr, and the final weights, bit for bit
    for key in ("loss", "lr"):
        want, got = log_rows(tmp_path / "full", key), log_rows(tmp_path / "part", key)
        assert sorted(want) == list(range(1, 7)) and got == want
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = load_file(str(tmp_path / "full/step-00000004/state.safetensors"))
    assert not torch.equal(state["rng.torch"], state["rng.torch.rank1"])  # own dropout per rank
    assert json.loads((tmp_path / "full/step-00000004/state.json").read_text())["world_size"] == 2

    # the 2 x 2 run continues in 1 process with --accumulate 4: same data per step, so the
    # result is still that of one big batch per step; other products are refused
    base = resolve(tmp_path / "w2k2").train_config
    with pytest.raises(ValueError, match=r"^accumulate: .* resume with --accumulate 4 with 1 "):
        train(replace(base, max_steps=5), tmp_path / "w2k2", resume=tmp_path / "w2k2")
    notes = []
    run = replace(base, max_steps=5, accumulate=4)
    train(run, tmp_path / "w2k2", resume=tmp_path / "w2k2", echo=notes.append)
    assert any(n.startswith("note: the checkpoint was written by 2 process(es)") for n in notes)
    assert_close_to_reference(tmp_path / "w2k2", per_step=4, steps=5)


def test_one_process_with_accumulate_equals_one_big_batch(tmp_path):
    train(TrainConfig(max_steps=STEPS, accumulate=2, **TINY), tmp_path / "w1k2", echo=print)
    assert_close_to_reference(tmp_path / "w1k2", per_step=2)


@pytest.mark.parametrize(
    "how, timeout",
    # exit: the peer's connections close and rank 0 fails at once, whatever the timeout (a long
    # one shows it is not what ends the run); hang: rank 0 waits for the timeout (10 s: every
    # wait is bounded by it, including the start, where a loaded machine can skew the ranks)
    [("exit", 120), ("hang", 10)],
)
def test_a_dead_rank_stops_the_other_with_one_line(tmp_path, how, timeout):
    args = ["train", *TINY_ARGS, "--max-steps=50", f"--dist-timeout={timeout}", "--out=run"]
    rank0 = [sys.executable, "-m", "attnkit", *args]
    rank1 = [sys.executable, "-c", DYING, how, *args]
    p0, p1 = start([rank0, rank1], tmp_path)
    try:
        code, out, err = finish(p0, LAUNCH_TIMEOUT)
        took = time.time() - float((tmp_path / "died_at").read_text())
    finally:
        p1.kill()
        p1.communicate()
    lines = err.strip().splitlines()
    assert code == 2, f"{out}\n{err}"
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(
        "attnkit train: error: rank 0: lost contact with another process of the run (step 2; "
        f"world size 2): one exited or did not respond within {timeout} s ("
    ), lines[0]
    assert lines[0].endswith("; the last checkpoint: none written"), lines[0]
    if how == "exit":
        assert took < 20, took  # at once (plus a loaded machine's scheduling)
    else:
        assert timeout - 1 < took < timeout + 20, took


def test_a_group_that_cannot_form_is_one_clear_error_after_the_timeout(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"^rank 0: the 2 processes did not all join at "):
        join(timeout=1)  # rank 1 never comes
    assert time.monotonic() - t0 < 15
    assert not torch.distributed.is_initialized()
