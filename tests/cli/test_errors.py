"""Honest errors (issue 31): only what attnkit's own checks raise is a user error (one line,
exit 2); a dependency's error is an internal error (exit 1) whose traceback
``ATTNKIT_TRACEBACK=1`` prints; an HF directory whose config.json disagrees with its weights is
bad input, named before anything is built. Real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit import checks
from attnkit.cli.support.errors import is_user_error, raised_by_attnkit

SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]


def attnkit(*args: str, code: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """``python -m attnkit ARGS`` (or ``python -c CODE``) with this checkout on the path."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "attnkit", *args]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{TESTS}", **env},
    )


def caught(fn) -> BaseException:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e
    raise AssertionError("no exception")


def test_which_exceptions_are_user_errors(tmp_path):
    ours = caught(lambda: checks.positive_int("num_heads", 0))  # attnkit's check
    assert raised_by_attnkit(ours) and is_user_error(ours)
    assert str(ours) == "num_heads: expected a positive int, got 0"  # the message is kept

    def dependency():
        raise ValueError("You cannot specify both decoder_input_ids and decoder_inputs_embeds")

    assert not is_user_error(caught(dependency))  # raised outside attnkit: a bug
    builtin = caught(lambda: checks.show(int("x")))  # Python's own ValueError
    assert not is_user_error(builtin)
    missing = caught(lambda: open(tmp_path / "absent.txt"))  # an OS error: the user's file
    assert is_user_error(missing)


def test_a_dependency_error_is_internal_with_the_traceback_switch():
    code = (
        "import sys, attnkit.cli as c, attnkit.cli.info as i\n"
        "def boom(ns):\n"
        "    raise ValueError('You cannot specify both decoder_input_ids and "
        "decoder_inputs_embeds')\n"
        "i.run = boom\n"
        "sys.exit(c.main(['info']))\n"
    )
    quiet = attnkit(code=code)
    assert quiet.returncode == 1, quiet.stderr
    assert "internal error (ValueError: You cannot specify both" in quiet.stderr
    assert "Traceback" not in quiet.stderr and "ATTNKIT_TRACEBACK=1" in quiet.stderr
    loud = attnkit(code=code, ATTNKIT_TRACEBACK="1")
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr
    assert "in boom" in loud.stderr


def test_attnkit_checks_stay_one_line_user_errors(tmp_path):
    done = attnkit("generate", "--ckpt", str(tmp_path), "--prompt", "x", "--max-new-tokens", "0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "attnkit generate: error: --max-new-tokens: expected a positive int, got 0"
    )


def test_hf_config_that_disagrees_with_its_weights_is_bad_input(tmp_path):
    pytest.importorskip("transformers")
    from support.tiny_hf_dirs import save_tiny

    path = save_tiny("gpt2", tmp_path / "tiny-gpt2")
    cfg = json.loads((path / "config.json").read_text())
    n_embd = cfg["n_embd"]
    cfg["n_embd"] = 2_000_000  # would need terabytes if anything were built from it
    (path / "config.json").write_text(json.dumps(cfg))
    done = attnkit("view", "hello there", "--model", str(path), "-o", str(tmp_path / "v.html"))
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "internal error" not in err
    assert "config.json: disagrees with the weights" in err
    want = f"c_attn.weight is ({n_embd}, {3 * n_embd}) in model.safetensors but (2000000, 6000000)"
    assert want + " by config.json" in err
    assert not (tmp_path / "v.html").exists()


def test_an_os_error_on_a_file_is_file_then_reason(monkeypatch, capsys, tmp_path):
    # was Python's own form: "[Errno 2] No such file or directory: '/x/absent.txt'"
    import attnkit.cli as c
    import attnkit.cli.info as i

    monkeypatch.setattr(i, "run", lambda ns: open(tmp_path / "absent.txt"))
    assert c.main(["info"]) == 2
    err = capsys.readouterr().err
    assert err == f"attnkit info: error: {tmp_path / 'absent.txt'}: No such file or directory\n"
