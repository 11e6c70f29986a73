"""The documentation site (``make docs``): it builds with ``mkdocs build --strict`` (a broken
link, a missing page or an unresolvable reference fails), no built page loads anything from the
network, and the Python examples of the home page and the guides run as written (each block in
a fresh namespace), as tests/test_readme.py does for the README."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.markdown import python_blocks, run_block, stated_messages

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
BLOCKS = [(p, code) for p in PAGES for code in python_blocks(p)]
TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
MISSING = [m for m in TOOLS if importlib.util.find_spec(m.split(".")[0]) is None]
NETWORK = re.compile(r'<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)="(?:https?:)?//', re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if MISSING:
        pytest.skip(f"the docs tools are not installed ({', '.join(MISSING)}; extra 'dev')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_site_builds_strict_with_every_page(site):
    for page in ("index", "guides/masks", "guides/training", "api/functional", "api/kernels"):
        assert (site / f"{page}.html").is_file(), page
    api = (site / "api" / "functional.html").read_text(encoding="utf-8")
    assert "scaled_dot_product_attention" in api  # built from the docstrings
    policy = (site / "api" / "kernels.html").read_text(encoding="utf-8")
    assert "P5" in policy and "finfo(compute).max" in policy  # the policy codes are defined


def test_no_page_loads_from_the_network(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 10
    loading = [p.relative_to(site) for p in pages if NETWORK.search(p.read_text("utf-8"))]
    assert loading == []


def test_every_page_using_a_policy_code_links_to_its_definition(site):
    """P1 ... P6 may appear on a page only with a link to the table that defines them."""
    definition = "conventions.html#the-numerics-policy-p1-to-p6"
    pages = [p for p in site.rglob("*.html") if re.search(r"\bP[1-6]\b", p.read_text("utf-8"))]
    assert pages  # the policy pages use them
    undefined = [
        p.relative_to(site)
        for p in pages
        if p.name != "conventions.html" and definition not in p.read_text("utf-8")
    ]
    assert undefined == []


def test_the_guides_have_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize(
    "path, code", BLOCKS, ids=[f"{p.stem}-{i}" for i, (p, _) in enumerate(BLOCKS)]
)
def test_docs_example_runs(path, code, capsys):
    run_block(code, path)
    out = capsys.readouterr().out
    for expected in stated_messages(code):
        assert expected in out
