"""Command-line options as a table from option to library field, and the options several verbs
share, defined once.

An :class:`Option` says which library argument (``field``) an option fills and which check of
:mod:`attnkit.checks` (or of the library) its value must pass. The checks are the library's own:
they raise with the field's name first (``"beam_size: expected a positive int, got 0"``), and
:func:`check` runs them inside :func:`~attnkit.cli.support.common.option_names`, which says the
option instead (``"--beam: expected a positive int, got 0"``). argparse only parses the text
into a number (:func:`int_arg`, :func:`float_arg`: ``"--beam: expected an integer, got 'x'"``).
So every bad value is one line naming the option, what it got and what was expected, before
any file or checkpoint is read, and a verb writes no check of its own for a single value.

Torch- and numpy-free (verbs import it at their top: ``--help`` stays fast)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from attnkit import checks
from attnkit.cli.support.common import UsageError, option_names, said

__all__ = [
    "BATCH_SIZE",
    "BEAM",
    "CKPT",
    "DEVICE",
    "LENGTH_PENALTY",
    "MAX_LEN",
    "Option",
    "add",
    "blamed_on",
    "check",
    "checkpoint_of",
    "data_of",
    "float_arg",
    "int_arg",
    "names",
    "on_device",
    "renamed",
]


def int_arg(text: str) -> int:
    """argparse's ``type=`` for an int: the text parsed, no range (the range is the check's)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def float_arg(text: str) -> float:
    """argparse's ``type=`` for a number ('nan' and 'inf' parse; the check refuses them)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


@dataclass(frozen=True)
class Option:
    """One command-line option: ``flag`` fills the library argument ``field``; ``check(field,
    value)`` is the library's check of it (None: argparse's ``choices`` or nothing to check);
    ``kwargs`` are argparse's ``add_argument`` keywords (type, default, help, ...)."""

    flag: str
    field: str
    check: Callable[[str, Any], object] | None = None
    kwargs: Mapping[str, Any] = dataclass_field(default_factory=dict)

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value under (``--max-len`` -> ``max_len``)."""
        return self.flag.lstrip("-").replace("-", "_")


def add(parser: argparse.ArgumentParser, *options: Option) -> None:
    """Register ``options`` on ``parser``."""
    for o in options:
        parser.add_argument(o.flag, **o.kwargs)


def names(*options: Option, **extra: str) -> dict[str, str]:
    """Library field -> option, for :func:`~attnkit.cli.support.common.option_names`; ``extra``
    adds fields that no table option fills (``prompt="--prompt"``)."""
    return {o.field: o.flag for o in options} | extra


def check(ns: argparse.Namespace, *options: Option) -> None:
    """Every given value of ``options`` through its check, before any work; a bad one is a
    :class:`~attnkit.cli.support.common.UsageError` naming the option."""
    with option_names(names(*options)):
        for o in options:
            value = getattr(ns, o.dest)
            if o.check is not None and value is not None:
                o.check(o.field, value)


@contextlib.contextmanager
def renamed(*options: Option, **extra: str) -> Iterator[None]:
    """Inside the block, a library error about a field of ``options`` names the option
    (:func:`~attnkit.cli.support.common.option_names` with :func:`names`)."""
    with option_names(names(*options, **extra)):
        yield


def positive(help: str, default: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """argparse keywords of a positive-int option."""
    return dict(type=int_arg, default=default, metavar="N", help=help) | kwargs


# ---------------------------------------------------------------------------------------------
# the options several verbs share
# ---------------------------------------------------------------------------------------------
CKPT = Option("--ckpt", "ckpt", None, dict(required=True, metavar="DIR",
              help="checkpoint or run directory"))  # fmt: skip
"""The checkpoint of evaluate, translate, generate and export (read by ``session.load``)."""


@contextlib.contextmanager
def blamed_on(flag: str, *errors: type[Exception]) -> Iterator[None]:
    """Inside the block, an error of the types ``errors`` (whose messages name a file) is a
    UsageError naming ``flag`` first: the option that gave the file."""
    try:
        yield
    except errors as e:
        raise UsageError(f"{flag}: {said(e)}") from None


def checkpoint_of(flag: str) -> contextlib.AbstractContextManager[None]:
    """:func:`blamed_on` ``flag`` for a checkpoint that cannot be used (missing, not a
    checkpoint, a file missing or corrupt: :class:`~attnkit.train.checkpoint.CheckpointError`):
    ``--ckpt: runs/x: no such checkpoint or run directory``; also a file of it that cannot be
    read (PermissionError)."""
    from attnkit.train.checkpoint import CheckpointError  # torch-free; imported by a running verb

    return blamed_on(flag, CheckpointError, PermissionError)


def data_of(flag: str, given: bool = True) -> contextlib.AbstractContextManager[None]:
    """:func:`blamed_on` ``flag`` for a data file that cannot be used (missing, not UTF-8,
    malformed: :class:`~attnkit.train.data.sources.DataError`), when ``given`` (the verb read
    a file of that option); else nothing is renamed."""
    from attnkit.train.data.sources import DataError

    return blamed_on(flag, DataError) if given else contextlib.nullcontext()


DEVICE = Option("--device", "device", None, dict(default="cpu", metavar="DEVICE", help="cpu "
                "(default), cuda, cuda:N or mps; an error when this machine has no such "
                "device"))  # fmt: skip
"""Where a model runs; checked by :func:`on_device` (the machine decides what exists)."""


@contextlib.contextmanager
def on_device(name: str) -> Iterator[None]:
    """Check ``--device`` (a UsageError naming it when this machine has no such device), then
    run the block with that device as torch's default (:mod:`attnkit.devices`)."""
    from attnkit.devices import resolve, use_device

    with renamed(DEVICE):
        device = resolve(name)
    with use_device(device):
        yield


BEAM = Option("--beam", "beam_size", checks.positive_int, positive("beam size (1 = greedy)", 1))
"""Beam search's width (``models.decoding``'s ``beam_size``), for evaluate and translate."""

LENGTH_PENALTY = Option(
    "--length-penalty",
    "length_penalty",
    checks.finite_float,
    dict(type=float_arg, default=0.0, metavar="X",
         help="score = log p / length ** X (beam search; 0: the plain sum)"),
)  # fmt: skip
"""Beam search's length normalisation (``models.decoding``'s ``length_penalty``); checked also
with --beam 1, which does not use it."""

BATCH_SIZE = Option("--batch-size", "batch_size", checks.positive_int,
                    positive("sentences decoded together (64)", 64))  # fmt: skip
"""Sentences decoded together."""

MAX_LEN = Option("--max-len", "max_len", checks.positive_int, positive(
    "longest output in tokens (default: twice the input's, plus 10)"))  # fmt: skip
"""The longest decoded output."""
