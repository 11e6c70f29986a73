"""`make compat`: tests/integrations against the oldest transformers pyproject.toml allows and
the newest release on the package index, and the kernel and functional tests against the oldest
torch pyproject.toml allows and the newest torch release, each in a throwaway virtual environment.

    python scripts/compat.py [--only transformers|torch] [--versions 5.23.0,5.24.0] [--keep]
    python scripts/compat.py --dry-run      # print the plan (releases, tests), build nothing

Each environment gets the dev lock (requirements/dev.txt where the wheel directory holds torch's
CPU build, else requirements/dev-pypi.txt), then the release under test (with whatever its own
dependencies need: PyPI's Linux torch is the CUDA build, which runs on a CPU too), then attnkit
itself (editable, no dependencies). The tested ranges live in src/attnkit/integrations/versions.py
(transformers) and src/attnkit/support_range.py (torch): when the newest release passes and is
newer than the range's top, this script says so (raise it there and in the README).
Exit code 0 when every version passed, 1 otherwise, 2 on a usage or setup error.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnkit.integrations.versions import tested_range  # noqa: E402
from attnkit.support_range import TORCH_NEWEST, TORCH_OLDEST  # noqa: E402

PACKAGES = ("transformers", "torch")
TESTS = {  # what each package's environments run
    "transformers": ("tests/integrations",),
    "torch": ("tests/kernels", "tests/test_functional.py", "tests/test_functional_gqa.py"),
}


@dataclass(frozen=True)
class Check:
    """One environment: ``package==version`` over the dev ``lock``, then ``tests``."""

    package: str
    version: str
    lock: str
    tests: tuple[str, ...]


def dev_lock(wheels: str) -> str:
    """The dev lock ``make test`` would install: the wheel directory's, else PyPI's."""
    return (
        "requirements/dev.txt"
        if glob.glob(f"{wheels}/torch-2.13.0+cpu-*.whl")
        else ("requirements/dev-pypi.txt")
    )


def plan(only: str | None, versions: list[str], newest: dict[str, str], wheels: str) -> list[Check]:
    """The environments to build: for each package (``only`` one of them, or both) its oldest
    allowed and its newest release (``newest[package]``), or ``versions`` when given."""
    oldest = {"transformers": tested_range().oldest, "torch": TORCH_OLDEST}
    lock = dev_lock(wheels)
    out = []
    for pkg in [only] if only else PACKAGES:
        vs = versions or list(dict.fromkeys([oldest[pkg], newest[pkg]]))
        out += [Check(pkg, v, lock, TESTS[pkg]) for v in vs]
    return out


def newest_release(python: str, package: str = "transformers") -> str:
    """The newest release of ``package`` the package index serves (``pip index versions``)."""
    out = subprocess.run(
        [python, "-m", "pip", "index", "versions", package],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(rf"^{package} \(([^)]+)\)", out.stdout, re.M)
    if found is None:
        raise SystemExit(f"compat: cannot read the newest {package} release: {out.stderr}")
    return found.group(1)


def run(cmd: list[str], log) -> int:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    return done.returncode


def check_version(check: Check, uv: str, wheels: str, work: Path) -> tuple[bool, str, float]:
    """Build a venv for ``check``, run its tests; (passed, summary, seconds)."""
    t0 = time.perf_counter()
    name = f"{check.package}-{check.version}"
    venv = work / f"venv-{name}"
    py = str(venv / "bin" / "python")
    log_path = work / f"compat-{name}.log"
    src = ["--find-links", wheels] if os.path.isdir(wheels) else []
    with open(log_path, "w") as log:
        steps = [
            [uv, "venv", "-q", str(venv), "--python", sys.executable],
            [uv, "pip", "install", "-q", "--python", py, *src, "-r", check.lock],
            [uv, "pip", "install", "-q", "--python", py, *src, f"{check.package}=={check.version}"],
            [uv, "pip", "install", "-q", "--python", py, "--no-deps", "--no-build-isolation"]
            + ["-e", "."],
        ]
        for cmd in steps:
            if run(cmd, log) != 0:
                return False, f"install failed (see {log_path})", time.perf_counter() - t0
        test = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *check.tests]
        code = run(test, log)
    tail = [ln for ln in log_path.read_text().splitlines() if ln.strip()]
    summary = tail[-1].strip("= ") if tail else "no output"
    return code == 0, summary, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=PACKAGES, help="check one package (default: both)")
    ap.add_argument("--versions", help="comma-separated releases (default: oldest and newest)")
    ap.add_argument("--keep", action="store_true", help="keep the environments and logs")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, build nothing")
    ap.add_argument("--wheels", default=os.environ.get("WHEELS", "/opt/wheels"))
    args = ap.parse_args(argv)
    if args.versions and not args.only:
        print("compat: --versions needs --only transformers or --only torch", file=sys.stderr)
        return 2
    versions = [v.strip() for v in (args.versions or "").split(",") if v.strip()]
    wanted = [args.only] if args.only else list(PACKAGES)
    newest = {p: newest_release(sys.executable, p) for p in wanted if not versions}
    checks = plan(args.only, versions, newest, args.wheels)
    ranges = {"transformers": str(tested_range()), "torch": f"{TORCH_OLDEST} to {TORCH_NEWEST}"}
    for pkg in wanted:
        listed = ", ".join(c.version for c in checks if c.package == pkg)
        print(f"compat: {pkg} tested range {ranges[pkg]}; checking {listed}", flush=True)
    for c in checks:
        print(f"  {c.package}=={c.version} over {c.lock}: {' '.join(c.tests)}", flush=True)
    if args.dry_run:
        return 0
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        print("compat: uv not found (make compat installs it into .venv)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="attnkit-compat-"))
    results = []
    try:
        for c in checks:
            print(f"compat: {c.package} {c.version} ...", flush=True)
            ok, summary, secs = check_version(c, uv, args.wheels, work)
            results.append((c, ok))
            print(f"  {'PASS' if ok else 'FAIL'}  {summary}  ({secs:.0f} s)", flush=True)
            if not ok:  # the end of its log, before the environment goes
                lines = (work / f"compat-{c.package}-{c.version}.log").read_text().splitlines()
                print("\n".join("    " + ln for ln in lines[-40:]), flush=True)
    finally:
        if args.keep:
            print(f"compat: environments and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    from packaging.version import Version

    tops = {"transformers": tested_range().newest, "torch": TORCH_NEWEST}
    where = {
        "transformers": "TRANSFORMERS_TESTED in src/attnkit/integrations/versions.py",
        "torch": "TORCH_NEWEST in src/attnkit/support_range.py (and pyproject's bound)",
    }
    for c, ok in results:
        if ok and Version(c.version) > Version(tops[c.package]):
            print(
                f"compat: {c.package} {c.version} passes and is newer than the tested range: "
                f"raise {where[c.package]} and the README"
            )
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
