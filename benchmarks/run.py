"""Run every benchmark row in its own subprocess and print one table.

Discovers ``benchmarks/bench_*.py``, asks each for its rows (``--list``), runs each row in a fresh
subprocess (``python bench_x.py --row ID [--quick]``, so the peak memory of a row is that
process's peak RSS) with a progress bar, then prints one table: group, case, attnkit time, peer,
peer time, ratio (peer / attnkit, > 1 = attnkit faster), target and whether it is met, peak
memory and notes (compile time, block-mask time, errors, ...).

    python benchmarks/run.py [--quick] [--only PATTERN] [--timeout S] [--json FILE] [--markdown]

Exit code: 0 when every row ran (missed targets are listed, not failures), 1 when a row or a
script failed or timed out, 2 when nothing matched ``--only``.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
ORDER = ("bench_dense", "bench_masks", "bench_additive", "bench_embed")
"""Scripts run first, in this order (the order of the issue's targets); others follow by name."""

TAIL_CHARS = 1500
"""How much of a failed row's stderr is kept (its end)."""


@dataclass
class Spec:
    """One row to run: the script that owns it and what ``--list`` said about it."""

    script: Path
    id: str
    group: str = ""
    case: str = ""
    target: str = ""


# ---------------------------------------------------------------------------------------------
# subprocesses
# ---------------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(REPO / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run(cmd: list[str], timeout: float | None) -> tuple[int | None, str, str, float]:
    """Run ``cmd`` in its own process group; (returncode or None on timeout, stdout, stderr,
    seconds). On timeout the whole group (the row and anything it started) is killed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(),
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


def _tail(text: str, n: int = TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def discover(bench_dir: Path) -> list[Path]:
    """The ``bench_*.py`` scripts of ``bench_dir``, ORDER first."""
    scripts = sorted(bench_dir.glob("bench_*.py"))
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(scripts, key=lambda p: (rank.get(p.stem, len(ORDER)), p.name))


def list_rows(script: Path, timeout: float | None) -> tuple[list[Spec], str | None]:
    """The rows ``script --list`` declares, or ([], error text)."""
    rc, out, err, _ = _run([sys.executable, str(script), "--list"], timeout)
    if rc != 0:
        why = "timed out" if rc is None else f"exit code {rc}"
        return [], f"--list {why}: {_tail(err) or _tail(out)}"
    specs = []
    for line in out.splitlines():
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
                    script, str(d["id"]), d.get("group", ""), d.get("case", ""), d.get("target", "")
                )
            )
    if not specs:
        return [], f"--list printed no rows: {_tail(out) or _tail(err)}"
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


def run_row(spec: Spec, quick: bool, timeout: float | None) -> dict:
    """Run one row in a subprocess; the row's JSON plus script, status (ok / failed / timeout),
    error (stderr tail) and wall_s."""
    cmd = [sys.executable, str(spec.script), "--row", spec.id] + (["--quick"] if quick else [])
    rc, out, err, wall = _run(cmd, timeout)
    base = dict(
        id=spec.id,
        group=spec.group,
        case=spec.case,
        target=spec.target,
        script=spec.script.name,
        wall_s=wall,
    )
    data = None
    for line in out.splitlines():
        if line.startswith("ROW "):
            try:
                data = json.loads(line[4:])
            except json.JSONDecodeError as e:
                base.update(status="failed", error=f"unreadable ROW line: {e}")
                return base
    if rc is None:
        base.update(status="timeout", error=f"timed out after {timeout:g} s\n" + _tail(err))
        return base
    if rc != 0 or data is None:
        why = f"exit code {rc}" if rc != 0 else "no 'ROW {json}' line on stdout"
        base.update(status="failed", error=why + "\n" + (_tail(err) or _tail(out)))
        return base
    row = {**base, **data}
    row["script"], row["wall_s"], row["status"] = spec.script.name, wall, "ok"
    row["target_met"] = target_met(row)
    return row


# ---------------------------------------------------------------------------------------------
# targets and formatting
# ---------------------------------------------------------------------------------------------
_RATIO_TARGET = re.compile(r"^\s*>=?\s*([0-9]*\.?[0-9]+)\s*x\s*$")


def target_met(row: dict) -> bool | None:
    """Whether the row met its target: the row's own ``target_met`` when it gave one, else
    ``ratio >= N`` for targets of the form ``">=Nx"``; None when there is nothing to judge."""
    if isinstance(row.get("target_met"), bool):
        return row["target_met"]
    m = _RATIO_TARGET.match(row.get("target") or "")
    ratio = row.get("ratio")
    if not m or not isinstance(ratio, (int, float)):
        return None
    return ratio >= float(m.group(1))


def fmt_time(s: object) -> str:
    if not isinstance(s, (int, float)) or s <= 0:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_ratio(r: object) -> str:
    return f"{r:.2f}x" if isinstance(r, (int, float)) else "-"


def fmt_mem(row: dict) -> str:
    peak = row.get("peak_rss_mib")
    if not isinstance(peak, (int, float)):
        return "-"
    base = row.get("startup_rss_mib")
    if isinstance(base, (int, float)):
        return f"{peak:,.0f} (+{max(0.0, peak - base):,.0f})"
    return f"{peak:,.0f}"


def _fmt_value(v: object) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_fmt_value(x)}" for k, x in v.items()) + "}"
    return str(v)


COMPILE_KEYS = ("flex_compile_s", "compile_fwd_s")
BLOCK_MASK_KEYS = ("create_block_mask_s", "plan_s")
"""Keys of a row's ``extra`` shown in their own columns: the peer's (or our kernel's) compile
time, and the time to build the block mask (FlexAttention) or the block plan (attnkit)."""


def _extra(row: dict) -> dict:
    extra = row.get("extra") or {}
    return extra if isinstance(extra, dict) else {}


def fmt_extra_time(row: dict, keys: tuple[str, ...]) -> str:
    extra = _extra(row)
    parts = [f"{fmt_time(extra[k])} ({k.removesuffix('_s')})" for k in keys if k in extra]
    return ", ".join(parts)


def fmt_notes(row: dict) -> str:
    if row.get("status") != "ok":
        last = [ln for ln in (row.get("error") or "").splitlines() if ln.strip()]
        return f"{row.get('status', 'failed').upper()}: " + (last[-1] if last else "")
    extra = row.get("extra") or {}
    if not isinstance(extra, dict):
        return _fmt_value(extra)
    shown = COMPILE_KEYS + BLOCK_MASK_KEYS
    return ", ".join(f"{k}={_fmt_value(v)}" for k, v in extra.items() if k not in shown)


def fmt_met(row: dict) -> str:
    met = row.get("target_met")
    return "-" if met is None else ("yes" if met else "NO")


COLUMNS = (
    "group",
    "case",
    "attnkit",
    "peer",
    "peer time",
    "ratio",
    "target",
    "met",
    "peak MiB (+row)",
    "compile",
    "block mask / plan",
    "notes",
)


def cells(row: dict) -> list[str]:
    return [
        row.get("group", ""),
        row.get("case", ""),
        fmt_time(row.get("impl_s")),
        str(row.get("peer", "") or ""),
        fmt_time(row.get("peer_s")),
        fmt_ratio(row.get("ratio")),
        row.get("target", "") or "",
        fmt_met(row),
        fmt_mem(row),
        fmt_extra_time(row, COMPILE_KEYS),
        fmt_extra_time(row, BLOCK_MASK_KEYS),
        fmt_notes(row),
    ]


def markdown_table(rows: list[dict]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(esc(c) for c in cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def rich_table(rows: list[dict], title: str):
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for c in COLUMNS:
        right = c in ("attnkit", "peer time", "ratio", "peak MiB (+row)")
        t.add_column(c, justify="right" if right else "left", overflow="fold")
    for r in rows:
        c = cells(r)
        met = r.get("target_met")
        if r.get("status") != "ok":
            c[-1] = f"[red]{c[-1]}[/red]"
        if met is False:
            c[7] = "[bold red]NO[/bold red]"
        elif met:
            c[7] = "[green]yes[/green]"
        t.add_row(*c)
    return t


# ---------------------------------------------------------------------------------------------
# machine info, JSON
# ---------------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return sorted(
                        f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags
                    )
    except OSError:
        pass
    return []


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info(rows: list[dict]) -> dict:
    """CPU, cores, memory, library versions, torch threads (as the rows saw them), date, load."""
    threads = next((r["torch_threads"] for r in rows if r.get("torch_threads")), None)
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return dict(
        cpu=_cpu_model(),
        cpu_flags=_cpu_flags(),
        cores=os.cpu_count(),
        cores_usable=affinity,
        mem_total_gib=_mem_total_gib(),
        python=platform.python_version(),
        platform=platform.platform(),
        torch=_version("torch"),
        numba=_version("numba"),
        attnkit=_version("attnkit"),
        torch_threads=threads,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        git_commit=_git_commit(),
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        load_avg=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    )


def machine_line(m: dict) -> str:
    return (
        f"{m['cpu']} ({', '.join(m['cpu_flags']) or 'no AVX flags'}), {m['cores']} cores, "
        f"{m['mem_total_gib']} GiB; torch {m['torch']}"
        + (f" ({m['torch_threads']} threads)" if m["torch_threads"] else "")
        + ", "
        f"numba {m['numba']}, python {m['python']}; {m['date']}, commit {m['git_commit']}, "
        f"load avg {', '.join(f'{x:.1f}' for x in m['load_avg'] or [])}"
    )


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="run.py", description="Run the attnkit benchmarks, one subprocess per row."
    )
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke test)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run rows whose id, group or script matches (substring or glob; repeatable, "
        "comma-separated)",
    )
    p.add_argument(
        "--scripts",
        action="append",
        default=[],
        metavar="NAME",
        help="only these scripts (substring of the file name, e.g. 'dense'; repeatable, "
        "comma-separated); saves listing the others",
    )
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds per row")
    p.add_argument("--json", type=Path, metavar="FILE", help="save rows + machine info as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--list", action="store_true", help="list the rows that would run and exit")
    p.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.timeout <= 0:
        p.error(f"--timeout: expected a positive number of seconds, got {a.timeout:g}")
    a.only = [s.strip() for o in a.only for s in o.split(",") if s.strip()]
    a.scripts = [s.strip() for o in a.scripts for s in o.split(",") if s.strip()]
    return a


def _progress(console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def list_all(scripts: list[Path], a: argparse.Namespace, progress) -> tuple[list[Spec], list[dict]]:
    """The selected rows of every script (listed in parallel), and a failed row per script whose
    ``--list`` failed."""
    task = progress.add_task(f"listing {len(scripts)} scripts", total=len(scripts))
    specs: list[Spec] = []
    failed: list[dict] = []
    with ThreadPoolExecutor(max_workers=min(4, len(scripts))) as pool:
        listed = pool.map(lambda s: list_rows(s, min(a.timeout, 300.0)), scripts)
        for s, (found, why) in zip(scripts, listed, strict=True):
            if why:
                failed.append(
                    dict(
                        id=f"{s.stem}:list",
                        group=s.stem,
                        case="--list",
                        script=s.name,
                        status="failed",
                        error=why,
                    )
                )
            specs += [sp for sp in found if matches(sp, a.only)]
            progress.advance(task)
    progress.remove_task(task)
    seen: set[str] = set()
    for sp in specs:
        if sp.id in seen:
            progress.console.print(f"[yellow]warning: row id {sp.id!r} is in several scripts")
        seen.add(sp.id)
    return specs, failed


def run_all(specs: list[Spec], a: argparse.Namespace, progress, rows: list[dict]) -> bool:
    """Run the rows one after the other, appending to ``rows`` (and saving the JSON after each);
    False when interrupted by Ctrl-C (the running row is killed)."""
    started = time.time()
    task = progress.add_task("rows", total=len(specs))
    for sp in specs:
        progress.update(task, description=f"{sp.script.stem} {sp.id}")
        try:
            rows.append(run_row(sp, a.quick, a.timeout))
        except KeyboardInterrupt:
            rows.append(
                dict(
                    id=sp.id,
                    group=sp.group,
                    case=sp.case,
                    target=sp.target,
                    script=sp.script.name,
                    status="interrupted",
                    error="interrupted (Ctrl-C); the rows after it did not run",
                )
            )
            return False
        progress.advance(task)
        if a.json:
            write_json_atomic(a.json, _payload(a, rows, time.time() - started, partial=True))
    return True


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from rich.console import Console

    out = Console() if sys.stdout.isatty() else Console(width=220)
    err = Console(stderr=True)
    scripts = [
        s for s in discover(a.bench_dir) if not a.scripts or any(p in s.stem for p in a.scripts)
    ]
    if not scripts:
        where = f"{a.bench_dir}" + (f" matching --scripts {a.scripts}" if a.scripts else "")
        err.print(f"no bench_*.py scripts in {where}")
        return 2
    started = time.time()
    with _progress(err) as progress:
        specs, rows = list_all(scripts, a, progress)
        if a.list:
            progress.stop()
            for sp in specs:
                out.print(f"{sp.script.name:20} {sp.id:24} {sp.group} | {sp.case} | {sp.target}")
            for r in rows:
                print(f"FAILED {r['script']} --list: {r['error']}")
            return 1 if rows else 0
        if not specs and not rows:
            progress.stop()
            err.print(f"no rows match --only {a.only}")
            return 2
        complete = run_all(specs, a, progress, rows)

    machine = machine_info(rows)
    if a.json:
        payload = _payload(a, rows, time.time() - started, partial=not complete, machine=machine)
        write_json_atomic(a.json, payload)
    if a.markdown:
        print(f"Machine: {machine_line(machine)}\n")
        print(markdown_table(rows))
    else:
        quick = " (--quick: small sizes, targets are for full sizes)" if a.quick else ""
        out.print(rich_table(rows, "attnkit benchmarks" + quick))
        out.print(f"machine: {machine_line(machine)}", soft_wrap=True)
    _report(rows, a, interrupted=not complete)
    return 0 if complete and all(r.get("status") == "ok" for r in rows) else 1


def _payload(a, rows, total_s, partial, machine=None) -> dict:
    return dict(
        machine=machine or machine_info(rows),
        quick=a.quick,
        only=a.only,
        timeout_s=a.timeout,
        total_s=total_s,
        partial=partial,
        rows=rows,
    )


def _report(rows: list[dict], a: argparse.Namespace, interrupted: bool) -> None:
    """Plain-text summary after the table: missed targets, failures with their stderr tails."""
    missed = [r for r in rows if r.get("target_met") is False]
    failed = [r for r in rows if r.get("status") != "ok"]
    ok = len(rows) - len(failed)
    print(f"\n{ok} of {len(rows)} rows ran" + (" (interrupted)" if interrupted else ""))
    if missed:
        note = " (--quick: small sizes, the targets are for full sizes)" if a.quick else ""
        print(f"targets missed{note}:")
        for r in missed:
            print(f"  {r['id']}: {fmt_ratio(r.get('ratio'))}, target {r.get('target')}")
    for r in failed:
        print(f"\n{r.get('status', 'failed').upper()} {r['id']} ({r.get('script')}):")
        print("  " + (r.get("error") or "").replace("\n", "\n  "))
    if a.json:
        print(f"\nsaved {a.json}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # while listing; a row interrupted later still prints the table
        sys.exit("interrupted")
