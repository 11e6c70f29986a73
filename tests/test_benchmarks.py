"""The benchmark harness (benchmarks/run.py and the row protocol), not the speed of anything.

One real row runs with ``--quick``; failures, timeouts and broken scripts are exercised with tiny
fake benchmark scripts that do not import torch.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RUN = BENCH / "run.py"

pytestmark = pytest.mark.skipif(
    not RUN.is_file() or not (BENCH / "common.py").is_file(),
    reason=f"benchmarks/run.py or benchmarks/common.py absent under {BENCH}",
)


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=timeout
    )


def _load_run_module():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def _check_ok_row(r: dict) -> None:
    for key in ("id", "group", "case", "peer", "script"):
        assert isinstance(r[key], str) and r[key], (key, r)
    assert r["status"] == "ok", r
    assert r["impl_s"] > 0 and r["peer_s"] > 0, r
    assert r["ratio"] == pytest.approx(r["peer_s"] / r["impl_s"], rel=1e-12)
    assert r["peak_rss_mib"] >= r["startup_rss_mib"] > 0, r
    assert r["quick"] is True


@pytest.mark.skipif(not (BENCH / "bench_dense.py").is_file(), reason="bench_dense.py absent")
def test_quick_dense_row_json(tmp_path):
    out = tmp_path / "bench.json"
    p = _run(
        "--quick", "--scripts", "dense", "--only", "dense-1k", "--json", str(out), "--markdown"
    )
    assert p.returncode == 0, p.stderr + p.stdout
    data = json.loads(out.read_text())
    m = data["machine"]
    for key in ("cpu", "cores", "torch", "numba", "torch_threads", "date"):
        assert m[key], (key, m)
    assert data["quick"] is True and data["partial"] is False
    assert [r["id"] for r in data["rows"]] == ["dense-1k"]
    r = data["rows"][0]
    _check_ok_row(r)
    assert r["target"] == ">=0.95x" and r["target_met"] == (r["ratio"] >= 0.95)
    assert r["extra"]["backend"]
    # the Markdown table: header, separator, one row
    table = [ln for ln in p.stdout.splitlines() if ln.startswith("|")]
    assert len(table) == 3 and table[0].startswith("| group | case | attnkit")
    assert "dense fp32" in table[2] and ">=0.95x" in table[2]


FAKE = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {bench!r})
    from common import main, row, peak_memory_mib

    @row("fake-ok", "fake", "fine", ">=1.5x")
    def ok(quick):
        mib = peak_memory_mib(lambda: b"x" * (64 * 2**20))
        return dict(impl_s=0.5, peer_s=1.0, peer="slow peer", case=f"fine quick={{quick}}",
                    extra=dict(alloc_mib=mib))

    @row("fake-own-target", "fake", "memory bound", "<=1GB above inputs")
    def own(quick):
        return dict(impl_s=1.0, peer_s=1.0, peer="same", target_met=False)

    @row("fake-crash", "fake", "raises")
    def crash(quick):
        raise RuntimeError("deliberate failure 1234")

    @row("fake-slow", "fake", "hangs")
    def slow(quick):
        time.sleep(60)

    if __name__ == "__main__":
        main()
    """
)


def test_failures_timeouts_and_broken_scripts(tmp_path):
    (tmp_path / "bench_fake.py").write_text(FAKE.format(bench=str(BENCH)))
    (tmp_path / "bench_broken.py").write_text("raise ImportError('no such kernel 5678')\n")
    out = tmp_path / "sub" / "fake.json"
    p = _run("--bench-dir", str(tmp_path), "--quick", "--timeout", "3", "--json", str(out))
    assert p.returncode == 1, p.stderr + p.stdout
    rows = {r["id"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {
        "bench_broken:list",
        "fake-ok",
        "fake-own-target",
        "fake-crash",
        "fake-slow",
    }
    assert rows["bench_broken:list"]["status"] == "failed"
    assert "no such kernel 5678" in rows["bench_broken:list"]["error"]
    ok = rows["fake-ok"]
    _check_ok_row(ok)
    assert ok["ratio"] == 2.0 and ok["target_met"] is True and ok["case"] == "fine quick=True"
    assert 48 <= ok["extra"]["alloc_mib"] <= 200, ok["extra"]
    assert rows["fake-own-target"]["target_met"] is False
    assert rows["fake-crash"]["status"] == "failed"
    assert "deliberate failure 1234" in rows["fake-crash"]["error"]
    assert rows["fake-slow"]["status"] == "timeout"
    assert "FAILED" in p.stdout and "TIMEOUT" in p.stdout and "targets missed" in p.stdout
    assert not list(out.parent.glob("*.tmp")), "temporary JSON files left behind"


def test_only_matching_nothing_exits_2(tmp_path):
    (tmp_path / "bench_fake.py").write_text(FAKE.format(bench=str(BENCH)))
    p = _run("--bench-dir", str(tmp_path), "--only", "no-such-row-xyz")
    assert p.returncode == 2, p.stderr + p.stdout


def test_target_and_pattern_rules():
    run = _load_run_module()
    assert run.target_met(dict(target=">=0.95x", ratio=0.95)) is True
    assert run.target_met(dict(target=">= 20 x", ratio=19.9)) is False
    assert run.target_met(dict(target=">=20x, >=30x less memory", ratio=50.0)) is None
    assert run.target_met(dict(target="<=1GB", ratio=5.0, target_met=True)) is True
    assert run.target_met(dict(target="", ratio=5.0)) is None
    spec = run.Spec(Path("bench_masks.py"), "swa-fwd-16k", "sliding window", "L=16384 fwd")
    assert run.matches(spec, [])
    assert run.matches(spec, ["SWA"]) and run.matches(spec, ["window"])
    assert run.matches(spec, ["swa-*-16k"]) and run.matches(spec, ["masks"])
    assert not run.matches(spec, ["dense"])


def test_every_script_lists_rows():
    scripts = sorted(BENCH.glob("bench_*.py"))
    if not scripts:
        pytest.skip("no benchmarks/bench_*.py scripts yet")
    p = _run("--list")
    assert p.returncode == 0, p.stderr + p.stdout
    listed = p.stdout.split()
    for s in scripts:
        assert s.name in listed, f"{s.name} lists no rows:\n{p.stdout}\n{p.stderr}"
