"""Old import paths (attnkit.deprecation.MOVED): each still gives the same objects as its new
path, warns once imported (DeprecationWarning naming the new path and the removal date), and
is listed with a removal date still to come: once the date has passed this test fails, and the
old path is to be deleted (with its entry)."""

from __future__ import annotations

import datetime
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit import deprecation

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("moved", deprecation.MOVED, ids=lambda m: m.old)
def test_old_path_is_removed_by_its_date(moved):
    removal = datetime.date.fromisoformat(moved.removal)
    since = datetime.date.fromisoformat(moved.since)
    assert since < removal
    assert datetime.date.today() <= removal, (
        f"{moved.old}: its removal date {moved.removal} has passed; delete it and its entry "
        "in attnkit.deprecation.MOVED"
    )


_PROBE = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
try:
    {statement}
except DeprecationWarning as w:
    print("WARNED", w)
"""

CASES = [
    ("from attnkit.viz.model_attention import find_word", "attnkit.explain.model_attention"),
    ("from attnkit.masks.combine import Intersection", "attnkit.masks"),
    ("from attnkit.models.bert import MAX_SIZE", "attnkit.models.bert_config.MAX_SIZE"),
    ("from attnkit.integrations.hf_attentions import load_model", "hf_attention_weights"),
]


@pytest.mark.parametrize("statement, new", CASES, ids=[c[1] for c in CASES])
def test_old_path_warns_with_its_new_path_and_date(statement, new):
    r = subprocess.run(  # a fresh interpreter: a module warns when it is first imported
        [sys.executable, "-c", _PROBE.format(statement=statement)],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(SRC)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("WARNED") and new in r.stdout and "removed after 20" in r.stdout


def test_old_paths_give_the_same_objects():
    from attnkit import masks
    from attnkit.explain import model_attention, render
    from attnkit.models import bert_config

    with pytest.warns(DeprecationWarning):
        combine = importlib.reload(importlib.import_module("attnkit.masks.combine"))
    assert combine.Intersection is masks.Intersection and combine.Union is masks.Union
    with pytest.warns(DeprecationWarning):
        old = importlib.reload(importlib.import_module("attnkit.viz.model_attention"))
    assert old.find_word is model_attention.find_word
    assert old.render_model_attention is render.render_model_attention
    with pytest.warns(DeprecationWarning, match="bert_config.MAX_SIZE"):
        from attnkit.models.bert import MAX_SIZE
    assert MAX_SIZE == bert_config.MAX_SIZE


def test_every_listed_path_exists_and_the_private_alias_is_gone():
    for moved in deprecation.MOVED:
        module = moved.old if moved.old.count(".") < 3 else moved.old.rsplit(".", 1)[0]
        assert (SRC / (module.replace(".", "/") + ".py")).is_file(), moved.old
    from attnkit import masks

    assert not hasattr(masks.causal(), "_cache")  # Mask._cache(): private, removed
