"""The tuning (:mod:`attnkit.kernels.tuning`) and its store (:mod:`attnkit.kernels.tuning.store`):
validation of every field, the JSON round trip under this machine's key, another key or a
corrupt file giving the built-in defaults (with a warning for the corrupt file), the cache
directory following XDG_CACHE_HOME, atomic writes, and loading on first use."""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings

import pytest

from attnkit.kernels import tuning as T
from attnkit.kernels.tuning import store as S
from attnkit.kernels.tuning.sureness import Sureness

MEASURED = dataclasses.replace(
    T.DEFAULT,
    blocksparse_min_empty=0.45,
    scan_threaded_min=2**21,
    additive_block_q=16,
    measured=("blocksparse_min_empty", "scan_threaded_min", "additive_block_q"),
    measured_on="2026-01-02",
)


def test_defaults_are_valid_and_every_constant_is_documented():
    names = [f.name for f in T.constants()]
    assert len(names) == len(set(names)) >= 10
    for f in T.constants():
        value = getattr(T.DEFAULT, f.name)
        lo = f.metadata["range"][0]
        assert f.metadata["doc"]
        assert all(lo <= b for b, _ in value) if f.metadata.get("ranges") else lo <= value
    assert all(src == T.BUILT_IN for _, _, src, _ in T.describe(T.DEFAULT))


@pytest.mark.parametrize(
    "change, error, words",
    [
        ({"blocksparse_min_empty": 1.5}, ValueError, "blocksparse_min_empty: expected a value in"),
        ({"blocksparse_min_empty": "0.2"}, TypeError, "blocksparse_min_empty: expected float"),
        ({"blocksparse_block_q": 64.5}, TypeError, "blocksparse_block_q: expected an integer"),
        ({"blocksparse_block_q": True}, TypeError, "blocksparse_block_q: expected int, got bool"),
        ({"additive_block_q": 18}, ValueError, "additive_block_q: expected a multiple of 4"),
        ({"scan_threaded_min": 0}, ValueError, "scan_threaded_min: expected a value in"),
        ({"measured": ("no_such",)}, ValueError, "unknown constants ['no_such']"),
    ],
)
def test_bad_values_are_refused_naming_the_constant(change, error, words):
    with pytest.raises(error) as e:
        dataclasses.replace(T.DEFAULT, **change)
    assert words in str(e.value)


def test_source_and_cite_say_where_a_value_came_from():
    assert MEASURED.source("blocksparse_min_empty") == "measured by attnkit tune on 2026-01-02"
    assert MEASURED.source("blocksparse_block_q") == "built-in default"
    assert MEASURED.cite("scan_threaded_min") == (
        "scan_threaded_min = 2,097,152 (2**21) (measured by attnkit tune on 2026-01-02)"
    )


def test_round_trip_under_this_machines_key(tmp_path):
    path = S.save(MEASURED, tmp_path / "sub" / "tuning.json")
    record = json.loads(path.read_text())
    assert record["key"] == S.machine_key() and record["schema"] == S.SCHEMA
    assert set(record["tuning"]) == set(MEASURED.measured)  # only measured values are stored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = S.load(path)
    assert loaded.why_default is None and loaded.tuning == MEASURED


@pytest.mark.parametrize("part", ["cpu", "torch", "attnkit"])
def test_another_key_gives_the_defaults_silently(tmp_path, part):
    path = S.save(MEASURED, tmp_path / "tuning.json")
    record = json.loads(path.read_text())
    record["key"][part] = "something else"
    path.write_text(json.dumps(record))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = S.load(path)
    assert loaded.tuning == T.DEFAULT
    assert "something else" in loaded.why_default and "measured" in loaded.why_default


