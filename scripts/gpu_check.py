"""`make gpu-check`: attnkit's CUDA tests and GPU bench rows on a machine that already has a CUDA
build of torch (any version), in a few minutes, ending with one table.

    python scripts/gpu_check.py [--python /path/to/python-with-cuda-torch] [--quick] [--dry-run]

Steps (``--dry-run`` prints them and exits without running anything, on any machine):

1. the interpreter given by ``--python`` (default: this one) must import a torch that sees a
   CUDA device; its GPU name, torch and CUDA versions head the table;
2. a virtual environment ``.gpu-venv`` beside the checkout, made with ``--system-site-packages``
   so it uses that torch as it is (never reinstalled), with attnkit installed ``--no-deps``
   (editable) and every wheel in ``gpu-wheels/`` (e.g. platformdirs, if the system lacks it),
   also ``--no-deps``;
3. ``pytest -m cuda`` on the test files that hold tests marked ``cuda`` (every GPU call kind
   against float64 on the CPU, under ``torch.cuda.set_sync_debug_mode("error")``); they need
   only numpy and pytest beside torch (from the system, or wheels in ``gpu-wheels/``);
4. ``benchmarks/run.py --scripts gpu`` (every ``benchmarks/bench_gpu_*.py`` row) with a JSON
   file of the results;
5. one table: the machine, the tests' outcome, and each row's target, ratio and verdict.

Exit code 0 when the tests passed and every row ran (missed targets are listed, as by
``benchmarks/run.py``), 1 otherwise, 2 on a setup error (no CUDA device, venv or install failed).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".gpu-venv"
WHEELS = ROOT / "gpu-wheels"
RESULTS = ROOT / "gpu-check.json"
BUDGET_S = 8 * 60

PROBE = (
    "import json, torch; ok = torch.cuda.is_available(); print(json.dumps(dict(ok=ok, "
    "gpu=torch.cuda.get_device_name(0) if ok else None, torch=torch.__version__, "
    "cuda=torch.version.cuda)))"
)


@dataclass(frozen=True)
class Step:
    """One command of the check: what it is for, and the argv."""

    what: str
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(map(str, self.argv)))

    setup: bool = False
    """A failure is a setup error (exit 2) rather than a failed check (exit 1)."""

    def show(self) -> str:
        return f"{self.what}:\n    {shlex.join(self.argv)}"


def cuda_test_files() -> list[str]:
    """The test files (relative to the checkout) that hold tests marked ``cuda``."""
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    return [str(f.relative_to(ROOT)) for f in files if "pytest.mark.cuda" in f.read_text()]


def plan(python: str, quick: bool, wheels: list[Path]) -> list[Step]:
    """The commands of the check, in order (see the module docstring)."""
    vpy = str(VENV / "bin" / "python")
    steps = [
        Step("probe torch and the GPU", (python, "-c", PROBE), setup=True),
        Step(
            "virtual environment on the system's torch",
            (python, "-m", "venv", "--system-site-packages", str(VENV)),
            setup=True,
        ),
        Step(
            "attnkit without dependencies",
            (
                vpy,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-e",
                str(ROOT),
            ),
            setup=True,
        ),
    ]
    if wheels:
        steps.append(
            Step(
                f"wheels from {WHEELS.name}/",
                (vpy, "-m", "pip", "install", "-q", "--no-deps", *map(str, wheels)),
                setup=True,
            )
        )
    steps.append(
        Step(
            "the CUDA tests",
            (vpy, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *cuda_test_files()),
        )
    )
    bench = [vpy, str(ROOT / "benchmarks" / "run.py"), "--scripts", "gpu", "--json", str(RESULTS)]
    if quick:
        bench.append("--quick")
    steps.append(Step("the GPU bench rows", tuple(bench)))
    return steps


def _run(step: Step) -> subprocess.CompletedProcess:
    print(f"== {step.what}", flush=True)
    return subprocess.run(step.argv, cwd=ROOT, capture_output=True, text=True)


def _tests_line(out: str) -> str:
    """pytest's summary line ("12 passed, 3 skipped in 40s"), or the last line."""
    lines = [ln.strip("= ") for ln in out.splitlines() if ln.strip()]
    hits = [ln for ln in lines if " in " in ln and ("passed" in ln or "failed" in ln)]
    return (hits or lines or ["no output"])[-1]


def table(machine: dict, tests: str, rows: list[dict], elapsed: float) -> str:
    """The check's one table (plain text)."""
    head = [
        f"GPU: {machine.get('gpu')}   torch {machine.get('torch')}   CUDA {machine.get('cuda')}",
        f"CUDA tests: {tests}",
        f"time: {elapsed:.0f} s (budget {BUDGET_S} s)",
        "",
        f"{'row':<26} {'target':<10} {'ratio':>8} {'met':<4} notes",
    ]
    body = []
    for r in rows:
        ratio = r.get("ratio")
        met = r.get("target_met")
        verdict = "-" if met is None else ("yes" if met else "NO")
        extra = r.get("extra") or {}
        note = extra.get("status") or r.get("error") or ""
        if not note and "host_us_above_sdpa" in extra:
            note = f"{extra['host_us_above_sdpa']} us above SDPA"
        shown = "-" if not isinstance(ratio, (int, float)) else f"{ratio:.2f}x"
        body.append(
            f"{r.get('id', '?'):<26} {r.get('target') or '-':<10} {shown:>8} {verdict:<4} {note}"
        )
    return "\n".join(head + body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=sys.executable, help="an interpreter with a CUDA torch")
    p.add_argument("--quick", action="store_true", help="smaller bench sizes (smoke test)")
    p.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    a = p.parse_args(argv)
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    steps = plan(a.python, a.quick, wheels)
    if a.dry_run:
        print("gpu-check would run, from " + str(ROOT) + ":")
        for i, s in enumerate(steps, 1):
            print(f"{i}. {s.show()}")
        print(f"then print one table (results also in {RESULTS.name}); budget {BUDGET_S} s")
        return 0
    started = time.monotonic()
    probe = _run(steps[0])
    machine = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {}
    if not machine.get("ok"):
        print(f"gpu-check: {a.python} has no torch that sees a CUDA device", file=sys.stderr)
        print(probe.stderr[-1500:], file=sys.stderr)
        return 2
    tests, status = "not run", 0
    for s in steps[1:]:
        done = _run(s)
        if s.setup and done.returncode != 0:
            print(f"gpu-check: {s.what} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            return 2
        if s.what == "the CUDA tests":
            tests = _tests_line(done.stdout)
        if done.returncode != 0:
            status = 1
    rows = json.loads(RESULTS.read_text()).get("rows", []) if RESULTS.exists() else []
    print(table(machine, tests, rows, time.monotonic() - started))
    return status


if __name__ == "__main__":
    sys.exit(main())
