"""What a run reports: the progress bar (rich: step, loss, tokens/s, learning rate and ETA; or
nothing) and the JSONL log (one JSON object per line)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

__all__ = ["JsonLog", "Progress"]


class Progress:
    """A rich progress bar on stderr while ``enabled``; a no-op otherwise. ETA: the remaining
    steps at the current speed, or the remaining time budget, whichever ends first."""

    def __init__(self, enabled: bool, max_steps: int | None, max_seconds: float | None) -> None:
        self.enabled, self.max_steps, self.max_seconds = enabled, max_steps, max_seconds
        self.t0 = time.monotonic()
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]train[/]"),
                BarColumn(),
                TextColumn("{task.description}"),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self._task = self._bar.add_task("", total=max_steps)
            self._bar.start()

    def eta(self, step: int, first_step: int) -> float | None:
        """Seconds left (None when unknown)."""
        elapsed = time.monotonic() - self.t0
        left = []
        if self.max_steps is not None and step > first_step:
            left.append((self.max_steps - step) * elapsed / (step - first_step))
        if self.max_seconds is not None:
            left.append(max(self.max_seconds - elapsed, 0.0))
        return min(left) if left else None

    def update(self, step: int, first_step: int, loss: float, tok_s: float, lr: float) -> None:
        if self._bar is None:
            return
        eta = self.eta(step, first_step)
        eta_text = "?" if eta is None else f"{int(eta) // 60}:{int(eta) % 60:02d}"
        desc = f"step {step}  loss {loss:.4f}  {tok_s:,.0f} tok/s  lr {lr:.2e}  ETA {eta_text}"
        self._bar.update(self._task, completed=step, description=desc)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class JsonLog:
    """``log.jsonl`` of a run, appended one row (a JSON object with a ``step``) at a time;
    ``keep_until``: resuming at that step, rows of later steps are dropped first (atomically)."""

    def __init__(self, path: Path, keep_until: int | None) -> None:
        self.path = path
        if keep_until is not None and path.exists():
            kept = [
                s
                for s in path.read_text().splitlines()
                if s and json.loads(s)["step"] <= keep_until
            ]
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(s + "\n" for s in kept))
            os.replace(tmp, path)
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: dict) -> None:
        """Append ``row`` and flush."""
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()
