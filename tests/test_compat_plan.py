"""`make compat`'s plan (scripts/compat.py): which releases of transformers and torch get an
environment, over which lock, with which tests; and its --dry-run, which builds nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from attnkit.integrations import versions
from attnkit.support_range import TORCH_OLDEST

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compat():
    spec = importlib.util.spec_from_file_location("compat", ROOT / "scripts" / "compat.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compat"] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("compat", None)


NEWEST = {"transformers": "99.0.0", "torch": "9.9.0"}


def test_both_packages_oldest_allowed_and_newest_release(compat, tmp_path):
    checks = compat.plan(None, [], NEWEST, str(tmp_path))
    got = [(c.package, c.version) for c in checks]
    assert got == [
        ("transformers", versions.tested_range().oldest),
        ("transformers", "99.0.0"),
        ("torch", TORCH_OLDEST),
        ("torch", "9.9.0"),
    ]
    torch_tests = {t for c in checks if c.package == "torch" for t in c.tests}
    assert {"tests/kernels", "tests/test_functional.py"} <= torch_tests
    assert all((ROOT / t).exists() for c in checks for t in c.tests)


def test_the_newest_release_equal_to_the_oldest_is_checked_once(compat, tmp_path):
    checks = compat.plan("torch", [], {"torch": TORCH_OLDEST}, str(tmp_path))
    assert [c.version for c in checks] == [TORCH_OLDEST]


def test_explicit_versions_of_one_package(compat, tmp_path):
    checks = compat.plan("torch", ["2.12.0", "2.14.1"], {}, str(tmp_path))
    assert [(c.package, c.version) for c in checks] == [("torch", "2.12.0"), ("torch", "2.14.1")]


def test_the_lock_follows_the_install_route(compat, tmp_path):
    assert compat.plan("torch", ["2.12.0"], {}, str(tmp_path))[0].lock == (
        "requirements/dev-pypi.txt"
    )
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert compat.plan("torch", ["2.12.0"], {}, str(tmp_path))[0].lock == "requirements/dev.txt"


def test_dry_run_prints_the_plan_and_builds_nothing(compat, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compat, "newest_release", lambda python, package: NEWEST[package])
    monkeypatch.setattr(compat.tempfile, "mkdtemp", lambda **kw: pytest.fail("built a venv"))
    assert compat.main(["--dry-run", "--wheels", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"torch=={TORCH_OLDEST} over requirements/dev-pypi.txt: tests/kernels" in out
    assert "transformers==99.0.0" in out


def test_versions_without_a_package_is_a_usage_error(compat, capsys):
    assert compat.main(["--versions", "1.0", "--dry-run"]) == 2
    assert "--only" in capsys.readouterr().err
