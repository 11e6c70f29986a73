"""The README's Python examples are executed as written (each block in a fresh namespace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.markdown import python_blocks, run_block, stated_messages

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = python_blocks(README)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, capsys):
    run_block(code, README)
    # every example that states an error message in a comment must print exactly that message
    out = capsys.readouterr().out
    for expected in stated_messages(code):
        assert expected in out