def test_missing_file_gives_the_defaults_silently(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = S.load(tmp_path / "absent.json")
    assert loaded.tuning == T.DEFAULT and "attnkit tune" in loaded.why_default


def _corrupt(path, how):
    good = json.loads(S.save(MEASURED, path).read_text())
    if how == "not json":
        path.write_text('{"schema": "attnkit.tuning/1", "key": {')
    elif how == "other schema":
        path.write_text(json.dumps(dict(good, schema="something/9")))
    elif how == "bad value":
        path.write_text(json.dumps(dict(good, tuning={"blocksparse_min_empty": -3})))
    elif how == "unknown name":
        path.write_text(json.dumps(dict(good, tuning={"no_such_constant": 1})))
    elif how == "a list":
        path.write_text("[1, 2]")
    elif how == "bad sureness":
        path.write_text(json.dumps(dict(good, sureness={"blocksparse_min_empty": {"ratio": 1}})))
    elif how == "bad ranges":
        path.write_text(json.dumps(dict(good, tuning={"decode_split_k_ranges": [[5, "torch"]]})))


@pytest.mark.parametrize(
    "how",
    [
        "not json",
        "other schema",
        "bad value",
        "unknown name",
        "a list",
        "bad sureness",
        "bad ranges",
    ],
)
def test_corrupt_file_gives_the_defaults_with_a_warning(tmp_path, how):
    path = tmp_path / "tuning.json"
    _corrupt(path, how)
    with pytest.warns(S.TuningWarning, match="using the built-in defaults") as w:
        loaded = S.load(path)
    assert loaded.tuning == T.DEFAULT
    assert str(path) in str(w[0].message) and "attnkit tune" in str(w[0].message)


@pytest.mark.skipif(sys.platform != "linux", reason="XDG_CACHE_HOME is the Linux convention")
def test_cache_directory_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ATTNKIT_NO_TUNING", raising=False)
    assert S.store_path() == tmp_path / "attnkit" / "tuning.json"
    assert S.save(MEASURED) == tmp_path / "attnkit" / "tuning.json"
    assert S.load().tuning == MEASURED


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    import attnkit.files

    path = S.save(MEASURED, tmp_path / "tuning.json")
    before = path.read_bytes()

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(attnkit.files.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        S.save(T.DEFAULT, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tuning.json"]


def test_current_loads_the_stored_tuning_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(S, "store_path", lambda: tmp_path / "attnkit" / "tuning.json")
    S.save(MEASURED)
    monkeypatch.delenv("ATTNKIT_NO_TUNING", raising=False)
    with T.use(None):  # forget the tuning in use: the next current() loads the store
        assert T.current() == MEASURED
        (tmp_path / "attnkit" / "tuning.json").unlink()
        assert T.current() == MEASURED  # read once, not per call
    monkeypatch.setenv("ATTNKIT_NO_TUNING", "1")
    with T.use(None):
        assert T.current() == T.DEFAULT


def test_use_refuses_what_is_not_a_tuning():
    with pytest.raises(TypeError, match="tuning: expected a Tuning or None, got dict"):
        with T.use({"blocksparse_min_empty": 0.5}):
            pass
    with pytest.raises(TypeError, match="tuning: expected a Tuning, got str"):
        S.save("fast")


SURE = Sureness(1.31, 0.04, 9, "clear: faster beyond the noise")
RANGES = ((2**23, "split-k"), (2**40, "torch"))


def test_sureness_and_ranges_round_trip_and_are_said_in_words(tmp_path):
    t = dataclasses.replace(
        MEASURED,
        decode_split_k_ranges=RANGES,
        measured=(*MEASURED.measured, "decode_split_k_ranges"),
        sureness=(("decode_split_k_ranges", SURE), ("blocksparse_min_empty", SURE)),
    )
    path = S.save(t, tmp_path / "tuning.json")
    record = json.loads(path.read_text())
    assert record["sureness"]["decode_split_k_ranges"]["repeats"] == 9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = S.load(path)
    assert loaded.tuning == t and loaded.tuning.decode_split_k_ranges == RANGES
    assert t.sure("decode_split_k_ranges") == (
        "clear: faster beyond the noise (median ratio 1.31x +/- 0.04 over 9 races)"
    )
    assert t.sure("scan_threaded_min") == "not recorded (tuned by an older attnkit)"
    assert t.sure("blocksparse_block_q") == "not measured on this machine"
    shown = dict((n, v) for n, v, _, _ in T.describe(t))
    assert shown["decode_split_k_ranges"] == "split-K below 8 MiB, torch ops from 8 MiB"


def test_sureness_must_name_measured_constants():
    with pytest.raises(ValueError, match="sureness: expected"):
        dataclasses.replace(T.DEFAULT, sureness=(("blocksparse_min_empty", SURE),))
    with pytest.raises(ValueError, match="ratio: expected a number"):
        Sureness(-1.0, 0.0, 3, "clear")


@pytest.mark.parametrize(
    "least, ranges",
    [
        (0, ((2**40, "split-k"),)),
        (2**40, ((2**40, "torch"),)),
        (2**22, ((2**22, "torch"), (2**40, "split-k"))),
    ],
)
def test_an_old_file_with_the_single_threshold_and_no_sureness_still_loads(tmp_path, least, ranges):
    path = tmp_path / "tuning.json"
    record = {
        "schema": S.SCHEMA,
        "key": S.machine_key(),
        "tuning": {"blocksparse_min_empty": 0.4, "decode_split_k_min_bytes": least},
        "measured_on": "2026-11-01",
    }
    path.write_text(json.dumps(record))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = S.load(path)
    assert loaded.why_default is None
    t = loaded.tuning
    assert t.decode_split_k_ranges == ranges and t.blocksparse_min_empty == 0.4
    assert t.measured == ("blocksparse_min_empty", "decode_split_k_ranges")
    assert t.sureness == () and "older attnkit" in t.sure("decode_split_k_ranges")
