"""``attnkit info``: versions, CPU capability, threads, numba cache and backends, checked
against this installation (torch, platform, /proc/cpuinfo, each backend's ``available()``)."""

from __future__ import annotations

import json
from pathlib import Path

from attnkit import cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_json_matches_this_installation(capsys):
    import platform

    import torch

    import attnkit
    from attnkit.kernels import BACKENDS

    code, out, err = run(capsys, "info", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == "attnkit.info/1"
    v = d["versions"]
    assert v["attnkit"] == attnkit.__version__ and v["torch"].split("+")[0] in torch.__version__
    assert v["python"] == platform.python_version()
    assert d["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert d["threads"]["torch_intraop"] == torch.get_num_threads()
    assert [b["name"] for b in d["backends"]] == list(BACKENDS)
    for b in d["backends"]:
        why = BACKENDS[b["name"]].available()
        assert b["available"] == (why is None) and b["reason"] == why
    assert isinstance(d["cpu"]["native_bf16"], (bool, type(None)))
    if d["versions"]["numba"] is not None:
        assert Path(d["numba"]["cache_dir"]).is_dir() and "error" not in d["numba"]
    if Path("/proc/cpuinfo").is_file():
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0]
        assert d["cpu"]["amx"] == (" amx_tile" in flags)
        assert ("avx2" in d["cpu"]["flags"]) == (" avx2" in flags)


def test_info_text_lists_every_backend_and_says_why_not(capsys, monkeypatch):
    from attnkit.kernels import BACKENDS

    name = next(iter(BACKENDS))
    monkeypatch.setattr(type(BACKENDS[name]), "available", lambda self: "no \x1b[31mkernel[/]")
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run(capsys, "info")
    assert code == 0, err
    for n in BACKENDS:
        assert n in out
    row = next(line for line in out.splitlines() if f" {name} " in line)
    assert "no \\x1b[31mkernel[/]" in row and " no " in row
    assert "\x1b" not in out
    for word in ("torch CPU capability", "native bf16", "AMX", "threads", "numba cache"):
        assert word in out
