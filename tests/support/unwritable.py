"""A directory that a subprocess really cannot write in, also when the tests run as root.

Root writes anywhere (the capabilities CAP_DAC_OVERRIDE and CAP_FOWNER bypass file modes), so
``chmod 555`` alone proves nothing there: as root, the directory is given to ``nobody`` and the
subprocess runs without those capabilities (util-linux ``setpriv``); as another user, the
directory is made read-only. Either way a probe checks that writing fails before a test relies
on it (skipped, with the reason, when neither works)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["run_mains", "run_unwritable", "unwritable_dir"]

SRC = Path(__file__).resolve().parents[2] / "src"
_DROP = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def unwritable_dir(
    tmp_path: Path, mode: int = 0o555, fill: Callable[[Path], object] | None = None
) -> tuple[Path, list[str]]:
    """A new directory under ``tmp_path`` and the command prefix under which a process cannot
    create files in it (checked by a probe); ``mode`` 0o000 makes it unreadable too; ``fill``
    puts files in it first."""
    d = tmp_path / "read-only"
    d.mkdir()
    if fill is not None:
        fill(d)
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without util-linux setpriv: no unwritable directory")
        os.chown(d, 65534, 65534)
        prefix = list(_DROP)
    d.chmod(mode)
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", f"open({str(d / 'probe')!r}, 'w')"],
        capture_output=True,
        text=True,
    )
    if probe.returncode == 0 or "PermissionError" not in probe.stderr:
        pytest.skip(f"cannot make an unwritable directory here: {probe.stderr.strip()[-200:]}")
    return d, prefix


def run_unwritable(prefix: list[str], code: str) -> subprocess.CompletedProcess:
    """``python -c code`` with this checkout's ``src`` on the path, under ``prefix``."""
    return subprocess.run(
        [*prefix, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )


def run_mains(prefix: list[str], argvs: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """Each command line of ``argvs`` (name -> argv) through ``attnkit.cli.main`` in one
    subprocess under ``prefix``: name -> (exit code, stderr)."""
    code = (
        "import contextlib, io, json\n"
        "from attnkit.cli import main\n"
        "found = {}\n"
        f"for name, argv in {argvs!r}.items():\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        found[name] = [main(argv), err.getvalue()]\n"
        "print(json.dumps(found))\n"
    )
    r = run_unwritable(prefix, code)
    assert r.returncode == 0, r.stderr
    return {name: (status, err) for name, (status, err) in json.loads(r.stdout).items()}
