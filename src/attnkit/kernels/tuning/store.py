"""Where ``attnkit tune`` keeps its measurements: one JSON file in the user cache directory.

The file is ``<cache>/tuning.json``, ``<cache>`` being ``platformdirs.user_cache_dir("attnkit")``
(``$XDG_CACHE_HOME/attnkit`` on Linux when that is set, else ``~/.cache/attnkit``). It holds::

    {"schema": "attnkit.tuning/1",
     "key": {"cpu": "<CPU model>", "torch": "<torch version>", "attnkit": "<attnkit version>"},
     "tuning": {"<constant>": <value>, ...},   # the measured constants only
     "measured_on": "<ISO date, UTC>",
     "sureness": {"<constant>": {"ratio": r, "spread": s, "repeats": n, "verdict": "..."}}}

``sureness`` (how sure the tune was of each decision) is optional: files written before it
existed load without it. So do files holding the old single threshold
``decode_split_k_min_bytes``: it is read as the ranges ``decode_split_k_ranges`` it meant.

A stored tuning applies only when its key equals this process's (:func:`machine_key`): a new
CPU, torch or attnkit release gets the built-in defaults until ``attnkit tune`` runs again. A
missing file is silent; an unreadable or invalid one gives the defaults with a
:class:`TuningWarning` that says what is wrong and how to fix it. Writes are atomic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path

from attnkit.files import write_atomic
from attnkit.kernels.tuning import ranges as tuning_ranges
from attnkit.kernels.tuning.sureness import Sureness
from attnkit.kernels.tuning.values import DEFAULT, Tuning, constants
from attnkit.version import __version__

__all__ = [
    "SCHEMA",
    "Loaded",
    "TuningWarning",
    "cache_dir",
    "load",
    "machine_key",
    "save",
    "store_path",
]

SCHEMA = "attnkit.tuning/1"


class TuningWarning(UserWarning):
    """A stored tuning could not be used (the built-in defaults apply instead)."""


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` found: the tuning to use, the file it looked at, and, when the
    defaults apply, why (None when the stored tuning was used)."""

    tuning: Tuning
    path: Path
    why_default: str | None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``; else the platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_key() -> dict[str, str]:
    """What a stored tuning must have been measured under: CPU model, torch, attnkit."""
    import torch

    return {"cpu": cpu_model(), "torch": torch.__version__, "attnkit": __version__}


def cache_dir() -> Path:
    """attnkit's user cache directory (platformdirs; honours ``XDG_CACHE_HOME`` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("attnkit", appauthor=False))


def store_path() -> Path:
    """The tuning file: ``cache_dir() / "tuning.json"``."""
    return cache_dir() / "tuning.json"


def save(t: Tuning, path: Path | None = None) -> Path:
    """Write ``t``'s measured constants under this machine's key, atomically; the path."""
    if not isinstance(t, Tuning):
        raise TypeError(f"tuning: expected a Tuning, got {type(t).__name__}")
    path = store_path() if path is None else Path(path)
    record = {
        "schema": SCHEMA,
        "key": machine_key(),
        "tuning": {n: getattr(t, n) for n in t.measured},
        "measured_on": t.measured_on,
        "sureness": {n: v.record() for n, v in t.sureness},
    }
    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: f.write(data))
    return path


def load(path: Path | None = None) -> Loaded:
    """The stored tuning when ``path`` (default :func:`store_path`) holds one for this
    machine's key, else :data:`~attnkit.kernels.tuning.DEFAULT` and the reason. Warns
    (:class:`TuningWarning`) when the file exists but cannot be used for a reason other than a
    different machine key; never raises for the file's content. With no ``path`` and the
    environment variable ``ATTNKIT_NO_TUNING`` set, the defaults apply without reading."""
    if path is None and os.environ.get("ATTNKIT_NO_TUNING"):
        return Loaded(DEFAULT, store_path(), "ATTNKIT_NO_TUNING is set")
    path = store_path() if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Loaded(DEFAULT, path, "no stored tuning (run attnkit tune)")
    except OSError as e:
        return _invalid(path, f"cannot be read ({type(e).__name__}: {e})")
    try:
        record = json.loads(text)
    except ValueError as e:
        return _invalid(path, f"is not valid JSON ({e})")
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return _invalid(path, f"is not an attnkit tuning file (schema {SCHEMA!r} expected)")
    key, here = record.get("key"), machine_key()
    if key != here:
        diff = _key_difference(key, here)
        return Loaded(DEFAULT, path, f"the stored tuning was measured {diff}")
    values, when = record.get("tuning"), record.get("measured_on")
    names = {f.name for f in constants()}
    if isinstance(values, dict) and "decode_split_k_min_bytes" in values:
        values = _old_split_k(values)
    if not isinstance(values, dict) or not set(values) <= names:
        return _invalid(path, f"holds unknown constants {sorted(set(values or {}) - names)}")
    if when is not None and not isinstance(when, str):
        return _invalid(path, "has a measured_on that is not a date")
    sure = record.get("sureness", {})
    try:
        if not isinstance(sure, dict):
            raise TypeError(f"sureness: expected an object, got {type(sure).__name__}")
        sureness = tuple((n, Sureness(**v)) for n, v in sure.items())
        t = dataclasses.replace(
            DEFAULT, **values, measured=tuple(values), measured_on=when, sureness=sureness
        )
    except (TypeError, ValueError) as e:
        return _invalid(path, f"holds an invalid value: {e}")
    return Loaded(t, path, None)


def _old_split_k(values: dict) -> dict:
    """``values`` with the old threshold ``decode_split_k_min_bytes`` ("split-K from N bytes
    on") as the ranges it meant (left as it is when it is not a number: refused later)."""
    least = values["decode_split_k_min_bytes"]
    if isinstance(least, bool) or not isinstance(least, (int, float)):
        return values
    out = {n: v for n, v in values.items() if n != "decode_split_k_min_bytes"}
    out["decode_split_k_ranges"] = tuning_ranges.from_min_bytes(int(least))
    return out


def _key_difference(stored: object, here: dict[str, str]) -> str:
    if not isinstance(stored, dict):
        return "under an unknown machine"
    what = {
        "cpu": "on another CPU",
        "torch": "with another torch",
        "attnkit": "with another attnkit",
    }
    for name, words in what.items():
        if stored.get(name) != here[name]:
            return f"{words} ({stored.get(name)!r}, this is {here[name]!r})"
    return "under another machine key"


def _invalid(path: Path, why: str) -> Loaded:
    msg = (
        f"the stored tuning {str(path)!r} {why}; using the built-in defaults "
        "(run 'attnkit tune' to measure again, or delete the file)"
    )
    warnings.warn(msg, TuningWarning, stacklevel=3)
    return Loaded(DEFAULT, path, msg)
