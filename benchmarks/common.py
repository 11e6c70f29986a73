"""Shared helpers for the benchmark scripts: timing, peak memory, the row protocol.

Every ``benchmarks/bench_*.py`` script registers rows with :func:`row` and ends with
``main()``. ``python benchmarks/bench_x.py --list`` prints one JSON line per row (id, group, case,
target); ``python benchmarks/bench_x.py --row ID [--quick]`` runs one row in this (fresh) process
and prints one line ``ROW {json}``. ``benchmarks/run.py`` runs every row in its own subprocess, so
the peak memory of a row is the peak RSS of that subprocess, and builds the table.

A row's function takes ``quick`` (bool) and returns a dict with at least:
  ``impl_s``  median seconds of attnkit;  ``peer_s``  median seconds of the peer, measured in the
  same process (side by side); ``peer``  the peer's name; optional ``extra`` (dict: compile time,
  block-mask time, errors, memory of both sides, ...; ``run.py`` shows it in the notes column).
Optional keys:
  ``case``  overrides the registered case text (e.g. the sizes actually run with ``--quick``);
  ``target_met``  True/False when the target is not a plain ratio (e.g. a memory bound); when it
  is absent, ``run.py`` checks targets of the form ``">=20x"`` against ``ratio``.
Added here: ``ratio`` = peer_s / impl_s (> 1 means attnkit is faster), ``peak_rss_mib`` (peak RSS
of the whole row process), ``startup_rss_mib`` (RSS after imports, before the row ran),
``quick``, ``torch_threads``.

Child processes: ``python benchmarks/bench_x.py --child NAME --arg ARG`` runs the function
registered with :func:`child` and prints ``CHILD {json}``; :func:`run_child` starts it and returns
the result (e.g. one side's peak memory measured in a fresh process).

Peak memory of one side: :func:`peak_memory_mib` runs a function once and returns the peak RSS it
reached above the RSS before the call (it resets the kernel's high-water mark, Linux only), so
attnkit and its peer can each report their own peak from the same process.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

ROWS: dict[str, dict] = {}
CHILDREN: dict[str, Callable[[str], object]] = {}

_PEAK_BEFORE_RESET_MIB = 0.0
"""Highest peak RSS seen before the last high-water-mark reset (MiB)."""


def row(row_id: str, group: str, case: str, target: str = "") -> Callable:
    """Register a benchmark row, e.g.
    ``@row("swa-fwd-16k", "sliding window", "L=16384 fwd", ">=20x")``."""

    def deco(fn: Callable[[bool], dict]) -> Callable[[bool], dict]:
        ROWS[row_id] = dict(fn=fn, group=group, case=case, target=target)
        return fn

    return deco


def child(name: str) -> Callable:
    """Register a function a row runs in a fresh process of the same script
    (:func:`run_child`), e.g. to measure one side's peak memory without the other side's
    allocations in the same heap: ``@child("lm-memory") def f(arg: str) -> JSON value``."""

    def deco(fn: Callable[[str], object]) -> Callable[[str], object]:
        CHILDREN[name] = fn
        return fn

    return deco


def run_child(script: str, name: str, arg: str = "", timeout: float = 1800.0) -> object:
    """Run the child function ``name`` of ``script`` (``python script --child name --arg
    arg``) in a fresh process and return what it returned (JSON). RuntimeError with the end
    of its stderr when it fails."""
    cmd = [sys.executable, script, "--child", name, "--arg", arg]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"child {name}({arg}): exit code {out.returncode}: {out.stderr[-1500:]}")
    return json.loads(lines[-1][6:])


def median_time(fn: Callable[[], object], warmup: int = 1, reps: int = 5) -> float:
    """Median wall time of ``fn`` over ``reps`` runs after ``warmup`` runs (seconds)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(statistics.median(ts))


