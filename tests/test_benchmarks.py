"""The benchmark harness (benchmarks/run.py, benchmarks/harness/, the row protocol of common.py)
and the training rows' peers, not the speed of anything.

No real row runs here (``benchmarks/run.py --quick`` is the smoke test of the rows): the runner,
failures, timeouts, child processes and broken scripts are exercised with tiny fake benchmark
scripts that do not import torch; the harness modules are tested on made-up rows; the training
rows' peers are checked against attnkit's models at tiny sizes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RUN = BENCH / "run.py"

pytestmark = pytest.mark.skipif(
    not RUN.is_file() or not (BENCH / "harness").is_dir(),
    reason=f"benchmarks/run.py or benchmarks/harness absent under {BENCH}",
)


@pytest.fixture
def bench_path(monkeypatch):
    """benchmarks/ on sys.path (as the bench scripts see it)."""
    monkeypatch.syspath_prepend(str(BENCH))


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=timeout
    )


def _check_ok_row(r: dict) -> None:
    for key in ("id", "group", "case", "peer", "script"):
        assert isinstance(r[key], str) and r[key], (key, r)
    assert r["status"] == "ok", r
    assert r["impl_s"] > 0 and r["peer_s"] > 0, r
    assert r["ratio"] == pytest.approx(r["peer_s"] / r["impl_s"], rel=1e-12)
    assert r["peak_rss_mib"] >= r["startup_rss_mib"] > 0, r
    assert r["quick"] is True


FAKE = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {bench!r})
    from common import child, main, row, peak_memory_mib, run_child

    @row("fake-ok", "fake", "fine", ">=1.5x")
    def ok(quick):
        mib = peak_memory_mib(lambda: b"x" * (64 * 2**20))
        twice = run_child(__file__, "double", "21")
        return dict(impl_s=0.5, peer_s=1.0, peer="slow peer", case=f"fine quick={{quick}}",
                    extra=dict(alloc_mib=mib, child=twice))

    @row("fake-own-target", "fake", "memory bound", "<=1GB above inputs")
    def own(quick):
        return dict(impl_s=1.0, peer_s=1.0, peer="same", target_met=False)

    @row("fake-crash", "fake", "raises")
    def crash(quick):
        raise RuntimeError("deliberate failure 1234")

    @row("fake-child-crash", "fake", "child raises")
    def child_crash(quick):
        run_child(__file__, "fail", "x")

    @row("fake-slow", "fake", "hangs")
    def slow(quick):
        time.sleep(60)

    @child("double")
    def double(arg):
        return 2 * int(arg)

    @child("fail")
    def fail(arg):
        raise ValueError("child failure 9876")

    if __name__ == "__main__":
        main()
    """
)


