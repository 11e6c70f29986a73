"""``attnkit info``: what this installation supports (like ``python -m xformers.info``).

Versions (attnkit, Python, torch, numba, NumPy, safetensors, tokenizers), the CPU and its
capability, thread counts, the numba cache directory, for each attention backend whether it
is available and, if not, why, and the dispatch constants in use with where each came from
(built in, or measured by ``attnkit tune``) and how sure the tune was of it. :func:`collect`
returns the same as a JSON-ready dict (for ``--json`` and for benchmark records).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

from attnkit.cli.support.common import console, print_json
from attnkit.terminal import markup

NAME = "info"
EXAMPLES = """\
  info      versions, CPU capability (AVX2 / AVX-512 / AMX, bf16), threads, backends
              attnkit info
              attnkit info --json
"""

SCHEMA = "attnkit.info/1"

# /proc/cpuinfo flags worth showing (x86 names; aarch64 lists "asimd", "sve", "bf16", ...)
_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
          "amx_bf16", "amx_int8", "asimd", "sve", "bf16")  # fmt: skip


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="show versions, CPU capability, threads and which backends are available",
        description="Versions, the CPU and its capability, thread counts, the numba cache "
        "directory, and for each attention backend whether it is available and why not.",
    )
    p.add_argument("--json", action="store_true", help="print it as one JSON object")


def run(ns: argparse.Namespace) -> int:
    """Print the report; exit code 0."""
    info = collect()
    if ns.json:
        print_json(info)
    else:
        render(info)
    return 0


# ---------------------------------------------------------------------------------------------
# collecting
# ---------------------------------------------------------------------------------------------
def _dist_version(dist: str) -> str | None:
    import importlib.metadata  # here, not at the top: --help stays fast

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu() -> dict[str, Any]:
    import torch

    from attnkit.cpu import cpu_flags, cpuinfo, native_bf16

    fields, flags = cpuinfo(), cpu_flags()
    model = fields.get("model name") or fields.get("Model") or platform.processor() or None
    return {
        "model": model,
        "machine": platform.machine(),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "flags": [f for f in _FLAGS if f in flags],
        "amx": "amx_tile" in flags,
        "native_bf16": native_bf16(),
    }


def _threads() -> dict[str, Any]:
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    env = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_CACHE_DIR")
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "torch_intraop": torch.get_num_threads(),
        "torch_interop": torch.get_num_interop_threads(),
        "env": {k: os.environ.get(k) for k in env},
    }


def _kernel_cache_dir() -> str:
    """The numba disk-cache directory of attnkit's fused additive kernels: the directory
    ``runtime.load_kernels`` gives numba for them (the same public call and arguments)."""
    from attnkit.kernels.additive import autograd
    from attnkit.kernels.numba import runtime

    return runtime.cache_dir("additive_fused", autograd.KERNEL_FILES)


def _numba() -> dict[str, Any]:
    """numba's version, threading layer, and the kernels' cache directory."""
    try:
        import numba
    except Exception as e:  # noqa: BLE001 - a broken numba install is reported, not raised
        return {"version": None, "error": f"{type(e).__name__}: {e}", "cache_dir": None}
    try:
        cache: str | None = _kernel_cache_dir()
    except Exception as e:  # noqa: BLE001 - report, do not fail, when the kernels cannot say
        cache = None
        error = f"cache directory unknown ({type(e).__name__}: {e})"
    else:
        error = None
    info = {
        "version": numba.__version__,
        "cache_dir": cache,
        "threading_layer": numba.config.THREADING_LAYER,
    }
    if error:
        info["error"] = error
    return info


def _backends() -> list[dict[str, Any]]:
    from attnkit.kernels import BACKENDS

    rows = []
    for name, b in BACKENDS.items():
        try:
            why = b.available()
        except Exception as e:  # noqa: BLE001 - report why a backend cannot even say
            why = f"available() failed: {type(e).__name__}: {e}"
        rows.append(
            {
                "name": name,
                "available": why is None,
                "reason": why,
                "kinds": list(getattr(b, "kinds", ())),
                "dtypes": [str(d).removeprefix("torch.") for d in getattr(b, "dtypes", ())],
                "devices": list(getattr(b, "devices", ())),
            }
        )
    return rows


def collect() -> dict[str, Any]:
    """Everything ``attnkit info`` shows, as a JSON-ready dict (schema ``attnkit.info/1``)."""
    import attnkit
    from attnkit.support_range import torch_support

    numba = _numba()
    return {
        "schema": SCHEMA,
        "versions": {
            "attnkit": attnkit.__version__,
            "python": platform.python_version(),
            "torch": _dist_version("torch"),
            "numba": numba["version"],
            "numpy": _dist_version("numpy"),
            "safetensors": _dist_version("safetensors"),
            "tokenizers": _dist_version("tokenizers"),
        },
        "torch_support": torch_support(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpu": _cpu(),
        "threads": _threads(),
        "numba": numba,
        "backends": _backends(),
        "tuning": _tuning(),
    }


def _tuning() -> dict[str, Any]:
    """The dispatch constants in use, each with its value and where it came from, and the
    stored tuning's file (and why it is not used, when it is not)."""
    from attnkit.kernels import tuning
    from attnkit.kernels.tuning import store as tuning_store

    loaded = tuning_store.load()
    t = tuning.current()
    return {
        "file": str(loaded.path),
        "file_used": loaded.why_default is None and t == loaded.tuning,
        "why_defaults": loaded.why_default,
        "constants": [
            {
                "name": n,
                "value": getattr(t, n),
                "shown": v,
                "source": src,
                "how_sure": t.sure(n),
                "decides": doc,
            }
            for n, v, src, doc in tuning.describe(t)
        ],
    }