def interleaved_times(
    fns: dict[str, Callable[[], object]], warmup: int = 1, reps: int = 5
) -> dict[str, list[float]]:
    """Every wall time (seconds) of several functions measured alternately, so that noise on a
    shared machine hits all of them alike. The order flips every round (A B, B A, A B, ...) so
    that neither side always runs first (caches, allocator state, a neighbour's load pattern)."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(reps):
        for k in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
    return ts


def interleaved_medians(
    fns: dict[str, Callable[[], object]], warmup: int = 1, reps: int = 5
) -> dict[str, float]:
    """Median times of several functions measured alternately (see :func:`interleaved_times`)."""
    ts = interleaved_times(fns, warmup, reps)
    return {k: float(statistics.median(v)) for k, v in ts.items()}


def measure_pair(
    ours: Callable[[], object], peer: Callable[[], object], reps: int, **extra: object
) -> dict:
    """Time attnkit (``ours``) and its peer alternately; return the row fields ``impl_s`` and
    ``peer_s`` (medians) and ``extra`` with noise gauges added: each side's relative spread and
    the ratio of the fastest runs (noise only adds time, so on a loaded machine it is the
    steadier estimate)."""
    t = interleaved_times({"impl": ours, "peer": peer}, warmup=1, reps=reps)
    extra.update(
        reps=reps,
        spread=f"{spread(t['impl']):.0%}/{spread(t['peer']):.0%}",
        ratio_of_mins=round(min(t["peer"]) / min(t["impl"]), 3),
    )
    return dict(
        impl_s=float(statistics.median(t["impl"])),
        peer_s=float(statistics.median(t["peer"])),
        extra=extra,
    )


def sdpa_pair_times(q, k, v, calls: int, reps: int, gqa: bool = False, warmup: int = 1):
    """(round times {"impl", "peer"}, max relative error): ``calls`` attnkit calls (``auto``;
    ``grouped_query_attention`` when ``gqa``) against as many torch SDPA calls (``enable_gqa``)
    on the same q, k, v per round, rounds interleaved, in inference mode."""
    import torch
    import torch.nn.functional as F

    import attnkit
    from attnkit import functional

    ours_fn = functional.grouped_query_attention if gqa else attnkit.scaled_dot_product_attention
    kw = dict(enable_gqa=True) if gqa else {}

    def ours():
        for _ in range(calls):
            ours_fn(q, k, v)

    def peer():
        for _ in range(calls):
            F.scaled_dot_product_attention(q, k, v, **kw)

    with torch.inference_mode():
        want = F.scaled_dot_product_attention(q, k, v, **kw).float()
        err = max_rel_err(ours_fn(q, k, v).float(), want)
        return interleaved_times({"impl": ours, "peer": peer}, warmup=warmup, reps=reps), err


def cpu_line() -> str:
    """The CPU as the tables print it: model, torch capability, native bf16."""
    from attnkit.cli.info import collect

    cpu = collect()["cpu"]
    bf16 = {True: "yes", False: "no", None: "unknown"}[cpu["native_bf16"]]
    return f"{cpu['model']}, {cpu['torch_capability']}, native bf16 {bf16}"


def spread(times: list[float]) -> float:
    """Relative spread of repeated timings: (upper quartile - lower quartile) / median; a noise
    gauge to print next to a median (0.05 = 5 %)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(times)


def _status_mib(field: str) -> float | None:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM) in MiB, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def current_rss_mib() -> float:
    """Resident set size of this process now (MiB); 0 when unknown."""
    return _status_mib("VmRSS") or 0.0


