"""Run every benchmark row in its own subprocess and print one table.

Discovers ``benchmarks/bench_*.py``, asks each for its rows (``--list``), runs each row in a fresh
subprocess (``python bench_x.py --row ID [--quick]``, so the peak memory of a row is that
process's peak RSS) with a progress bar, then prints one table: group, case, attnkit time, peer,
peer time, ratio (peer / attnkit, > 1 = attnkit faster), target and whether it is met, peak
memory and notes (compile time, block-mask time, errors, ...). The pieces live in
``benchmarks/harness/`` (row, runner, table, machine, results).

    python benchmarks/run.py [--quick] [--only PATTERN] [--timeout S] [--json FILE] [--markdown]

Exit code: 0 when every row ran (missed targets are listed, not failures), 1 when a row or a
script failed or timed out, 2 when nothing matched ``--only``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # imported by path (tests) rather than run as a script
    sys.path.insert(0, str(BENCH_DIR))

from harness.contention import Contention, ContentionRecord  # noqa: E402
from harness.machine import cpu_summary, git_commit, machine_info, machine_line  # noqa: E402
from harness.results import payload, summary, write_json_atomic  # noqa: E402
from harness.row import Row, Spec  # noqa: E402
from harness.runner import discover, list_rows, matches, run_row  # noqa: E402
from harness.table import markdown_table, rich_table  # noqa: E402

LIST_TIMEOUT_S = 300.0
PROG_ENV = "ATTNKIT_BENCH_PROG"
"""The program name ``--help`` shows: ``attnkit bench`` sets it; run directly, the script's path."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options (see benchmarks/README.md)."""
    p = argparse.ArgumentParser(
        prog=os.environ.get(PROG_ENV, "python benchmarks/run.py"),
        description="Run the attnkit benchmarks, one subprocess per row.",
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
    p.add_argument(
        "--contend",
        action="store_true",
        help="run the rows while a second process copies memory in a loop on one thread "
        "(a loaded memory bus, as on a busy host); the record notes the copier's bandwidth",
    )
    p.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not a.timeout > 0:
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


def list_all(scripts: list[Path], a: argparse.Namespace, progress) -> tuple[list[Spec], list[Row]]:
    """The selected rows of every script (listed in parallel), and a failed row per script whose
    ``--list`` failed."""
    task = progress.add_task(f"listing {len(scripts)} scripts", total=len(scripts))
    specs: list[Spec] = []
    failed: list[Row] = []
    with ThreadPoolExecutor(max_workers=min(4, len(scripts))) as pool:
        listed = pool.map(lambda s: list_rows(s, min(a.timeout, LIST_TIMEOUT_S)), scripts)
        for s, (found, why) in zip(scripts, listed, strict=True):
            if why:
                spec = Spec(s, f"{s.stem}:list", s.stem, "--list")
                failed.append(Row.from_spec(spec, status="failed", error=why))
            specs += [sp for sp in found if matches(sp, a.only)]
            progress.advance(task)
    progress.remove_task(task)
    seen: set[str] = set()
    for sp in specs:
        if sp.id in seen:
            progress.console.print(f"[yellow]warning: row id {sp.id!r} is in several scripts")
        seen.add(sp.id)
    return specs, failed


def _machine(rows: list[Row], busy: ContentionRecord | None) -> dict:
    """The machine record, with what loaded the bus when ``--contend`` ran (known at the end)."""
    m = machine_info(rows)
    if busy is not None:
        m["contention"] = busy.to_json()
    return m


def _save(
    a: argparse.Namespace,
    rows: list[Row],
    started: float,
    partial: bool,
    busy: ContentionRecord | None = None,
) -> None:
    if a.json:
        record = payload(
            rows,
            _machine(rows, busy),
            quick=a.quick,
            only=a.only,
            timeout_s=a.timeout,
            total_s=time.time() - started,
            partial=partial,
        )
        write_json_atomic(a.json, record)


def run_all(
    specs: list[Spec], a: argparse.Namespace, progress, rows: list[Row], started: float
) -> bool:
    """Run the rows one after the other, appending to ``rows`` (and saving the JSON after each);
    False when interrupted by Ctrl-C (the running row is killed)."""
    task = progress.add_task("rows", total=len(specs))
    for sp in specs:
        progress.update(task, description=f"{sp.script.stem} {sp.id}")
        try:
            rows.append(run_row(sp, a.quick, a.timeout))
        except KeyboardInterrupt:
            why = "interrupted (Ctrl-C); the rows after it did not run"
            rows.append(Row.from_spec(sp, status="interrupted", error=why))
            return False
        progress.advance(task)
        _save(a, rows, started, partial=True)
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the selected rows and print the table; the exit code (see the module docstring)."""
    a = parse_args(argv)
    from rich.console import Console

    out = Console() if sys.stdout.isatty() else Console(width=220)
    err = Console(stderr=True)
    scripts = discover(a.bench_dir, a.scripts)
    if not scripts:
        where = f"{a.bench_dir}" + (f" matching --scripts {a.scripts}" if a.scripts else "")
        err.print(f"no bench_*.py scripts in {where}")
        return 2
    started = time.time()
    git_commit()  # the code that runs: read now, before a long run
    with _progress(err) as progress:
        specs, rows = list_all(scripts, a, progress)
        if a.list:
            progress.stop()
            for sp in specs:
                out.print(
                    f"{sp.script.name:20} {sp.id:24} {sp.group} | {sp.case} | {sp.target}",
                    markup=False,
                )
            for r in rows:
                print(f"FAILED {r.script} --list: {r.error}")
            return 1 if rows else 0
        if not specs and not rows:
            progress.stop()
            err.print(f"no rows match --only {a.only}", markup=False)
            return 2
        busy = None
        if a.contend:
            with Contention() as copier:
                complete = run_all(specs, a, progress, rows, started)
            busy = copier.record()
        else:
            complete = run_all(specs, a, progress, rows, started)

    cpu = cpu_summary()  # rows run on this machine: each records it
    for r in rows:
        r.cpu = r.cpu or cpu
    _save(a, rows, started, not complete, busy)
    machine = _machine(rows, busy)
    if a.markdown:
        print(f"Machine: {machine_line(machine)}\n")
        print(markdown_table(rows))
    else:
        quick = " (--quick: small sizes, targets are for full sizes)" if a.quick else ""
        out.print(rich_table(rows, "attnkit benchmarks" + quick))
        out.print(f"machine: {machine_line(machine)}", soft_wrap=True, markup=False)
    print(summary(rows, a.quick, interrupted=not complete))
    if a.json:
        print(f"\nsaved {a.json}")
    return 0 if complete and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # while listing; a row interrupted later still prints the table
        sys.exit("interrupted")
