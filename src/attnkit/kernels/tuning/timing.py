"""The timing of ``attnkit tune``'s races: candidates run alternately (A B A B ...), after one
warm-up each, so repeat i of every candidate saw about the same load; the decisions on the
times are in :mod:`attnkit.kernels.tuning.rules`."""

from __future__ import annotations

import time

__all__ = ["best_times", "median_time", "pairs", "race_times"]


def race_times(fns: dict, reps: int) -> dict:
    """Seconds of each repeat of each function, run alternately ``reps`` times (A B A B ...)
    after one warm-up, so repeat i of every candidate saw about the same load."""
    times: dict = {n: [] for n in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for n, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t0)
    return times


def best_times(fns: dict, reps: int) -> dict:
    """Fastest seconds of each function, run alternately ``reps`` times after one warm-up."""
    return {n: min(t) for n, t in race_times(fns, reps).items()}


def pairs(reps: int) -> int:
    """Alternate races per candidate of a choice under a budget of ``reps`` repeats: enough
    pairs for a median and a spread (at least 5)."""
    return max(5, 2 * reps + 1)


def median_time(times: list[float]) -> float:
    """The median of ``times`` (the upper one of an even count)."""
    return sorted(times)[len(times) // 2]
