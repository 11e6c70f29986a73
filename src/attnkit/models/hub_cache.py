"""A ``--model`` value as a local directory: ``default`` (the packaged all-MiniLM-L6-v2), a
directory, or the name of a model already in the local Hugging Face cache (``gpt2``,
``Helsinki-NLP/opus-mt-en-fr``). Nothing is downloaded unless ``download=True``.

Also the model's display name (what titles and the ``model:`` line show): ``all-MiniLM-L6-v2``
for the default, the repository name for a cached model (read back from the cache's folder
name), else the directory's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from attnkit.checks import flag
from attnkit.models.hub import default_model_path

__all__ = ["DEFAULT_NAME", "LocatedModel", "locate_model", "model_type"]

DEFAULT_NAME = "all-MiniLM-L6-v2"
"""The default model's name."""

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_CACHE_FOLDER = re.compile(r"^models--(.+)$")
_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "merges.txt"]


@dataclass(frozen=True)
class LocatedModel:
    """A model directory (``path``) and its display name (``name``)."""

    path: Path
    name: str


def _name_of(path: Path) -> str:
    """A directory's display name: ``org/name`` for a snapshot inside a Hugging Face cache
    (``.../models--org--name/snapshots/<commit>``), else the directory's own name."""
    resolved = path.resolve()
    parts = resolved.parts
    if len(parts) >= 3 and parts[-2] == "snapshots":
        m = _CACHE_FOLDER.match(parts[-3])
        if m:
            return m.group(1).replace("--", "/")
    return resolved.name or str(resolved)


def _from_cache(name: str, download: bool) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover - transformers depends on huggingface_hub
        raise FileNotFoundError(
            f"model: {name!r} is not a local directory, and looking it up in the Hugging Face "
            "cache needs huggingface_hub: pip install 'attnkit[hf]'"
        ) from e
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        where = snapshot_download(name, local_files_only=not download, allow_patterns=_FILES)
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"model: {name!r} is neither a local directory nor a model in the local Hugging Face "
            "cache; give a directory saved with save_pretrained, or add --download to fetch "
            "it from the Hugging Face Hub"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise FileNotFoundError(
            f"model: could not download {name!r} ({' '.join(str(e).split())[:200]})"
        ) from None
    return Path(where)


def locate_model(model: str | Path, *, download: bool = False) -> LocatedModel:
    """Where the files of ``model`` are, and its display name.

    Args:
        model: ``"default"``, a directory path, or a model name in the local Hugging Face cache.
        download: fetch a model that is not in the cache from the Hugging Face Hub (default:
            never download).

    Raises:
        TypeError: ``model`` is not a str or Path.
        FileNotFoundError: neither a directory nor a cached model (the message says what to do).
    """
    if not isinstance(model, (str, Path)):
        raise TypeError(f"model: expected 'default', a directory or a model name, got {model!r}")
    download = flag("download", download)
    if model == "default":
        return LocatedModel(default_model_path(), DEFAULT_NAME)
    path = Path(model).expanduser()
    if path.is_dir():
        return LocatedModel(path, _name_of(path))
    if path.exists():
        raise FileNotFoundError(f"model: {str(model)!r} is a file; expected a model directory")
    if isinstance(model, Path) or not _REPO_ID.match(model):
        raise FileNotFoundError(
            f"model: {str(model)!r} is not a directory (expected 'default', a directory saved "
            "with save_pretrained, or a model name such as gpt2 in the Hugging Face cache)"
        )
    return LocatedModel(_from_cache(model, download), model)


def model_type(path: Path) -> str:
    """The ``model_type`` of ``path/config.json`` ("" when absent). FileNotFoundError /
    ValueError naming the file when it is missing or not a JSON object."""
    from attnkit.models.hf_loading import read_json_object

    kind = read_json_object(path / "config.json").get("model_type", "")
    return kind if isinstance(kind, str) else ""
