"""The packed in-projection (issue 32 section 3): layouts, the products it runs, and weights
written before it (separate q_proj / k_proj / v_proj) loading with the same outputs.

The old weights and the outputs that the old code computed from them are fixtures
(tests/fixtures/old_qkv, written by its make_fixture.py before the change): an independent
reference for the loading path, float64, compared to 1e-12 of the output's scale.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
from tokenizers import Tokenizer, models

from attnkit.nn import MultiHeadAttention
from attnkit.nn.projection import InProjection, pack_legacy, unpack
from attnkit.train.checkpoint import FORMAT, write_checkpoint
from attnkit.train.config import TrainConfig
from attnkit.train.inference import session

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "old_qkv"
REF = st.load_file(str(OLD / "outputs.safetensors"))
MHA = json.loads((OLD / "mha.json").read_text())


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.detach(), want.detach()
    tol = 1e-12 * max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) <= tol


@pytest.mark.parametrize("name", sorted(MHA))
def test_old_attention_weights_load_with_the_old_outputs(name):
    m = MultiHeadAttention(**MHA[name], dtype=torch.float64).eval()
    old = st.load_file(str(OLD / f"{name}.safetensors"))
    assert "q_proj.weight" in old  # the fixture is in the old format
    m.load_state_dict(old, strict=True)
    x, mem, val = REF[f"{name}.x"], REF[f"{name}.mem"], REF[f"{name}.val"]
    with torch.no_grad():
        _close(m(x, mem, val)[0], REF[f"{name}.kv"])
        if f"{name}.self" in REF:
            _close(m(x)[0], REF[f"{name}.self"])
            _close(m(x, mem)[0], REF[f"{name}.cross"])
    assert m.in_proj.packed == ("kdim" not in MHA[name])


def _tokenizer() -> Tokenizer:
    return Tokenizer(models.WordLevel({f"w{i}": i for i in range(8)}, unk_token="w3"))


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_old_checkpoints_load_with_the_old_outputs(tmp_path, kind):
    """A checkpoint whose model.safetensors is in the old format: session.load checks it
    against config.json, builds and loads the model; its outputs equal the old code's."""
    model_cfg = json.loads((OLD / f"{kind}.json").read_text())
    config = {"format": FORMAT, "kind": kind, "step": 1, "model": model_cfg}
    config["train"] = TrainConfig().to_dict()
    files = {
        "model.safetensors": (OLD / f"{kind}.safetensors").read_bytes(),
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": _tokenizer().to_str().encode(),
        "state.safetensors": st.save({}),
        "state.json": b"{}",
        "heldout.jsonl": b"",
        "train_sample.jsonl": b"",
    }
    loaded = session.load(write_checkpoint(tmp_path, 1, files, keep=1))
    model = loaded.model.double()
    with torch.no_grad():
        if kind == "lm":
            got = model(REF["lm.ids"])
        else:
            got = model(REF["seq2seq.src"], REF["seq2seq.tgt"], REF["seq2seq.lengths"])
    _close(got, REF[f"{kind}.logits"])
    assert any(k.endswith("in_proj.weight") for k in loaded.model.state_dict())


def test_old_checkpoint_with_wrong_shapes_names_the_weight(tmp_path):
    """A bad old-format file still gets the named refusal (no traceback from packing)."""
    state = st.load_file(str(OLD / "lm.safetensors"))
    key = next(k for k in state if k.endswith("k_proj.weight"))
    state[key] = state[key][:-1]
    cfg = {"format": FORMAT, "kind": "lm", "step": 1, "train": TrainConfig().to_dict()}
    cfg["model"] = json.loads((OLD / "lm.json").read_text())
    files = {"model.safetensors": st.save(state), "config.json": json.dumps(cfg).encode()}
    files |= {"tokenizer.json": _tokenizer().to_str().encode(), "state.json": b"{}"}
    files |= {"state.safetensors": st.save({}), "heldout.jsonl": b"", "train_sample.jsonl": b""}
    with pytest.raises(session.CheckpointError, match="model.safetensors"):
        session.load(write_checkpoint(tmp_path, 1, files, keep=1))