def test_failures_timeouts_and_broken_scripts(tmp_path):
    (tmp_path / "bench_fake.py").write_text(FAKE.format(bench=str(BENCH)))
    (tmp_path / "bench_broken.py").write_text("raise ImportError('no such kernel 5678')\n")
    out = tmp_path / "sub" / "fake.json"
    p = _run(
        "--bench-dir", str(tmp_path), "--quick", "--timeout", "5", "--json", str(out), "--markdown"
    )  # fmt: skip
    assert p.returncode == 1, p.stderr + p.stdout
    data = json.loads(out.read_text())
    assert data["quick"] is True and data["partial"] is False
    m = data["machine"]
    for key in ("cpu", "cpu_capability", "cores", "torch", "numba", "torch_threads", "date"):
        assert m[key], (key, m)
    assert m["info"]["schema"] == "attnkit.info/1" and m["info_error"] is None
    # the Markdown table: header, separator, one line per row; the machine line above it
    table = [ln for ln in p.stdout.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + 6 and table[0].startswith("| group | case | attnkit")
    assert any(ln.startswith("| fake | fine quick=True | 500.0 ms |") for ln in table), table
    assert f"torch capability {m['cpu_capability']}" in p.stdout
    rows = {r["id"]: r for r in data["rows"]}
    assert set(rows) == {
        "bench_broken:list",
        "fake-ok",
        "fake-own-target",
        "fake-crash",
        "fake-child-crash",
        "fake-slow",
    }
    assert rows["bench_broken:list"]["status"] == "failed"
    assert "no such kernel 5678" in rows["bench_broken:list"]["error"]
    ok = rows["fake-ok"]
    _check_ok_row(ok)
    assert ok["ratio"] == 2.0 and ok["target_met"] is True and ok["case"] == "fine quick=True"
    assert ok["cpu"].startswith(m["cpu"]) and f"capability {m['cpu_capability']}" in ok["cpu"]
    assert 48 <= ok["extra"]["alloc_mib"] <= 200, ok["extra"]
    assert ok["extra"]["child"] == 42
    assert isinstance(ok["load_avg"], float) and ok["load_avg"] >= 0  # load when it finished
    assert rows["fake-own-target"]["target_met"] is False
    assert rows["fake-crash"]["status"] == "failed"
    assert "deliberate failure 1234" in rows["fake-crash"]["error"]
    assert rows["fake-child-crash"]["status"] == "failed"
    assert "child failure 9876" in rows["fake-child-crash"]["error"]
    assert rows["fake-slow"]["status"] == "timeout"
    assert "FAILED" in p.stdout and "TIMEOUT" in p.stdout and "targets missed" in p.stdout
    assert not list(out.parent.glob("*.tmp")), "temporary JSON files left behind"


def test_only_matching_nothing_exits_2(tmp_path):
    (tmp_path / "bench_fake.py").write_text(FAKE.format(bench=str(BENCH)))
    p = _run("--bench-dir", str(tmp_path), "--only", "no-such-row-xyz")
    assert p.returncode == 2, p.stderr + p.stdout


def test_every_script_lists_rows():
    scripts = sorted(BENCH.glob("bench_*.py"))
    if not scripts:
        pytest.skip("no benchmarks/bench_*.py scripts yet")
    p = _run("--list")
    assert p.returncode == 0, p.stderr + p.stdout
    listed = p.stdout.split()
    for s in scripts:
        assert s.name in listed, f"{s.name} lists no rows:\n{p.stdout}\n{p.stderr}"
    for rid in ("train-seq2seq", "train-seq2seq-packed", "train-lm-8k", "train-ddp"):
        assert rid in listed, rid


def test_cli_bench_passes_arguments_through():
    p = subprocess.run(
        [sys.executable, "-m", "attnkit", "bench", "--scripts", "ddp", "--list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr + p.stdout
    assert "train-ddp" in p.stdout and "dense-1k" not in p.stdout


# ---------------------------------------------------------------------------------------------
# harness modules on made-up rows
# ---------------------------------------------------------------------------------------------
def test_row_json_round_trip_and_targets(bench_path):
    from harness.row import Row, Spec, target_met
    from harness.runner import matches

    r = Row.from_json(dict(id="a", impl_s=1.0, peer_s=2.0, ratio=2.0, extra=dict(x=1), new=5))
    assert r.extra == {"x": 1, "new": 5}  # unknown keys are kept, in extra
    assert Row.from_json(r.to_json()) == r
    assert Row.from_json(dict(id="b", extra=3)).extra == {"value": 3}
    with pytest.raises(ValueError, match="id"):
        Row.from_json(dict(group="no id"))
    assert target_met(dict(target=">=0.95x", ratio=0.95)) is True
    assert target_met(Row("c", target=">= 20 x", ratio=19.9)) is False
    assert target_met(dict(target=">=20x, >=30x less memory", ratio=50.0)) is None
    assert target_met(dict(target="<=1GB", ratio=5.0, target_met=True)) is True
    assert target_met(dict(target="", ratio=5.0)) is None
    assert target_met(dict(target=">=1x", ratio=True)) is None
    spec = Spec(Path("bench_masks.py"), "swa-fwd-16k", "sliding window", "L=16384 fwd")
    assert matches(spec, [])
    assert matches(spec, ["SWA"]) and matches(spec, ["window"])
    assert matches(spec, ["swa-*-16k"]) and matches(spec, ["masks"])
    assert not matches(spec, ["dense"])


def test_runner_turns_outputs_into_rows(bench_path):
    from harness.row import Spec
    from harness.runner import discover, parse_list, row_from_output

    spec = Spec(Path("bench_x.py"), "x-1", "grp", "listed case", ">=2x")
    line = 'ROW {"impl_s": 1.0, "peer_s": 3.0, "ratio": 3.0, "peer": "p", "case": "ran"}'
    ok = row_from_output(spec, 0, "noise\n" + line + "\n", "", 4.5, 60)
    assert (ok.status, ok.case, ok.group, ok.script, ok.wall_s) == (
        "ok",
        "ran",
        "grp",
        "bench_x.py",
        4.5,
    )
    assert ok.target_met is True and ok.ratio == 3.0
    timeout = row_from_output(spec, None, "", "last words", 60.0, 60)
    assert timeout.status == "timeout" and "60 s" in timeout.error and "last words" in timeout.error
    crash = row_from_output(spec, 1, "", "Traceback\nValueError: bad", 1.0, 60)
    assert crash.status == "failed" and crash.error.startswith("exit code 1")
    silent = row_from_output(spec, 0, "no row here", "", 1.0, 60)
    assert silent.status == "failed" and "no 'ROW {json}' line" in silent.error
    garbled = row_from_output(spec, 0, "ROW {not json", "", 1.0, 60)
    assert garbled.status == "failed" and "unreadable ROW line" in garbled.error
    specs = parse_list(Path("s.py"), 'hello\n{"id": "r1", "group": "g"}\n{"no": "id"}\n{bad\n')
    assert [(s.id, s.group, s.case) for s in specs] == [("r1", "g", "")]
    names = [p.name for p in discover(BENCH)]
    assert names[:2] == ["bench_dense.py", "bench_masks.py"] and "bench_train.py" in names
    assert [p.name for p in discover(BENCH, ["train"])] == ["bench_train.py"]


def test_table_columns_and_rendering(bench_path):
    from harness.row import Row
    from harness.table import COLUMNS, cells, fmt_time, markdown_table, rich_table
    from rich.console import Console

    assert [fmt_time(x) for x in (5e-6, 0.0123, 2.5, None, 0, True)] == [
        "5.0 µs", "12.3 ms", "2.50 s", "-", "-", "-",
    ]  # fmt: skip
    ok = Row(
        "a", group="g|1", case="c", target=">=1x", impl_s=0.5, peer="p", peer_s=1.0, ratio=2.0,
        target_met=True, peak_rss_mib=300.0, startup_rss_mib=200.0, load_avg=2.345,
        extra={"plan_s": 0.25, "backend": "[bold]x", "n": 12345.0},
    )  # fmt: skip
    bad = Row("b", status="timeout", error="timed out after 5 s\nsome [red] tail")
    c = cells(ok)
    assert list(c) == [col.name for col in COLUMNS]
    assert c["peak MiB (+row)"] == "300 (+100)" and c["ratio"] == "2.00x" and c["met"] == "yes"
    assert c["block mask / plan"] == "250.0 ms (plan)" and c["load"] == "2.3"
    assert c["notes"] == "backend=[bold]x, n=12,345"
    assert cells(bad)["notes"] == "TIMEOUT: some [red] tail" and cells(bad)["attnkit"] == "-"
    assert cells(bad)["load"] == "-"
    md = markdown_table([ok, bad]).splitlines()
    assert len(md) == 4 and md[0] == "| " + " | ".join(col.name for col in COLUMNS) + " |"
    assert md[2].startswith("| g\\|1 | c | 500.0 ms |")
    console = Console(record=True, width=400)
    console.print(rich_table([ok, bad], "t"))
    text = console.export_text()
    assert "[bold]x" in text and "some [red] tail" in text  # markup in data is shown, not applied


def test_machine_uses_attnkit_info(bench_path, monkeypatch):
    import torch
    from harness import machine
    from harness.row import Row

    m = machine.machine_info([Row("a", torch_threads=7)])
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert m["info"]["schema"] == "attnkit.info/1" and m["torch_threads"] == 7
    assert m["torch"] == torch.__version__.split("+")[0] or m["torch"] == torch.__version__
    line = machine.machine_line(m)
    assert f"torch capability {m['cpu_capability']}" in line and "(7 threads)" in line
    bf16 = {True: "yes", False: "no", None: "unknown"}[m["info"]["cpu"]["native_bf16"]]
    assert f"native bf16 {bf16}" in line
    cpu = machine.cpu_summary()  # what every row records
    assert m["cpu"] in cpu and f"torch capability {m['cpu_capability']}" in cpu
    assert f"native bf16 {bf16}" in cpu
    monkeypatch.setattr(machine, "attnkit_info", lambda: ({}, "ImportError: broken tree"))
    m = machine.machine_info([])
    assert (
        m["cpu"]
        and m["info"] == {}
        and "attnkit info failed: ImportError" in machine.machine_line(m)
    )


def test_git_commit_is_read_once_and_names_uncommitted_changes(bench_path, tmp_path, monkeypatch):
    """The commit of a run is the one its rows ran (read once, at the start), marked when
    tracked files differ from it; None outside a git checkout."""
    from harness import machine

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(machine, "REPO", tmp_path)
    machine.git_commit.cache_clear()
    first = machine.git_commit()
    assert first and " " not in first
    (tmp_path / "f.txt").write_text("b")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    assert machine.git_commit() == first  # a commit during the run does not relabel it
    machine.git_commit.cache_clear()
    second = machine.git_commit()
    assert second != first and " " not in second
    (tmp_path / "f.txt").write_text("c")
    machine.git_commit.cache_clear()
    assert machine.git_commit() == second + " + uncommitted changes"
    monkeypatch.setattr(machine, "REPO", tmp_path / "absent")
    machine.git_commit.cache_clear()
    assert machine.git_commit() is None
    machine.git_commit.cache_clear()


def test_results_json_and_summary(bench_path, tmp_path):
    from harness.results import payload, summary, write_json_atomic
    from harness.row import Row

    rows = [
        Row("a", ratio=0.5, target=">=1x", target_met=False),
        Row("b", status="failed", script="bench_b.py", error="exit code 1\nboom"),
    ]
    path = tmp_path / "d" / "r.json"
    record = payload(rows, {"cpu": "x"}, quick=True, only=[], timeout_s=1, total_s=2, partial=False)
    write_json_atomic(path, record)
    data = json.loads(path.read_text())
    assert [Row.from_json(r) for r in data["rows"]] == rows and data["machine"] == {"cpu": "x"}
    assert list(path.parent.iterdir()) == [path]
    text = summary(rows, quick=True, interrupted=False)
    assert "1 of 2 rows ran" in text and "a: 0.50x, target >=1x" in text
    assert "FAILED b (bench_b.py)" in text and "  boom" in text


# ---------------------------------------------------------------------------------------------
# bench_train's peers compute what attnkit computes (same weights -> same outputs)
# ---------------------------------------------------------------------------------------------
def test_tutorial_seq2seq_matches_attnkit(bench_path):
    import torch
    from train_peers import TutorialSeq2Seq, seq2seq_state_from_attnkit

    from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    cfg = Seq2SeqConfig(
        23, 23, d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=1,
        dim_feedforward=24, dropout=0.0, tie_embeddings="all", norm_first=True,
    )  # fmt: skip
    ours = Seq2SeqTransformer(cfg).eval()
    peer = TutorialSeq2Seq(23, 16, 2, 2, 24, 0.0, 0, norm_first=True).eval()
    with pytest.raises(RuntimeError):  # different depths: the renamed weights do not fit
        peer.load_state_dict(seq2seq_state_from_attnkit(ours.state_dict()))
    peer = TutorialSeq2Seq(23, 16, 2, 2, 24, 0.0, 0, norm_first=True)
    cfg.num_decoder_layers = 2
    ours = Seq2SeqTransformer(cfg).eval()
    peer.load_state_dict(seq2seq_state_from_attnkit(ours.state_dict()))
    peer.eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 23, (3, 7), generator=g)
    tgt = torch.randint(3, 23, (3, 5), generator=g)
    src[1, 4:] = 0  # padding
    tgt[2, 3:] = 0
    with torch.no_grad():
        a, b = ours(src, tgt), peer(src, tgt)
    live = tgt != 0
    torch.testing.assert_close(a[live], b[live], rtol=1e-5, atol=1e-5)


def test_sdpa_lm_matches_attnkit_window(bench_path):
    import dataclasses

    import torch
    from train_peers import SDPALanguageModel

    from attnkit import masks
    from attnkit.models.lm import LMConfig, TransformerLM
    from attnkit.nn.projection import unpack

    if "window" not in {f.name for f in dataclasses.fields(LMConfig)}:
        pytest.skip("LMConfig has no window option yet")
    torch.manual_seed(0)
    ours = TransformerLM(
        LMConfig(vocab_size=31, d_model=16, nhead=2, num_layers=2, dim_feedforward=24,
                 dropout=0.0, window=5)
    )  # fmt: skip
    peer = SDPALanguageModel(31, 16, 2, 2, 24)
    peer.load_state_dict(unpack(ours.state_dict()))
    tokens = torch.randint(3, 31, (2, 19), generator=torch.Generator().manual_seed(2))
    dense = masks.sliding_window(5, 0).materialize(19, 19)
    assert dense.dtype == torch.bool and int(dense[10].sum()) == 6  # itself + 5 before
    a, b = ours(tokens), peer(tokens, dense)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ga = torch.autograd.grad(a.square().sum(), ours.layers[0].self_attn.in_proj.weight)
    gb = torch.autograd.grad(b.square().sum(), peer.layers[0].self_attn.q_proj.weight)
    torch.testing.assert_close(ga[0][:16], gb[0], rtol=1e-4, atol=1e-5)  # the q block


def test_ddp_row_helpers(bench_path):
    from bench_ddp import ddp_command, ddp_speed

    log = [
        {"step": 1, "tokens": 100, "elapsed_s": 5.0},  # start-up is in the first step
        {"step": 2, "tokens": 300, "elapsed_s": 6.0},
        {"step": 2, "val_loss": 3.0},
        {"step": 4, "tokens": 700, "elapsed_s": 8.0},
    ]
    assert ddp_speed(log) == (200.0, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        ddp_speed(log[:1])
    one, two = ddp_command(1, "o", 3, True), ddp_command(2, "o", 3, True)
    assert one[one.index("--accumulate") + 1] == "2" and two[two.index("--accumulate") + 1] == "1"
    assert "--nproc_per_node=2" in two and two[two.index("--max-steps") + 1] == "3"


def test_translation_batches(bench_path):
    import bench_train

    if not bench_train.DATA.is_file():
        pytest.skip(f"{bench_train.DATA} absent")
    from attnkit.train.data import tokenizer as tk

    vocab, batches = bench_train.translation_batches(3, 5)
    assert vocab > 100 and [len(b) for b in batches] == [5, 5, 5]
    for src, tgt in (e for b in batches for e in b):
        assert src[-1] == tk.EOS and tgt[0] == tk.BOS and tgt[-1] == tk.EOS
    flat = [tuple(map(tuple, e)) for b in batches for e in b]
    assert bench_train._tokens(batches) == sum(len(s) + len(t) - 1 for s, t in map(list, flat))


@pytest.mark.parametrize(
    "ours_us, peer_us, met",
    # a busy host's 30 us over a 1 ms call is met; 12 us over a 45 us call is not
    [(1030.0, 1000.0, True), (57.0, 45.0, False), (120.0, 100.0, False)],
)
def test_dense_overhead_is_judged_as_a_share_of_sdpas_call_time(
    bench_path, monkeypatch, ours_us, peer_us, met
):
    import bench_dense

    calls = 400

    def fake(q, k, v, n, reps, gqa=False):  # injected round times: no timing here
        assert n == calls
        return {"impl": [ours_us * 1e-6 * n] * reps, "peer": [peer_us * 1e-6 * n] * reps}, 0.0

    monkeypatch.setattr(bench_dense, "sdpa_pair_times", fake)
    res = bench_dense.dense_overhead(False)
    extra = res["extra"]
    assert extra["overhead_share_of_sdpa"] == pytest.approx(
        (ours_us - peer_us) / peer_us, abs=5e-4
    )  # rounded to 3
    assert extra["median_overhead_us"] == pytest.approx(ours_us - peer_us, abs=0.05)
    assert res["target_met"] is met
