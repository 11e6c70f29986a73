"""The committed locks (requirements/*.txt, README "Dependencies and why") agree with
pyproject.toml: every dependency of an install is pinned with hashes, torch is its CPU build and
nothing pulls in CUDA. (Whether they install is what `make test` itself shows.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from packaging.version import Version  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {  # lock -> the pyproject extras it covers (besides the base dependencies)
    "run.txt": ("model",),
    "hf.txt": ("hf",),
    "dev.txt": ("dev", "model", "hf"),
}


def pins(lock: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a lock written by `uv pip compile --generate-hashes`."""
    text = (ROOT / "requirements" / lock).read_text()
    out = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.\-\[\]]+)==(\S+)", block)
        if m:
            out[canonicalize_name(m.group(1))] = (m.group(2), re.findall(r"sha256:\w+", block))
    return out


def wanted(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for e in extras:
        reqs += project["optional-dependencies"][e]
    return [Requirement(r) for r in reqs]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_lock_pins_every_dependency_with_hashes(lock):
    pinned = pins(lock)
    assert pinned, f"{lock}: no pins read"
    for name, (version, hashes) in pinned.items():
        assert hashes, f"{lock}: {name}=={version} has no hash"
    for req in wanted(LOCKS[lock]):
        name = canonicalize_name(req.name)
        assert name in pinned, f"{lock}: {req} is not locked"
        assert req.specifier.contains(Version(pinned[name][0]), prereleases=True), (
            f"{lock}: {name}=={pinned[name][0]} is outside pyproject's {req}"
        )


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_torch_is_the_cpu_build(lock):
    pinned = pins(lock)
    assert pinned["torch"][0].endswith("+cpu"), pinned["torch"]
    assert not [n for n in pinned if n.startswith(("nvidia-", "triton", "cuda-"))]


def test_the_lock_tool_is_pinned_with_hashes():
    pinned = pins("uv.txt")
    assert list(pinned) == ["uv"] and pinned["uv"][1]
    makefile = (ROOT / "Makefile").read_text()
    assert "requirements/uv.txt" in makefile and "--require-hashes" in makefile