@pytest.mark.parametrize(
    "kw",
    [{}, {"bias": False}, {"num_kv_heads": 2}, {"kdim": 5, "vdim": 3}, {"kdim": 6, "vdim": 6}],
)
def test_unpack_and_pack_legacy_are_inverse(kw):
    m = MultiHeadAttention(8, 4, **kw)
    state = m.state_dict()
    old = unpack(state)
    assert not any("in_proj" in k for k in old)
    assert {k.split(".")[0] for k in old} == {"q_proj", "k_proj", "v_proj", "out_proj"}
    pack_legacy(old)
    assert old.keys() == state.keys()
    for k in state:
        assert torch.equal(old[k], state[k]), k


def test_self_attention_runs_one_product_and_cross_attention_two(monkeypatch):
    """One F.linear for q, k and v of self-attention (the packed (E + 2D, E) weight), two for
    cross-attention with key is value ((E, E) and the packed (2D, E)), three otherwise."""
    calls = []
    real = torch.nn.functional.linear

    def spy(x, w, b=None):
        calls.append(tuple(w.shape))
        return real(x, w, b)

    m = MultiHeadAttention(8, 4, num_kv_heads=2)
    x, mem, val = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    m(x)
    assert calls == [(16, 8), (8, 8)]  # q | k | v packed, then out_proj
    calls.clear()
    m(x, mem)
    assert calls == [(8, 8), (8, 8), (8, 8)]  # q, k | v packed (2 x 4 rows), out_proj
    calls.clear()
    m(x, mem, val)
    assert calls == [(8, 8), (4, 8), (4, 8), (8, 8)]


def test_packed_and_separate_products_agree_with_float64_math():
    """q, k, v of every path against x @ W.T + b by hand in float64 (packed views)."""
    torch.manual_seed(0)
    p = InProjection(6, 6, 6, 4, bias=True, dtype=torch.float64)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    (wq, wk, wv), (bq, bk, bv) = p.weight.split([6, 4, 4]), p.bias.split([6, 4, 4])
    want = x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    for got in (p.qkv(x), (p.q(x), *p.kv(x)), (p.q(x), p.k(x), p.v(x))):
        for g, w in zip(got, want, strict=True):
            _close(g, w)


def test_an_old_run_resumes_as_the_old_code_resumed_it(tmp_path):
    """A run checkpointed before the packed in-projection (weights and AdamW state with
    separate q/k/v parameters) resumes with today's code: after 2 more steps its weights equal
    what the old code computed resuming the same checkpoint (float32, 1e-5 of each tensor's
    scale: the packed products round differently; the key bias, whose true gradient is 0, is
    rounding noise on both sides and left out)."""
    from attnkit.train.loop.trainer import train

    run = json.loads(next((OLD / "run").glob("step-*/config.json")).read_text())["train"]
    run["max_steps"] = 4
    ckpt = next((OLD / "run").glob("step-*"))
    last = train(TrainConfig.from_dict(run, "fixture"), tmp_path / "new", resume=ckpt, echo=print)
    got = st.load_file(str(last / "model.safetensors"))
    want = st.load_file(str(OLD / "run_step4.safetensors"))
    pack_legacy(want)
    assert got.keys() == want.keys()
    for k, w in want.items():
        g = got[k]
        if k.endswith("in_proj.bias"):  # q | k | v: the k block's true gradient is exactly 0
            e = w.shape[0] // 3  # (a shift of every score of a row), so AdamW turns rounding
            g, w = torch.cat([g[:e], g[2 * e :]]), torch.cat([w[:e], w[2 * e :]])  # into steps
        tol = 1e-5 * max(1.0, float(w.abs().max()))
        assert float((g - w).abs().max()) <= tol, k
