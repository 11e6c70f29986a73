"""The user's vocabulary: no project-internal term reaches a user. ``--help`` of every verb, the
output of ``attnkit explain`` (walkthrough and every worked example), the README and the guides
of the documentation site contain none of :data:`FORBIDDEN`: the seed file names (the project's
name for the tutorials it follows), undefined policy codes ("P5"; the policy is described in
words, or defined on the docs site's numerics page), the benchmark script's own name as a
program name, and options that no longer exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnkit import cli
from attnkit.explain import catalog

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "a seed file name (seed 000, seed002, ...)": re.compile(r"\bseed ?0\d\d\b", re.I),
    "an undefined policy code (P1 ... P9)": re.compile(r"\bP[1-9]\b"),
    "the benchmark script as program name": re.compile(r"usage: run\.py"),
    "the removed --seeds option": re.compile(r"--seeds\b"),
}
"""What must not appear, by what it is."""

HELP_ONLY = {"a path into the source checkout's ../shared": re.compile(r"\.\./shared")}
"""Also forbidden in --help and command output (the README's checkout instructions may use it)."""


DEFINED_IN = {"conventions.md": "an undefined policy code (P1 ... P9)"}
"""Pages that define a term (with a table of what each code means) may use it."""


def _violations(text: str, patterns: dict[str, re.Pattern]) -> list[str]:
    found = []
    for what, pattern in patterns.items():
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {m.group(0)!r} ({what})")
    return found


def _run(capsys, *argv: str) -> str:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out + err


def test_the_patterns_catch_what_they_name():
    """Each pattern fails on the phrase the issue quotes, and passes on plain words."""
    bad = "Self-attention (seed 000); --example seed002; its P5 bound; usage: run.py; --seeds DIR"
    assert len(_violations(bad, FORBIDDEN)) == 5
    assert _violations("seed 3, --seed N, P50 latency, seeds of the sampler", FORBIDDEN) == []


@pytest.mark.parametrize("argv", [["--help"]] + [[v, "--help"] for v in cli.VERBS])
def test_help_speaks_the_users_language(capsys, argv):
    text = _run(capsys, *argv)
    assert _violations(text, FORBIDDEN | HELP_ONLY) == []


def test_bench_help_names_the_command(capfd):
    code = cli.main(["bench", "--help"])
    out = capfd.readouterr().out
    assert code == 0 and out.startswith("usage: attnkit bench"), out[:200]


@pytest.mark.parametrize(
    "argv",
    [["explain", "--d-model", "4"]] + [["explain", "--example", n] for n in catalog.EXAMPLES],
)
def test_explain_output_speaks_the_users_language(capsys, argv):
    text = _run(capsys, *argv)
    assert _violations(text, FORBIDDEN | HELP_ONLY) == []
    if argv == ["explain", "--d-model", "4"]:  # the title names the sentence, not a file
        assert f'step by step: "{catalog.DEFAULT_SENTENCE}"' in text


@pytest.mark.parametrize(
    "path",
    [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))],
    ids=lambda p: p.name,
)
def test_readme_and_guides_speak_the_users_language(path):
    text = path.read_text(encoding="utf-8")
    defined = DEFINED_IN.get(path.name)
    if defined:  # the page that defines the codes: each has its row
        assert all(f"| P{i} |" in text for i in range(1, 7))
    patterns = {what: p for what, p in FORBIDDEN.items() if what != defined}
    assert _violations(text, patterns) == []
