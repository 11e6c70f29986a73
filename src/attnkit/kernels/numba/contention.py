"""Whether other processes hold this machine's cores, for the team size of a short parallel
region.

A decode step is tens of microseconds of work per thread. On a machine where another process
keeps a core busy, a team of threads waits at the region's end for a thread the scheduler has
parked, for a time slice (milliseconds): measured on a 2-core VM at a load of 4, a step at
Lk = 2,048 took 2.7 ms on two threads and 0.93 ms on one (SDPA: 4.2 ms and 0.68 ms). So the
decode kernels ask :func:`team` how many threads to use.

The signal is the run-queue wait of this process's own threads, from Linux's
``/proc/self/task/*/schedstat`` (nanoseconds run, nanoseconds waited to run): when they waited
at least :data:`ENTER` of the time they ran, the machine is contended and :func:`team` gives
one thread. One thread waits little even on a busy machine, so the team is tried again at full
size after :data:`HOLD_S` seconds, for one sample. Samples are at least :data:`SAMPLE_S` apart
(reading the files takes tens of microseconds). Where the files are missing (not Linux, or a
kernel without schedstats), :func:`team` gives every thread.

The team size never changes a result: the kernels split their work by the configured thread
count, and the team claims the same units whatever its size.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ENTER", "HOLD_S", "SAMPLE_S", "Monitor", "read_schedstat", "team"]

SAMPLE_S = 0.05
"""Least seconds between two samples of the threads' run and wait times."""

ENTER = 0.25
"""Waited / ran over one sample from which the machine counts as contended."""

HOLD_S = 1.0
"""Seconds a contended verdict holds before the full team is tried again for one sample."""


def read_schedstat() -> tuple[int, int] | None:
    """(nanoseconds run, nanoseconds waited on a run queue), summed over this process's
    threads; None where Linux's schedstat files cannot be read."""
    run = wait = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    seen = False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
        except OSError:  # the thread ended meanwhile, or no schedstats
            continue
        if len(fields) >= 2:
            run, wait, seen = run + int(fields[0]), wait + int(fields[1]), True
    return (run, wait) if seen else None


@dataclass
class Monitor:
    """The contention verdict from samples of ``read`` (:func:`read_schedstat`) at times of
    ``clock`` (seconds). ``contended`` is the current verdict; ``since`` when it was reached."""

    read: Callable[[], tuple[int, int] | None] = read_schedstat
    clock: Callable[[], float] = time.monotonic
    contended: bool = False
    since: float = 0.0
    last: tuple[float, int, int] | None = None
    probing: bool = False

    def team(self, threads: int) -> int:
        """How many of ``threads`` a short parallel region should use now: 1 while the machine
        is contended, else ``threads``."""
        if threads <= 1:
            return threads
        now = self.clock()
        if self.last is None or now - self.last[0] >= SAMPLE_S:
            self._sample(now)
        if self.contended and not self.probing and now - self.since >= HOLD_S:
            self.probing = True  # one sample at full size: is the machine still contended?
            self._restart(now)
        return 1 if self.contended and not self.probing else threads

    def _restart(self, now: float) -> None:
        got = self.read()
        self.last = None if got is None else (now, *got)

    def _sample(self, now: float) -> None:
        got = self.read()
        if got is None:
            self.last, self.contended = None, False
            return
        if self.last is not None:
            ran, waited = got[0] - self.last[1], got[1] - self.last[2]
            if ran > 0 and waited >= 0:
                busy = waited >= ENTER * ran
                if self.probing:  # the full team's sample decides
                    self.probing, self.contended, self.since = False, busy, now
                elif busy and not self.contended:
                    self.contended, self.since = True, now
                # contended and not probing: one thread waits little, so hold the verdict
        self.last = (now, *got)


_MONITOR = Monitor()
_LOCK = threading.Lock()


def team(threads: int) -> int:
    """:meth:`Monitor.team` of the process's monitor (one for every kernel that asks)."""
    with _LOCK:
        return _MONITOR.team(threads)