def _high_water_mib() -> float:
    """This process's peak RSS since start or the last reset (MiB): VmHWM of /proc/self/status.

    Not ``getrusage().ru_maxrss``: Linux folds the peak of the image a process replaced at exec
    into it, so a child started by a process holding 2 GB reports at least 2 GB, and a reset of
    the high-water mark does not clear it. ru_maxrss only where /proc is missing."""
    hwm = _status_mib("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB), including peaks before any reset done
    by :func:`peak_memory_mib`."""
    return max(_high_water_mib(), _PEAK_BEFORE_RESET_MIB)


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS high-water mark of this process (Linux >= 4.0)."""
    global _PEAK_BEFORE_RESET_MIB
    _PEAK_BEFORE_RESET_MIB = peak_rss_mib()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Run ``fn`` once; return the peak RSS it reached above the RSS just before it (MiB).

    Free what earlier calls allocated before calling this (``del`` results). Without a resettable
    high-water mark (not Linux) the result is the process peak so far minus the RSS before, an
    upper bound."""
    before = current_rss_mib()
    _reset_peak()
    fn()
    return max(0.0, _high_water_mib() - before)


def trim_heap() -> None:
    """Return free heap memory to the OS (glibc ``malloc_trim``), so that a following
    :func:`peak_memory_mib` starts from the memory really in use; a no-op elsewhere."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the numbers are upper bounds
        pass


def trimmed_peak_memory_mib(fn: Callable[[], object]) -> float:
    """:func:`peak_memory_mib` of ``fn`` after :func:`trim_heap`."""
    trim_heap()
    return peak_memory_mib(fn)


def mem_available_bytes() -> int:
    """MemAvailable of /proc/meminfo (bytes); 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------------------------------
# attention inputs and errors shared by the kernel rows
# ---------------------------------------------------------------------------------------------
def qkv(
    length: int, batch: int = 1, heads: int = 8, dim: int = 64, grad: bool = False, seed: int = 0
):
    """q, k, v (batch, heads, length, dim) float32 from a seeded generator."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, heads, length, dim, generator=g).requires_grad_(grad) for _ in range(3)
    )


def rel_err(a, b) -> str:
    """Relative error ||a - b|| / ||b|| (Frobenius, in float64), formatted ``1.2e-07``."""
    a, b = a.detach().double(), b.detach().double()
    return f"{float((a - b).norm() / b.norm()):.1e}"


def max_rel_err(a, b) -> float:
    """max |a - b| / max |b| (b's scale floored at 1e-30)."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def chosen_backend(q, k, v, mask=None, **kwargs) -> str:
    """The backend ``auto`` picks for this call (``attnkit.explain_dispatch``)."""
    import attnkit

    return str(attnkit.explain_dispatch(q, k, v, mask, **kwargs).chosen)


def _jsonable(x: object) -> object:
    """JSON fallback for numpy / torch scalars and anything else (as text)."""
    item = getattr(x, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(x)


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--list", action="store_true", help="print the row ids")
    p.add_argument("--row", help="run one row and print 'ROW {json}'")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (smoke test)")
    p.add_argument("--child", help="run a registered child function (see run_child)")
    p.add_argument("--arg", default="", help="the child function's argument")
    a = p.parse_args()
    if a.child:
        if a.child not in CHILDREN:
            sys.exit(f"--child: unknown child {a.child!r}; known: {sorted(CHILDREN)}")
        print("CHILD " + json.dumps(CHILDREN[a.child](a.arg), default=_jsonable), flush=True)
        return
    if a.list or not a.row:
        for rid, r in ROWS.items():
            print(json.dumps(dict(id=rid, group=r["group"], case=r["case"], target=r["target"])))
        return
    if a.row not in ROWS:
        sys.exit(f"--row: unknown row {a.row!r}; known: {sorted(ROWS)}")
    r = ROWS[a.row]
    base = current_rss_mib() or peak_rss_mib()
    res = r["fn"](a.quick)
    if not isinstance(res, dict):
        sys.exit(
            f"row {a.row!r}: expected a dict with impl_s, peer_s, peer (and optional extra), "
            f"got {type(res).__name__}"
        )
    out = dict(id=a.row, group=r["group"], case=r["case"], target=r["target"])
    out.update(res)  # a row may override 'case' (sizes run with --quick)
    if res.get("impl_s") and res.get("peer_s"):
        out["ratio"] = res["peer_s"] / res["impl_s"]
    out["peak_rss_mib"] = peak_rss_mib()
    out["startup_rss_mib"] = base
    out["quick"] = bool(a.quick)
    out["torch_threads"] = _torch_threads()
    print("ROW " + json.dumps(out, default=_jsonable), flush=True)


def train_step(m, ids):
    """One training step of causal LM ``m`` on ``ids`` (gradients zeroed, loss, backward) as a
    function returning the loss."""

    def run():
        m.zero_grad(set_to_none=True)
        loss = m(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach()

    return run
