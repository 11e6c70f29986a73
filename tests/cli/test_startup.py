"""Fast start: ``attnkit --help``, ``attnkit VERB --help`` and ``--version`` import neither torch
nor numpy (each is checked in a fresh interpreter), while every public name of attnkit's lazily
importing packages still imports with ``from PACKAGE import NAME``. The time itself is a
benchmark row (benchmarks/bench_startup.py), not a test."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit import cli

SRC = Path(cli.__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "transformers", "matplotlib", "numba")

_PROBE = """
import contextlib, io, json, sys
from attnkit.cli import build_parser, main
build_parser()
after_parser = sorted(m for m in {heavy!r} if m in sys.modules)
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    codes = [main(list(a)) for a in {argvs!r}]
print(json.dumps({{"parser": after_parser, "codes": codes, "out": out.getvalue(),
                  "after": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


def _probe(argvs: list[list[str]]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    code = _PROBE.format(heavy=HEAVY, argvs=argvs)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_building_the_parser_imports_no_heavy_module():
    d = _probe([])
    assert d["parser"] == [], f"building the parser imported {d['parser']}"


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"]] + [[v, "--help"] for v in cli.VERBS if v != "bench"]
)
def test_help_and_version_import_no_heavy_module(argv):
    d = _probe([argv])
    assert d["codes"] == [0]
    assert d["after"] == [], f"attnkit {' '.join(argv)} imported {d['after']}"
    assert d["out"].startswith(("usage: attnkit", "attnkit 0.")), d["out"][:200]


@pytest.mark.parametrize("package", ["attnkit", "attnkit.explain", "attnkit.train"])
def test_every_public_name_imports(package):
    """``from PACKAGE import NAME`` works for every name in ``__all__`` (they are imported on
    first use); the walkthrough function is the function, not its module."""
    mod = importlib.import_module(package)
    for name in mod.__all__:
        ns: dict = {}
        exec(f"from {package} import {name}", ns)  # noqa: S102 - the statement users write
        assert ns[name] is getattr(mod, name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        mod.no_such_name  # noqa: B018


def test_walkthrough_is_the_function_after_its_module_is_imported():
    from attnkit import explain

    importlib.import_module("attnkit.explain.steps")
    assert callable(explain.walkthrough)
    assert callable(explain.seed_example)
