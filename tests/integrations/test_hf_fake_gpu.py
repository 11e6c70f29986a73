"""``attn_implementation="attnkit"`` as on a GPU, on the CPU: the tiny models of hf_models.py
moved to an emulated GPU (tests/support/fake_device.py: parameters and inputs tagged as GPU
tensors, torch's default device left on the CPU as a user's is); every tensor the integration
builds must meet the model's tensors on the same device (masks are host objects; the kernels
copy what they need). A real-GPU comparison with "sdpa" is benchmarks/bench_gpu_hf.py."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")

from attnkit.integrations import transformers as ak_hf  # noqa: E402
from tests.integrations import hf_models as hm  # noqa: E402
from tests.support.fake_device import FakeCuda  # noqa: E402

ak_hf.register()


def _report(records) -> str:
    return "\n".join(f"{n} x {r.op} at {r.where}" for r, n in collections.Counter(records).items())


# gpt-oss is left out: its MoE router (transformers' code) takes a CUDA-only op on "cuda"
@pytest.mark.parametrize("default_gpu", [False, True], ids=["default cpu", "default cuda"])
@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "gemma2", "gemma3"])
def test_decoder_forward_and_generate_on_the_gpu_device(name, default_gpu):
    """``default_gpu``: torch's default device is the GPU too (``with torch.device("cuda")``,
    as some users load models): the integration's host tensors stay on the host."""
    _, ours = hm.pair(name)
    ids, am = hm.batch(2, 9, pad="left")
    fake = FakeCuda(default_gpu=default_gpu)
    with fake:
        ids, am = ids.to("cuda"), am.to("cuda")
        out = ours(input_ids=ids, attention_mask=am).logits
        assert fake.where(out) == "gpu"
        ours.generate(input_ids=ids, attention_mask=am, max_new_tokens=3, do_sample=False)
    assert not fake.mixed, _report(fake.mixed)
