"""Shared helpers for the benchmark scripts: timing, peak memory, the row protocol.

Every ``benchmarks/bench_*.py`` script registers rows with :func:`row` and ends with
``main()``. ``python benchmarks/bench_x.py --list`` prints the row ids;
``python benchmarks/bench_x.py --row ID [--quick]`` runs one row in this (fresh) process and prints
one line ``ROW {json}``. ``benchmarks/run.py`` runs every row in its own subprocess, so the peak
memory of a row is the peak RSS of that subprocess, and builds the table.

A row's function returns a dict with at least:
  ``impl_s``  median seconds of attnkit;  ``peer_s``  median seconds of the peer, measured in the
  same process (side by side); ``peer``  the peer's name; optional ``extra`` (dict: compile time,
  block-mask time, errors, memory of both sides, ...). ``ratio`` = peer_s / impl_s is added here
  (> 1 means attnkit is faster).
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


def row(row_id: str, group: str, case: str, target: str = "") -> Callable:
    """Register a benchmark row: ``@row("swa-fwd-16k", "sliding window", "L=16384 fwd", ">=20x")``."""

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


def interleaved_medians(
    fns: dict[str, Callable[[], object]], warmup: int = 1, reps: int = 5
) -> dict[str, float]:
    """Median times of several functions measured alternately (A B A B ...), so that noise on a
    shared machine hits all of them alike."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    return {k: float(statistics.median(v)) for k, v in ts.items()}


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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
    base = peak_rss_mib()
    res = r["fn"](a.quick)
    out = dict(id=a.row, group=r["group"], case=r["case"], target=r["target"], **res)
    if res.get("impl_s") and res.get("peer_s"):
        out["ratio"] = res["peer_s"] / res["impl_s"]
    out["peak_rss_mib"] = peak_rss_mib()
    out["startup_rss_mib"] = base
    print("ROW " + json.dumps(out), flush=True)
