"""A loaded memory bus on demand: ``run.py --contend`` runs every row while a second process
copies a large tensor in a loop on one thread (the "busy host" of issue 32: a neighbour that
streams memory, as another job on a shared machine does).

The copier writes the bandwidth of each of its copies to a file; :class:`Contention` reads them
back when the run ends, so the record says how hard the bus was loaded (median GB/s of the
copier, counting bytes read plus bytes written), beside the rows that ran under it.

    with Contention(mib=512) as c:
        ...                      # rows run here
    c.record()                   # ContentionRecord(kind=..., copier_gbps_median=..., copies=...)
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

COPIER = """
import sys, time, torch
torch.set_num_threads(1)
n = int(sys.argv[1]) * 2**20 // 4
src, dst = torch.ones(n), torch.empty(n)
with open(sys.argv[2], "a", buffering=1) as log:
    while True:
        t = time.perf_counter()
        dst.copy_(src)
        log.write(f"{2 * n * 4 / (time.perf_counter() - t) / 1e9:.3f}\\n")
"""
"""The copier: one thread, ``dst.copy_(src)`` of ``mib`` MiB each, forever; one line of GB/s
(read + written bytes) per copy."""


@dataclass(frozen=True)
class ContentionRecord:
    """What loaded the bus during a run: ``kind`` in words, the copier's buffer size, its
    median bandwidth (GB/s, read + written) and how many copies it made."""

    kind: str
    mib: int
    copier_gbps_median: float | None
    copies: int

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON file stores it."""
        return asdict(self)

    def line(self) -> str:
        """One phrase for under the table."""
        bw = f"{self.copier_gbps_median:.1f} GB/s" if self.copier_gbps_median else "no reading"
        return f"{self.kind} ({self.mib} MiB per copy, median {bw} over {self.copies} copies)"


class Contention:
    """Context manager: starts the copier on entry, stops it (and its process group) on exit.
    ``mib``: the size of each copy, well above the last-level cache so every copy goes to DRAM."""

    def __init__(self, mib: int = 512) -> None:
        if not isinstance(mib, int) or isinstance(mib, bool) or mib < 64:
            raise ValueError(
                f"mib: expected an int of at least 64 (beyond the caches), got {mib!r}"
            )
        self.mib = mib
        self._log = Path(tempfile.mkstemp(prefix="attnkit-contend-", suffix=".log")[1])
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> Contention:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", COPIER, str(self.mib), str(self._log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        return self

    def __exit__(self, *exc: object) -> None:
        p = self._proc
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    @property
    def pid(self) -> int | None:
        """The copier's process id while it runs (None before the block)."""
        return None if self._proc is None else self._proc.pid

    def readings(self) -> list[float]:
        """The copier's readings so far (GB/s per copy)."""
        try:
            text = self._log.read_text()
        except OSError:
            text = ""
        return [float(x) for x in text.split() if x.strip()]

    def record(self) -> ContentionRecord:
        """The copier's readings (call after the block); the log file is removed."""
        gbps = self.readings()
        self._log.unlink(missing_ok=True)
        med = round(statistics.median(gbps), 2) if gbps else None
        kind = "a second process copying memory in a loop on one thread"
        return ContentionRecord(kind, self.mib, med, len(gbps))
