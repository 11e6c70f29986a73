"""``attnkit tune`` and the constants ``attnkit info`` shows: a real ``--quick`` run stores a
tuning under XDG_CACHE_HOME that a fresh load reads back; ``info`` says where each constant came
from; ``--dry-run`` stores nothing; ``--reset`` forgets; misuse is one line, exit 2. Values
measured here are never asserted (they depend on this CPU): only their validity and sources."""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys

import pytest

from attnkit import autotune, cli
from attnkit.kernels import tuning as T
from attnkit.kernels.tuning import store as S

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the store's place is checked through XDG_CACHE_HOME (Linux)"
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "attnkit" / "tuning.json"


def test_quick_tune_stores_what_info_then_shows(capsys, cache, monkeypatch):
    code, out, err = run(capsys, "tune", "--quick", "--json")
    assert code == 0, err
    d = json.loads(out)
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert d["stored"] == str(cache) and d["measured_on"] == today
    stored = json.loads(cache.read_text())
    assert stored["key"] == S.machine_key()
    measured = {c["name"] for c in d["constants"] if c["seen"]}
    assert measured == set(stored["tuning"]) and {"blocksparse_min_empty"} <= measured
    T.Tuning(**stored["tuning"])  # every stored value is valid (range, type, multiple)
    assert set(stored["sureness"]) == measured  # every decision says how sure it was
    for c in d["constants"]:
        assert (c["how_sure"] is None) == (c["name"] not in measured), c
    assert T.current() == T.DEFAULT  # the running process keeps the tuning it started with

    monkeypatch.delenv("ATTNKIT_NO_TUNING", raising=False)
    with T.use(None):  # as a new process would: load from the store
        assert set(T.current().measured) == measured
        code, out, err = run(capsys, "info", "--json")
        assert code == 0, err
        info = json.loads(out)["tuning"]
        assert info["file"] == str(cache) and info["file_used"] and info["why_defaults"] is None
        sources = {c["name"]: c["source"] for c in info["constants"]}
        assert all("not recorded" not in c["how_sure"] for c in info["constants"])
        for name, source in sources.items():
            want = f"measured by attnkit tune on {today}" if name in measured else T.BUILT_IN
            assert source == want, (name, source)
        code, out, err = run(capsys, "info")
    assert code == 0, err
    assert "dispatch constants" in out and f"measured by attnkit tune on {today}" in out
    assert f"measured constants read from {cache}" in out


def test_info_without_a_stored_tuning_says_built_in(capsys, cache):
    code, out, err = run(capsys, "info")
    assert code == 0, err
    for f in T.constants():
        assert f.name in out
    assert "built-in default" in out and "built-in defaults:" in out
    assert "how sure" in out and "not measured on this machine" in out


def test_info_says_how_sure_each_stored_decision_is(capsys, cache, monkeypatch):
    from attnkit.kernels.tuning import store as tuning_store
    from attnkit.kernels.tuning.sureness import Sureness

    t = dataclasses.replace(
        T.DEFAULT,
        blocksparse_band_block_q=64,
        decode_split_k_ranges=((2**23, "split-k"), (2**40, "torch")),
        measured=("blocksparse_band_block_q", "decode_split_k_ranges"),
        measured_on="2026-11-02",
        sureness=(
            ("blocksparse_band_block_q", Sureness(1.4, 0.05, 7, "clear: faster beyond the noise")),
        ),
    )
    tuning_store.save(t, cache)
    monkeypatch.delenv("ATTNKIT_NO_TUNING", raising=False)
    monkeypatch.setenv("COLUMNS", "400")  # one line per constant
    with T.use(None):
        code, out, err = run(capsys, "info", "--json")
        assert code == 0, err
        rows = {c["name"]: c for c in json.loads(out)["tuning"]["constants"]}
        code, text, err = run(capsys, "info")
    assert rows["blocksparse_band_block_q"]["how_sure"] == (
        "clear: faster beyond the noise (median ratio 1.40x +/- 0.05 over 7 races)"
    )
    assert rows["decode_split_k_ranges"]["how_sure"] == "not recorded (tuned by an older attnkit)"
    assert rows["decode_split_k_ranges"]["shown"] == "split-K below 8 MiB, torch ops from 8 MiB"
    assert rows["scan_threaded_min"]["how_sure"] == "not measured on this machine"
    assert "how sure" in text and "7 races" in text and "older attnkit" in text


def test_dry_run_stores_nothing_and_reset_forgets(capsys, cache, monkeypatch):
    fake = autotune.Found({"blocksparse_min_empty": 0.5}, "a fake measurement")
    monkeypatch.setattr(autotune, "MEASUREMENTS", (lambda budget: fake,))
    code, out, err = run(capsys, "tune", "--dry-run")
    assert code == 0, err
    assert "not stored (--dry-run)" in out and "a fake measurement" in out
    assert not cache.exists()
    code, out, err = run(capsys, "tune")
    assert code == 0 and cache.exists(), err
    assert json.loads(cache.read_text())["tuning"] == {"blocksparse_min_empty": 0.5}
    code, out, err = run(capsys, "tune", "--reset")
    assert code == 0 and not cache.exists(), err
    assert "deleted" in out and "built-in defaults apply" in out
    code, out, err = run(capsys, "tune", "--reset")
    assert code == 0 and "nothing stored at" in out


def test_reset_with_measuring_options_is_refused(capsys, cache):
    code, out, err = run(capsys, "tune", "--reset", "--quick")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--reset" in err and "--quick" in err and "Traceback" not in err


def test_tune_refuses_a_budget_of_the_wrong_type():
    with pytest.raises(TypeError, match="budget: expected a Budget, got int"):
        autotune.tune(3)


def test_an_unwritable_store_is_refused_before_measuring(tmp_path):
    # was: a minute of measuring, then "[Errno 13] Permission denied: '.../.tuning.json.x.tmp'"
    from tests.support.unwritable import run_unwritable, unwritable_dir

    ro, prefix = unwritable_dir(tmp_path)
    code = (
        "import contextlib, io, json, os\n"
        f"os.environ['XDG_CACHE_HOME'] = {str(ro)!r}\n"
        "from attnkit import autotune\n"
        "from attnkit.cli import main\n"
        "autotune.tune = lambda *a, **k: print('MEASURED')\n"
        "found = []\n"
        "for argv in (['tune', '--quick'], ['tune']):\n"
        "    err, out = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):\n"
        "        found.append([main(argv), out.getvalue(), err.getvalue()])\n"
        "print(json.dumps(found))\n"
    )
    r = run_unwritable(prefix, code)
    assert r.returncode == 0, r.stderr
    for status, out, err in json.loads(r.stdout):
        assert status == 2 and out == "", (out, err)  # nothing measured
        assert err == (
            "attnkit tune: error: the tuning store (the user cache directory, "
            "XDG_CACHE_HOME/attnkit; --dry-run stores nothing): cannot create files in the "
            f"directory '{ro}' (permission denied or a read-only file system)\n"
        )
    assert list(ro.iterdir()) == []
