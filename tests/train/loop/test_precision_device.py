"""--bf16 and --compile on the run's device: bf16 autocast where the device computes bf16
natively (CPU flags, or a GPU of compute capability 8.0+), a clear refusal elsewhere; --compile
compiles the training module and reports the first step's time, compile included; the CUDA
generator's state goes into checkpoints and comes back on resume."""

from __future__ import annotations

import pytest
import torch

from attnkit.train.config import TrainConfig
from attnkit.train.loop import precision, run, state, trainer
from attnkit.train.loop.trainer import train


def test_bf16_on_a_gpu_without_bf16_is_refused_naming_the_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.raises(ValueError, match=r"^bf16: this GPU \(Tesla T4\) has no native bfloat16"):
        precision.require_bf16(torch.device("cuda"))


def test_bf16_on_a_gpu_with_bf16_is_accepted(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    precision.require_bf16(torch.device("cuda:0"))


def test_bf16_on_the_cpu_follows_its_flags(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    with pytest.raises(ValueError, match=r"^bf16: this CPU has no native bfloat16"):
        precision.require_bf16(torch.device("cpu"))
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    precision.require_bf16(torch.device("cpu"))


def test_bf16_elsewhere_is_refused():
    with pytest.raises(ValueError, match=r"^bf16: autocast is supported on cpu and cuda, not on"):
        precision.require_bf16(torch.device("meta"))


@pytest.mark.filterwarnings("ignore:CUDA is not available")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_autocast_follows_the_device_type(device):
    ctx = precision.autocast(torch.device(device), True)
    assert isinstance(ctx, torch.autocast) and ctx.device == device
    assert ctx.fast_dtype == torch.bfloat16
    with precision.autocast(torch.device(device), False):
        assert not torch.is_autocast_enabled(device)


def test_compile_compiles_the_training_module_and_reports_the_first_step(monkeypatch, tmp_path):
    compiled = []

    def fake_compile(module, *args, **kwargs):  # torch.compile itself is slow on 2 cores
        compiled.append(module)
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    lines: list[str] = []
    c = TrainConfig(task="reverse", train_size=64, valid_size=8, vocab=6, length=5, d_model=16,
                    nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_steps=2,
                    compile=True)  # fmt: skip
    train(c, tmp_path / "r", echo=lines.append)
    assert len(compiled) == 1 and isinstance(compiled[0], torch.nn.Module)
    assert any("step 1 took" in s and "compile included" in s for s in lines), lines


def test_compile_is_not_part_of_the_runs_identity():
    a, b = TrainConfig(max_steps=1).resolved(), TrainConfig(max_steps=1, compile=True).resolved()
    assert a.identity_differences(b) == []


def test_gpu_generator_states_are_stored_and_restored(monkeypatch):
    g0, g1 = torch.arange(8, dtype=torch.uint8), torch.arange(8, 16, dtype=torch.uint8)
    tensors, meta = state.rng_state([torch.get_rng_state()] * 2, [g0, g1])
    assert torch.equal(tensors["rng.cuda"], g0) and torch.equal(tensors["rng.cuda.rank1"], g1)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda t, *a: restored.append(t))
    state.set_rng_state(tensors, meta, rank=1)
    assert len(restored) == 1 and torch.equal(restored[0], g1)
    state.set_rng_state(tensors, meta, rank=1, torch_state=False)
    assert len(restored) == 1  # a resume with another world size draws fresh
    assert state.gpu_rng(torch.device("cpu")) is None


def test_trainer_reads_the_run_device():
    assert trainer.current() == run.current() == torch.device("cpu")


def test_fp16_is_refused_off_a_gpu_and_with_bf16(tmp_path):
    with pytest.raises(ValueError, match=r"^fp16: float16 autocast with gradient scaling runs on"):
        precision.require_fp16(torch.device("cpu"))
    precision.require_fp16(torch.device("cuda"))
    with pytest.raises(ValueError, match=r"^fp16: choose --bf16 or --fp16, not both"):
        TrainConfig(bf16=True, fp16=True).resolved()
    with pytest.raises(ValueError, match=r"^fp16: float16 autocast"):
        train(TrainConfig(max_steps=1, fp16=True), tmp_path / "r", echo=lambda _: None)
    assert not (tmp_path / "r").exists()


def test_fp16_scales_the_loss_unscales_before_clipping_and_keeps_the_scale(monkeypatch, tmp_path):
    """--fp16 on the CPU's own autocast and gradient scaler (a GPU's work the same way): the
    scaler's state goes into the checkpoint, and a resumed run goes on from it."""
    import json

    from safetensors.torch import load_file  # noqa: F401 - the state is JSON, read below

    monkeypatch.setattr(run, "require_fp16", lambda device: None)
    c = TrainConfig(task="reverse", train_size=64, valid_size=8, vocab=6, length=5, d_model=16,
                    nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_steps=3,
                    save_every=3, fp16=True)  # fmt: skip
    lines: list[str] = []
    out = train(c, tmp_path / "r", echo=lines.append)
    state = json.loads((out / "state.json").read_text())
    assert state["scaler"]["scale"] > 0 and "fp16 autocast, scaled gradients" in lines[1]
    seen = []
    real = torch.amp.GradScaler.load_state_dict
    monkeypatch.setattr(torch.amp.GradScaler, "load_state_dict",
                        lambda self, sd: seen.append(sd) or real(self, sd))  # fmt: skip
    train(TrainConfig(**{**c.__dict__, "max_steps": 4}), tmp_path / "r", resume=out,
          echo=lambda _: None)  # fmt: skip
    assert seen == [state["scaler"]]
