"""What ``pip install`` ships: the wheel built from this tree holds the package data the
commands need outside a source checkout (the worked examples' tutorial texts, the viewer's
assets, py.typed). Built offline from a copy of the tree (the checkout is not written to)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnkit.explain import catalog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (needed to build the wheel offline)")
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.nbi", "*.nbc")
    shutil.copytree(ROOT / "src", tree / "src", ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("attnkit-*.whl")
    with zipfile.ZipFile(whl) as z:
        return set(z.namelist())


def test_wheel_ships_the_examples_texts(wheel_names):
    for name in catalog.EXAMPLES:
        assert f"attnkit/explain/texts/{name}.txt" in wheel_names, name


def test_wheel_ships_the_viewer_assets_and_types(wheel_names):
    assets = [n for n in wheel_names if n.startswith("attnkit/viz/assets/")]
    assert any(n.endswith(".js") for n in assets) and any(n.endswith(".css") for n in assets)
    assert "attnkit/py.typed" in wheel_names
