"""`make compat`: tests/integrations against the oldest transformers pyproject.toml allows and
the newest release on the package index, each in a throwaway virtual environment.

    python scripts/compat.py [--versions 5.23.0,5.24.0] [--keep]

Each environment gets the dev lock (requirements/dev.txt), then the transformers release under
test (with whatever its own dependencies need), then attnkit itself (editable, no dependencies).
The tested range lives in src/attnkit/integrations/versions.py: when the newest release passes
and is newer than TRANSFORMERS_TESTED, this script says so (raise it there and in the README).
Exit code 0 when every version passed, 1 otherwise, 2 on a usage or setup error.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnkit.integrations.versions import tested_range  # noqa: E402


def newest_release(python: str) -> str:
    """The newest transformers release the package index serves (``pip index versions``)."""
    out = subprocess.run(
        [python, "-m", "pip", "index", "versions", "transformers"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"^transformers \(([^)]+)\)", out.stdout, re.M)
    if found is None:
        raise SystemExit(f"compat: cannot read the newest transformers release: {out.stderr}")
    return found.group(1)


def run(cmd: list[str], log) -> int:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    return done.returncode


def check_version(version: str, uv: str, wheels: str, work: Path) -> tuple[bool, str, float]:
    """Build a venv with transformers ``version``, run tests/integrations; (passed, summary, s)."""
    t0 = time.perf_counter()
    venv = work / f"venv-{version}"
    py = str(venv / "bin" / "python")
    log_path = work / f"compat-{version}.log"
    src = ["--find-links", wheels] if os.path.isdir(wheels) else []
    with open(log_path, "w") as log:
        steps = [
            [uv, "venv", "-q", str(venv), "--python", sys.executable],
            [uv, "pip", "install", "-q", "--python", py, *src, "-r", "requirements/dev.txt"],
            [uv, "pip", "install", "-q", "--python", py, *src, f"transformers=={version}"],
            [uv, "pip", "install", "-q", "--python", py, "--no-deps", "--no-build-isolation"]
            + ["-e", "."],
        ]
        for cmd in steps:
            if run(cmd, log) != 0:
                return False, f"install failed (see {log_path})", time.perf_counter() - t0
        test = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integrations"]
        code = run(test, log)
    tail = [ln for ln in log_path.read_text().splitlines() if ln.strip()]
    summary = tail[-1].strip("= ") if tail else "no output"
    return code == 0, summary, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", help="comma-separated releases (default: oldest and newest)")
    ap.add_argument("--keep", action="store_true", help="keep the environments and logs")
    ap.add_argument("--wheels", default=os.environ.get("WHEELS", "/opt/wheels"))
    args = ap.parse_args(argv)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        print("compat: uv not found (make compat installs it into .venv)", file=sys.stderr)
        return 2
    rng = tested_range()
    if args.versions:
        versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    else:
        versions = list(dict.fromkeys([rng.oldest, newest_release(sys.executable)]))
    print(f"compat: tested range {rng}; checking transformers {', '.join(versions)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="attnkit-compat-"))
    results = []
    try:
        for v in versions:
            print(f"compat: transformers {v} ...", flush=True)
            ok, summary, secs = check_version(v, uv, args.wheels, work)
            results.append((v, ok))
            print(f"  {'PASS' if ok else 'FAIL'}  {summary}  ({secs:.0f} s)", flush=True)
            if not ok:  # the end of its log, before the environment goes
                lines = (work / f"compat-{v}.log").read_text().splitlines()
                print("\n".join("    " + ln for ln in lines[-40:]), flush=True)
    finally:
        if args.keep:
            print(f"compat: environments and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    from packaging.version import Version

    for v, ok in results:
        if ok and Version(v) > Version(rng.newest):
            print(
                f"compat: transformers {v} passes and is newer than the tested range: raise "
                "TRANSFORMERS_TESTED in src/attnkit/integrations/versions.py and the README"
            )
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
