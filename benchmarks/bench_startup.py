"""Start-up time of the installed ``attnkit`` command: ``attnkit --help``, ``attnkit --version``
and ``attnkit explain --help`` (none may import torch or numpy; target < 0.3 s, the median of
10 runs), each next to ``python -c "import torch"`` measured in the same run (what every
``--help`` paid before the imports became lazy; ratio > 1: the command starts that many times
faster than torch alone imports). ``python -c pass`` (the interpreter's own start) is in the notes.

``first-calls``: a new user's naive benchmark. The median of the first 50 attention calls of a
fresh process (q, k, v 1x8x64x64 float32, ``backend="auto"``) against the median of the first 50
calls of ``torch.nn.functional.scaled_dot_product_attention`` in another fresh process; target:
at most 1.2x SDPA's. The first call, which pays attnkit's one-time costs (numba's kernels of the
input scan), and the slowest of calls 2-50 are in the notes (of the last process). Three fresh
processes per side, alternately; the median of their medians.

The command is the ``attnkit`` script beside this Python (the installed entry point), run with
this process's environment (so ``PYTHONPATH`` picks the source tree to measure).

    python benchmarks/bench_startup.py --list
    python benchmarks/bench_startup.py --row startup-help [--quick]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import child, main, row, run_child

TARGET_S = 0.3
RUNS = 10
FIRST_CALLS = 50
FIRST_CALLS_TARGET = 1.2
FIRST_CALLS_PROCESSES = 3
"""Fresh processes per side (alternately); the row reports the median of their medians."""


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


@child("first-calls")
def first_calls(side: str) -> list[float]:
    """Wall times (s) of the first FIRST_CALLS attention calls of this (fresh) process: attnkit's
    ``scaled_dot_product_attention`` (``side="attnkit"``) or torch's SDPA (``side="sdpa"``)."""
    import torch

    if side == "attnkit":
        from attnkit import functional

        fn = functional.scaled_dot_product_attention
    else:
        fn = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 64, 64, generator=gen) for _ in range(3))
    times = []
    for _ in range(FIRST_CALLS):
        t0 = time.perf_counter()
        fn(q, k, v)
        times.append(time.perf_counter() - t0)
    return times


@row(
    "first-calls",
    "start-up",
    f"median of the first {FIRST_CALLS} calls of a fresh process, 1x8x64x64",
    f"<={FIRST_CALLS_TARGET}x SDPA",
)
def first_calls_row(quick: bool) -> dict:
    pairs = 1 if quick else FIRST_CALLS_PROCESSES
    runs = [
        (run_child(__file__, "first-calls", "attnkit"), run_child(__file__, "first-calls", "sdpa"))
        for _ in range(pairs)
    ]  # alternately: load hits both sides alike
    impl = statistics.median(statistics.median(a) for a, _ in runs)
    peer_s = statistics.median(statistics.median(b) for _, b in runs)
    ours, peer = runs[-1]
    return dict(
        impl_s=impl,
        peer_s=peer_s,
        peer="torch SDPA, fresh process",
        target_met=impl <= FIRST_CALLS_TARGET * peer_s,
        extra=dict(
            first_call_ms=round(ours[0] * 1e3, 1),
            slowest_2_to_50_ms=round(max(ours[1:]) * 1e3, 2),
            sdpa_first_call_ms=round(peer[0] * 1e3, 2),
            processes_per_side=pairs,
        ),
    )


if __name__ == "__main__":
    main()
