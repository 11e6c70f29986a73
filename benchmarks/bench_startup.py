"""Start-up time of the installed ``attnkit`` command: ``attnkit --help``, ``attnkit --version``
and ``attnkit explain --help`` (none may import torch or numpy; target < 0.3 s, the median of
10 runs), each next to ``python -c "import torch"`` measured in the same run (what every
``--help`` paid before the imports became lazy; ratio > 1: the command starts that many times
faster than torch alone imports). ``python -c pass`` (the interpreter's own start) is in the notes.

The command is the ``attnkit`` script beside this Python (the installed entry point), run with
this process's environment (so ``PYTHONPATH`` picks the source tree to measure).

    python benchmarks/bench_startup.py --list
    python benchmarks/bench_startup.py --row startup-help [--quick]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import main, row

TARGET_S = 0.3
RUNS = 10


def _command() -> list[str]:
    """The installed ``attnkit`` entry point (beside this Python, else on PATH)."""
    beside = Path(sys.executable).with_name("attnkit")
    found = str(beside) if beside.is_file() else shutil.which("attnkit")
    if found is None:
        raise SystemExit("bench_startup: the attnkit command is not installed (pip install -e .)")
    return [found]


def _median_wall(argv: list[str], runs: int) -> float:
    """Median wall time (s) of ``runs`` runs of ``argv`` (output discarded), after one warm-up
    run that fills the OS file cache; runs that fail are an error."""
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
        elapsed = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode()[-500:]}")
        if i:
            times.append(elapsed)
    times.sort()
    return times[len(times) // 2]


def _startup_row(args: list[str], quick: bool) -> dict:
    runs = 3 if quick else RUNS
    impl = _median_wall([*_command(), *args], runs)
    torch_s = _median_wall([sys.executable, "-c", "import torch"], runs)
    floor = _median_wall([sys.executable, "-c", "pass"], runs)
    return dict(
        impl_s=impl,
        peer_s=torch_s,
        peer='python -c "import torch"',
        target_met=impl < TARGET_S,
        extra=dict(
            runs=runs, python_startup_s=round(floor, 4), command=" ".join(["attnkit", *args])
        ),
    )


@row("startup-help", "start-up", "attnkit --help, median of 10 runs", "<0.3 s")
def startup_help(quick: bool) -> dict:
    return _startup_row(["--help"], quick)


@row("startup-version", "start-up", "attnkit --version, median of 10 runs", "<0.3 s")
def startup_version(quick: bool) -> dict:
    return _startup_row(["--version"], quick)


@row("startup-verb-help", "start-up", "attnkit explain --help, median of 10 runs", "<0.3 s")
def startup_verb_help(quick: bool) -> dict:
    return _startup_row(["explain", "--help"], quick)


if __name__ == "__main__":
    main()
