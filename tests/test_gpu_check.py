"""``scripts/gpu_check.py`` (``make gpu-check``) on a machine without a GPU: its dry run lists
every step (venv on the system's torch, attnkit without dependencies, the CUDA tests, the GPU
bench rows) and runs nothing; without a CUDA device a real run stops at the probe with exit 2;
the table shows each row's target and verdict."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_lists_every_step_and_creates_nothing():
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--quick"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "--system-site-packages" in out and "--no-deps" in out
    assert "-m cuda" in out and "tests/kernels/policy/test_device_path.py" in out
    assert "run.py --scripts gpu" in out and "--quick" in out
    assert not (ROOT / ".gpu-venv").exists()


def test_cuda_tests_are_found_by_their_marker():
    files = _module().cuda_test_files()
    assert "tests/kernels/test_additive_chunked.py" in files
    assert all("pytest.mark.cuda" in (ROOT / f).read_text() for f in files)


def test_wheels_are_installed_without_dependencies(tmp_path):
    mod = _module()
    steps = mod.plan("python3", False, [tmp_path / "platformdirs-4.0-py3-none-any.whl"])
    wheel = next(s for s in steps if "wheels" in s.what)
    assert "--no-deps" in wheel.argv and wheel.setup


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_a_real_run_without_cuda_stops_at_the_probe(capsys):
    assert _module().main([]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_table_names_the_machine_and_each_target():
    rows = [
        dict(id="gpu-causal-4k-fwd", target=">=0.97x", ratio=1.01, target_met=True),
        dict(id="gpu-overhead-dense", target="<=15 us", ratio=0.5, target_met=False,
             extra=dict(host_us_above_sdpa=22.0)),
        dict(id="gpu-decode-b1-8k", target=">=1.0x", extra=dict(status="skipped: no GPU")),
    ]  # fmt: skip
    machine = dict(gpu="NVIDIA H200", torch="2.11.0+cu130", cuda="13.0")
    text = _module().table(machine, "12 passed in 40s", rows, 300.0)
    assert "NVIDIA H200" in text and "2.11.0+cu130" in text and "CUDA 13.0" in text
    assert "12 passed" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("gpu-")}
    assert "yes" in lines["gpu-causal-4k-fwd"] and "1.01x" in lines["gpu-causal-4k-fwd"]
    assert "NO" in lines["gpu-overhead-dense"] and "22.0 us" in lines["gpu-overhead-dense"]
    assert "skipped" in lines["gpu-decode-b1-8k"]
