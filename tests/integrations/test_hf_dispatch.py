"""Which backend ``auto`` picks inside transformers for the ``hf-bert-embed`` bench row's calls:
a BERT batch of 32 texts of 16-256 tokens, right-padded, 12 heads of width 32. Key padding that
varies per element leaves about 29% of the blocks empty per element and none in every element;
each per-element call skips more than the built-in ``blocksparse_element_call_entries`` (the
calls run in streams, one thread each), so every call goes to ``blocksparse``, and to ``dense``
where the tuning says per-element calls never pay."""

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


def test_bert_padded_batch_runs_on_blocksparse():
    assert set(_chosen_in_bert_batch()) == {"blocksparse"}


def test_bert_padded_batch_follows_the_threshold():
    """With the thresholds of a machine where per-element calls never pay off, the same calls
    go to dense: the choice is the tuning's."""
    never = dict(blocksparse_element_call_entries=2**40)
    with use(dataclasses.replace(DEFAULT, **never)):
        assert set(_chosen_in_bert_batch()) == {"dense"}
