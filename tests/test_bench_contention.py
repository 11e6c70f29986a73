"""``benchmarks/run.py --contend``: the rows run while a second process streams memory, and the
record says how hard it loaded the bus. Not a speed test: the copier must run during the rows,
report readings, and be gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RUN = BENCH / "run.py"

pytestmark = pytest.mark.skipif(
    not (BENCH / "harness" / "contention.py").is_file(),
    reason=f"benchmarks/harness/contention.py absent under {BENCH}",
)

FAKE = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {bench!r})
    from common import main, row

    @row("fake-busy", "fake", "sleeps while the copier runs")
    def busy(quick):
        time.sleep(2.0)
        return dict(impl_s=1.0, peer_s=1.0, peer="same")

    if __name__ == "__main__":
        main()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


@pytest.fixture
def contention(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from harness import contention

    return contention


def test_copier_reports_bandwidth_and_stops(contention):
    with contention.Contention(mib=64) as c:
        deadline = time.time() + 60
        while time.time() < deadline and not c.readings():
            time.sleep(0.2)
        pid = c.pid
        assert _alive(pid)
    assert not _alive(pid), "the copier outlived the block"
    rec = c.record()
    assert rec.copies >= 1 and rec.copier_gbps_median > 0, rec
    assert rec.mib == 64 and "copying memory" in rec.line()
    assert json.loads(json.dumps(rec.to_json()))["copies"] == rec.copies


@pytest.mark.parametrize("bad", [0, 63, 1.5, True, "512"])
def test_bad_size_is_refused(contention, bad):
    with pytest.raises(ValueError, match="mib: expected an int of at least 64"):
        contention.Contention(mib=bad)


def test_run_records_the_load(tmp_path):
    (tmp_path / "bench_fake.py").write_text(FAKE.format(bench=str(BENCH)))
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, str(RUN), "--bench-dir", str(tmp_path), "--contend", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr + p.stdout
    m = json.loads(out.read_text())["machine"]
    assert m["contention"]["copies"] >= 1 and m["contention"]["copier_gbps_median"] > 0, m
    assert "loaded bus: a second process copying memory" in p.stdout
