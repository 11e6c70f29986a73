"""The Python examples of a Markdown page (the README, the docs site's pages), executed as
written by tests/test_readme.py and tests/test_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["python_blocks", "run_block", "stated_messages"]


def python_blocks(path: Path) -> list[str]:
    """The code of every fenced ```python block of ``path``, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def run_block(code: str, path: Path) -> None:
    """Run one block in a fresh namespace (errors name ``path``)."""
    exec(compile(code, str(path), "exec"), {"__name__": "docs_example"})  # noqa: S102


def stated_messages(code: str) -> list[str]:
    """The error messages a block states in ``print(e)  # MESSAGE`` comments: running the
    block must print each of them."""
    return [m.strip() for m in re.findall(r"print\(e\)\s*#\s*(.+)", code)]
