"""Shared helpers for the benchmark scripts: timing, peak memory, the row protocol.

Every ``benchmarks/bench_*.py`` script registers rows with :func:`row` and ends with
``main()``. ``python benchmarks/bench_x.py --list`` prints one JSON line per row (id, group, case,
target); ``python benchmarks/bench_x.py --row ID [--quick]`` runs one row in this (fresh) process
and prints one line ``ROW {json}``. ``benchmarks/run.py`` runs every row in its own subprocess, so
the peak memory of a row is the peak RSS of that subprocess, and builds the table.

A row's function takes ``quick`` (bool) and returns a dict with at least:
  ``impl_s``  median seconds of attnkit;  ``peer_s``  median seconds of the peer, measured in the
  same process (side by side); ``peer``  the peer's name; optional ``extra`` (dict: compile time,
  block-mask time, errors, memory of both sides, ...; ``run.py`` shows it in the notes column).
Optional keys:
  ``case``  overrides the registered case text (e.g. the sizes actually run with ``--quick``);
  ``target_met``  True/False when the target is not a plain ratio (e.g. a memory bound); when it
  is absent, ``run.py`` checks targets of the form ``">=20x"`` against ``ratio``.
Added here: ``ratio`` = peer_s / impl_s (> 1 means attnkit is faster), ``peak_rss_mib`` (peak RSS
of the whole row process), ``startup_rss_mib`` (RSS after imports, before the row ran),
``quick``, ``torch_threads``.

Peak memory of one side: :func:`peak_memory_mib` runs a function once and returns the peak RSS it
reached above the RSS before the call (it resets the kernel's high-water mark, Linux only), so
attnkit and its peer can each report their own peak from the same process.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable

ROWS: dict[str, dict] = {}

_PEAK_BEFORE_RESET_MIB = 0.0
"""Highest peak RSS seen before the last high-water-mark reset (MiB)."""


def row(row_id: str, group: str, case: str, target: str = "") -> Callable:
    """Register a benchmark row, e.g.
    ``@row("swa-fwd-16k", "sliding window", "L=16384 fwd", ">=20x")``."""

    def deco(fn: Callable[[bool], dict]) -> Callable[[bool], dict]:
        ROWS[row_id] = dict(fn=fn, group=group, case=case, target=target)
        return fn

    return deco


def median_time(fn: Callable[[], object], warmup: int = 1, reps: int = 5) -> float:
    """Median wall time of ``fn`` over ``reps`` runs after ``warmup`` runs (seconds)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(statistics.median(ts))


def interleaved_times(
    fns: dict[str, Callable[[], object]], warmup: int = 1, reps: int = 5
) -> dict[str, list[float]]:
    """Every wall time (seconds) of several functions measured alternately, so that noise on a
    shared machine hits all of them alike. The order flips every round (A B, B A, A B, ...) so
    that neither side always runs first (caches, allocator state, a neighbour's load pattern)."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(reps):
        for k in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
    return ts


def interleaved_medians(
    fns: dict[str, Callable[[], object]], warmup: int = 1, reps: int = 5
) -> dict[str, float]:
    """Median times of several functions measured alternately (see :func:`interleaved_times`)."""
    ts = interleaved_times(fns, warmup, reps)
    return {k: float(statistics.median(v)) for k, v in ts.items()}


def measure_pair(
    ours: Callable[[], object], peer: Callable[[], object], reps: int, **extra: object
) -> dict:
    """Time attnkit (``ours``) and its peer alternately; return the row fields ``impl_s`` and
    ``peer_s`` (medians) and ``extra`` with noise gauges added: each side's relative spread and
    the ratio of the fastest runs (noise only adds time, so on a loaded machine it is the
    steadier estimate)."""
    t = interleaved_times({"impl": ours, "peer": peer}, warmup=1, reps=reps)
    extra.update(
        reps=reps,
        spread=f"{spread(t['impl']):.0%}/{spread(t['peer']):.0%}",
        ratio_of_mins=round(min(t["peer"]) / min(t["impl"]), 3),
    )
    return dict(
        impl_s=float(statistics.median(t["impl"])),
        peer_s=float(statistics.median(t["peer"])),
        extra=extra,
    )


def spread(times: list[float]) -> float:
    """Relative spread of repeated timings: (upper quartile - lower quartile) / median; a noise
    gauge to print next to a median (0.05 = 5 %)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(times)


def _status_mib(field: str) -> float | None:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM) in MiB, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def current_rss_mib() -> float:
    """Resident set size of this process now (MiB); 0 when unknown."""
    return _status_mib("VmRSS") or 0.0


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB), including peaks before any reset done
    by :func:`peak_memory_mib`."""
    now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return max(now, _PEAK_BEFORE_RESET_MIB)


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS high-water mark of this process (Linux >= 4.0)."""
    global _PEAK_BEFORE_RESET_MIB
    _PEAK_BEFORE_RESET_MIB = peak_rss_mib()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Run ``fn`` once; return the peak RSS it reached above the RSS just before it (MiB).

    Free what earlier calls allocated before calling this (``del`` results). Without a resettable
    high-water mark (not Linux) the result is the process peak so far minus the RSS before, an
    upper bound."""
    before = current_rss_mib()
    _reset_peak()
    fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return max(0.0, peak - before)


def _jsonable(x: object) -> object:
    """JSON fallback for numpy / torch scalars and anything else (as text)."""
    item = getattr(x, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(x)


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--list", action="store_true", help="print the row ids")
    p.add_argument("--row", help="run one row and print 'ROW {json}'")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (smoke test)")
    a = p.parse_args()
    if a.list or not a.row:
        for rid, r in ROWS.items():
            print(json.dumps(dict(id=rid, group=r["group"], case=r["case"], target=r["target"])))
        return
    if a.row not in ROWS:
        sys.exit(f"--row: unknown row {a.row!r}; known: {sorted(ROWS)}")
    r = ROWS[a.row]
    base = current_rss_mib() or peak_rss_mib()
    res = r["fn"](a.quick)
    if not isinstance(res, dict):
        sys.exit(
            f"row {a.row!r}: expected a dict with impl_s, peer_s, peer (and optional extra), "
            f"got {type(res).__name__}"
        )
    out = dict(id=a.row, group=r["group"], case=r["case"], target=r["target"])
    out.update(res)  # a row may override 'case' (sizes run with --quick)
    if res.get("impl_s") and res.get("peer_s"):
        out["ratio"] = res["peer_s"] / res["impl_s"]
    out["peak_rss_mib"] = peak_rss_mib()
    out["startup_rss_mib"] = base
    out["quick"] = bool(a.quick)
    out["torch_threads"] = _torch_threads()
    print("ROW " + json.dumps(out, default=_jsonable), flush=True)
