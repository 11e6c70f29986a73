"""--device: cpu works everywhere; cuda and mps give a clear error (exit 2, one line naming
--device) on a machine or torch build without them; the context puts new tensors and modules
on the chosen device. The GPU comparison runs only where CUDA exists (the lock pins torch's CPU
build, so under `make test` it is skipped with its reason)."""

from __future__ import annotations

import pytest
import torch

from attnkit.cli import main
from attnkit.devices import resolve, use_device
from attnkit.train.config import TrainConfig
from attnkit.train.loop.trainer import train

NO_CUDA = "no CUDA device here (torch's CPU build, or no GPU): the GPU comparison cannot run"


def test_resolve_names_the_argument():
    assert resolve("cpu") == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "cpu:1", ""):
        with pytest.raises(ValueError, match=r"^device: expected cpu, cuda, cuda:N or mps, got"):
            resolve(bad)
    with pytest.raises(TypeError, match="device: expected one of"):
        resolve(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_absent_cuda_is_a_clear_error(capsys, tmp_path):
    with pytest.raises(ValueError, match=r"^device: cuda is not available \(torch "):
        resolve("cuda")
    for verb, extra in (
        ("translate", ["--ckpt", str(tmp_path), "1 2"]),
        ("evaluate", ["--ckpt", str(tmp_path)]),
        ("generate", ["--ckpt", str(tmp_path), "--prompt", "a"]),
        ("train", ["--out", str(tmp_path / "r"), "--max-steps", "1"]),
    ):
        code = main([verb, *extra, "--device", "cuda"])
        err = capsys.readouterr().err
        assert code == 2 and f"attnkit {verb}: error: --device: cuda is not available" in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing written


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_absent_mps_is_a_clear_error():
    with pytest.raises(ValueError, match=r"^device: mps is not available"):
        resolve("mps")


def test_use_device_places_new_tensors_and_modules():
    meta = torch.device("meta")  # a non-CPU device every torch build has
    with use_device(meta):
        assert torch.zeros(3).device == meta
        assert torch.nn.Linear(2, 2).weight.device == meta
    assert torch.zeros(3).device.type == "cpu"
    with use_device(torch.device("cpu")):
        assert torch.zeros(3).device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_decoding_equals_cpu(tmp_path, capsys, tiny):
    train(TrainConfig(**tiny, max_steps=6), tmp_path / "r", echo=lambda _: None)
    outs = []
    for device in ("cpu", "cuda"):
        assert main(["translate", "--ckpt", str(tmp_path / "r"), "1 2 3", "--device", device]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