# ---------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------
def _yes(flag: bool | None) -> str:
    return "unknown" if flag is None else ("yes" if flag else "no")


def render(info: dict[str, Any]) -> None:
    """Print ``info`` (from :func:`collect`) as a few rich tables."""
    from rich.table import Table

    out = console()
    t = Table(title="attnkit info", title_justify="left", show_header=False, show_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for name, v in info["versions"].items():
        t.add_row(name, markup(v or "not installed"))
    t.add_row("torch range", markup(info.get("torch_support", "")))
    cpu, th, nb = info["cpu"], info["threads"], info["numba"]
    t.add_row("platform", markup(info["platform"]))
    t.add_row("CPU", markup(cpu["model"] or "unknown") + f" ({markup(cpu['machine'])})")
    t.add_row("torch CPU capability", markup(cpu["torch_capability"]))
    t.add_row("CPU flags", markup(" ".join(cpu["flags"]) or "none of interest found"))
    t.add_row("AMX", _yes(cpu["amx"]))
    t.add_row("native bf16", _yes(cpu["native_bf16"]))
    t.add_row(
        "threads",
        f"torch {th['torch_intraop']} intra-op, {th['torch_interop']} inter-op; "
        f"{th['usable_cpus']} usable of {th['cpu_count']} CPUs",
    )
    env = ", ".join(f"{k}={markup(v)}" for k, v in th["env"].items() if v is not None)
    t.add_row("environment", env or "no thread / cache variables set")
    t.add_row("numba cache", markup(nb.get("cache_dir") or "unknown"))
    if nb.get("error"):
        t.add_row("numba", markup(nb["error"]))
    out.print(t)

    b = Table(title="backends", title_justify="left")
    for col in ("backend", "available", "kinds", "dtypes", "why not"):
        b.add_column(col)
    for row in info["backends"]:
        b.add_row(
            markup(row["name"]),
            "[green]yes[/]" if row["available"] else "[red]no[/]",
            markup(", ".join(row["kinds"])),
            markup(", ".join(row["dtypes"])),
            markup(row["reason"] or ""),
        )
    out.print(b)

    tu = info["tuning"]
    c = Table(title="dispatch constants (attnkit tune measures them)", title_justify="left")
    c.add_column("constant", no_wrap=True)
    for col in ("value", "from", "how sure", "decides"):
        c.add_column(col, overflow="fold")
    for row in tu["constants"]:
        c.add_row(
            row["name"],
            markup(row["shown"]),
            markup(row["source"]),
            markup(row["how_sure"]),
            markup(row["decides"]),
        )
    out.print(c)
    if tu["file_used"]:
        out.print(f"measured constants read from {markup(tu['file'])}")
    else:
        out.print(f"built-in defaults: {markup(tu['why_defaults'] or 'set by the program')}")
