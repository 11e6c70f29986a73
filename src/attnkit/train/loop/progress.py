"""What a run reports, and where: :class:`Reporter` sends every training and evaluation row to

- the screen: on a terminal a rich progress bar (step/total, loss, last held-out loss, tokens/s,
  learning rate, ETA); elsewhere (a pipe, nohup, CI, a cluster log) one plain line every
  ``log_every`` steps and one per evaluation; or nothing;
- ``log.jsonl`` (one JSON object per row) and ``metrics.csv`` (fixed columns, one row per
  logging step or evaluation) in the run directory, every run; a training row holds
  ``elapsed_s``, the wall seconds since the run (re)started, and ``cpu_s``, the CPU seconds the
  process spent in them (on a busy machine the wall time grows faster than the CPU time);
- TensorBoard event files in ``RUN/tensorboard`` with ``--tensorboard`` (optional extra
  ``attnkit[tensorboard]``), so that ``tensorboard --logdir runs`` shows every run.

A resumed run first drops the rows of later steps from ``log.jsonl`` and ``metrics.csv``.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from attnkit.files import write_atomic

__all__ = ["CSV_COLUMNS", "JsonLog", "Progress", "Reporter", "clock"]

CSV_COLUMNS = (
    "step",
    "epoch",
    "loss",
    "lr",
    "tokens",
    "tok_per_s",
    "elapsed_s",
    "cpu_s",
    "val_loss",
    "val_ppl",
    "val_exact",
    "val_bleu",
    "eval_s",
    "val_loss_exact",
)
"""The columns of ``metrics.csv``; a training row leaves the ``val_*`` cells empty, an
evaluation row the others."""


def clock(seconds: float | None) -> str:
    """``h:mm:ss`` (or ``m:ss`` under an hour); ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(seconds)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class Progress:
    """The screen: ``mode`` "bar" (rich, on stderr), "lines" (plain lines through ``echo``) or
    "off". ETA: the remaining steps at the current speed, or the remaining time budget,
    whichever ends first."""

    def __init__(
        self,
        mode: str,
        max_steps: int | None,
        max_seconds: float | None,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.mode, self.max_steps, self.max_seconds, self.echo = mode, max_steps, max_seconds, echo
        self.t0 = time.monotonic()
        self.val_loss: float | None = None
        self.eval_s = 0.0  # seconds spent in evaluations so far (issue 31: shown as a share)
        self._bar = None
        if mode == "bar":
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

    def _of(self, step: int) -> str:
        return f"{step}/{self.max_steps}" if self.max_steps is not None else f"{step}"

    def update(
        self, step: int, first_step: int, loss: float, tok_s: float, lr: float, line: bool
    ) -> None:
        """After every step; ``line``: a logging step (plain lines are printed only then)."""
        if self.mode == "off" or (self.mode == "lines" and not line):
            return
        eta = clock(self.eta(step, first_step))
        val = "" if self.val_loss is None else f"  val loss {self.val_loss:.4f}"
        val += self._eval_share()
        if self._bar is not None:
            desc = (
                f"step {self._of(step)}  loss {loss:.4f}{val}  {tok_s:,.0f} tok/s  lr {lr:.2e}  "
                f"ETA {eta}"
            )
            self._bar.update(self._task, completed=step, description=desc)
            return
        elapsed = clock(time.monotonic() - self.t0)
        self.echo(
            f"step {self._of(step)}  loss {loss:.4f}  lr {lr:.2e}  {tok_s:,.0f} tok/s  "
            f"elapsed {elapsed}  ETA {eta}{val}"
        )

    def _eval_share(self, sep: str = " ") -> str:
        """``  eval 12% of time``: the evaluations' share of the run's wall time so far."""
        elapsed = time.monotonic() - self.t0
        if not self.eval_s or elapsed <= 0:
            return ""
        return f"{sep} eval {100 * self.eval_s / elapsed:.0f}% of time"

    def evaluated(self, row: dict, note: str) -> None:
        """After an evaluation ``row`` (``step``, ``val_loss``, ``eval_s``, ...); ``note`` e.g.
        "best"."""
        self.val_loss = row["val_loss"]
        self.eval_s += row.get("eval_s", 0.0)
        if self.mode != "lines":
            return
        extra = "".join(
            f"  {name} {row[key]:.4f}"
            for key, name in (
                ("val_exact", "exact"),
                ("val_bleu", "BLEU"),
                ("val_ppl", "ppl"),
                ("val_loss_exact", "whole-split loss"),
            )  # fmt: skip
            if key in row and not (key == "val_loss_exact" and "val_batches" not in row)
        )
        how = f"estimate, {row['val_batches']} batches" if "val_batches" in row else "whole split"
        cost = f", {row['eval_s']:.2f} s{self._eval_share(',')}" if "eval_s" in row else ""
        self.echo(
            f"step {self._of(row['step'])}  val loss {row['val_loss']:.4f}{extra}  "
            f"({how}{cost}){note}"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _truncate(path: Path, keep: Callable[[str], bool], header: int = 0) -> None:
    """Keep the first ``header`` lines and the lines for which ``keep`` is true (atomically)."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = lines[:header] + [s for s in lines[header:] if s and keep(s)]
    data = "".join(s + "\n" for s in kept).encode("utf-8")
    write_atomic(path, lambda f: f.write(data))


class JsonLog:
    """``log.jsonl`` of a run, appended one row (a JSON object with a ``step``) at a time;
    ``keep_until``: resuming at that step, rows of later steps are dropped first (atomically)."""

    def __init__(self, path: Path, keep_until: int | None) -> None:
        self.path = path
        if keep_until is not None:
            _truncate(path, lambda s: json.loads(s)["step"] <= keep_until)
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: dict) -> None:
        """Append ``row`` and flush."""
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class CsvLog:
    """``metrics.csv``: :data:`CSV_COLUMNS`, one row per call of :meth:`write` (a resumed run
    keeps the columns of the file it continues, which an older version may have written)."""

    def __init__(self, path: Path, keep_until: int | None) -> None:
        if keep_until is not None:
            _truncate(path, lambda s: int(s.split(",", 1)[0]) <= keep_until, header=1)
        new = not path.exists() or path.stat().st_size == 0
        self.columns = CSV_COLUMNS
        if not new:
            with path.open(encoding="utf-8", newline="") as f:
                self.columns = tuple(next(csv.reader(f), CSV_COLUMNS))
        self.f = open(path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - close()
        if new:
            self.write({c: c for c in CSV_COLUMNS})

    def write(self, row: dict) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([row.get(c, "") for c in self.columns])
        self.f.write(buf.getvalue())
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class TensorBoardLog:
    """Scalars (train/loss, train/lr, train/tok_per_s, val/*) as TensorBoard event files."""

    def __init__(self, logdir: Path, keep_until: int | None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError(
                "tensorboard: --tensorboard needs the tensorboard package (pip install "
                "'attnkit[tensorboard]')"
            ) from None
        self.w = SummaryWriter(
            str(logdir), purge_step=None if keep_until is None else keep_until + 1
        )

    def write(self, row: dict) -> None:
        for key, value in row.items():
            if key in ("step", "epoch", "best") or not isinstance(value, (int, float)):
                continue
            tag = f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"
            self.w.add_scalar(tag, value, row["step"])
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class Reporter:
    """Every output of a run (see the module docstring). ``out``: the run directory;
    ``keep_until``: the step a resumed run starts from (None for a new run)."""

    def __init__(
        self,
        out: Path,
        progress: Progress,
        *,
        keep_until: int | None,
        log_every: int,
        tensorboard: bool,
    ) -> None:
        self.progress, self.log_every = progress, log_every
        self.logs: list = [JsonLog(out / "log.jsonl", keep_until)]
        self.csv = CsvLog(out / "metrics.csv", keep_until)
        self.logs.append(self.csv)
        if tensorboard:
            self.logs.append(TensorBoardLog(out / "tensorboard", keep_until))

    def step(self, row: dict, first_step: int) -> None:
        """A training row (step, epoch, loss, lr, tokens, tok_per_s, elapsed_s, cpu_s) after
        every step; written to the logs every ``log_every`` steps."""
        line = row["step"] % self.log_every == 0
        self.progress.update(
            row["step"], first_step, row["loss"], row["tok_per_s"], row["lr"], line
        )
        if line:
            for log in self.logs:
                log.write(row)

    def evaluation(self, row: dict, note: str = "") -> None:
        """An evaluation row (step, val_loss, and val_ppl / val_exact / val_bleu)."""
        self.progress.evaluated(row, note)
        for log in self.logs:
            log.write(row)

    def close(self) -> None:
        self.progress.close()
        for log in self.logs:
            log.close()
