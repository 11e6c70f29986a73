"""attnkit.models.hub_cache: a --model value as a directory and a display name, without any
network access (a model missing from the cache is an error that says how to download it)."""

from __future__ import annotations

import json

import pytest

from attnkit.models.hub_cache import DEFAULT_NAME, locate_model, model_type


def test_directory_and_cache_snapshot_names(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    assert locate_model(str(d)).name == "my-model"
    assert locate_model(d).path == d
    snap = tmp_path / "models--org--some-model" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert locate_model(snap).name == "org/some-model"  # a cache snapshot: the repository name


def test_default_is_named(monkeypatch):
    try:
        got = locate_model("default")
    except FileNotFoundError as e:
        pytest.skip(f"the default model is not installed: {e}")
    assert got.name == DEFAULT_NAME == "all-MiniLM-L6-v2"
    assert model_type(got.path) == "bert"


def test_missing_models_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="add --download"):
        locate_model("surely-not-a-cached-model-h22a")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        locate_model(str(tmp_path / "a" / "b" / "c"))
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        locate_model(str(f))
    with pytest.raises(TypeError, match="model: expected"):
        locate_model(3)
    with pytest.raises(TypeError, match="download"):
        locate_model("x", download="yes")


def test_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert model_type(tmp_path) == "gpt2"
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 3}))
    assert model_type(tmp_path) == ""
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        model_type(tmp_path)
    with pytest.raises(FileNotFoundError, match="file not found"):
        model_type(tmp_path / "nowhere")
