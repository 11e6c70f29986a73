"""benchmarks/bench_gpu_hf.py without a GPU: its four models build, attnkit matches eager on
them on the CPU (so the GPU rows compare like with like), the flex/eager peer choice, and a
row without CUDA reports that it was skipped and why, with no ratio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed")

from tests.support.benchmarks import BENCH, bench_module  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    import attnkit.integrations.transformers as ak_hf

    ak_hf.register()
    return bench_module("bench_gpu_hf")


@pytest.mark.parametrize("kind", ["mistral", "llama", "gemma2", "gptoss"])
def test_models_match_eager_on_the_cpu(bench, kind):
    import copy

    model = bench.build(kind)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    model.set_attn_implementation("attnkit")
    ids = torch.randint(3, bench.VOCAB, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got = model(ids, use_cache=False).last_hidden_state.double()
        want = eager(ids, use_cache=False).last_hidden_state.double()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert bench.peer_implementation(model, "flex_attention") in ("flex_attention", "eager")
    assert bench.peer_implementation(model, "no-such-attention") == "eager"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_rows_without_a_gpu_say_skipped(bench):
    p = subprocess.run([sys.executable, "bench_gpu_hf.py", "--row", "gpu-hf-llama-8k", "--quick"],
                       capture_output=True, text=True, cwd=BENCH, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.split("ROW ", 1)[1])
    assert r["extra"]["skipped"].startswith("needs a CUDA GPU") and "ratio" not in r
