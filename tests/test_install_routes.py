"""The two install routes of ``make demo``/``make test`` (the wheel directory with torch's CPU
build, else PyPI alone) and the tested torch range (src/attnkit/support_range.py) agree with
pyproject.toml, the locks, the Makefile and the README."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from attnkit import support_range

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

from tests.test_locks import pins  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")


def make_dry(target: str, wheels: Path) -> str:
    """What ``make -n -B target WHEELS=wheels`` would run (nothing runs; -B: as on a fresh
    checkout, whatever .venv holds)."""
    r = subprocess.run(
        [MAKE, "-n", "-B", "--no-print-directory", "-C", str(ROOT), target, f"WHEELS={wheels}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


def sync_lines(out: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if " pip sync " in ln]
    assert lines, out
    return lines


@pytest.mark.skipif(MAKE is None, reason="needs make")
@pytest.mark.parametrize(("target", "lock"), [("demo", "run"), ("test", "dev")])
def test_without_the_wheel_directory_the_pypi_lock_is_installed(tmp_path, target, lock):
    out = make_dry(target, tmp_path / "absent")
    for sync in sync_lines(out):
        assert f"requirements/{lock}-pypi.txt" in sync and "--find-links" not in sync
    assert "install route: PyPI only" in out


@pytest.mark.skipif(MAKE is None, reason="needs make")
@pytest.mark.parametrize(("target", "lock"), [("demo", "run"), ("test", "dev")])
def test_an_empty_or_foreign_wheel_directory_is_not_used(tmp_path, target, lock):
    (tmp_path / "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    for sync in sync_lines(make_dry(target, tmp_path)):
        assert f"requirements/{lock}-pypi.txt" in sync


@pytest.mark.skipif(MAKE is None, reason="needs make")
@pytest.mark.parametrize(("target", "lock"), [("demo", "run"), ("test", "dev")])
def test_with_the_cpu_wheel_the_wheel_directory_lock_is_installed(tmp_path, target, lock):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    out = make_dry(target, tmp_path)
    for sync in sync_lines(out):
        assert f"requirements/{lock}.txt" in sync and f"--find-links {tmp_path}" in sync
    assert f"install route: wheel directory {tmp_path}" in out


@pytest.mark.parametrize("lock", ["run", "dev"])
def test_the_pypi_lock_differs_from_the_wheel_lock_only_by_torch_and_its_cuda_packages(lock):
    wheel, pypi = pins(f"{lock}.txt"), pins(f"{lock}-pypi.txt")
    assert pypi["torch"][0] == support_range.TORCH_LOCKED  # PyPI's plain wheel, not +cpu
    assert all(h for _, h in pypi.values()), "every pin of the PyPI lock has its hashes"
    cuda = {n for n in pypi if n.startswith(("nvidia-", "triton", "cuda-"))}
    assert cuda, "PyPI's Linux torch pulls in its CUDA libraries: the lock must pin them"
    assert set(pypi) - cuda == set(wheel)
    for name in set(wheel) - {"torch"}:
        assert pypi[name][0] == wheel[name][0], name


def test_pyproject_requires_the_tested_torch_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_req,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert str(torch_req.specifier) == str(Requirement(support_range.torch_requirement()).specifier)
    for v in (support_range.TORCH_OLDEST, support_range.TORCH_NEWEST, "2.13.0+cpu"):
        assert torch_req.specifier.contains(Version(v)), v
    assert not torch_req.specifier.contains(Version(support_range.TORCH_BELOW))
    older = Version(support_range.TORCH_OLDEST)
    assert not torch_req.specifier.contains(Version(f"{older.major}.{older.minor - 1}.0"))
    locked = Version(pins("run.txt")["torch"][0])
    assert locked.base_version == support_range.TORCH_LOCKED


def test_readme_states_the_tested_range_and_both_routes():
    readme = (ROOT / "README.md").read_text()
    assert f"torch {support_range.TORCH_OLDEST} to {support_range.TORCH_NEWEST}" in readme
    assert "run-pypi.txt" in readme and "make route" in readme


def test_info_reports_the_tested_range():
    from attnkit.cli import info

    assert info.collect()["torch_support"] == support_range.torch_support()
