"""Stopping a training run safely on Ctrl-C (SIGINT) or SIGTERM.

The first signal only raises a flag: the loop finishes its current step, writes a resumable
checkpoint (atomically, :mod:`attnkit.train.checkpoint`) and says how to resume. A second
signal raises :class:`KeyboardInterrupt` at once (the previous checkpoints stay intact: every
write is atomic). Under torchrun every process receives the signal; the flag is combined with the
other stop reasons in the step's all-reduce, so all ranks stop after the same step.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["Interrupt"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupt:
    """A context manager that installs the handlers (main thread only; elsewhere it does
    nothing) and restores the previous ones on exit. ``requested``: the name of the first
    signal received, or None."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
