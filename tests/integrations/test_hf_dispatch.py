"""Which backend ``auto`` picks inside transformers for the ``hf-bert-embed`` bench row's calls:
a BERT batch of 32 texts of 16-256 tokens, right-padded, 12 heads of width 32. Key padding that
varies per element leaves about 29% of the blocks empty per element (under the built-in
``blocksparse_min_empty``) and none in every element, and per-element calls would skip too
little each (``blocksparse_element_call_entries``): every call must go to ``dense``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

tf = pytest.importorskip(
    "transformers", reason="transformers not installed (pip install 'attnkit[hf]')"
)

import attnkit.integrations.transformers as ak_hf  # noqa: E402
from attnkit.kernels import dispatch  # noqa: E402
from attnkit.kernels.tuning import DEFAULT, use  # noqa: E402
from tests.support.backends import chosen_backends  # noqa: E402


def _chosen_in_bert_batch() -> list[str]:
    ak_hf.register()
    cfg = tf.BertConfig(
        vocab_size=500,
        hidden_size=384,
        num_hidden_layers=1,
        num_attention_heads=12,
        intermediate_size=64,
    )
    torch.manual_seed(0)
    model = tf.BertModel(cfg).eval()
    model.set_attn_implementation("attnkit")
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 257, (32,), generator=g)
    width = int(lengths.max())
    ids = torch.randint(5, 500, (32, width), generator=g)
    am = (torch.arange(width)[None, :] < lengths[:, None]).long()
    dispatch.clear_cache()
    with chosen_backends() as chosen, torch.inference_mode():
        model(input_ids=ids * am, attention_mask=am)
    return chosen


def test_bert_padded_batch_runs_on_dense():
    assert set(_chosen_in_bert_batch()) == {"dense"}


def test_bert_padded_batch_follows_the_threshold():
    """With the thresholds of a machine where skipping always pays off (20% empty blocks, per-
    element calls of any size) the same calls go to blocksparse: the choice is the tuning's."""
    eager = dict(blocksparse_min_empty=0.2, blocksparse_element_call_entries=1)
    with use(dataclasses.replace(DEFAULT, **eager)):
        assert set(_chosen_in_bert_batch()) == {"blocksparse"}
