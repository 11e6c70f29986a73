"""attnkit.explain.model_attention: model_attention_report on all-MiniLM-L6-v2, checked against
the attention weights of HuggingFace transformers (eager attention) on the same weights. The
``model`` and ``it_report`` fixtures are in this directory's conftest.py."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from attnkit.explain.model_attention import (
    ModelAttentionReport,
    find_word,
    model_attention_report,
)
from attnkit.models import default_model_path

TEXT = "The animal didn't cross the street because it was too tired"
TOKENS = "[CLS] the animal didn ' t cross the street because it was too tired [SEP]".split()


@pytest.fixture(scope="module")
def ref_rows(model):
    """Attention rows of token 'it' (index 10) from transformers: (layers, H, L) float64."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers (dev extra, the reference) not installed")
    from transformers import AutoModel, AutoTokenizer

    path = str(default_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    ref = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    batch = tok([TEXT], return_tensors="pt")
    assert tok.convert_ids_to_tokens(batch["input_ids"][0].tolist()) == TOKENS
    with torch.no_grad():
        att = ref(**batch, output_attentions=True).attentions
    return torch.stack([a[0, :, 10, :] for a in att]).double()


def _check_top(items, row: torch.Tensor, k: int, allowed: torch.Tensor | None = None) -> None:
    """items (our top-k) against a reference (L,) row: same weights in order (1e-5); the same
    tokens wherever the reference's ranking is not a near-tie."""
    row = row.clone()
    if allowed is not None:
        row[~allowed] = -1.0
    vals, idx = row.sort(descending=True)
    assert len(items) == k
    for n, a in enumerate(items):
        assert abs(a.weight - float(vals[n])) <= 1e-5
        gap_before = float(vals[n - 1] - vals[n]) if n else 1.0
        gap_after = float(vals[n] - vals[n + 1]) if n + 1 < len(vals) else 1.0
        if min(gap_before, gap_after) > 1e-5:
            assert a.index == int(idx[n])
            assert a.token == TOKENS[a.index]


def test_report_matches_transformers(model, ref_rows):
    r = model_attention_report(model, TEXT, "it", top_k=3)
    assert r.tokens == TOKENS
    assert r.word_indices == [10] and r.query_index == 10 and r.word_pieces == ["it"]
    assert (r.num_layers, r.num_heads) == (6, 12)
    assert len(r.heads) == 6 and all(len(h) == 12 for h in r.heads)
    for layer in range(6):
        for h in range(12):
            _check_top(r.heads[layer][h], ref_rows[layer, h], 3)
        avg = ref_rows[layer].mean(0)
        _check_top(r.averaged[layer], avg, 3)
        special = avg[0] + avg[-1]  # [CLS] and [SEP]
        assert abs(r.special_weight[layer] - float(special)) <= 1e-5


def test_skip_special_and_the_seed_example(model, ref_rows):
    r = model_attention_report(model, TEXT, "It", top_k=4, skip_special=True)
    allowed = torch.ones(len(TOKENS), dtype=torch.bool)
    allowed[[0, -1]] = False
    for layer in range(6):
        for h in range(12):
            _check_top(r.heads[layer][h], ref_rows[layer, h], 4, allowed)
            assert all(a.token not in ("[CLS]", "[SEP]") for a in r.heads[layer][h])
        _check_top(r.averaged[layer], ref_rows[layer].mean(0), 4, allowed)
    assert any("special tokens" in n for n in r.notes)
    # seed 002's example: in the last layer, 'it' attends most to 'animal' (besides [CLS]/[SEP])
    last = ref_rows[-1].mean(0).clone()
    last[[0, -1]] = -1
    assert TOKENS[int(last.argmax())] == "animal"
    assert r.averaged[-1][0].token == "animal"


def test_word_pieces_occurrences_and_errors(model):
    r = model_attention_report(model, TEXT, "didn't", top_k=2)
    assert r.word_pieces == ["didn", "'", "t"] and r.query_index == 3
    assert any("first piece" in n for n in r.notes)
    r = model_attention_report(model, TEXT, "the", top_k=1, occurrence=1)
    assert r.word_indices == [1, 7] and r.query_index == 7
    assert any("occurs 2 times" in n for n in r.notes)
    with pytest.raises(ValueError, match="occurrence"):
        model_attention_report(model, TEXT, "the", occurrence=2)
    with pytest.raises(ValueError, match=r"'dog'.*\[CLS\].*animal.*tired"):
        model_attention_report(model, TEXT, "dog")
    with pytest.raises(ValueError, match="'anim'"):  # a prefix of a token is not a word
        model_attention_report(model, TEXT, "anim")
    with pytest.raises(ValueError, match="top_k"):
        model_attention_report(model, TEXT, "it", top_k=0)
    with pytest.raises(ValueError, match="word"):
        model_attention_report(model, TEXT, " ")
    with pytest.raises(TypeError, match="model"):
        model_attention_report("default", TEXT, "it")
    r = model_attention_report(model, "a b", "a", top_k=10)  # top_k larger than the text
    assert all(len(h) == 4 for h in r.heads[0])


def test_find_word_boundaries():
    toks = ["[CLS]", "play", "##ing", "play", "[SEP]"]
    assert find_word(toks, ["play"]) == [3]
    assert find_word(toks, ["play", "##ing"]) == [1]
    assert find_word(toks, ["x"]) == []


def test_to_dict_is_json(it_report):
    r = it_report
    assert isinstance(r, ModelAttentionReport)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["tokens"] == TOKENS and d["query_index"] == 10
    assert d["heads"][5][11][0]["token"] == r.heads[5][11][0].token
    assert set(d["averaged"][0][0]) == {"token", "index", "weight"}


def test_old_import_path_is_the_same_module():
    """attnkit.viz.model_attention stays importable with the same names (an alias)."""
    from attnkit.explain import model_attention, render
    from attnkit.viz import model_attention as old

    for name in old.__all__:
        source = render if name == "render_model_attention" else model_attention
        assert getattr(old, name) is getattr(source, name), name
