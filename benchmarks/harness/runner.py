"""Finding the bench scripts, listing their rows and running each row in its own subprocess.

A row runs as ``python bench_x.py --row ID [--quick]`` in a fresh process group (so its peak
memory is that process's peak RSS, and a timeout kills the row and anything it started) and
prints one ``ROW {json}`` line; :func:`run_row` turns that into a :class:`~harness.row.Row`
with status ``ok``, ``failed`` (exit code != 0, no or unreadable ROW line) or ``timeout``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.row import Row, Spec, target_met

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO = BENCH_DIR.parent
ORDER = ("bench_dense", "bench_masks", "bench_additive", "bench_embed", "bench_train", "bench_ddp")
"""Scripts run first, in this order (the order of the issues' targets); others follow by name."""

TAIL_CHARS = 1500
"""How much of a failed row's stderr is kept (its end)."""


def child_env() -> dict[str, str]:
    """The environment of a row: this one, with the checkout's ``src`` first on PYTHONPATH."""
    env = dict(os.environ)
    src = str(REPO / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_command(cmd: list[str], timeout: float | None) -> tuple[int | None, str, str, float]:
    """Run ``cmd`` in its own process group; (returncode or None on timeout, stdout, stderr,
    seconds). On timeout or Ctrl-C the whole group (the row and anything it started) is
    killed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        rc = None
    except BaseException:  # KeyboardInterrupt: do not leave the row running
        _kill_group(proc)
        proc.communicate()
        raise
    return rc, out, err, time.perf_counter() - t0


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def tail(text: str, n: int = TAIL_CHARS) -> str:
    """The last ``n`` characters of ``text`` (stripped), with "..." when cut."""
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def discover(bench_dir: Path, names: list[str] | None = None) -> list[Path]:
    """The ``bench_*.py`` scripts of ``bench_dir`` (ORDER first), only those whose file name
    contains one of ``names`` when given."""
    scripts = sorted(bench_dir.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if any(n in s.stem for n in names)]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(scripts, key=lambda p: (rank.get(p.stem, len(ORDER)), p.name))


def parse_list(script: Path, stdout: str) -> list[Spec]:
    """The rows of a script's ``--list`` output (one JSON object per line; other lines are
    ignored)."""
    specs = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(d, dict) and d.get("id"):
            specs.append(
                Spec(
                    script,
                    str(d["id"]),
                    str(d.get("group", "")),
                    str(d.get("case", "")),
                    str(d.get("target", "")),
                )
            )
    return specs


def list_rows(script: Path, timeout: float | None) -> tuple[list[Spec], str | None]:
    """The rows ``script --list`` declares, or ([], error text)."""
    rc, out, err, _ = run_command([sys.executable, str(script), "--list"], timeout)
    if rc != 0:
        why = "timed out" if rc is None else f"exit code {rc}"
        return [], f"--list {why}: {tail(err) or tail(out)}"
    specs = parse_list(script, out)
    if not specs:
        return [], f"--list printed no rows: {tail(out) or tail(err)}"
    return specs, None


def matches(spec: Spec, patterns: list[str]) -> bool:
    """True when any pattern matches the row id, group or script name (substring or glob,
    case-insensitive); no patterns match everything."""
    if not patterns:
        return True
    fields = [spec.id.lower(), spec.group.lower(), spec.script.stem.lower()]
    for pat in patterns:
        p = pat.lower()
        if any(p in f or fnmatch.fnmatchcase(f, p) for f in fields):
            return True
    return False


def row_from_output(
    spec: Spec, rc: int | None, out: str, err: str, wall: float, timeout: float | None
) -> Row:
    """The :class:`Row` of one finished (or killed) row process: its ``ROW {json}`` line and
    exit code (None = timed out)."""
    data = None
    for line in out.splitlines():
        if line.startswith("ROW "):
            try:
                data = json.loads(line[4:])
            except json.JSONDecodeError as e:
                return Row.from_spec(
                    spec, status="failed", wall_s=wall, error=f"unreadable ROW line: {e}"
                )
    if rc is None:
        why = f"timed out after {timeout:g} s\n" if timeout else "timed out\n"
        return Row.from_spec(spec, status="timeout", wall_s=wall, error=why + tail(err))
    if rc != 0 or not isinstance(data, dict):
        why = f"exit code {rc}" if rc != 0 else "no 'ROW {json}' line on stdout"
        error = why + "\n" + (tail(err) or tail(out))
        return Row.from_spec(spec, status="failed", wall_s=wall, error=error)
    fields = {"group": spec.group, "case": spec.case, "target": spec.target}
    fields.update(data)  # a row may override 'case' (the sizes it really ran)
    fields.update(id=spec.id, script=spec.script.name, wall_s=wall, status="ok")
    row = Row.from_json(fields)
    row.target_met = target_met(row)
    return row


def run_row(spec: Spec, quick: bool, timeout: float | None) -> Row:
    """Run one row in a subprocess (see the module docstring)."""
    cmd = [sys.executable, str(spec.script), "--row", spec.id] + (["--quick"] if quick else [])
    rc, out, err, wall = run_command(cmd, timeout)
    row = row_from_output(spec, rc, out, err, wall, timeout)
    row.load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return row
