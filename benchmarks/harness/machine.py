"""The machine a run measured: what ``attnkit info`` reports (versions, CPU model and torch's
capability, CPU flags, thread counts, backends; :func:`attnkit.cli.info.collect`, not a copy),
plus what only a benchmark record needs: memory, git commit, date and load average."""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
from collections.abc import Sequence
from typing import Any

from harness.contention import ContentionRecord
from harness.row import Row
from harness.runner import REPO


@functools.cache
def attnkit_info() -> tuple[dict[str, Any], str | None]:
    """(``attnkit info``'s dict, None), or ({}, why) when it cannot be collected (a broken
    tree must not cost the table of a finished run). Collected once per run."""
    try:
        from attnkit.cli.info import collect

        return collect(), None
    except Exception as e:  # noqa: BLE001 - reported in the record, never raised
        return {}, f"{type(e).__name__}: {e}"


def cpu_summary() -> str:
    """The CPU a row ran on, in one phrase: model, torch's capability, native bf16 yes/no
    (from ``attnkit info``); every row records it (the ``cpu`` field)."""
    info, _ = attnkit_info()
    cpu = info.get("cpu", {})
    model = cpu.get("model") or platform.processor() or platform.machine()
    bf16 = {True: "yes", False: "no"}.get(cpu.get("native_bf16"), "unknown")
    return f"{model} (torch capability {cpu.get('torch_capability')}, native bf16 {bf16})"


def mem_total_gib() -> float | None:
    """Total memory of the machine (GiB, one decimal), None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


@functools.cache
def git_commit() -> str | None:
    """The checkout's short commit, with " + uncommitted changes" when tracked files differ
    from it; None outside git. Read once per run (``run.py`` reads it before the first row),
    so a commit made during a long run does not relabel the code that ran."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += " + uncommitted changes"
    return commit or None


def machine_info(rows: Sequence[Row]) -> dict[str, Any]:
    """The machine record of a run: flat fields for the table's machine line (``torch_threads``
    as the rows saw them) and ``info``, the whole ``attnkit info`` dict."""
    info, error = attnkit_info()
    cpu, threads = info.get("cpu", {}), info.get("threads", {})
    versions = info.get("versions", {})
    seen = next((r.torch_threads for r in rows if r.torch_threads), None)
    return dict(
        cpu=cpu.get("model") or platform.processor() or platform.machine(),
        cpu_capability=cpu.get("torch_capability"),
        cpu_flags=cpu.get("flags", []),
        cpu_native_bf16=cpu.get("native_bf16"),
        cores=threads.get("cpu_count") or os.cpu_count(),
        cores_usable=threads.get("usable_cpus"),
        mem_total_gib=mem_total_gib(),
        python=versions.get("python") or platform.python_version(),
        platform=info.get("platform") or platform.platform(),
        torch=versions.get("torch"),
        numba=versions.get("numba"),
        attnkit=versions.get("attnkit"),
        torch_threads=seen or threads.get("torch_intraop"),
        torch_interop_threads=threads.get("torch_interop"),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        git_commit=git_commit(),
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        load_avg=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        info=info,
        info_error=error,
    )


def machine_line(m: dict[str, Any]) -> str:
    """One line for under the table: CPU, capability, flags, cores, memory, versions, threads,
    date, commit, load."""
    cap = f"torch capability {m['cpu_capability']}; " if m.get("cpu_capability") else ""
    bf16 = {True: "yes", False: "no"}.get(m.get("cpu_native_bf16"), "unknown")
    cap += f"native bf16 {bf16}; "
    flags = ", ".join(m.get("cpu_flags") or []) or "no AVX flags"
    threads = f" ({m['torch_threads']} threads)" if m.get("torch_threads") else ""
    load = ", ".join(f"{x:.1f}" for x in m.get("load_avg") or [])
    return (
        f"{m['cpu']} ({cap}{flags}), {m['cores']} cores, {m['mem_total_gib']} GiB; "
        f"torch {m['torch']}{threads}, numba {m['numba']}, python {m['python']}; "
        f"{m['date']}, commit {m['git_commit']}, load avg {load}"
        + (f"; attnkit info failed: {m['info_error']}" if m.get("info_error") else "")
        + (
            f"; loaded bus: {ContentionRecord(**m['contention']).line()}"
            if m.get("contention")
            else ""
        )
    )
