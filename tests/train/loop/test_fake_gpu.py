"""Every verb's code path as on a GPU, on the CPU: a GPU emulated by tests/support/fake_device.py
(every tensor tagged with where a CUDA run would put it) and the run's device answered as
``cuda``. A tensor created on the host and used beside a GPU tensor fails a real GPU run
("indices should be either on cpu or on the same device", "Expected all tensors to be on the
same device"); here it is a record in ``fake.mixed``. The real-GPU runs are in
tests/train/test_cuda_verbs.py (skipped without a GPU)."""

from __future__ import annotations

import collections

import pytest
import torch

import attnkit.devices as device_mod
from attnkit.cli import main
from attnkit.kernels.policy import numerics
from attnkit.train.checkpoint import find_checkpoint
from attnkit.train.config import TrainConfig
from attnkit.train.loop import run, steps, trainer
from attnkit.train.loop.trainer import train
from tests.support.fake_device import FakeCuda
from tests.train.conftest import RHYME, TINY

GPU = torch.device("cuda")
FAKE_GPU_RNG = torch.arange(16, dtype=torch.uint8)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The run's device answers ``cuda`` (batches are copied "there", autocast and the
    generators follow it); the CUDA generator's state is a stand-in. The numerics policy takes
    its device path throughout, as it does on a GPU: the emulation loses the tag of the
    tensors activation checkpointing recomputes from, which would otherwise send the
    recomputation down the host path (a different set of saved tensors)."""
    for mod in (device_mod, steps, trainer, run):
        monkeypatch.setattr(mod, "current", lambda: GPU)
    monkeypatch.setattr(run, "gpu_rng", lambda device: FAKE_GPU_RNG.clone())
    with numerics.use_path("device"):
        yield FakeCuda()


def _report(records) -> str:
    counts = collections.Counter(records)
    return "\n".join(f"{n} x {r.op} at {r.where}" for r, n in counts.most_common())


@pytest.fixture
def rhyme(tmp_path):
    p = tmp_path / "rhyme.txt"
    p.write_text(RHYME, encoding="utf-8")
    return str(p)


def _config(task: str, data: str | None, **extra) -> TrainConfig:
    small = {k: TINY[k] for k in ("d_model", "nhead", "layers", "dim_feedforward", "warmup")}
    if task == "lm":
        base = dict(task="lm", data=data, tokenizer="char", block_size=16, batch_size=4,
                    max_steps=3, eval_every=2, log_every=1, **small)  # fmt: skip
        return TrainConfig(**{**base, **extra})
    return TrainConfig(**{**TINY, "task": task, "max_steps": 3, **extra})


CASES = {
    "reverse": ("reverse", {}),
    "copy, packed": ("copy", {"pack": True}),
    "lm stream": ("lm", {}),
    "lm lines, packed": ("lm", {"lines": True, "pack": True}),
    "lm, checkpointed head": ("lm", {"checkpoint": True}),
    "lm, window": ("lm", {"window": 4}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_creates_every_tensor_on_the_run_device(case, fake_gpu, rhyme, tmp_path):
    task, extra = CASES[case]
    c = _config(task, rhyme if task == "lm" else None, **extra)
    with fake_gpu:
        out = train(c, tmp_path / "r", echo=lambda _: None)
    assert not fake_gpu.mixed, _report(fake_gpu.mixed)
    # the CUDA generator is stored beside the CPU one (a resumed GPU run draws the same dropout)
    from safetensors.torch import load_file

    state = load_file(str(out / "state.safetensors"))
    assert torch.equal(state["rng.cuda"], FAKE_GPU_RNG)


def test_the_training_loop_reads_the_gpu_only_at_log_steps(fake_gpu, rhyme, tmp_path):
    """The syncs the loop itself adds per step: none (the loss is read back every
    ``log_every`` steps and at the first); the model's token check reads the ids' range once
    per forward (the kernels' input scan is the kernels' business and not counted here)."""
    counts = []
    for n in (2, 6):
        fake = FakeCuda()
        c = _config("lm", rhyme, log_every=100, eval_every=1000, max_steps=n)
        with fake:
            train(c, tmp_path / f"r{n}", echo=lambda _: None)
        assert not fake.mixed, _report(fake.mixed)
        ours = [r for r in fake.syncs if "attnkit/kernels/" not in r.where]
        counts.append(collections.Counter(r.where.split()[0] for r in ours))
    grown = {k: counts[1][k] - counts[0][k] for k in counts[1] if counts[1][k] != counts[0][k]}
    assert all(k.startswith("attnkit/models/lm.py") for k in grown), grown
    assert sum(grown.values()) == 4, grown  # one per forward: 4 more steps, 1 micro-batch each


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny trained reverse run and a char lm run (trained on the CPU, as a GPU run's
    checkpoints are written from CPU copies)."""
    root = tmp_path_factory.mktemp("runs")
    rhyme = root / "rhyme.txt"
    rhyme.write_text(RHYME, encoding="utf-8")
    train(TrainConfig(**{**TINY, "max_steps": 4}), root / "rev", echo=lambda _: None)
    train(_config("lm", str(rhyme)), root / "lm", echo=lambda _: None)
    return root


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "--ckpt", "{rev}", "1 2 3"],
        ["translate", "--ckpt", "{rev}", "1 2 3", "--beam", "3"],
        ["evaluate", "--ckpt", "{rev}"],
        ["evaluate", "--ckpt", "{lm}"],
        ["generate", "--ckpt", "{lm}", "--prompt", "humpty", "--max-new-tokens", "8"],
        [
            "generate",
            "--ckpt",
            "{lm}",
            "--prompt",
            "jack",
            "--max-new-tokens",
            "8",
            "--temperature",
            "0.8",
            "--seed",
            "1",
        ],
    ],  # fmt: skip
    ids=lambda a: " ".join(a[:1] + a[4:6]),
)
def test_decoding_verbs_create_every_tensor_on_the_run_device(argv, runs, fake_gpu, capsys):
    argv = [a.format(rev=runs / "rev", lm=runs / "lm") for a in argv]
    with fake_gpu:
        code = main([*argv, "--device", "cpu"])  # the fake GPU stands for the device
    err = capsys.readouterr().err
    assert code == 0, err
    assert not fake_gpu.mixed, _report(fake_gpu.mixed)


def test_checkpoint_of_a_gpu_run_holds_host_tensors(runs):
    """What a GPU run writes is read on any device: safetensors of CPU copies."""
    from safetensors import safe_open

    ckpt = find_checkpoint(runs / "lm")
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert all(f.get_tensor(k).device.type == "cpu" for k in f.keys())


def test_the_process_group_is_formed_for_the_run_device(fake_gpu, tmp_path, monkeypatch):
    """Under torchrun a GPU run forms an NCCL group (gloo on the CPU): the trainer hands the
    run's device to ``join``."""
    seen = []
    real = trainer.join
    monkeypatch.setattr(
        trainer, "join", lambda timeout, device: seen.append(device) or real(timeout)
    )
    with fake_gpu:
        train(_config("reverse", None), tmp_path / "r", echo=lambda _: None)
    assert seen == [GPU]
