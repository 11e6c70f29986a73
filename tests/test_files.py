"""attnkit.files: atomic writes and the check that a directory takes new files.

Failures speak of the file the user asked for: before, a write into a directory that cannot
hold files failed with the temporary file's name (``[Errno 13] Permission denied:
'.../.view.html.1yz7ov4p.tmp'``), after the work was done."""

from __future__ import annotations

import errno
import json

import pytest

from attnkit.files import check_writable, write_atomic
from tests.support.unwritable import run_unwritable, unwritable_dir


def test_write_atomic_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "out.txt"
    target.write_bytes(b"old")
    write_atomic(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_bytes(b"old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        write_atomic(target, fail)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_directory_that_cannot_hold_the_file_is_named_not_the_temporary_file(tmp_path):
    # a file where the directory should be: the temporary file cannot be created
    (tmp_path / "notes").write_text("x")
    target = tmp_path / "notes" / "view.html"
    with pytest.raises(NotADirectoryError) as e:
        write_atomic(target, lambda f: f.write(b"x"))
    assert str(e.value).startswith(f"{target}: cannot write the file")
    assert ".tmp" not in str(e.value) and "[Errno" not in str(e.value)
    assert e.value.errno == errno.ENOTDIR  # the system's reason is kept for callers


def test_check_writable_accepts_a_writable_directory_and_a_new_one_below_it(tmp_path):
    assert check_writable("out", tmp_path) == tmp_path
    assert check_writable("out", tmp_path / "runs" / "a") == tmp_path / "runs" / "a"


def test_check_writable_refuses_a_file_on_the_way(tmp_path):
    # was "[Errno 20] Not a directory: 'notes/run'" from train --out notes/run
    (tmp_path / "notes").write_text("x")
    with pytest.raises(NotADirectoryError) as e:
        check_writable("--out", tmp_path / "notes" / "run")
    assert str(e.value) == f"--out: '{tmp_path / 'notes'}' is a file, not a directory"


def test_check_writable_refuses_a_directory_without_write_permission(tmp_path):
    ro, prefix = unwritable_dir(tmp_path)
    code = (
        "import json\n"
        "from attnkit.files import check_writable, write_atomic\n"
        "from pathlib import Path\n"
        "found = {}\n"
        f"for key, call in [('dir', lambda: check_writable('-o', {str(ro)!r})),\n"
        f"                  ('new', lambda: check_writable('--out', {str(ro / 'runs/a')!r})),\n"
        f"                  ('write', lambda: write_atomic(Path({str(ro / 'x.html')!r}),\n"
        "                                                  lambda f: f.write(b'x')))]:\n"
        "    try:\n"
        "        call()\n"
        "        found[key] = None\n"
        "    except OSError as e:\n"
        "        found[key] = [type(e).__name__, str(e), e.errno]\n"
        "print(json.dumps(found))\n"
    )
    r = run_unwritable(prefix, code)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    expected = f"cannot create files in the directory '{ro}'"
    assert found["dir"][:2] == ["PermissionError", f"-o: {expected} " + _REASON]
    assert found["new"][:2] == ["PermissionError", f"--out: {expected} " + _REASON]
    kind, message, code_ = found["write"]
    assert kind == "PermissionError" and code_ == errno.EACCES
    assert message == f"{ro / 'x.html'}: cannot write the file (Permission denied)"
    assert list(ro.iterdir()) == []


_REASON = "(permission denied or a read-only file system)"
