"""Reading training data: TSV pairs (``source<TAB>target[<TAB>anything]``) and plain text, with
errors that name the file and the line; the synthetic tasks (copy, reverse, sort); the seeded
held-out split.

Every function here works on text; :mod:`attnkit.train.data.tokenizer` turns it into ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = [
    "SYNTHETIC",
    "DataError",
    "read_lines",
    "read_pairs",
    "read_text",
    "read_text_lines",
    "split_heldout",
    "synthetic_pairs",
    "synthetic_split",
]

SYNTHETIC = ("copy", "reverse", "sort")
"""Synthetic tasks: the target is the source, reversed, or sorted."""


class DataError(ValueError):
    """Bad data: the message names the file (and the line when there is one)."""


def read_text(path: str | Path) -> str:
    """A UTF-8 text file exactly as written (a leading byte-order mark dropped); DataError when
    the file is missing, unreadable, not UTF-8 (naming the line) or has no non-blank line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a text file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise DataError(f"{path}: the file is empty (no non-blank line)")
    return text


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (without line ends); errors as :func:`read_text`."""
    return read_text(path).splitlines()


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """Pairs (source, target) from a TSV file ``source<TAB>target[<TAB>anything]``; blank lines
    are skipped. DataError naming the file and line for a line without a tab or with an empty
    source or target."""
    pairs = []
    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise DataError(
                f"{path}:{n}: expected 'source<TAB>target', found no tab in {line[:60]!r}"
            )
        src, tgt = line.split("\t")[:2]
        if not src.strip() or not tgt.strip():
            side = "source" if not src.strip() else "target"
            raise DataError(f"{path}:{n}: the {side} is empty")
        pairs.append((src.strip(), tgt.strip()))
    return pairs


def read_text_lines(path: str | Path) -> list[str]:
    """The non-blank lines of a text file (stripped), for the ``lm`` task."""
    return [s.strip() for s in read_lines(path) if s.strip()]


def split_heldout(n: int, fraction: float, seed: int, minimum: int = 1) -> np.ndarray:
    """Sorted indices of the held-out items among ``n``: round(n * fraction) (at least
    ``minimum``, at most n - 1) chosen by a generator seeded with (seed, "heldout")."""
    k = min(max(round(n * fraction), minimum), n - 1)
    rng = np.random.default_rng([seed, 0x5EED])
    return np.sort(rng.permutation(n)[:k])


def _target(task: str, seq: np.ndarray) -> np.ndarray:
    if task == "copy":
        return seq
    if task == "reverse":
        return seq[::-1]
    return np.sort(seq)


def synthetic_pairs(
    task: str, n: int, vocab: int, min_length: int, max_length: int, rng: np.random.Generator
) -> list[tuple[str, str]]:
    """``n`` random (source, target) pairs of the synthetic ``task``: sources are
    ``min_length..max_length`` symbols drawn uniformly from ``vocab`` symbols ("0", "1", ...),
    written space-separated."""
    out = []
    lengths = rng.integers(min_length, max_length + 1, size=n)
    for length in lengths:
        seq = rng.integers(0, vocab, size=int(length))
        out.append((" ".join(map(str, seq)), " ".join(map(str, _target(task, seq)))))
    return out


def synthetic_split(
    task: str,
    train_size: int,
    valid_size: int,
    vocab: int,
    min_length: int,
    max_length: int,
    seed: int,
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training pairs, held-out pairs) of a synthetic task, a function of the arguments only.
    The held-out sources are drawn first (without repeats) and never occur in training."""
    rng = np.random.default_rng([seed, 0xC0DE])
    heldout: dict[str, str] = {}
    tries = 0
    while len(heldout) < valid_size and tries < 100 * valid_size:
        (src, tgt), tries = (
            synthetic_pairs(task, 1, vocab, min_length, max_length, rng)[0],
            tries + 1,
        )
        heldout.setdefault(src, tgt)
    train = [
        p
        for p in synthetic_pairs(task, train_size, vocab, min_length, max_length, rng)
        if p[0] not in heldout
    ]
    if not train or not heldout:
        raise DataError(
            f"{task}: vocabulary {vocab} and lengths {min_length}..{max_length} leave no "
            "distinct sequences for both a training and a held-out split; use a larger --vocab "
            "or --length"
        )
    return train, list(heldout.items())
